//! Host kernels of the experts on Flex: single-threaded strided GEMMs through the `gemm` crate (the
//! tasks of [`super::grouped_tasks`] are the parallel units) and the fused SwiGLU passes.
//!
//! Legend: p = rows (sorted by expert), f = expert width.

use rayon::prelude::*;

use super::simd::{self, multiversion};

/// Rows per parallel chunk of the element-wise passes.
const ROWS_PER_TASK: usize = 64;

/// `(expert, first row, rows)` of each expert that has rows.
pub(super) fn experts(counts_e: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    counts_e
        .iter()
        .enumerate()
        .scan(0usize, |r0, (e, &n)| {
            let start = *r0;
            *r0 += n;
            Some((e, start, n))
        })
        .filter(|&(_, _, n)| n > 0)
}

/// `dst[m, n] (+)= lhs[m, k] · rhs[k, n]` on the calling thread (the tasks calling it are the parallel
/// units), `dst` row-major; `lhs`/`rhs` given with their `(row stride, column stride)` so that a
/// transpose is just swapped strides.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_st(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: &[f32],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[f32],
    (rhs_rs, rhs_cs): (usize, usize),
) {
    assert!(dst.len() >= m * n, "gemm: destination too small");
    assert!(m == 0 || k == 0 || lhs.len() > (m - 1) * lhs_rs + (k - 1) * lhs_cs, "gemm: lhs out of bounds");
    assert!(k == 0 || n == 0 || rhs.len() > (k - 1) * rhs_rs + (n - 1) * rhs_cs, "gemm: rhs out of bounds");
    // SAFETY: the bounds of every element the strides reach were checked above; `dst` is exclusively
    // borrowed and does not alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[inline(always)]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + simd::exp(-g))
}

multiversion! {
    pub(super) fn swiglu_chunk(g: &[f32], u: &[f32], h: &mut [f32]) {
        for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
            *h = g * sigmoid(g) * u;
        }
    }
}

/// `h = silu(g) ⊙ u`, in parallel chunks of rows of width `f`.
pub(super) fn swiglu_rows(g: &[f32], u: &[f32], h: &mut [f32], f: usize) {
    let chunk = (ROWS_PER_TASK * f).max(1);
    h.par_chunks_mut(chunk).zip(g.par_chunks(chunk)).zip(u.par_chunks(chunk)).for_each(|((h, g), u)| {
        swiglu_chunk(g, u, h);
    });
}

multiversion! {
    /// One chunk of [`swiglu_backward_rows`]; `h` is either empty or as long as `g`.
    pub(super) fn swiglu_backward_chunk(g: &[f32], u: &[f32], dh: &mut [f32], du: &mut [f32], h: &mut [f32]) {
        let n = g.len().min(u.len()).min(dh.len()).min(du.len());
        let (g, u, dh, du) = (&g[..n], &u[..n], &mut dh[..n], &mut du[..n]);
        let with_h = h.len() >= n;
        for i in 0..n {
            let s = sigmoid(g[i]);
            let silu = g[i] * s;
            let grad = dh[i];
            dh[i] = grad * u[i] * s * (1.0 + g[i] * (1.0 - s));
            du[i] = grad * silu;
            if with_h {
                h[i] = silu * u[i];
            }
        }
    }
}

/// From `dh` (overwritten with `dg`): `dg = dh ⊙ u ⊙ silu'(g)`, `du = dh ⊙ silu(g)` and, when asked,
/// `h = silu(g) ⊙ u`, with `silu'(g) = σ(g) · (1 + g · (1 − σ(g)))`.
pub(super) fn swiglu_backward_rows(
    g: &[f32],
    u: &[f32],
    dh: &mut [f32],
    du: &mut [f32],
    h: Option<&mut [f32]>,
    f: usize,
) {
    let chunk = (ROWS_PER_TASK * f).max(1);
    match h {
        Some(h) => dh
            .par_chunks_mut(chunk)
            .zip(du.par_chunks_mut(chunk))
            .zip(h.par_chunks_mut(chunk))
            .zip(g.par_chunks(chunk).zip(u.par_chunks(chunk)))
            .for_each(|(((dh, du), h), (g, u))| swiglu_backward_chunk(g, u, dh, du, h)),
        None => dh
            .par_chunks_mut(chunk)
            .zip(du.par_chunks_mut(chunk))
            .zip(g.par_chunks(chunk).zip(u.par_chunks(chunk)))
            .for_each(|((dh, du), (g, u))| swiglu_backward_chunk(g, u, dh, du, &mut [])),
    }
}
