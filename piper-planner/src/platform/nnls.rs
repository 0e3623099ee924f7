//! Non-negative least squares for the few units a calibration fits: `y ≈ Σ aⱼ·xⱼ` with every `aⱼ ≥ 0`,
//! each row weighted. With at most a handful of units the exact answer is the best of the unconstrained
//! fits on every subset of units whose coefficients all come out non-negative.

/// One measured row: the units of work, the measured value, and the row's weight (`1 / y` fits relative
/// errors, so a small run counts as much as a large one).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub units: Vec<f64>,
    pub y: f64,
    pub weight: f64,
}

/// The coefficients (one per unit, ≥ 0) minimising `Σ (weight · (y − Σ aⱼ·xⱼ))²`; `None` when no row
/// has any work or the rows are not finite.
pub fn nnls(rows: &[Row]) -> Option<Vec<f64>> {
    let n = rows.first()?.units.len();
    let finite = rows.iter().all(|r| {
        r.units.len() == n && r.units.iter().all(|x| x.is_finite()) && r.y.is_finite() && r.weight.is_finite()
    });
    if !finite || n == 0 || n > 8 || rows.iter().all(|r| r.units.iter().all(|x| *x == 0.0)) {
        return None;
    }
    let sse = |a: &[f64]| -> f64 {
        rows.iter().map(|r| (r.weight * (r.y - r.units.iter().zip(a).map(|(x, c)| x * c).sum::<f64>())).powi(2)).sum()
    };
    let mut best: Option<(f64, Vec<f64>)> = Some((sse(&vec![0.0; n]), vec![0.0; n]));
    for mask in 1u32..(1 << n) {
        let picked: Vec<usize> = (0..n).filter(|j| mask & (1 << j) != 0).collect();
        let Some(sub) = solve_subset(rows, &picked) else { continue };
        if sub.iter().any(|c| !(c.is_finite() && *c >= 0.0)) {
            continue;
        }
        let mut a = vec![0.0; n];
        for (j, c) in picked.iter().zip(sub) {
            a[*j] = c;
        }
        let e = sse(&a);
        if best.as_ref().is_none_or(|(b, _)| e < *b) {
            best = Some((e, a));
        }
    }
    best.map(|(_, a)| a)
}

/// The unconstrained weighted fit on every unit; `None` when they are collinear over the rows or a row is
/// not finite.
pub fn least_squares(rows: &[Row]) -> Option<Vec<f64>> {
    let n = rows.first()?.units.len();
    let finite = rows.iter().all(|r| {
        r.units.len() == n && r.units.iter().all(|x| x.is_finite()) && r.y.is_finite() && r.weight.is_finite()
    });
    if !finite || n == 0 {
        return None;
    }
    solve_subset(rows, &(0..n).collect::<Vec<_>>())
}

/// The unconstrained weighted fit on the units `picked` (normal equations, Gaussian elimination with
/// partial pivoting); `None` when they are collinear over the rows.
fn solve_subset(rows: &[Row], picked: &[usize]) -> Option<Vec<f64>> {
    let k = picked.len();
    let mut m = vec![vec![0.0; k + 1]; k];
    for r in rows {
        let w2 = r.weight * r.weight;
        for (i, &a) in picked.iter().enumerate() {
            for (j, &b) in picked.iter().enumerate() {
                m[i][j] += w2 * r.units[a] * r.units[b];
            }
            m[i][k] += w2 * r.units[a] * r.y;
        }
    }
    let scale = crate::limits::max_or_zero((0..k).map(|i| m[i][i].abs()));
    for col in 0..k {
        let pivot = (col..k).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() <= 1e-12 * scale {
            return None;
        }
        m.swap(col, pivot);
        for row in 0..k {
            if row != col {
                let f = m[row][col] / m[col][col];
                let pivot_row = m[col].clone();
                for (x, p) in m[row].iter_mut().zip(&pivot_row).skip(col).take(k + 1 - col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| m[i][k] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(truth: &[f64], units: &[Vec<f64>]) -> Vec<Row> {
        units
            .iter()
            .map(|x| {
                let y: f64 = x.iter().zip(truth).map(|(a, b)| a * b).sum();
                Row { units: x.clone(), y, weight: 1.0 / y }
            })
            .collect()
    }

    #[test]
    fn exact_rows_give_back_their_coefficients() {
        let units = vec![vec![1.0, 2.0, 1.0], vec![3.0, 1.0, 1.0], vec![2.0, 5.0, 1.0], vec![7.0, 1.0, 2.0]];
        let a = nnls(&rows(&[0.5, 2.0, 3.0], &units)).unwrap();
        for (got, want) in a.iter().zip([0.5, 2.0, 3.0]) {
            assert!((got - want).abs() < 1e-9, "{a:?}");
        }
    }

    /// Where the unconstrained answer has a negative coefficient, the constrained one sets it to 0 and
    /// refits the rest: compare with a brute-force grid.
    #[test]
    fn a_negative_coefficient_is_clipped_to_zero_and_the_rest_refitted() {
        let r: Vec<Row> = [(1.0, 1.0, 3.0), (2.0, 1.0, 4.0), (3.0, 1.0, 5.5), (4.0, 1.0, 5.0)]
            .iter()
            .map(|&(x, z, y)| Row { units: vec![x, -z], y, weight: 1.0 })
            .collect();
        let a = nnls(&r).unwrap();
        assert_eq!(a[1], 0.0, "{a:?}");
        let sse = |c: f64| r.iter().map(|r| (r.y - c * r.units[0]).powi(2)).sum::<f64>();
        let grid = (0..=100_000).map(|i| i as f64 * 1e-4).min_by(|a, b| sse(*a).total_cmp(&sse(*b))).unwrap();
        assert!((a[0] - grid).abs() < 2e-4, "{a:?} vs {grid}");
    }

    #[test]
    fn no_work_or_non_finite_rows_give_none() {
        assert_eq!(nnls(&[Row { units: vec![0.0, 0.0], y: 1.0, weight: 1.0 }]), None);
        assert_eq!(nnls(&[Row { units: vec![1.0], y: f64::NAN, weight: 1.0 }]), None);
        assert_eq!(nnls(&[Row { units: vec![f64::NAN, 1.0], y: 1.0, weight: 1.0 }]), None);
        assert_eq!(nnls(&[]), None);
    }
}
