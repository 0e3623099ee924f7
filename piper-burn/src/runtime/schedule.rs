//! The learning rate of each step: a schedule the author chooses ([`LrSchedule`]), by default the run
//! configuration's linear warm-up and cosine decay ([`RunConfig::learning_rate`]). Every rank evaluates
//! the same schedule at the same step; it holds no state, so a resumed run continues it.

use super::config::RunConfig;

/// The learning rate of every optimizer step (0-based). It must be finite and ≥ 0 at every step of the
/// run; the runtime refuses the step otherwise, naming it.
pub trait LrSchedule: Send + Sync {
    fn learning_rate(&self, step: usize) -> f64;
}

impl LrSchedule for RunConfig {
    fn learning_rate(&self, step: usize) -> f64 {
        RunConfig::learning_rate(self, step)
    }
}
