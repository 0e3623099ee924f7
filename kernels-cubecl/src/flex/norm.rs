//! RMS normalisation on Flex: one pass over the rows forward (the row's sum of squares, then the scaled
//! row) and one backward (each row's `⟨g, x⟩`, then `dx`; `dgamma` summed per task and then over tasks),
//! instead of Burn's five element-wise tensor ops forward and about ten backward.
//!
//! Legend: r = rows, d = width.

use rayon::prelude::*;

use super::simd::{self, multiversion};

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 32;

/// `(y_rd, rstd_r)`.
pub(super) fn forward(x: &[f32], gamma: &[f32], eps: f64, d: usize) -> (Vec<f32>, Vec<f32>) {
    let r = x.len() / d.max(1);
    let (mut y, mut rstd) = (vec![0f32; r * d], vec![0f32; r]);
    y.par_chunks_mut((ROWS_PER_TASK * d).max(1)).zip(rstd.par_chunks_mut(ROWS_PER_TASK)).enumerate().for_each(
        |(task, (y, rstd))| {
            let first = task * ROWS_PER_TASK * d;
            forward_chunk(&x[first..first + y.len()], gamma, eps as f32, y, rstd);
        },
    );
    (y, rstd)
}

multiversion! {
    fn forward_chunk(x: &[f32], gamma: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]) {
        let d = gamma.len();
        for ((x, y), rstd) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(rstd.iter_mut()) {
            // As Burn: the mean of squares plus eps, its square root, then its reciprocal.
            *rstd = 1.0 / (simd::dot(x, x) / d as f32 + eps).sqrt();
            for ((y, &x), &g) in y.iter_mut().zip(x).zip(gamma) {
                *y = x * *rstd * g;
            }
        }
    }
}

/// `(dx_rd, dgamma_d)` from `dy_rd`.
pub(super) fn backward(dy: &[f32], x: &[f32], gamma: &[f32], rstd: &[f32], d: usize) -> (Vec<f32>, Vec<f32>) {
    let mut dx = vec![0f32; x.len()];
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut((ROWS_PER_TASK * d).max(1))
        .enumerate()
        .map(|(task, dx)| {
            let (first, rows) = (task * ROWS_PER_TASK, dx.len() / d.max(1));
            let span = first * d..(first + rows) * d;
            let mut dgamma = vec![0f32; d];
            backward_chunk(&dy[span.clone()], &x[span], gamma, &rstd[first..first + rows], dx, &mut dgamma);
            dgamma
        })
        .collect();
    let mut dgamma = vec![0f32; d];
    for p in &partials {
        for (a, b) in dgamma.iter_mut().zip(p) {
            *a += b;
        }
    }
    (dx, dgamma)
}

multiversion! {
    fn backward_chunk(dy: &[f32], x: &[f32], gamma: &[f32], rstd: &[f32], dx: &mut [f32], dgamma: &mut [f32]) {
        let d = gamma.len();
        for (((dy, x), dx), &r) in dy.chunks_exact(d).zip(x.chunks_exact(d)).zip(dx.chunks_exact_mut(d)).zip(rstd) {
            // ⟨g, x⟩ with g = dy · gamma, written into dx first.
            for ((g, &dy), &gm) in dx.iter_mut().zip(dy).zip(gamma) {
                *g = dy * gm;
            }
            let c = r * r * r * simd::dot(dx, x) / d as f32;
            for ((dx, &x), (dg, &dy)) in dx.iter_mut().zip(x).zip(dgamma.iter_mut().zip(dy)) {
                *dx = r * *dx - c * x;
                *dg += dy * x * r;
            }
        }
    }
}
