//! Output buffers the kernels' tasks fill themselves. `vec![0f32; n]` makes the allocating thread
//! zero the whole buffer (mimalloc's `calloc`: one serial memset, 2–4% of a training step) before the
//! tasks overwrite it; here the buffer starts unwritten, and each task either lets a GEMM write its block
//! (`accumulate` false: every element stored, none read first) or zeroes the block it is about to use,
//! in parallel and while it is in cache.

use std::mem::MaybeUninit;

use super::gemm::gemm_block;

/// `len` floats nothing has written yet.
pub(super) fn unwritten(len: usize) -> Vec<MaybeUninit<f32>> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` needs no initialisation, and the capacity is `len`.
    unsafe { v.set_len(len) };
    v
}

/// The block, zeroed, as floats.
pub(super) fn zeroed(block: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    block.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just written; `MaybeUninit<f32>` has the layout of `f32`.
    unsafe { &mut *(block as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// `block[m, n] = lhs[m, k] · rhs[k, n]` (row-major, on all threads if `threads`), then the block as floats.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_into<'a>(
    threads: bool,
    (m, n, k): (usize, usize, usize),
    block: &'a mut [MaybeUninit<f32>],
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
) -> &'a mut [f32] {
    assert_eq!(block.len(), m * n, "gemm_into: the block must hold the m × n product");
    // SAFETY: the block is exclusively borrowed and `m × n` long; with `accumulate` false the `gemm`
    // crate stores every element (zeros when k = 0) without reading any, so afterwards all are written.
    unsafe {
        gemm_block(
            (m, n, k),
            block.as_mut_ptr().cast(),
            block.len(),
            n,
            false,
            lhs,
            lhs_strides,
            rhs,
            rhs_strides,
            1.0,
            threads,
        );
        &mut *(block as *mut [MaybeUninit<f32>] as *mut [f32])
    }
}

/// The buffer as floats.
///
/// # Safety
/// Every element has been written.
pub(super) unsafe fn written(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: same allocation, length and capacity; `MaybeUninit<f32>` has the layout of `f32` and the
    // caller guarantees every element is initialised.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast(), v.len(), v.capacity()) }
}

/// `lhs[m, k] · rhs[k, n]` into a new row-major `[m, n]` buffer (on all threads if `threads`), never
/// zero-filled.
pub(super) fn gemm_new(
    threads: bool,
    (m, n, k): (usize, usize, usize),
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
) -> Vec<f32> {
    let mut out = unwritten(m.checked_mul(n).expect("gemm: output size overflows usize"));
    gemm_into(threads, (m, n, k), &mut out, lhs, lhs_strides, rhs, rhs_strides);
    // SAFETY: `gemm_into` wrote the whole block.
    unsafe { written(out) }
}
