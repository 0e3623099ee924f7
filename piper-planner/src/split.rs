//! Choosing a pipeline's stage split: contiguous layers per stage, balancing per-micro-batch stage time
//! subject to every stage fitting in GPU memory (stage 0 holds the most in-flight activations under 1F1B,
//! the last stage the logits), by binary search on the bottleneck time with a greedy fill.

use crate::layout::StageSplit;
use crate::memory::Footprint;
use crate::time::CostModel;

/// Smallest-bottleneck split whose every stage fits in `cap_bytes`, or `None` if the greedy finds none.
pub fn balanced_split(
    cost: &CostModel,
    footprint: &Footprint,
    num_layers: u64,
    pp: u64,
    cap_bytes: f64,
) -> Option<StageSplit> {
    let times: Vec<f64> = (0..num_layers as usize).map(|i| cost.layer_total_s(i)).collect();
    let extra = cost.last_stage_extra_s();
    let total: f64 = times.iter().sum::<f64>() + extra;
    let longest = crate::limits::max_or_zero(times.iter().copied());
    // Feasibility of a bottleneck `t`: fill stages left to right as long as time and memory allow,
    // keeping at least one layer for each later stage.
    let fill = |t: f64| -> Option<StageSplit> {
        let mut split = Vec::with_capacity(pp as usize);
        let mut first = 0u64;
        for s in 0..pp {
            let n = if s == pp - 1 {
                let n = num_layers - first;
                let time = times[first as usize..].iter().sum::<f64>() + extra;
                if n == 0 || time > t || footprint.stage_total_bytes(s, first, n) > cap_bytes {
                    return None;
                }
                n
            } else {
                let max_n = num_layers - first - (pp - s - 1);
                let (mut n, mut time) = (0u64, 0.0);
                while n < max_n {
                    let next_time = time + times[(first + n) as usize];
                    if next_time > t || footprint.stage_total_bytes(s, first, n + 1) > cap_bytes {
                        break;
                    }
                    time = next_time;
                    n += 1;
                }
                if n == 0 {
                    return None;
                }
                n
            };
            split.push(n);
            first += n;
        }
        Some(StageSplit(split))
    };
    let (mut lo, mut hi) = (longest.max(extra), total);
    let mut best = fill(hi)?;
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        match fill(mid) {
            Some(split) => {
                best = split;
                hi = mid;
            }
            None => lo = mid,
        }
        if hi - lo <= 1e-6 * hi {
            break;
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::A2aAlgo;
    use crate::layout::{Layout, TrainConfig};
    use crate::model::preset;
    use crate::platform;

    #[test]
    fn balanced_split_is_no_slower_than_even_and_fits() {
        let spec = preset("deepseek-v3").unwrap(); // 3 dense layers first, MTP and logits on the last stage
        let p = platform::preset("frontier").unwrap();
        let layout = Layout { pp: 8, ep: 8, dp: 1 };
        let cfg =
            TrainConfig { num_micro_batches: 16, recompute: crate::layout::Recompute::Full, ..TrainConfig::new(4096) };
        let cost = CostModel::new(&spec, &p, &layout, &cfg, A2aAlgo::Flat).unwrap();
        let fp = Footprint::new(&spec, &p, &layout, &cfg).unwrap();
        let split = balanced_split(&cost, &fp, 61, 8, f64::INFINITY).unwrap();
        split.validate(61, 8).unwrap();
        let even = StageSplit::even(61, 8);
        assert!(cost.predict(&split).step_time_s <= cost.predict(&even).step_time_s * (1.0 + 1e-9));
        // A memory cap forces a feasible split or none: never one that overflows.
        let cap = crate::limits::max_or_zero(fp.stages(&even).iter().map(|s| s.total_bytes)) * 0.98;
        if let Some(capped) = balanced_split(&cost, &fp, 61, 8, cap) {
            assert!(fp.stages(&capped).iter().all(|s| s.total_bytes <= cap));
        }
    }
}
