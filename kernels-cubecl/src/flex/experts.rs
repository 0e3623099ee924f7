//! Host kernels of the experts on Flex: the fused SwiGLU passes (the GEMMs are [`super::gemm`]'s).
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
        let one = |g: f32, u: f32, grad: f32| {
            let s = sigmoid(g);
            let silu = g * s;
            (grad * u * s * (1.0 + g * (1.0 - s)), grad * silu, silu * u)
        };
        // Two loops, so that neither branches per element (and both vectorise).
        if h.len() >= n {
            let h = &mut h[..n];
            for i in 0..n {
                (dh[i], du[i], h[i]) = one(g[i], u[i], dh[i]);
            }
        } else {
            for i in 0..n {
                (dh[i], du[i], _) = one(g[i], u[i], dh[i]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flex::simd::{TIERS, Tier, with_widest};

    /// SwiGLU forward and backward give the same bits in every version the CPU has (AVX-512, AVX2 +
    /// FMA, baseline): the AVX2 one runs on most laptops but would never run on an AVX-512 test machine.
    #[test]
    fn swiglu_is_the_same_in_every_version() {
        let n = 1000;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
        let u: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let run = |tier: Tier| {
            let mut h = vec![0f32; n];
            let (mut dh, mut du, mut h2) = (vec![0.5f32; n], vec![0f32; n], vec![0f32; n]);
            let ((), taken) = with_widest(tier, || {
                swiglu_chunk(&g, &u, &mut h);
                swiglu_backward_chunk(&g, &u, &mut dh, &mut du, &mut h2);
            });
            assert!(taken.is_some_and(|t| t <= tier), "{tier:?}: took {taken:?}");
            [h, dh, du, h2].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        let baseline = run(Tier::Baseline);
        for tier in TIERS {
            assert_eq!(run(tier), baseline, "{tier:?} differs from the baseline");
        }
        // And the baseline is the definition: h = g·σ(g)·u with the crate's exp.
        let want = g[7] * (1.0 / (1.0 + crate::flex::simd::exp(-g[7]))) * u[7];
        assert_eq!(f32::from_bits(baseline[0][7]), want);
    }
}
