//! The host kernels' GEMM: one strided block through the `gemm` crate, on the calling thread (where
//! the kernels' tasks are the parallel units) or on all threads. Operands are given by slice and `(row stride, column
//! stride)`, so a transpose is just swapped strides.

/// `dst[i·dst_rs + j] = (dst if accumulate) + beta · Σ_l lhs[i, l] · rhs[l, j]` for an `m × n` block.
///
/// # Safety
/// `dst` is valid for reads and writes of `dst_len` elements, no other thread touches the block's
/// elements meanwhile, and they do not alias `lhs` or `rhs`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_block(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_len: usize,
    dst_rs: usize,
    accumulate: bool,
    lhs: &[f32],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[f32],
    (rhs_rs, rhs_cs): (usize, usize),
    beta: f32,
    threads: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!((m - 1) * dst_rs + n <= dst_len, "gemm: destination out of bounds");
    assert!(k == 0 || lhs.len() > (m - 1) * lhs_rs + (k - 1) * lhs_cs, "gemm: lhs out of bounds");
    assert!(k == 0 || rhs.len() > (k - 1) * rhs_rs + (n - 1) * rhs_cs, "gemm: rhs out of bounds");
    // SAFETY: every element the strides reach was bounds-checked above; exclusivity of `dst` is the
    // caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            beta,
            false,
            false,
            false,
            if threads { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None },
        );
    }
}

/// `dst[m, n] (+)= lhs[m, k] · rhs[k, n]` into a row-major slice, on all threads if `threads`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_st(
    threads: bool,
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
) {
    // SAFETY: `dst` is exclusively borrowed, so it is valid for its length and aliases nothing.
    unsafe {
        gemm_block(
            (m, n, k),
            dst.as_mut_ptr(),
            dst.len(),
            n,
            accumulate,
            lhs,
            lhs_strides,
            rhs,
            rhs_strides,
            1.0,
            threads,
        )
    }
}
