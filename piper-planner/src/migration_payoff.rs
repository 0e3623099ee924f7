//! When an expert migration pays: the decision [`crate::migration::rebalance`] leaves to its caller,
//! made on evidence that persists rather than on one window's counts.
//!
//! Per MoE layer the tokens each expert receives are smoothed over the check windows (an exponential
//! moving average of tokens per step, so one noisy window moves it by `smoothing` of the way). A layer
//! is rebalanced only when
//! 1. the rank imbalance (max / mean tokens per rank of the expert group) has exceeded the threshold at
//!    `persist_windows` consecutive checks, both the window's own and the smoothed load's (one skewed
//!    window among balanced ones never moves), and
//! 2. the step time the move (hill climbing on the smoothed load) saves over the horizon — the slowest rank's routed tokens per step before
//!    minus after, times the seconds one routed token costs it (forward and backward through one
//!    expert) — exceeds what the move costs (the busiest rank's bytes over the link, plus a fixed cost).
//!
//! Each verdict says why, so a run can log what it decided and what it expected to gain.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;
use crate::migration::{Migration, imbalance, rank_loads, rebalance};

/// The policy's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct PayoffSettings {
    /// Max / mean tokens per rank of the expert group above which a layer is out of balance.
    pub threshold: f64,
    /// Consecutive checks the imbalance must hold.
    pub persist_windows: u32,
    /// Weight of the newest window in the smoothed load, in (0, 1].
    pub smoothing: f64,
    /// Seconds one routed token costs the rank that holds its expert (forward and backward).
    pub seconds_per_token: f64,
    /// Steps a move is expected to keep paying for (at most the steps left in the run).
    pub horizon_steps: f64,
    /// Seconds a move costs beyond its transfer (the pause, the placement update).
    pub fixed_cost_s: f64,
}

impl PayoffSettings {
    /// Checks every field; errors name the field and its range.
    pub fn validate(&self) -> Result<()> {
        let src = "migration policy";
        limits::number(src, "threshold", self.threshold, 1.0, 1e6)?;
        limits::count(src, "persist_windows", self.persist_windows as u64, 1, 1000)?;
        if !(self.smoothing.is_finite() && self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(Error::invalid(src, "smoothing", format!("is {}; it must be in (0, 1]", self.smoothing)));
        }
        limits::number(src, "seconds_per_token", self.seconds_per_token, 0.0, 1e3)?;
        limits::number(src, "horizon_steps", self.horizon_steps, 0.0, 1e12)?;
        limits::number(src, "fixed_cost_s", self.fixed_cost_s, 0.0, 1e6)?;
        Ok(())
    }
}

/// What the policy knows of one layer: its smoothed tokens per expert per step, the last window's, and
/// for how many consecutive checks both have been out of balance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerEvidence {
    pub tokens_per_step: Vec<f64>,
    pub last_window: Vec<f64>,
    pub windows_over: u32,
}

/// Why a layer moves or stays.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The smoothed load is within the threshold.
    Balanced { imbalance: f64 },
    /// Out of balance, but not yet for `persist_windows` checks.
    NotYetPersistent { imbalance: f64, windows: u32 },
    /// The move would cost more than it saves over the horizon.
    DoesNotPay { imbalance: f64, gain_s: f64, cost_s: f64 },
    /// Move: the planner's swaps, the step time saved per step and the move's cost.
    Move { migration: Migration, gain_per_step_s: f64, cost_s: f64 },
}

impl LayerEvidence {
    /// Adds a window of `steps` steps whose tokens per expert were `window` (summed over the steps).
    pub fn observe(&mut self, window: &[f64], steps: usize, smoothing: f64) {
        self.last_window = window.iter().map(|t| t / steps.max(1) as f64).collect();
        if self.tokens_per_step.len() != window.len() {
            self.tokens_per_step = self.last_window.clone();
            return;
        }
        for (s, w) in self.tokens_per_step.iter_mut().zip(&self.last_window) {
            *s += smoothing * (w - *s);
        }
    }

    /// The verdict for the layer's expert group (`placement`: expert → rank of `ranks`), with
    /// `steps_left` steps to run. Counts a check towards persistence; a move resets it.
    #[allow(clippy::too_many_arguments)]
    pub fn weigh(
        &mut self,
        placement: &[u64],
        ranks: u64,
        s: &PayoffSettings,
        max_swaps: u64,
        bytes_per_expert: f64,
        link_gbs: f64,
        steps_left: f64,
    ) -> Result<Verdict> {
        let loads = &self.tokens_per_step;
        let imb = imbalance(&rank_loads(loads, placement, ranks));
        let window_imb = imbalance(&rank_loads(&self.last_window, placement, ranks));
        if imb <= s.threshold || window_imb <= s.threshold {
            self.windows_over = 0;
            return Ok(Verdict::Balanced { imbalance: imb });
        }
        self.windows_over += 1;
        if self.windows_over < s.persist_windows {
            return Ok(Verdict::NotYetPersistent { imbalance: imb, windows: self.windows_over });
        }
        let m = rebalance(loads, placement, ranks, max_swaps, bytes_per_expert, link_gbs)?;
        let busiest = |l: &[f64]| limits::max_or_zero(l.iter().copied());
        let gain_per_step_s = (busiest(&m.rank_loads_before) - busiest(&m.rank_loads_after)) * s.seconds_per_token;
        let gain_s = gain_per_step_s * s.horizon_steps.min(steps_left.max(0.0));
        let cost_s = m.time_s + s.fixed_cost_s;
        // A gain that is not a number never pays.
        if m.experts_moved == 0 || gain_s.partial_cmp(&cost_s) != Some(std::cmp::Ordering::Greater) {
            return Ok(Verdict::DoesNotPay { imbalance: imb, gain_s, cost_s });
        }
        self.windows_over = 0;
        Ok(Verdict::Move { migration: m, gain_per_step_s, cost_s })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PayoffSettings {
        PayoffSettings {
            threshold: 1.1,
            persist_windows: 2,
            smoothing: 0.5,
            seconds_per_token: 1e-5,
            horizon_steps: 100.0,
            fixed_cost_s: 1e-3,
        }
    }

    /// Four experts on two ranks, experts 0 and 1 (rank 0) hot.
    const PLACEMENT: [u64; 4] = [0, 0, 1, 1];
    const SKEWED: [f64; 4] = [400.0, 400.0, 100.0, 100.0];

    fn weigh(e: &mut LayerEvidence, s: &PayoffSettings) -> Verdict {
        e.weigh(&PLACEMENT, 2, s, 4, 1e6, 10.0, 1e6).unwrap()
    }

    /// A skew that holds moves after `persist_windows` checks, with the gain the closed form gives:
    /// rank 0 carries 800 tokens per step before and 500 after (one hot expert swapped for a cold
    /// one), so 300 tokens × 1e-5 s per step.
    #[test]
    fn a_persistent_skew_moves_once_it_holds() {
        let s = settings();
        let mut e = LayerEvidence::default();
        e.observe(&SKEWED.map(|t| t * 10.0), 10, s.smoothing);
        assert!(matches!(weigh(&mut e, &s), Verdict::NotYetPersistent { windows: 1, .. }));
        e.observe(&SKEWED.map(|t| t * 10.0), 10, s.smoothing);
        match weigh(&mut e, &s) {
            Verdict::Move { migration, gain_per_step_s, cost_s } => {
                assert_eq!(migration.experts_moved, 2);
                assert!((gain_per_step_s - 300.0 * 1e-5).abs() < 1e-12, "{gain_per_step_s}");
                // Each rank sends and receives one expert: 1 MB over 10 GB/s, plus the fixed cost.
                assert!((cost_s - (1e-4 + 1e-3)).abs() < 1e-12, "{cost_s}");
            }
            v => panic!("expected a move, got {v:?}"),
        }
        assert_eq!(e.windows_over, 0, "a move starts the count again");
    }

    /// One noisy window out of balance among balanced ones never moves: the smoothed load barely
    /// leaves the threshold, and not for two checks in a row.
    #[test]
    fn a_noisy_window_does_not_move() {
        let s = settings();
        let mut e = LayerEvidence::default();
        let balanced = [250.0; 4].map(|t| t * 10.0);
        for window in [balanced, SKEWED.map(|t| t * 10.0), balanced, balanced] {
            e.observe(&window, 10, s.smoothing);
            let v = weigh(&mut e, &s);
            assert!(!matches!(v, Verdict::Move { .. }), "{v:?}");
        }
    }

    /// A move whose gain over the steps left is below its cost is refused, naming both.
    #[test]
    fn a_move_that_costs_more_than_it_saves_is_refused() {
        let s = PayoffSettings { fixed_cost_s: 1.0, ..settings() };
        let skewed =
            || LayerEvidence { tokens_per_step: SKEWED.to_vec(), last_window: SKEWED.to_vec(), windows_over: 1 };
        let mut e = skewed();
        match weigh(&mut e, &s) {
            Verdict::DoesNotPay { gain_s, cost_s, .. } => {
                assert!((gain_s - 300.0 * 1e-5 * 100.0).abs() < 1e-9 && cost_s > 1.0, "{gain_s} {cost_s}");
            }
            v => panic!("expected no move, got {v:?}"),
        }
        // Near the end of the run the horizon shrinks to the steps left.
        let mut e = skewed();
        let v = e.weigh(&PLACEMENT, 2, &settings(), 4, 1e6, 10.0, 0.2).unwrap();
        assert!(matches!(v, Verdict::DoesNotPay { .. }), "{v:?}");
    }

    #[test]
    fn smoothing_moves_a_fraction_of_the_way() {
        let mut e = LayerEvidence::default();
        e.observe(&[100.0, 0.0], 10, 0.25);
        assert_eq!(e.tokens_per_step, vec![10.0, 0.0]);
        e.observe(&[0.0, 100.0], 10, 0.25);
        assert_eq!(e.tokens_per_step, vec![7.5, 2.5]);
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = PayoffSettings { smoothing: 0.0, ..settings() };
        assert!(bad.validate().unwrap_err().to_string().contains("smoothing"));
        let bad = PayoffSettings { seconds_per_token: f64::NAN, ..settings() };
        assert!(bad.validate().unwrap_err().to_string().contains("seconds_per_token"));
        settings().validate().unwrap();
    }
}
