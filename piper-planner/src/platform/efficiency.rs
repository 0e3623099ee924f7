//! Interpolation of measured efficiency tables: piecewise linear in `log2(m)` along a table, and linear in
//! `log2(n·k)` between the two measured shapes that bracket the query; clamped at the ends.

use super::spec::Platform;

/// Piecewise-linear interpolation of `[x, y]` points in `log2(x)`, clamped to the end values.
pub fn interpolate_log(points: &[[f64; 2]], x: f64) -> f64 {
    let first = points[0];
    let last = points[points.len() - 1];
    if x <= first[0] {
        return first[1];
    }
    if x >= last[0] {
        return last[1];
    }
    let lx = x.log2();
    for w in points.windows(2) {
        let ([x0, y0], [x1, y1]) = (w[0], w[1]);
        if x <= x1 {
            let t = (lx - x0.log2()) / (x1.log2() - x0.log2());
            return y0 + t * (y1 - y0);
        }
    }
    last[1]
}

/// The grid values either side of `x` (sorted `axis`, non-empty) and `x`'s position between them in
/// log space, clamped to the ends.
fn bracket(axis: &[u64], x: f64) -> (u64, u64, f64) {
    let (first, last) = (axis[0], axis[axis.len() - 1]);
    if x <= first as f64 {
        return (first, first, 0.0);
    }
    if x >= last as f64 {
        return (last, last, 0.0);
    }
    let i = axis.iter().position(|v| *v as f64 >= x).expect("x below the last value");
    let (lo, hi) = (axis[i - 1], axis[i]);
    (lo, hi, (x.log2() - (lo as f64).log2()) / ((hi as f64).log2() - (lo as f64).log2()))
}

impl Platform {
    /// Achieved fraction of peak for `[m × k] · [k × n]`, from the measured tables.
    pub fn gemm_efficiency(&self, m: f64, n: u64, k: u64) -> f64 {
        if m <= 0.0 {
            return 1.0; // no work: any efficiency gives zero time
        }
        let size = ((n * k) as f64).log2();
        let mut tables: Vec<(f64, f64)> =
            self.gemm_efficiency.iter().map(|t| (((t.n * t.k) as f64).log2(), interpolate_log(&t.points, m))).collect();
        tables.sort_by(|a, b| a.0.total_cmp(&b.0));
        let below = tables.iter().rev().find(|(s, _)| *s <= size);
        let above = tables.iter().find(|(s, _)| *s >= size);
        match (below, above) {
            (Some(&(s0, e0)), Some(&(s1, e1))) if s1 > s0 => e0 + (size - s0) / (s1 - s0) * (e1 - e0),
            (Some(&(_, e)), _) | (None, Some(&(_, e))) => e,
            (None, None) => unreachable!("validated platforms have at least one GEMM table"),
        }
    }

    /// Achieved fraction of peak of the routed experts (the runtime's dispatch, grouped SwiGLU GEMMs and
    /// combine, forward + backward) at `m` tokens per expert, expert width `f` and model width `d`:
    /// bilinear in `log2(f)` and `log2(d)` over the measured grid (clamped at its edges), each table
    /// interpolated in `m`. Without experts tables, the GEMM tables at `[m × d] · [d × f]`.
    pub fn experts_efficiency(&self, m: f64, f: u64, d: u64) -> f64 {
        if self.experts_efficiency.is_empty() {
            return self.gemm_efficiency(m, f, d);
        }
        if m <= 0.0 {
            return 1.0;
        }
        let axis = |key: fn(&super::spec::GemmTable) -> u64| {
            let mut v: Vec<u64> = self.experts_efficiency.iter().map(key).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (fs, ds) = (axis(|t| t.n), axis(|t| t.k));
        let at = |n: u64, k: u64| {
            self.experts_efficiency
                .iter()
                .find(|t| t.n == n && t.k == k)
                .map(|t| interpolate_log(&t.points, m))
                .unwrap_or_else(|| self.gemm_efficiency(m, n, k))
        };
        let (f0, f1, tf) = bracket(&fs, f as f64);
        let (d0, d1, td) = bracket(&ds, d as f64);
        let low = at(f0, d0) + tf * (at(f1, d0) - at(f0, d0));
        let high = at(f0, d1) + tf * (at(f1, d1) - at(f0, d1));
        low + td * (high - low)
    }

    /// Achieved fraction of peak of the attention core at sequence length `seq_len`.
    pub fn attention_efficiency(&self, seq_len: u64) -> f64 {
        interpolate_log(&self.attention_efficiency, seq_len as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::preset;

    #[test]
    fn interpolates_in_log_space_and_clamps() {
        let pts = [[64.0, 0.1], [256.0, 0.3], [1024.0, 0.5]];
        assert_eq!(interpolate_log(&pts, 1.0), 0.1);
        assert_eq!(interpolate_log(&pts, 1e9), 0.5);
        assert!((interpolate_log(&pts, 128.0) - 0.2).abs() < 1e-12); // halfway in log2
        assert!((interpolate_log(&pts, 256.0) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn gemm_efficiency_grows_with_tokens_and_stays_in_range() {
        for name in ["frontier", "nvlink-8", "local"] {
            let p = preset(name).unwrap();
            let mut prev = 0.0;
            for m in [1.0, 16.0, 256.0, 4096.0, 65536.0] {
                let e = p.gemm_efficiency(m, 2048, 7168);
                assert!(e > 0.0 && e <= 1.0 && e >= prev, "{name} m={m}: {e}");
                prev = e;
            }
        }
    }

    #[test]
    fn between_shapes_is_between_their_values() {
        let p = preset("frontier").unwrap();
        let small = &p.gemm_efficiency[0];
        let large = &p.gemm_efficiency[p.gemm_efficiency.len() - 1];
        let (es, el) = (p.gemm_efficiency(1024.0, small.n, small.k), p.gemm_efficiency(1024.0, large.n, large.k));
        let mid = p.gemm_efficiency(1024.0, 4096, 4096);
        assert!(mid >= es.min(el) && mid <= es.max(el));
    }
}
