//! Expert migration (Piper §VI-A), the pure algorithm: from tokens per expert and the expert → rank
//! placement of one expert group, hill-climbing swaps that rebalance the ranks' token loads.
//!
//! Each iteration takes the most-loaded rank k⁺ and the least-loaded rank k⁻, finds the single swap of an
//! expert on k⁺ with an expert on k⁻ that most lowers the larger of the two new loads, applies it if that
//! is below k⁺'s load, and stops otherwise or after `max_iterations`. Swaps keep every rank's expert count,
//! so memory stays as planned; the model's function is unchanged (experts move with their weights).
//! Only experts whose final rank differs from their first move, each once, with weights, gradients and
//! optimizer states.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::limits;
use crate::model::ModelSpec;
use crate::model::counts::mlp_params;

/// One applied swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Swap {
    /// Expert that left the most-loaded rank.
    pub expert_out: u64,
    pub from_rank: u64,
    /// Expert that left the least-loaded rank.
    pub expert_in: u64,
    pub to_rank: u64,
}

/// Result of a rebalancing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Migration {
    pub swaps: Vec<Swap>,
    pub placement_after: Vec<u64>,
    pub rank_loads_before: Vec<f64>,
    pub rank_loads_after: Vec<f64>,
    /// Max / mean tokens per rank.
    pub imbalance_before: f64,
    pub imbalance_after: f64,
    /// Experts whose rank changed.
    pub experts_moved: u64,
    pub bytes_moved: f64,
    /// Slowest rank's send or receive volume over the link bandwidth.
    pub time_s: f64,
}

/// Tokens per rank for a placement.
pub fn rank_loads(loads: &[f64], placement: &[u64], ranks: u64) -> Vec<f64> {
    let mut out = vec![0.0; ranks as usize];
    for (e, r) in placement.iter().enumerate() {
        out[*r as usize] += loads[e];
    }
    out
}

/// Max / mean of rank loads (1 = balanced; 1 for an idle group).
pub fn imbalance(rank_loads: &[f64]) -> f64 {
    let mean = rank_loads.iter().sum::<f64>() / rank_loads.len() as f64;
    if mean <= 0.0 { 1.0 } else { rank_loads.iter().copied().max_by(f64::total_cmp).unwrap_or(0.0) / mean }
}

/// Checks the inputs of [`hill_climb`]; errors name the field.
pub fn validate(loads: &[f64], placement: &[u64], ranks: u64) -> Result<()> {
    let src = "migration input";
    if loads.is_empty() || loads.len() != placement.len() {
        return Err(Error::invalid(
            src,
            "placement",
            format!("needs one rank per expert: {} loads, {} placements", loads.len(), placement.len()),
        ));
    }
    limits::count(src, "loads (experts)", loads.len() as u64, 1, limits::MAX_EXPERTS)?;
    if let Some(l) = loads.iter().find(|l| !(l.is_finite() && **l >= 0.0 && **l <= 1e18)) {
        return Err(Error::invalid(src, "loads", format!("has {l}; loads must be finite token counts in [0, 1e18]")));
    }
    // Every rank of an expert group holds at least one expert.
    limits::count(src, "ranks", ranks, 1, loads.len() as u64)?;
    if let Some(r) = placement.iter().find(|r| **r >= ranks) {
        return Err(Error::invalid(src, "placement", format!("rank {r} is outside the expert group of {ranks} ranks")));
    }
    Ok(())
}

/// The paper's hill-climbing swap. Returns the swaps and the final placement.
pub fn hill_climb(loads: &[f64], placement: &[u64], ranks: u64, max_iterations: u64) -> (Vec<Swap>, Vec<u64>) {
    let mut place = placement.to_vec();
    let mut swaps = Vec::new();
    for _ in 0..max_iterations {
        let rl = rank_loads(loads, &place, ranks);
        let hi = (0..ranks as usize).max_by(|a, b| rl[*a].total_cmp(&rl[*b]).then(b.cmp(a))).expect("ranks ≥ 1");
        let lo = (0..ranks as usize).min_by(|a, b| rl[*a].total_cmp(&rl[*b]).then(a.cmp(b))).expect("ranks ≥ 1");
        if hi == lo {
            break;
        }
        let mut best: Option<(f64, usize, usize)> = None;
        for a in (0..place.len()).filter(|e| place[*e] as usize == hi) {
            for b in (0..place.len()).filter(|e| place[*e] as usize == lo) {
                let delta = loads[a] - loads[b];
                let pair_max = (rl[hi] - delta).max(rl[lo] + delta);
                if best.is_none_or(|(m, _, _)| pair_max < m) {
                    best = Some((pair_max, a, b));
                }
            }
        }
        match best {
            Some((pair_max, a, b)) if pair_max < rl[hi] => {
                place[a] = lo as u64;
                place[b] = hi as u64;
                swaps.push(Swap {
                    expert_out: a as u64,
                    from_rank: hi as u64,
                    expert_in: b as u64,
                    to_rank: lo as u64,
                });
            }
            _ => break,
        }
    }
    (swaps, place)
}

/// Bytes to move one routed expert of `spec`: parameters × (weight + grad + optimizer) bytes.
pub fn expert_bytes(spec: &ModelSpec, bytes_per_param: f64) -> Result<f64> {
    let moe = spec.moe.as_ref().ok_or_else(|| {
        Error::invalid(format!("model `{}`", spec.name), "num_experts", "is a dense model: nothing to migrate")
    })?;
    limits::number("migration", "--bytes-per-param", bytes_per_param, 0.0, limits::MAX_BYTES_PER_PARAM)?;
    Ok(mlp_params(spec.hidden_size, &moe.expert) as f64 * bytes_per_param)
}

/// Rebalances and prices the move at `link_gbs` GB/s per rank.
pub fn rebalance(
    loads: &[f64],
    placement: &[u64],
    ranks: u64,
    max_iterations: u64,
    bytes_per_expert: f64,
    link_gbs: f64,
) -> Result<Migration> {
    validate(loads, placement, ranks)?;
    limits::positive("migration input", "--link-gbps", link_gbs, 1e6)?;
    limits::number("migration input", "--expert-bytes", bytes_per_expert, 0.0, 1e15)?;
    let (swaps, after) = hill_climb(loads, placement, ranks, max_iterations);
    let before_loads = rank_loads(loads, placement, ranks);
    let after_loads = rank_loads(loads, &after, ranks);
    let mut sent = vec![0.0; ranks as usize];
    let mut received = vec![0.0; ranks as usize];
    let mut moved = 0;
    for (from, to) in placement.iter().zip(&after) {
        if from != to {
            moved += 1;
            sent[*from as usize] += bytes_per_expert;
            received[*to as usize] += bytes_per_expert;
        }
    }
    let busiest = sent.iter().chain(&received).copied().max_by(f64::total_cmp).unwrap_or(0.0);
    Ok(Migration {
        swaps,
        placement_after: after,
        imbalance_before: imbalance(&before_loads),
        imbalance_after: imbalance(&after_loads),
        rank_loads_before: before_loads,
        rank_loads_after: after_loads,
        experts_moved: moved,
        bytes_moved: moved as f64 * bytes_per_expert,
        time_s: busiest / (link_gbs * 1e9),
    })
}

/// Bytes of an expert of `matrices` `d × f` matrices at `bytes_per_param` (Piper's convention: 3 × 16 B,
/// "48·d·f", whatever the model's MLP).
pub fn expert_bytes_with(d: u64, f: u64, matrices: u64, bytes_per_param: f64) -> f64 {
    matrices as f64 * d as f64 * f as f64 * bytes_per_param
}

/// Bytes of one routed expert priced as `matrices` `d × f` matrices (Piper's Table IV prices every expert
/// as 3, "48·d·f" at 16 B, whatever the model's MLP), or as the model's own MLP for `None`.
pub fn expert_bytes_as(spec: &ModelSpec, matrices: Option<u64>, bytes_per_param: f64) -> Result<f64> {
    let own = expert_bytes(spec, bytes_per_param)?;
    let Some(m) = matrices else { return Ok(own) };
    limits::count("migration", "--expert-matrices", m, 1, 16)?;
    let moe = spec.moe.as_ref().expect("expert_bytes checked it is an MoE model");
    Ok(expert_bytes_with(spec.hidden_size, moe.expert.intermediate_size, m, bytes_per_param))
}

/// Piper's worst case (Table IV): every expert of one layer changes rank, `E · expert bytes / G` per GPU.
pub fn worst_case_bytes_per_gpu(spec: &ModelSpec, group_size: u64, bytes_per_param: f64) -> Result<f64> {
    worst_case_bytes_per_gpu_with(spec.num_experts(), expert_bytes(spec, bytes_per_param)?, group_size)
}

/// `experts · expert_bytes / group_size`, the group size checked.
pub fn worst_case_bytes_per_gpu_with(experts: u64, expert_bytes: f64, group_size: u64) -> Result<f64> {
    limits::count("migration", "--group-size", group_size, 1, limits::MAX_GPUS)?;
    Ok(experts as f64 * expert_bytes / group_size as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn swaps_the_hot_expert_away() {
        // 4 experts on 2 ranks: rank 0 holds the two hot ones.
        let loads = [100.0, 90.0, 10.0, 0.0];
        let (swaps, after) = hill_climb(&loads, &[0, 0, 1, 1], 2, 10);
        assert_eq!(swaps.len(), 1);
        assert_eq!(rank_loads(&loads, &after, 2), vec![100.0, 100.0]);
        // Swapping 0↔2 or 1↔3 both give 100/100; ties go to the lowest expert ids.
        assert_eq!(swaps[0], Swap { expert_out: 0, from_rank: 0, expert_in: 2, to_rank: 1 });
    }

    #[test]
    fn balanced_groups_are_left_alone() {
        let m = rebalance(&[5.0; 8], &[0, 0, 1, 1, 2, 2, 3, 3], 4, 16, 1e6, 50.0).unwrap();
        assert!(m.swaps.is_empty());
        assert_eq!((m.imbalance_before, m.imbalance_after, m.bytes_moved, m.time_s), (1.0, 1.0, 0.0, 0.0));
    }

    #[test]
    fn bad_input_names_the_field() {
        let err = rebalance(&[1.0, 2.0], &[0], 2, 4, 1.0, 50.0).unwrap_err().to_string();
        assert!(err.contains("`placement` needs one rank per expert"), "{err}");
        let err = rebalance(&[1.0, 2.0], &[0, 5], 2, 4, 1.0, 50.0).unwrap_err().to_string();
        assert!(err.contains("rank 5 is outside"), "{err}");
    }

    proptest! {
        #[test]
        fn never_worse_and_keeps_expert_counts(loads in proptest::collection::vec(0u32..10_000, 16), iters in 0u64..20) {
            let loads: Vec<f64> = loads.into_iter().map(f64::from).collect();
            let placement: Vec<u64> = (0..16).map(|e| e / 4).collect();
            let m = rebalance(&loads, &placement, 4, iters, 1.0, 1.0).unwrap();
            prop_assert!(m.imbalance_after <= m.imbalance_before + 1e-12);
            prop_assert!(m.swaps.len() as u64 <= iters);
            for r in 0..4 {
                prop_assert_eq!(m.placement_after.iter().filter(|p| **p == r).count(), 4);
            }
            // Replaying the swaps: each takes an expert off a most-loaded rank onto a least-loaded one,
            // both of the pair's new loads are strictly below the old maximum, and the maximum never rises.
            let mut place = placement.clone();
            for s in &m.swaps {
                let before = rank_loads(&loads, &place, 4);
                let max = before.iter().copied().max_by(f64::total_cmp).unwrap();
                let min = before.iter().copied().min_by(f64::total_cmp).unwrap();
                prop_assert_eq!(before[s.from_rank as usize], max);
                prop_assert_eq!(before[s.to_rank as usize], min);
                prop_assert_eq!((place[s.expert_out as usize], place[s.expert_in as usize]), (s.from_rank, s.to_rank));
                place[s.expert_out as usize] = s.to_rank;
                place[s.expert_in as usize] = s.from_rank;
                let after = rank_loads(&loads, &place, 4);
                prop_assert!(after[s.from_rank as usize] < max && after[s.to_rank as usize] < max, "{:?} → {:?}", before, after);
                prop_assert!(after.iter().all(|l| *l <= max));
            }
            prop_assert_eq!(&place, &m.placement_after);
            let total: f64 = loads.iter().sum();
            prop_assert!((m.rank_loads_after.iter().sum::<f64>() - total).abs() < 1e-9);
            prop_assert!(m.experts_moved <= 2 * m.swaps.len() as u64);
        }
    }
}
