//! What the history of training runs says about a calibrated platform: how much slower (or faster)
//! and larger its runs really were than it predicted. `piper calibrate --refine` fits it from the
//! history file every run appends to ([`crate::history`]); the planner multiplies every predicted
//! step time and peak memory by it. A calibration measures the machine in minutes; the history is
//! hours of real runs — the host's speed as it is now, and memory the short calibration runs do not
//! reach (allocator pools that grow over a long run).

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::limits;

/// Measured ÷ predicted of the recent runs, as `piper calibrate --refine` fitted them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refinement {
    /// Multiplies every predicted time of a step (compute, exchanges, reductions, optimizer).
    pub time_scale: f64,
    /// Multiplies every predicted peak memory (the parts and the framework overhead).
    pub memory_scale: f64,
    /// Runs of the history it was fitted on.
    pub runs: u64,
}

impl Refinement {
    /// No correction.
    pub const NONE: Refinement = Refinement { time_scale: 1.0, memory_scale: 1.0, runs: 0 };

    pub fn validate(&self, src: &str) -> Result<()> {
        limits::number(src, "refinement.time_scale", self.time_scale, 0.05, 20.0)?;
        limits::number(src, "refinement.memory_scale", self.memory_scale, 0.1, 10.0)?;
        limits::count(src, "refinement.runs", self.runs, 1, u64::MAX)?;
        Ok(())
    }
}
