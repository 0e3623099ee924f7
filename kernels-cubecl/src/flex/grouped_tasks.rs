//! The grouped SwiGLU experts on Flex as parallel tasks, each GEMM on the task's thread: the row work
//! (`G`, `U`, `H`, `Y` forward; `dH`, `dG`, `dU`, `dX` backward) per block of rows of one expert, and the
//! weight gradients per expert, cut along their rows when there are fewer experts than tasks wanted. No
//! fork-join per expert and matrix, and a block's SwiGLU runs while its GEMM outputs are still in cache.
//! (Threaded GEMMs one expert after another were slower at every shape measured once the outputs were
//! no longer zero-filled first: `tiny` 26 → 58–80 GFLOP/s, Mixtral-style d = 256 120 → 138, the coarse
//! 8 × 512 × 1024 block 0.92 → 1.01 of the dense GEMM rate, 2 threads.)
//!
//! Legend: p = rows (sorted by expert), d = model width, f = expert width, e = experts.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::buffers::{gemm_into, unwritten, written, zeroed};
use super::experts::{experts, swiglu_backward_chunk, swiglu_chunk};
use super::gemm::gemm_st;
use super::transpose::with_transposed;

/// Fewest rows of one expert per row task.
const ROW_BLOCK: usize = 128;
/// Tasks per thread the blocks aim at: enough to balance uneven experts, few enough that each GEMM
/// stays large.
const TASKS_PER_THREAD: usize = 4;

fn wanted_tasks() -> usize {
    TASKS_PER_THREAD * rayon::current_num_threads()
}

/// Rows per block when `rows` rows are to be cut into about `TASKS_PER_THREAD` tasks per thread,
/// at least [`ROW_BLOCK`].
fn block_rows(rows: usize) -> usize {
    (rows / wanted_tasks().max(1)).max(ROW_BLOCK)
}

/// `(expert, first row, rows)` blocks covering every expert's rows in order: an expert of `n` rows is
/// cut into `⌊n / block⌋` (at least one) equal blocks, so no block is a short remainder — a GEMM of a
/// few dozen rows runs at half the rate, and each block of the backward transposes the expert's
/// weights again ([`with_transposed`]).
fn row_blocks(counts_e: &[usize]) -> Vec<(usize, usize, usize)> {
    let block = block_rows(counts_e.iter().sum());
    experts(counts_e)
        .flat_map(|(e, r0, n)| {
            let blocks = (n / block).max(1);
            (0..blocks).map(move |b| (e, r0 + b * n / blocks, (b + 1) * n / blocks - b * n / blocks))
        })
        .collect()
}

/// `buf` (rows of `width`) cut into the row ranges of `blocks`, which cover the rows in order.
fn split_rows<'a, T>(mut buf: &'a mut [T], width: usize, blocks: &[(usize, usize, usize)]) -> Vec<&'a mut [T]> {
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
    let (mut g, mut u, mut y) = (unwritten(p * f), unwritten(p * f), unwritten(p * d));
    let blocks = row_blocks(counts_e);
    let (gs, us, ys) = (split_rows(&mut g, f, &blocks), split_rows(&mut u, f, &blocks), split_rows(&mut y, d, &blocks));
    let tasks: Vec<_> = blocks.iter().zip(gs).zip(us).zip(ys).collect();
    tasks.into_par_iter().for_each(|(((&(e, r0, n), g), u), y)| {
        let x = &x[r0 * d..(r0 + n) * d];
        // G = X·Wg, U = X·Wu: [n, d] × [d, f]; H = silu(G) ⊙ U; Y = H·Wd: [n, f] × [f, d].
        let g = gemm_into(false, (n, f, d), g, x, (d, 1), &wg[e * d * f..], (f, 1));
        let u = gemm_into(false, (n, f, d), u, x, (d, 1), &wu[e * d * f..], (f, 1));
        let mut h = vec![0f32; n * f];
        swiglu_chunk(g, u, &mut h);
        gemm_into(false, (n, d, f), y, &h, (f, 1), &wd[e * f * d..], (d, 1));
    });
    // SAFETY: the blocks cover every row, and each task wrote its blocks of g, u and y whole.
    let (g, u, y) = unsafe { (written(g), written(u), written(y)) };
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
    let (mut dg, mut du, mut h, mut dx) = (unwritten(p * f), unwritten(p * f), unwritten(p * f), unwritten(p * d));
    let blocks = row_blocks(counts_e);
    let (dgs, dus) = (split_rows(&mut dg, f, &blocks), split_rows(&mut du, f, &blocks));
    let (hs, dxs) = (split_rows(&mut h, f, &blocks), split_rows(&mut dx, d, &blocks));
    let tasks: Vec<_> = blocks.iter().zip(dgs).zip(dus).zip(hs.into_iter().zip(dxs)).collect();
    tasks.into_par_iter().for_each(|(((&(e, r0, n), dg), du), (h, dx))| {
        let dy = &dy[r0 * d..(r0 + n) * d];
        // Wd_e is [f, d] and Wg_e, Wu_e are [d, f], row-major: each is read transposed.
        let dg = with_transposed(&wd[e * f * d..], (f, d), n, false, |w, s| {
            gemm_into(false, (n, f, d), dg, dy, (d, 1), w, s)
        });
        let (du, h) = (zeroed(du), zeroed(h));
        swiglu_backward_chunk(&g[r0 * f..(r0 + n) * f], &u[r0 * f..(r0 + n) * f], dg, du, h);
        let dx = with_transposed(&wg[e * d * f..], (d, f), n, false, |w, s| {
            gemm_into(false, (n, d, f), dx, dg, (f, 1), w, s)
        });
        with_transposed(&wu[e * d * f..], (d, f), n, false, |w, s| gemm_st(false, n, d, f, dx, true, du, (f, 1), w, s));
    });
    // SAFETY: the blocks cover every row, and each task wrote its blocks whole.
    let (dg, du, h, dx) = unsafe { (written(dg), written(du), written(h), written(dx)) };
    // Weight tasks: dWg = Xᵀ·dG, dWu = Xᵀ·dU ([d, n] × [n, f]), dWd = Hᵀ·dY ([f, n] × [n, d]).
    let (mut dwg, mut dwu, mut dwd) = (unwritten(ne * d * f), unwritten(ne * d * f), unwritten(ne * f * d));
    let starts: Vec<usize> = counts_e.iter().scan(0, |r, &n| Some(std::mem::replace(r, *r + n))).collect();
    let (dg, du, h) = (&dg, &du, &h);
    // Pieces of rows per expert's matrix, so that even a few experts make enough tasks.
    let pieces = wanted_tasks().div_ceil(experts(counts_e).count().max(1));
    let weight_tasks =
        |w: &mut [MaybeUninit<f32>], rows: usize, cols: usize, lhs: &[f32], lhs_w: usize, rhs: &[f32]| {
            let piece = rows.div_ceil(pieces).max(1);
            let tasks: Vec<_> = w
                .chunks_mut((rows * cols).max(1))
                .enumerate()
                .flat_map(|(e, w_e)| {
                    w_e.chunks_mut(piece * cols).enumerate().map(move |(j, w_ej)| (e, j * piece, w_ej))
                })
                .collect();
            tasks.into_par_iter().for_each(|(e, i0, w_ej)| {
                let (r0, n, m) = (starts[e], counts_e[e], w_ej.len() / cols.max(1));
                if n == 0 {
                    // An expert without rows: a zero gradient.
                    zeroed(w_ej);
                    return;
                }
                // Rows i0.. of lhsᵀ [rows, n]: element (i, l) at (r0 + l)·lhs_w + i0 + i.
                gemm_into(false, (m, cols, n), w_ej, &lhs[r0 * lhs_w + i0..], (1, lhs_w), &rhs[r0 * cols..], (cols, 1));
            });
        };
    weight_tasks(&mut dwg, d, f, x, d, dg);
    weight_tasks(&mut dwu, d, f, x, d, du);
    weight_tasks(&mut dwd, f, d, h, f, dy);
    // SAFETY: the pieces cover every expert's matrix, and each task wrote (or zeroed) its piece whole.
    let (dwg, dwu, dwd) = unsafe { (written(dwg), written(dwu), written(dwd)) };
    (dx, dwg, dwu, dwd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocks tile every expert's rows in order, and none is shorter than the block size unless
    /// its expert is, nor as long as two blocks.
    #[test]
    fn row_blocks_cover_each_expert_in_blocks_of_one_to_two_block_sizes() {
        for counts_e in [vec![600, 0, 3, 1100, 511, 512, 1024, 1023], vec![7; 64], vec![0, 5000], vec![]] {
            let block = block_rows(counts_e.iter().sum());
            let blocks = row_blocks(&counts_e);
            let mut next_row = 0;
            for (e, &n) in counts_e.iter().enumerate() {
                let mine: Vec<_> = blocks.iter().filter(|b| b.0 == e).collect();
                assert_eq!(mine.iter().map(|b| b.2).sum::<usize>(), n, "expert {e} of {counts_e:?}");
                for &&(_, r0, rows) in &mine {
                    assert_eq!(r0, next_row, "blocks out of order in {counts_e:?}");
                    next_row += rows;
                    assert!(
                        rows >= block.min(n) && rows < 2 * block,
                        "block of {rows} rows (block {block}) in {counts_e:?}"
                    );
                }
            }
            assert!(blocks.iter().all(|b| b.2 > 0), "an empty block in {counts_e:?}");
        }
    }
}
