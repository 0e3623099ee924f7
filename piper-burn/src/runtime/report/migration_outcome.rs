//! What a migration saved: the median step time of the window after a check's moves against the window
//! before them, beside the step time the policy predicted they would save. Migrations happen between
//! steps, at the end of a window, so neither window includes a move's own time.
//!
//! Windows are the policy's (`check_every_steps` steps). The window before a move is the last full one
//! the run saw (shorter right after the start or a resume); the one after is the next `check_every_steps`
//! steps. A run that ends first reports no outcome for its last move.

use std::collections::VecDeque;

use piper_planner::stats::median;

use super::metrics::{MigrationOutcome, StepMetrics};

/// The moves waiting for their window after to close.
struct Awaiting {
    moved_after_step: usize,
    layers: Vec<usize>,
    predicted_gain_per_step_s: f64,
    before_s: Vec<f64>,
    after_s: Vec<f64>,
}

/// Follows the steps' times and migrations, and closes each check's outcome one window later.
pub struct OutcomeTracker {
    window: usize,
    recent_s: VecDeque<f64>,
    awaiting: Option<Awaiting>,
}

impl OutcomeTracker {
    /// A tracker for a policy that checks every `window` steps (at least 1).
    pub fn new(window: usize) -> Self {
        OutcomeTracker { window: window.max(1), recent_s: VecDeque::new(), awaiting: None }
    }

    /// Takes in one step's metrics (its time, and the migrations after it); returns the outcome of
    /// the moves whose window after this step closes.
    pub fn observe(&mut self, m: &StepMetrics) -> Option<MigrationOutcome> {
        let closed = self.observe_time(m.step_time_s);
        if !m.migration.is_empty() {
            self.awaiting = Some(Awaiting {
                moved_after_step: m.step,
                layers: m.migration.iter().map(|e| e.layer).collect(),
                predicted_gain_per_step_s: m.migration.iter().map(|e| e.predicted_gain_per_step_s).sum(),
                before_s: self.recent_s.iter().copied().collect(),
                after_s: Vec::new(),
            });
            self.recent_s.clear();
        }
        closed
    }

    fn observe_time(&mut self, seconds: f64) -> Option<MigrationOutcome> {
        self.recent_s.push_back(seconds);
        if self.recent_s.len() > self.window {
            self.recent_s.pop_front();
        }
        let awaiting = self.awaiting.as_mut()?;
        awaiting.after_s.push(seconds);
        if awaiting.after_s.len() < self.window {
            return None;
        }
        let a = self.awaiting.take()?;
        let (before, after) = (median(&a.before_s)?, median(&a.after_s)?);
        Some(MigrationOutcome {
            moved_after_step: a.moved_after_step,
            layers: a.layers,
            predicted_gain_per_step_s: a.predicted_gain_per_step_s,
            step_time_before_s: before,
            step_time_after_s: after,
            steps_before: a.before_s.len(),
            steps_after: a.after_s.len(),
            realised_gain_per_step_s: before - after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::report::MigrationEvent;

    fn step(step: usize, seconds: f64, moved_layers: &[usize]) -> StepMetrics {
        let json = serde_json::json!({
            "step": step, "loss": 1.0, "total_loss": 1.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1.0,
            "flops_per_s": 1.0, "mfu": 0.1, "expert_load": [1.0], "rank_load_max_mean": [1.0],
            "step_time_s": seconds,
        });
        let mut m: StepMetrics = serde_json::from_value(json).unwrap();
        m.migration = moved_layers
            .iter()
            .map(|&layer| MigrationEvent {
                layer,
                swaps: 1,
                experts_moved: 2,
                bytes: 1.0,
                seconds: 1e-3,
                predicted_seconds: 1e-3,
                imbalance_before: 2.0,
                imbalance_after: 1.0,
                predicted_gain_per_step_s: 0.01 * (layer + 1) as f64,
            })
            .collect();
        m
    }

    #[test]
    fn an_outcome_compares_the_window_before_the_moves_with_the_window_after() {
        let mut t = OutcomeTracker::new(3);
        // Steps 1–5 at 10 s (only the last 3 count as the window before), moves after step 5,
        // steps 6–8 at 4, 6 and 5 s: median 5, so 5 s saved per step.
        let times = [10.0, 10.0, 9.0, 11.0, 10.0, 4.0, 6.0, 5.0, 5.0];
        let mut outcomes = Vec::new();
        for (i, &s) in times.iter().enumerate() {
            let layers: &[usize] = if i + 1 == 5 { &[0, 1] } else { &[] };
            outcomes.extend(t.observe(&step(i + 1, s, layers)));
        }
        assert_eq!(outcomes.len(), 1, "one check's moves, one outcome");
        let o = &outcomes[0];
        assert_eq!((o.moved_after_step, o.layers.clone()), (5, vec![0, 1]));
        assert_eq!((o.steps_before, o.steps_after), (3, 3));
        assert_eq!((o.step_time_before_s, o.step_time_after_s), (10.0, 5.0));
        assert_eq!(o.realised_gain_per_step_s, 5.0);
        assert!((o.predicted_gain_per_step_s - 0.03).abs() < 1e-12, "the layers' predictions add up");
    }

    #[test]
    fn a_move_that_slows_the_steps_shows_a_negative_gain_and_a_run_that_ends_early_shows_none() {
        let mut t = OutcomeTracker::new(2);
        let mut outcomes = Vec::new();
        for (i, s) in [1.0, 1.0, 3.0, 3.0, 2.0].into_iter().enumerate() {
            let layers: &[usize] = if i + 1 == 2 || i + 1 == 4 { &[0] } else { &[] };
            outcomes.extend(t.observe(&step(i + 1, s, layers)));
        }
        // Moves after steps 2 and 4: the first window after (3, 3) closes at step 4; the second
        // window after has one step when the run ends.
        assert_eq!(outcomes.len(), 1);
        assert_eq!((outcomes[0].step_time_before_s, outcomes[0].step_time_after_s), (1.0, 3.0));
        assert_eq!(outcomes[0].realised_gain_per_step_s, -2.0);
    }
}
