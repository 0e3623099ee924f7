//! The grouped SwiGLU experts on Flex as independent tasks, each a few single-threaded GEMMs: the row
//! work (`G`, `U`, `H`, `Y` forward; `dH`, `dG`, `dU`, `dX` backward) per block of up to
//! [`ROW_BLOCK`] rows of one expert, the weight gradients per block of up to [`WEIGHT_BLOCK`] rows of
//! one expert's `dWg`, `dWu` or `dWd`. Many small experts (fine-grained MoE: 64 experts of a few hundred
//! rows) then keep every thread busy without the fork-join of a threaded GEMM per expert and matrix,
//! and a block's SwiGLU runs while its GEMM outputs are still in cache.
//!
//! Legend: p = rows (sorted by expert), d = model width, f = expert width, e = experts.

use rayon::prelude::*;

use super::experts::{experts, swiglu_backward_chunk, swiglu_chunk};
use super::gemm::gemm_st;

/// Rows of one expert per forward/backward row task.
const ROW_BLOCK: usize = 128;
/// Rows of one weight gradient per task.
const WEIGHT_BLOCK: usize = 64;

/// `(expert, first row, rows)` blocks covering every expert's rows in order.
fn row_blocks(counts_e: &[usize]) -> Vec<(usize, usize, usize)> {
    experts(counts_e)
        .flat_map(|(e, r0, n)| {
            (0..n.div_ceil(ROW_BLOCK)).map(move |b| (e, r0 + b * ROW_BLOCK, ROW_BLOCK.min(n - b * ROW_BLOCK)))
        })
        .collect()
}

/// `buf` (rows of `width`) cut into the row ranges of `blocks`, which cover the rows in order.
fn split_rows<'a>(mut buf: &'a mut [f32], width: usize, blocks: &[(usize, usize, usize)]) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(blocks.len());
    for &(_, _, n) in blocks {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(n * width);
        out.push(head);
        buf = tail;
    }
    out
}

/// Forward: `(y [p, d], g [p, f], u [p, f])`.
pub(super) fn forward(
    x: &[f32],
    (wg, wu, wd): (&[f32], &[f32], &[f32]),
    counts_e: &[usize],
    d: usize,
    f: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let p: usize = counts_e.iter().sum();
    let (mut g, mut u, mut y) = (vec![0f32; p * f], vec![0f32; p * f], vec![0f32; p * d]);
    let blocks = row_blocks(counts_e);
    let (gs, us, ys) = (split_rows(&mut g, f, &blocks), split_rows(&mut u, f, &blocks), split_rows(&mut y, d, &blocks));
    blocks.par_iter().zip(gs).zip(us).zip(ys).for_each(|(((&(e, r0, n), g), u), y)| {
        let x = &x[r0 * d..(r0 + n) * d];
        // G = X·Wg, U = X·Wu: [n, d] × [d, f]; H = silu(G) ⊙ U; Y = H·Wd: [n, f] × [f, d].
        gemm_st(n, f, d, g, false, x, (d, 1), &wg[e * d * f..], (f, 1));
        gemm_st(n, f, d, u, false, x, (d, 1), &wu[e * d * f..], (f, 1));
        let mut h = vec![0f32; n * f];
        swiglu_chunk(g, u, &mut h);
        gemm_st(n, d, f, y, false, &h, (f, 1), &wd[e * f * d..], (d, 1));
    });
    (y, g, u)
}

/// Backward from `dy [p, d]`: `(dx [p, d], dwg [e, d, f], dwu [e, d, f], dwd [e, f, d])`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    dy: &[f32],
    x: &[f32],
    (wg, wu, wd): (&[f32], &[f32], &[f32]),
    (g, u): (&[f32], &[f32]),
    counts_e: &[usize],
    d: usize,
    f: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let p: usize = counts_e.iter().sum();
    let ne = counts_e.len();
    // Row tasks: dH = dY·Wdᵀ (becomes dG in place), dU and H beside it, dX = dG·Wgᵀ + dU·Wuᵀ.
    let (mut dg, mut du, mut h, mut dx) = (vec![0f32; p * f], vec![0f32; p * f], vec![0f32; p * f], vec![0f32; p * d]);
    let blocks = row_blocks(counts_e);
    let (dgs, dus) = (split_rows(&mut dg, f, &blocks), split_rows(&mut du, f, &blocks));
    let (hs, dxs) = (split_rows(&mut h, f, &blocks), split_rows(&mut dx, d, &blocks));
    blocks.par_iter().zip(dgs).zip(dus).zip(hs.into_par_iter().zip(dxs)).for_each(
        |(((&(e, r0, n), dg), du), (h, dx))| {
            let dy = &dy[r0 * d..(r0 + n) * d];
            // Wd_e is [f, d] row-major, so its transpose has strides (1, d).
            gemm_st(n, f, d, dg, false, dy, (d, 1), &wd[e * f * d..], (1, d));
            swiglu_backward_chunk(&g[r0 * f..(r0 + n) * f], &u[r0 * f..(r0 + n) * f], dg, du, h);
            gemm_st(n, d, f, dx, false, dg, (f, 1), &wg[e * d * f..], (1, f));
            gemm_st(n, d, f, dx, true, du, (f, 1), &wu[e * d * f..], (1, f));
        },
    );
    // Weight tasks: dWg = Xᵀ·dG, dWu = Xᵀ·dU ([d, n] × [n, f]), dWd = Hᵀ·dY ([f, n] × [n, d]), by row blocks.
    let (mut dwg, mut dwu, mut dwd) = (vec![0f32; ne * d * f], vec![0f32; ne * d * f], vec![0f32; ne * f * d]);
    let starts: Vec<usize> = counts_e.iter().scan(0, |r, &n| Some(std::mem::replace(r, *r + n))).collect();
    let (dg, du, h) = (&dg, &du, &h);
    let weight_tasks = |w: &mut [f32], rows: usize, cols: usize, lhs: &[f32], lhs_w: usize, rhs: &[f32]| {
        w.par_chunks_mut((rows * cols).max(1)).enumerate().for_each(|(e, w_e)| {
            let (r0, n) = (starts[e], counts_e[e]);
            if n == 0 {
                return; // no rows: a zero gradient, as allocated
            }
            w_e.par_chunks_mut((WEIGHT_BLOCK * cols).max(1)).enumerate().for_each(|(b, w_b)| {
                let (i0, m) = (b * WEIGHT_BLOCK, w_b.len() / cols.max(1));
                // Rows i0..i0 + m of lhsᵀ are columns of lhs: element (i, l) at (r0 + l)·lhs_w + i0 + i.
                gemm_st(m, cols, n, w_b, false, &lhs[r0 * lhs_w + i0..], (1, lhs_w), &rhs[r0 * cols..], (cols, 1));
            });
        });
    };
    weight_tasks(&mut dwg, d, f, x, d, dg);
    weight_tasks(&mut dwu, d, f, x, d, du);
    weight_tasks(&mut dwd, f, d, h, f, dy);
    (dx, dwg, dwu, dwd)
}
