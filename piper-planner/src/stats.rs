//! Order statistics of measurements, shared by the calibration, the planner's checks and the runtime's
//! reports: one median, which refuses what it cannot order.

/// The median of `values` (the mean of the middle two for an even count); `None` for no values or for
/// any NaN among them — `f64::total_cmp` would sort a NaN to an end and give a median that hides it.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[mid] } else { 0.5 * (v[mid - 1] + v[mid]) })
}

/// [`median`] for a figure that reports rather than decides: NaN where there is none, so that it reads
/// as missing (and a platform or summary field that must be a number refuses it) instead of as 0.
pub fn median_or_nan(values: &[f64]) -> f64 {
    median(values).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::{median, median_or_nan};

    #[test]
    fn the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[-1.0]), Some(-1.0));
        assert_eq!(median(&[f64::INFINITY, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn no_values_or_a_nan_have_no_median() {
        assert_eq!(median(&[]), None);
        // Sorted by total order the NaN would sit at the end and the median would read 2.0.
        assert_eq!(median(&[1.0, 2.0, f64::NAN]), None);
        assert_eq!(median(&[1.0, -f64::NAN, 2.0]), None);
        assert!(median_or_nan(&[]).is_nan() && median_or_nan(&[2.0, f64::NAN, 1.0]).is_nan());
        assert_eq!(median_or_nan(&[2.0, 1.0]), 1.5);
    }
}
