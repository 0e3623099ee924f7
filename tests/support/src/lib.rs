//! Helpers for the workspace's tests (a dev-dependency only): comparisons that can fail — NaN or
//! infinity on either side is a failure (never "smaller than the tolerance"), and so is a length
//! mismatch — and the folder of the fixtures the crates share.

pub mod hf_folder;

use std::path::PathBuf;

/// `tests/fixtures/` at the workspace root: the transformers fixtures (models, configs, the scripts that
/// made them), shared by every crate's tests.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("fixtures")
}

/// Largest relative difference `|got − want| / max(|want|, floor)` over two equally long series;
/// `Err` naming the index on a length mismatch or a non-finite value.
pub fn max_relative_difference(got: &[f64], want: &[f64], floor: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("lengths differ: {} values against {}", got.len(), want.len()));
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        if !a.is_finite() || !b.is_finite() {
            return Err(format!("value {i} is not finite: {a} against {b}"));
        }
        let d = (a - b).abs() / b.abs().max(floor);
        if d > worst {
            worst = d;
        }
    }
    Ok(worst)
}

/// Panics unless `got` and `want` have the same length, are finite, and agree to `rel_tol` relative.
/// Returns the largest relative difference (tests print it).
pub fn assert_close(what: &str, got: &[f64], want: &[f64], rel_tol: f64) -> f64 {
    match max_relative_difference(got, want, 1e-12) {
        Ok(worst) if worst <= rel_tol => worst,
        Ok(worst) => panic!("{what}: worst relative difference {worst:e} > {rel_tol:e}\n got {got:?}\nwant {want:?}"),
        Err(e) => panic!("{what}: {e}\n got {got:?}\nwant {want:?}"),
    }
}

/// As [`assert_close`], with each difference relative to the largest `|want|` (for tensors whose
/// elements pass near zero, where a per-element relative difference measures only round-off).
pub fn assert_close_scaled(what: &str, got: &[f64], want: &[f64], rel_tol: f64) -> f64 {
    let scale =
        want.iter().map(|x| x.abs()).fold(f64::MIN_POSITIVE, |a, b| if b.is_nan() { f64::NAN } else { a.max(b) });
    match max_relative_difference(got, want, scale) {
        Ok(worst) if worst <= rel_tol => worst,
        Ok(worst) => panic!("{what}: worst difference {worst:e} of max |want| {scale:e} > {rel_tol:e}"),
        Err(e) => panic!("{what}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_infinity_and_length_mismatches_fail() {
        assert!(max_relative_difference(&[1.0, f64::NAN], &[1.0, 1.0], 1e-12).is_err());
        assert!(max_relative_difference(&[1.0], &[f64::INFINITY], 1e-12).is_err());
        assert!(max_relative_difference(&[1.0], &[1.0, 2.0], 1e-12).is_err());
        assert_eq!(max_relative_difference(&[1.0, 2.2], &[1.0, 2.0], 1e-12).unwrap(), 0.10000000000000009);
        assert!(std::panic::catch_unwind(|| assert_close("x", &[f64::NAN], &[f64::NAN], 1.0)).is_err());
    }
}
