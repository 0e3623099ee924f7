//! The grouped SwiGLU experts on Flex as tasks: the row work (`G`, `U`, `H`, `Y` forward; `dH`, `dG`,
//! `dU`, `dX` backward) per block of rows of one expert, and each expert's weight gradients. With many
//! experts (fine-grained MoE: 64 of a few hundred rows) the tasks run in parallel, each GEMM on one
//! thread — no fork-join per expert and matrix, and a block's SwiGLU runs while its GEMM outputs are
//! still in cache; with few large experts (Mixtral's 8) they run in order, each GEMM on all threads.
//!
//! Legend: p = rows (sorted by expert), d = model width, f = expert width, e = experts.

use rayon::prelude::*;

use super::experts::{experts, swiglu_backward_chunk, swiglu_chunk};
use super::gemm::gemm_st;

/// Fewest rows of one expert per row task.
const ROW_BLOCK: usize = 128;
/// Tasks per thread the blocks aim at: enough to balance uneven experts, few enough that each GEMM
/// stays large.
const TASKS_PER_THREAD: usize = 4;
/// From this many experts with rows per thread on, the tasks run in parallel with single-threaded
/// GEMMs; below it one after another, each GEMM on all threads — 8 experts of 512 rows on 2 threads
/// ran 5–7% slower as parallel tasks than as threaded GEMMs, 64 experts of 256 rows 10–15% faster.
const PARALLEL_EXPERTS_PER_THREAD: usize = 8;

/// Whether the tasks of `counts_e` run in parallel (else their GEMMs use the threads).
fn parallel_tasks(counts_e: &[usize]) -> bool {
    experts(counts_e).count() >= PARALLEL_EXPERTS_PER_THREAD * rayon::current_num_threads()
}

/// Runs `f` on every task: in parallel, or in order.
fn run<T: Send>(tasks: Vec<T>, parallel: bool, f: impl Fn(T) + Sync + Send) {
    if parallel {
        tasks.into_par_iter().for_each(f);
    } else {
        tasks.into_iter().for_each(f);
    }
}

/// Rows per block when `rows` rows are to be cut into about `TASKS_PER_THREAD` tasks per thread,
/// at least [`ROW_BLOCK`].
fn block_rows(rows: usize) -> usize {
    (rows / (TASKS_PER_THREAD * rayon::current_num_threads()).max(1)).max(ROW_BLOCK)
}

/// `(expert, first row, rows)` blocks covering every expert's rows in order (whole experts when the
/// tasks run one after another).
fn row_blocks(counts_e: &[usize], parallel: bool) -> Vec<(usize, usize, usize)> {
    let total = counts_e.iter().sum();
    let block = if parallel { block_rows(total) } else { total.max(1) };
    experts(counts_e)
        .flat_map(|(e, r0, n)| (0..n.div_ceil(block)).map(move |b| (e, r0 + b * block, block.min(n - b * block))))
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
    let parallel = parallel_tasks(counts_e);
    let blocks = row_blocks(counts_e, parallel);
    let (gs, us, ys) = (split_rows(&mut g, f, &blocks), split_rows(&mut u, f, &blocks), split_rows(&mut y, d, &blocks));
    let tasks: Vec<_> = blocks.iter().zip(gs).zip(us).zip(ys).collect();
    let threads = !parallel;
    run(tasks, parallel, |(((&(e, r0, n), g), u), y)| {
        let x = &x[r0 * d..(r0 + n) * d];
        // G = X·Wg, U = X·Wu: [n, d] × [d, f]; H = silu(G) ⊙ U; Y = H·Wd: [n, f] × [f, d].
        gemm_st(threads, n, f, d, g, false, x, (d, 1), &wg[e * d * f..], (f, 1));
        gemm_st(threads, n, f, d, u, false, x, (d, 1), &wu[e * d * f..], (f, 1));
        let mut h = vec![0f32; n * f];
        swiglu_chunk(g, u, &mut h);
        gemm_st(threads, n, d, f, y, false, &h, (f, 1), &wd[e * f * d..], (d, 1));
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
    let parallel = parallel_tasks(counts_e);
    let blocks = row_blocks(counts_e, parallel);
    let threads = !parallel;
    let (dgs, dus) = (split_rows(&mut dg, f, &blocks), split_rows(&mut du, f, &blocks));
    let (hs, dxs) = (split_rows(&mut h, f, &blocks), split_rows(&mut dx, d, &blocks));
    let tasks: Vec<_> = blocks.iter().zip(dgs).zip(dus).zip(hs.into_iter().zip(dxs)).collect();
    run(tasks, parallel, |(((&(e, r0, n), dg), du), (h, dx))| {
        let dy = &dy[r0 * d..(r0 + n) * d];
        // Wd_e is [f, d] row-major, so its transpose has strides (1, d).
        gemm_st(threads, n, f, d, dg, false, dy, (d, 1), &wd[e * f * d..], (1, d));
        swiglu_backward_chunk(&g[r0 * f..(r0 + n) * f], &u[r0 * f..(r0 + n) * f], dg, du, h);
        gemm_st(threads, n, d, f, dx, false, dg, (f, 1), &wg[e * d * f..], (1, f));
        gemm_st(threads, n, d, f, dx, true, du, (f, 1), &wu[e * d * f..], (1, f));
    });
    // Weight tasks: dWg = Xᵀ·dG, dWu = Xᵀ·dU ([d, n] × [n, f]), dWd = Hᵀ·dY ([f, n] × [n, d]).
    let (mut dwg, mut dwu, mut dwd) = (vec![0f32; ne * d * f], vec![0f32; ne * d * f], vec![0f32; ne * f * d]);
    let starts: Vec<usize> = counts_e.iter().scan(0, |r, &n| Some(std::mem::replace(r, *r + n))).collect();
    let (dg, du, h) = (&dg, &du, &h);
    let weight_tasks = |w: &mut [f32], rows: usize, cols: usize, lhs: &[f32], lhs_w: usize, rhs: &[f32]| {
        // One task per expert (tasks run in parallel only from 8 experts per thread on, plenty to share);
        // an expert without rows keeps the zero gradient it was allocated with.
        let tasks: Vec<_> = w.chunks_mut((rows * cols).max(1)).enumerate().filter(|&(e, _)| counts_e[e] > 0).collect();
        run(tasks, parallel, |(e, w_e)| {
            let (r0, n) = (starts[e], counts_e[e]);
            // lhsᵀ [rows, n]: element (i, l) at (r0 + l)·lhs_w + i.
            gemm_st(threads, rows, cols, n, w_e, false, &lhs[r0 * lhs_w..], (1, lhs_w), &rhs[r0 * cols..], (cols, 1));
        });
    };
    weight_tasks(&mut dwg, d, f, x, d, dg);
    weight_tasks(&mut dwu, d, f, x, d, du);
    weight_tasks(&mut dwd, f, d, h, f, dy);
    (dx, dwg, dwu, dwd)
}
