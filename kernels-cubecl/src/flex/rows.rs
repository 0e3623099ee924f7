//! Host kernels of dispatch and combine on Flex: one multi-threaded pass per op over whole rows,
//! instead of the gather, reshape, multiply and sum tensors of the generic definitions.
//!
//! Legend: t = tokens, k = experts per token, p = permuted rows (t · k), d = row width.
//! `row_tk[t · k + j]` is the permuted row of (token t, slot j); `slot_p[i]` is the inverse map.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::simd::{self, multiversion};

/// Tokens (or permuted rows) per parallel chunk.
const TOKENS_PER_TASK: usize = 32;

/// Dispatch permute: `x_pd[i] = x_td[token_p[i]]`, every row written whole.
pub(super) fn permute(x_td: &[f32], token_p: &[usize], d: usize, x_pd: &mut [MaybeUninit<f32>]) {
    let chunk = (TOKENS_PER_TASK * d).max(1);
    x_pd.par_chunks_mut(chunk).enumerate().for_each(|(c, out)| {
        for (i, row) in out.chunks_mut(d.max(1)).enumerate() {
            let t = token_p[c * TOKENS_PER_TASK + i];
            for (a, &b) in row.iter_mut().zip(&x_td[t * d..(t + 1) * d]) {
                *a = MaybeUninit::new(b);
            }
        }
    });
}

/// Backward of the dispatch permute: `dx_td[t] = Σ_j dy_pd[row_tk[t, j]]`.
pub(super) fn permute_backward(dy_pd: &[f32], row_tk: &[usize], k: usize, d: usize, dx_td: &mut [f32]) {
    let chunk = (TOKENS_PER_TASK * d).max(1);
    dx_td.par_chunks_mut(chunk).enumerate().for_each(|(c, out)| {
        for (i, dx) in out.chunks_mut(d.max(1)).enumerate() {
            let t = c * TOKENS_PER_TASK + i;
            dx.fill(0.0);
            for &row in &row_tk[t * k..(t + 1) * k] {
                for (a, &b) in dx.iter_mut().zip(&dy_pd[row * d..(row + 1) * d]) {
                    *a += b;
                }
            }
        }
    });
}

/// Combine: `out_td[t] = Σ_j w_tk[t, j] · y_pd[row_tk[t, j]]`.
pub(super) fn combine(y_pd: &[f32], w_tk: &[f32], row_tk: &[usize], k: usize, d: usize, out_td: &mut [f32]) {
    let chunk = (TOKENS_PER_TASK * d).max(1);
    out_td.par_chunks_mut(chunk).enumerate().for_each(|(c, out)| {
        for (i, o) in out.chunks_mut(d.max(1)).enumerate() {
            let t = c * TOKENS_PER_TASK + i;
            o.fill(0.0);
            for j in 0..k {
                let (w, row) = (w_tk[t * k + j], row_tk[t * k + j]);
                for (a, &b) in o.iter_mut().zip(&y_pd[row * d..(row + 1) * d]) {
                    *a += w * b;
                }
            }
        }
    });
}

/// Backward of [`combine`] from `dout_td`: `dy_pd[i] = w[slot_p[i]] · dout_td[slot_p[i] / k]` (every row
/// written whole) and
/// `dw_tk[t, j] = ⟨dout_td[t], y_pd[row_tk[t, j]]⟩`.
#[allow(clippy::too_many_arguments)]
pub(super) fn combine_backward(
    dout_td: &[f32],
    y_pd: &[f32],
    w_tk: &[f32],
    row_tk: &[usize],
    slot_p: &[usize],
    k: usize,
    d: usize,
    dy_pd: &mut [MaybeUninit<f32>],
    dw_tk: &mut [f32],
) {
    let chunk = (TOKENS_PER_TASK * d).max(1);
    dy_pd.par_chunks_mut(chunk).enumerate().for_each(|(c, out)| {
        for (i, dy) in out.chunks_mut(d.max(1)).enumerate() {
            let slot = slot_p[c * TOKENS_PER_TASK + i];
            let (w, t) = (w_tk[slot], slot / k);
            for (a, &b) in dy.iter_mut().zip(&dout_td[t * d..(t + 1) * d]) {
                *a = MaybeUninit::new(w * b);
            }
        }
    });
    let chunk = (TOKENS_PER_TASK * k).max(1);
    dw_tk
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(c, out)| combine_dw_chunk(out, c * chunk, dout_td, y_pd, row_tk, k, d));
}

multiversion! {
    /// `dw_tk` for the slots from `first` on: each a dot product over the row width, in eight lanes.
    fn combine_dw_chunk(dw: &mut [f32], first: usize, dout_td: &[f32], y_pd: &[f32], row_tk: &[usize], k: usize, d: usize) {
        for (i, dw) in dw.iter_mut().enumerate() {
            let slot = first + i;
            let (t, row) = (slot / k, row_tk[slot]);
            *dw = simd::dot(&dout_td[t * d..(t + 1) * d], &y_pd[row * d..(row + 1) * d]);
        }
    }
}
