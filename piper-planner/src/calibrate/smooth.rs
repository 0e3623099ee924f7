//! The routed experts' efficiency grid, smoothed. Each point of the grid (tokens per expert × expert width
//! × hidden width) is the median of a few timed repetitions on a shared machine, and two calibrations of
//! the same machine disagree point by point by 17% (one thread) to 28% (two threads, AMD EPYC Zen 4,
//! 2 vCPUs) while the runtime's own routed-experts op runs at nearly the same speed over those shapes.
//! Pricing a model between grid points then inherits the noise of the nearest points, and the step-cost
//! fit, made on a few calibration shapes, carries it to every other shape. A low-order surface through
//! the whole grid — the logarithm of the efficiency as a quadratic in the logarithms of the three sizes,
//! cubic in tokens per expert — keeps the shape dependence the grid measures and averages the noise of
//! its 80 points (the same two calibrations then disagree by 11% and 10%).

use crate::platform::GemmTable;
use crate::platform::nnls::{Row, least_squares};

/// Distinct values each axis needs (a quadratic through fewer points is not a fit).
const MIN_AXIS_VALUES: usize = 3;

/// `tables` (one per expert width `n` and hidden width `k`, efficiency over tokens per expert) with every
/// point replaced by the fitted surface's value; unchanged where the grid is too small to fit (fewer than
/// three values on an axis, or fewer than twice as many points as terms) or a value is not positive.
pub fn smooth_experts(tables: &[GemmTable]) -> Vec<GemmTable> {
    let points: Vec<[f64; 4]> =
        tables.iter().flat_map(|t| t.points.iter().map(move |p| [p[0], t.n as f64, t.k as f64, p[1]])).collect();
    let distinct = |i: usize| {
        let mut v: Vec<u64> = points.iter().map(|p| p[i].to_bits()).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let positive = points.iter().all(|p| p.iter().all(|x| x.is_finite() && *x > 0.0));
    if !positive || (0..3).any(|i| distinct(i) < MIN_AXIS_VALUES) || points.len() < 2 * TERMS {
        return tables.to_vec();
    }
    let centre: [f64; 3] = std::array::from_fn(|i| points.iter().map(|p| p[i].ln()).sum::<f64>() / points.len() as f64);
    let terms = |p: &[f64; 4]| terms([p[0].ln() - centre[0], p[1].ln() - centre[1], p[2].ln() - centre[2]]);
    let rows: Vec<Row> = points.iter().map(|p| Row { units: terms(p).to_vec(), y: p[3].ln(), weight: 1.0 }).collect();
    let Some(c) = least_squares(&rows) else { return tables.to_vec() };
    let fitted = |m: f64, t: &GemmTable| {
        let u = terms(&[m, t.n as f64, t.k as f64, 0.0]);
        u.iter().zip(&c).map(|(a, b)| a * b).sum::<f64>().exp().clamp(1e-6, 1.0)
    };
    tables
        .iter()
        .map(|t| GemmTable { points: t.points.iter().map(|p| [p[0], fitted(p[0], t)]).collect(), ..t.clone() })
        .collect()
}

const TERMS: usize = 11;

/// The surface's terms at centred logarithms `x` (tokens per expert), `y` (expert width), `z` (hidden
/// width).
fn terms([x, y, z]: [f64; 3]) -> [f64; TERMS] {
    [1.0, x, y, z, x * x, y * y, z * z, x * y, x * z, y * z, x * x * x]
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENS: [f64; 4] = [16.0, 64.0, 256.0, 1024.0];

    /// A grid over the calibration's shapes from `eff(m, f, d)`.
    fn grid(mut eff: impl FnMut(f64, f64, f64) -> f64) -> Vec<GemmTable> {
        [64u64, 128, 256, 512, 1024]
            .iter()
            .flat_map(|&f| [64u64, 128, 256, 512].map(|d| (f, d)))
            .map(|(n, k)| GemmTable { n, k, points: TOKENS.map(|m| [m, eff(m, n as f64, k as f64)]).to_vec() })
            .collect()
    }

    fn smooth_truth(m: f64, f: f64, d: f64) -> f64 {
        let (x, y, z) = (m.ln(), f.ln(), d.ln());
        (-4.0 + 0.9 * x - 0.06 * x * x + 0.05 * y - 0.01 * (y - 5.0).powi(2) + 0.03 * z).exp()
    }

    /// A surface of the fitted family comes back exactly.
    #[test]
    fn a_surface_of_the_family_is_kept() {
        let truth = grid(smooth_truth);
        for (got, want) in smooth_experts(&truth).iter().zip(&truth) {
            for (g, w) in got.points.iter().zip(&want.points) {
                assert_eq!(g[0], w[0]);
                assert!((g[1] / w[1] - 1.0).abs() < 1e-9, "{g:?} vs {w:?}");
            }
        }
    }

    /// Noise of ±15% on every point (a fixed pseudo-random pattern): the smoothed grid is closer to the
    /// truth than the measured one, by more than half.
    #[test]
    fn noise_is_averaged_out() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut noise = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            1.0 + 0.15 * ((state % 2001) as f64 / 1000.0 - 1.0)
        };
        let measured = grid(|m, f, d| smooth_truth(m, f, d) * noise());
        let truth = grid(smooth_truth);
        let rms = |tables: &[GemmTable]| {
            let e: Vec<f64> = tables
                .iter()
                .zip(&truth)
                .flat_map(|(a, b)| a.points.iter().zip(&b.points).map(|(p, q)| (p[1] / q[1]).ln().powi(2)))
                .collect();
            (e.iter().sum::<f64>() / e.len() as f64).sqrt()
        };
        let (before, after) = (rms(&measured), rms(&smooth_experts(&measured)));
        assert!(before > 0.05 && after < 0.5 * before, "rms log error {before} measured, {after} smoothed");
    }

    /// Too few shapes to fit a surface, or a point that is not positive: the grid stands as measured.
    #[test]
    fn a_small_or_bad_grid_is_left_as_measured() {
        let small: Vec<GemmTable> = grid(smooth_truth).into_iter().filter(|t| t.n <= 128).collect();
        let noisy: Vec<GemmTable> = small
            .iter()
            .map(|t| GemmTable { points: t.points.iter().map(|p| [p[0], p[1] * 1.1]).collect(), ..t.clone() })
            .collect();
        assert_eq!(smooth_experts(&noisy), noisy);
        let mut bad = grid(smooth_truth);
        bad[3].points[2][1] = 0.0;
        assert_eq!(smooth_experts(&bad), bad);
    }
}
