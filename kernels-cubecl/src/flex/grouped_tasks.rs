//! The grouped SwiGLU experts on Flex as parallel tasks, each GEMM on the task's thread: the row work
//! (`G`, `U`, `H`, `Y` forward; `dH`, `dG`, `dU`, `dX` backward) per block of rows of one expert, and the
//! weight gradients per expert, cut along their rows when there are fewer experts than tasks wanted. No
//! fork-join per expert and matrix, and a block's SwiGLU runs while its GEMM outputs are still in cache.
//! (Threaded GEMMs one expert after another, with outputs not zero-filled either, are slower at every
//! shape measured: `benchmarks/notes/2026-12-02-cpu-speed.md`.)
//!
//! Rows come from a [`RowSource`]: a buffer sorted by expert, or (routed experts) the token rows gathered
//! per task; the backward starts from `dY` rows or, with the combine folded in, from the tokens'
//! gradient and the combine weights ([`Upstream`]).
//!
//! Legend: p = rows (sorted by expert), d = model width, f = expert width, e = experts.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::buffers::{gemm_into, unwritten, written, zeroed};
use super::experts::{experts, swiglu_backward_chunk, swiglu_chunk};
use super::gemm::gemm_st;
use super::row_source::RowSource;
use super::simd::{self, multiversion};
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

/// Forward: `(y [p, d], g [p, f], u [p, f])`, the rows `x` read from in expert order.
pub(super) fn forward(
    x: RowSource,
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
        // G = X·Wg, U = X·Wu: [n, d] × [d, f]; H = silu(G) ⊙ U; Y = H·Wd: [n, f] × [f, d].
        let (g, u) = x.with_block((r0, n), (0, d), d, |x, rs| {
            let g = gemm_into(false, (n, f, d), g, x, (rs, 1), &wg[e * d * f..], (f, 1));
            let u = gemm_into(false, (n, f, d), u, x, (rs, 1), &wu[e * d * f..], (f, 1));
            (g, u)
        });
        let mut h = vec![0f32; n * f];
        swiglu_chunk(g, u, &mut h);
        gemm_into(false, (n, d, f), y, &h, (f, 1), &wd[e * f * d..], (d, 1));
    });
    // SAFETY: the blocks cover every row, and each task wrote its blocks of g, u and y whole.
    let (g, u, y) = unsafe { (written(g), written(u), written(y)) };
    (y, g, u)
}

/// The gradient the experts' backward starts from.
#[derive(Clone, Copy)]
pub(super) enum Upstream<'a> {
    /// `dY` of each row.
    Rows(RowSource<'a>),
    /// The experts' output rows were combined into tokens with weights `w_p` (`out[t] = Σ w_p · Y`):
    /// `dout` is the tokens' gradient, read per row (`dY = w_p · dout`), and the backward also
    /// returns `dw_p = ⟨dout, Y⟩ = ⟨dout·Wdᵀ, H⟩` — computed from the `f`-wide rows, without `Y`.
    Combined { dout: RowSource<'a>, w_p: &'a [f32] },
}

/// What [`backward`] returns: `dx [p, d]`, `dwg [e, d, f]`, `dwu [e, d, f]`, `dwd [e, f, d]` and, for
/// [`Upstream::Combined`], `dw_p [p]` (else empty).
pub(super) struct Grads {
    pub(super) dx: Vec<f32>,
    pub(super) dwg: Vec<f32>,
    pub(super) dwu: Vec<f32>,
    pub(super) dwd: Vec<f32>,
    pub(super) dw_p: Vec<f32>,
}

multiversion! {
    /// `dw[i] = ⟨dh_i, h_i⟩`, then `dh_i *= w[i]` and `h_i *= w[i]`, for rows of width `f`.
    fn combine_weight_rows(dh: &mut [f32], h: &mut [f32], w: &[f32], dw: &mut [f32], f: usize) {
        for (((dh, h), &w), dw) in dh.chunks_mut(f).zip(h.chunks_mut(f)).zip(w).zip(dw) {
            *dw = simd::dot(dh, h);
            dh.iter_mut().for_each(|v| *v *= w);
            h.iter_mut().for_each(|v| *v *= w);
        }
    }
}

/// Backward from `upstream`, the forward's rows `x` and projections `g`, `u` (see [`Grads`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    upstream: Upstream,
    x: RowSource,
    (wg, wu, wd): (&[f32], &[f32], &[f32]),
    (g, u): (&[f32], &[f32]),
    counts_e: &[usize],
    d: usize,
    f: usize,
) -> Grads {
    let p: usize = counts_e.iter().sum();
    let ne = counts_e.len();
    let (dy, w_p) = match upstream {
        Upstream::Rows(dy) => (dy, None),
        Upstream::Combined { dout, w_p } => (dout, Some(w_p)),
    };
    // Row tasks: dH = dY·Wdᵀ (becomes dG in place), dU and H beside it, dX = dG·Wgᵀ + dU·Wuᵀ. Combined:
    // dH starts as dout·Wdᵀ, gives dw, then is scaled by w — and so is H, as dWd = (w ⊙ H)ᵀ·dout.
    let (mut dg, mut du, mut h, mut dx) = (unwritten(p * f), unwritten(p * f), unwritten(p * f), unwritten(p * d));
    let mut dw_p = unwritten(if w_p.is_some() { p } else { 0 });
    let blocks = row_blocks(counts_e);
    let (dgs, dus) = (split_rows(&mut dg, f, &blocks), split_rows(&mut du, f, &blocks));
    let (hs, dxs) = (split_rows(&mut h, f, &blocks), split_rows(&mut dx, d, &blocks));
    let dws = split_rows(&mut dw_p, usize::from(w_p.is_some()), &blocks);
    let tasks: Vec<_> = blocks.iter().zip(dgs).zip(dus).zip(hs.into_iter().zip(dxs).zip(dws)).collect();
    tasks.into_par_iter().for_each(|(((&(e, r0, n), dg), du), ((h, dx), dw))| {
        // Wd_e is [f, d] and Wg_e, Wu_e are [d, f], row-major: each is read transposed.
        let dg = dy.with_block((r0, n), (0, d), d, |dy, rs| {
            with_transposed(&wd[e * f * d..], (f, d), n, false, |w, s| {
                gemm_into(false, (n, f, d), dg, dy, (rs, 1), w, s)
            })
        });
        let (g, u) = (&g[r0 * f..(r0 + n) * f], &u[r0 * f..(r0 + n) * f]);
        let (du, h) = (zeroed(du), zeroed(h));
        match w_p {
            None => swiglu_backward_chunk(g, u, dg, du, h),
            Some(w_p) => {
                swiglu_chunk(g, u, h);
                combine_weight_rows(dg, h, &w_p[r0..r0 + n], zeroed(dw), f);
                swiglu_backward_chunk(g, u, dg, du, &mut []);
            }
        }
        let dx = with_transposed(&wg[e * d * f..], (d, f), n, false, |w, s| {
            gemm_into(false, (n, d, f), dx, dg, (f, 1), w, s)
        });
        with_transposed(&wu[e * d * f..], (d, f), n, false, |w, s| gemm_st(false, n, d, f, dx, true, du, (f, 1), w, s));
    });
    // SAFETY: the blocks cover every row, and each task wrote its blocks whole.
    let (dg, du, h, dx, dw_p) = unsafe { (written(dg), written(du), written(h), written(dx), written(dw_p)) };
    // Weight tasks: dWg = Xᵀ·dG and dWu = Xᵀ·dU ([d, n] × [n, f]) on one read of X's columns,
    // dWd = Hᵀ·dY ([f, n] × [n, d]); each expert's matrices cut into pieces of rows, so that even a
    // few experts make enough tasks.
    let (mut dwg, mut dwu, mut dwd) = (unwritten(ne * d * f), unwritten(ne * d * f), unwritten(ne * f * d));
    let starts: Vec<usize> = counts_e.iter().scan(0, |r, &n| Some(std::mem::replace(r, *r + n))).collect();
    let pieces = wanted_tasks().div_ceil(experts(counts_e).count().max(1));
    let tasks: Vec<WeightTask> = pieces_of(&mut dwg, d, f, pieces)
        .into_iter()
        .zip(pieces_of(&mut dwu, d, f, pieces))
        .map(|((e, i0, dwg), (_, _, dwu))| WeightTask::GateUp(e, i0, dwg, dwu))
        .chain(pieces_of(&mut dwd, f, d, pieces).into_iter().map(|(e, i0, dwd)| WeightTask::Down(e, i0, dwd)))
        .collect();
    tasks.into_par_iter().for_each(|task| {
        let e = match &task {
            WeightTask::GateUp(e, ..) | WeightTask::Down(e, ..) => *e,
        };
        let (r0, n) = (starts[e], counts_e[e]);
        match task {
            // An expert without rows: zero gradients.
            WeightTask::GateUp(_, _, dwg, dwu) if n == 0 => {
                zeroed(dwg);
                zeroed(dwu);
            }
            WeightTask::Down(_, _, dwd) if n == 0 => {
                zeroed(dwd);
            }
            // Rows i0.. of Xᵀ [d, n] are columns i0.. of X's rows: element (i, l) at l·stride + i.
            WeightTask::GateUp(_, i0, dwg, dwu) => x.with_block((r0, n), (i0, dwg.len() / f), d, |x, rs| {
                let m = dwg.len() / f;
                gemm_into(false, (m, f, n), dwg, x, (1, rs), &dg[r0 * f..], (f, 1));
                gemm_into(false, (m, f, n), dwu, x, (1, rs), &du[r0 * f..], (f, 1));
            }),
            // Rows i0.. of Hᵀ [f, n]: element (i, l) at (r0 + l)·f + i0 + i.
            WeightTask::Down(_, i0, dwd) => dy.with_block((r0, n), (0, d), d, |dy, rs| {
                gemm_into(false, (dwd.len() / d, d, n), dwd, &h[r0 * f + i0..], (1, f), dy, (rs, 1));
            }),
        }
    });
    // SAFETY: the pieces cover every expert's matrices, and each task wrote (or zeroed) its pieces whole.
    let (dwg, dwu, dwd) = unsafe { (written(dwg), written(dwu), written(dwd)) };
    Grads { dx, dwg, dwu, dwd, dw_p }
}

/// One task of the weight gradients: `(expert, first row, piece)` of `dWg` and `dWu` together (they
/// share the read of X), or of `dWd`.
enum WeightTask<'a> {
    GateUp(usize, usize, &'a mut [MaybeUninit<f32>], &'a mut [MaybeUninit<f32>]),
    Down(usize, usize, &'a mut [MaybeUninit<f32>]),
}

/// `w` (one `rows × cols` matrix per expert) cut into `(expert, first row, piece)` of `⌈rows / pieces⌉`
/// rows (the last may be shorter).
fn pieces_of(
    w: &mut [MaybeUninit<f32>],
    rows: usize,
    cols: usize,
    pieces: usize,
) -> Vec<(usize, usize, &mut [MaybeUninit<f32>])> {
    let piece = rows.div_ceil(pieces.max(1)).max(1);
    w.chunks_mut((rows * cols).max(1))
        .enumerate()
        .flat_map(|(e, w_e)| w_e.chunks_mut(piece * cols).enumerate().map(move |(j, w_ej)| (e, j * piece, w_ej)))
        .collect()
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
