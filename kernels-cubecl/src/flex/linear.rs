//! Linear layers on Flex: `Y = X·W (+ b)` as one GEMM over all rows, written straight into its output
//! (Burn's matmul zero-fills a fresh output, and for `[batch, seq, width]` inputs runs one GEMM per
//! batch entry, packing the weight again for each); the backward's `dX = dY·Wᵀ` and `dW = Xᵀ·dY` read
//! the transposes as strides. A weight that is a transposed view (a head tied to the embedding) is
//! read in place too.
//!
//! Legend: r = rows (every leading dim of the input), k = input width, n = output width.

use burn::backend::TensorMetadata;
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::buffers::gemm_new;
use super::gemm::gemm_block;
use super::transpose::with_transposed;
use super::{f32s, tensor};

/// A 2-D f32 tensor's storage from its first element, with its `(row, column)` strides; `None` for
/// negative strides or other ranks (the caller then copies it to row-major).
fn strided(t: &FlexTensor) -> Option<(&[f32], (usize, usize))> {
    let layout = t.layout();
    let strides = layout.strides();
    if strides.len() != 2 || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let data = t.storage::<f32>().get(layout.start_offset()..)?;
    Some((data, (strides[0] as usize, strides[1] as usize)))
}

/// Runs `f` on the weight's storage and strides, copying it to row-major only when its layout cannot
/// be read in place.
fn with_weight<R>(w_kn: &FlexTensor, f: impl FnOnce(&[f32], (usize, usize)) -> R) -> R {
    match strided(w_kn) {
        Some((data, strides)) => f(data, strides),
        None => {
            let n = w_kn.shape()[1];
            f(&f32s(w_kn), (n, 1))
        }
    }
}

/// `y_rn = x_rk · w_kn (+ b_n)`.
pub(super) fn forward(x_rk: &FlexTensor, w_kn: &FlexTensor, b_n: Option<&FlexTensor>) -> FlexTensor {
    let (r, k, n) = (x_rk.shape()[0], x_rk.shape()[1], w_kn.shape()[1]);
    let x = f32s(x_rk);
    let y = with_weight(w_kn, |w, w_strides| match b_n {
        None => gemm_new(true, (r, n, k), &x, (k, 1), w, w_strides),
        Some(b_n) => {
            // Every row starts as the bias; the GEMM adds onto it.
            let b = f32s(b_n);
            let mut y = Vec::with_capacity(r * n);
            for _ in 0..r {
                y.extend_from_slice(&b);
            }
            // SAFETY: `y` is exclusively owned, `r × n` long and aliases no operand.
            unsafe { gemm_block((r, n, k), y.as_mut_ptr(), y.len(), n, true, &x, (k, 1), w, w_strides, 1.0, true) };
            y
        }
    });
    tensor(y, [r, n])
}

/// `dx_rk = dy_rn · w_knᵀ`: Wᵀ's element (l, j) is W's (j, l), so its strides are W's swapped; a
/// row-major W with long rows (an untied vocabulary head) is transposed first ([`with_transposed`]:
/// `[2048, 4096] × [4096, 256]` 284–295 → 322–342 GFLOP/s on 2 threads).
pub(super) fn backward_x(dy_rn: &FlexTensor, w_kn: &FlexTensor) -> FlexTensor {
    let (r, (k, n)) = (dy_rn.shape()[0], (w_kn.shape()[0], w_kn.shape()[1]));
    let dy = f32s(dy_rn);
    let dx = with_weight(w_kn, |w, (w_rs, w_cs)| {
        if w_cs == 1 && w_rs == n {
            with_transposed(w, (k, n), r, true, |wt, s| gemm_new(true, (r, k, n), &dy, (n, 1), wt, s))
        } else {
            gemm_new(true, (r, k, n), &dy, (n, 1), w, (w_cs, w_rs))
        }
    });
    tensor(dx, [r, k])
}

/// Fewest rows of the input per part of a weight gradient's sum.
const ROWS_PER_PART: usize = 256;

/// `dw_kn = x_rkᵀ · dy_rn`: Xᵀ's element (i, l) is X's (l, i), at l·k + i. The sum runs over all r rows
/// and the output is small (`[k, n]`, often 256 × 128): a threaded GEMM can only split that output and
/// reached 104–134 GFLOP/s on 2 threads, so each thread sums its own share of the rows with a
/// single-threaded GEMM (82–93 GFLOP/s each) and the partial gradients are added.
pub(super) fn backward_w(dy_rn: &FlexTensor, x_rk: &FlexTensor) -> FlexTensor {
    let (r, k, n) = (x_rk.shape()[0], x_rk.shape()[1], dy_rn.shape()[1]);
    let (x, dy) = (f32s(x_rk), f32s(dy_rn));
    let parts = rayon::current_num_threads().min(r / ROWS_PER_PART).max(1);
    if parts == 1 {
        return tensor(gemm_new(true, (k, n, r), &x, (1, k), &dy, (n, 1)), [k, n]);
    }
    let rows = r.div_ceil(parts);
    let mut partials: Vec<Vec<f32>> = (0..parts)
        .into_par_iter()
        .map(|p| {
            let (r0, m) = (p * rows, rows.min(r - p * rows));
            gemm_new(false, (k, n, m), &x[r0 * k..], (1, k), &dy[r0 * n..], (n, 1))
        })
        .collect();
    let mut dw = partials.swap_remove(0);
    dw.par_chunks_mut(ADD_CHUNK).enumerate().for_each(|(c, out)| {
        for p in &partials {
            for (a, b) in out.iter_mut().zip(&p[c * ADD_CHUNK..]) {
                *a += b;
            }
        }
    });
    tensor(dw, [k, n])
}

/// Elements per task when the partial gradients are added.
const ADD_CHUNK: usize = 1 << 14;

/// `db_n = Σ_rows dy_rn`, as the one-row GEMM `1ᵀ·dY`.
pub(super) fn backward_b(dy_rn: &FlexTensor) -> FlexTensor {
    let (r, n) = (dy_rn.shape()[0], dy_rn.shape()[1]);
    tensor(gemm_new(true, (1, n, r), &vec![1f32; r], (r, 1), &f32s(dy_rn), (n, 1)), [n])
}
