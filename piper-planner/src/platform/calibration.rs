//! Calibrating a platform's runtime costs: the per-element costs measured on every rank (averaged) and
//! the memory fitted by least squares over whole runs (`scripts/calibrate.sh` drives it).

use serde::{Deserialize, Serialize};

use super::runtime::RuntimeCosts;
use super::spec::{GIB, Platform};
use crate::error::{Error, Result};

/// One whole run for the memory fit: what the planner's model counts (at 16 configured bytes per
/// parameter and factors 1) and the peak resident memory measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPoint {
    /// Parameters the rank holds.
    pub params: f64,
    /// The model's activation bytes of the decoder layers at the peak.
    pub activation_bytes: f64,
    /// The model's bytes of the logits and cross-entropy.
    pub logits_bytes: f64,
    pub peak_rss_bytes: f64,
}

/// The fitted memory of a runtime.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryFit {
    pub base_bytes: f64,
    pub bytes_per_param: f64,
    pub activation_factor: f64,
    pub logits_factor: f64,
}

/// Least squares of `peak_rss = base + bytes_per_param · params + activation_factor · activations +
/// logits_factor · logits` over the runs. Needs four runs that vary the three counts independently;
/// every coefficient must come out ≥ 0.
pub fn fit_memory(points: &[MemoryPoint]) -> Result<MemoryFit> {
    const N: usize = 4;
    let src = "memory calibration";
    if points.len() < N {
        return Err(Error::invalid(src, "runs", format!("needs at least {N} runs, got {}", points.len())));
    }
    // Normal equations AᵀA x = Aᵀy, in GiB for conditioning.
    let g = GIB;
    let mut m = [[0.0f64; N + 1]; N];
    for p in points {
        let row = [1.0, p.params / g, p.activation_bytes / g, p.logits_bytes / g];
        for i in 0..N {
            for j in 0..N {
                m[i][j] += row[i] * row[j];
            }
            m[i][N] += row[i] * p.peak_rss_bytes / g;
        }
    }
    let scale = crate::limits::max_or_zero((0..N).map(|i| m[i][i].abs()));
    for col in 0..N {
        let pivot = (col..N).max_by(|a, b| m[*a][col].abs().total_cmp(&m[*b][col].abs())).expect("rows");
        m.swap(col, pivot);
        let tiny = m[col][col].abs() <= 1e-12 * scale || m[col][col].is_nan();
        if tiny {
            return Err(Error::invalid(
                src,
                "runs",
                "do not vary parameters, activations and logits independently; add runs that change one of them",
            ));
        }
        for r in 0..N {
            if r != col {
                let f = m[r][col] / m[col][col];
                let pivot_row = m[col];
                for (x, p) in m[r].iter_mut().zip(pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let x: Vec<f64> = (0..N).map(|i| m[i][N] / m[i][i]).collect();
    let fit = MemoryFit { base_bytes: x[0] * g, bytes_per_param: x[1], activation_factor: x[2], logits_factor: x[3] };
    if x.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(Error::invalid(
            src,
            "runs",
            format!("fit a negative or non-finite coefficient ({fit:?}); measure larger runs"),
        ));
    }
    Ok(fit)
}

/// `platform` with the runtime's measured costs (the mean over ranks of `costs`) and the memory fitted
/// from `runs`: the fitted base becomes the framework overhead. Errors name what is missing or off.
pub fn with_runtime(mut platform: Platform, costs: &[RuntimeCosts], runs: &[MemoryPoint]) -> Result<Platform> {
    let n = costs.len() as f64;
    if costs.is_empty() {
        return Err(Error::invalid("runtime calibration", "costs", "needs at least one rank's measurement"));
    }
    let mean = |f: fn(&RuntimeCosts) -> f64| costs.iter().map(f).sum::<f64>() / n;
    let fit = fit_memory(runs)?;
    let rc = RuntimeCosts {
        op_overhead_us: mean(|c| c.op_overhead_us),
        norm_ns: mean(|c| c.norm_ns),
        rope_ns: mean(|c| c.rope_ns),
        softmax_ns: mean(|c| c.softmax_ns),
        swiglu_ns: mean(|c| c.swiglu_ns),
        elementwise_ns: mean(|c| c.elementwise_ns),
        optimizer_ns_per_param: mean(|c| c.optimizer_ns_per_param),
        bytes_per_param: fit.bytes_per_param,
        activation_factor: fit.activation_factor,
        logits_factor: fit.logits_factor,
    };
    platform.framework_overhead_gib = fit.base_bytes / GIB;
    platform.runtime = Some(rc);
    platform.validate()?;
    Ok(platform)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_known_coefficients() {
        let truth = |p: f64, a: f64, l: f64| 5e7 + 28.0 * p + 0.7 * a + 3.2 * l;
        let runs = [(1e6, 1e7, 2e7), (1e6, 4e7, 2e7), (5e6, 1e7, 2e7), (3e6, 2.5e7, 6e7), (2e6, 3e7, 1e7)];
        let points: Vec<MemoryPoint> = runs
            .iter()
            .map(|(p, a, l)| MemoryPoint {
                params: *p,
                activation_bytes: *a,
                logits_bytes: *l,
                peak_rss_bytes: truth(*p, *a, *l),
            })
            .collect();
        let f = fit_memory(&points).unwrap();
        let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-9;
        assert!(close(f.base_bytes, 5e7) && close(f.bytes_per_param, 28.0), "{f:?}");
        assert!(close(f.activation_factor, 0.7) && close(f.logits_factor, 3.2), "{f:?}");
        let same = vec![points[0]; 4];
        assert!(fit_memory(&same).unwrap_err().to_string().contains("independently"));
        assert!(fit_memory(&points[..3]).is_err());
    }
}
