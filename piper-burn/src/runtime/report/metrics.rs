//! One record per step — every rank gets the same numbers — with the expert migrations and the
//! checkpoint the step ended with, and the JSON-lines file that keeps them (`--metrics FILE.jsonl`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use piper_planner::atomic::write_atomic;
use serde::{Deserialize, Serialize};

use crate::runtime::error::{Result, RuntimeError};

/// What one step did (every rank gets the same numbers).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepMetrics {
    /// The step's number, counting from 1 (a resumed run's first step is its checkpoint's number + 1): the
    /// checkpoint saved after step N is `step-N`, and a run resumed from it continues with step N + 1.
    pub step: usize,
    /// Next-token cross-entropy, nats.
    pub loss: f64,
    /// Cross-entropy + router losses (what was differentiated).
    pub total_loss: f64,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    /// Model FLOPs (Megatron convention) per second.
    pub flops_per_s: f64,
    /// `flops_per_s` over the measured peak × ranks.
    pub mfu: f64,
    /// Max / mean tokens per expert, per MoE layer (the whole step, all ranks).
    pub expert_load: Vec<f64>,
    /// Max / mean tokens per expert-parallel rank of the expert group, per MoE layer (what expert
    /// migration minimises).
    pub rank_load_max_mean: Vec<f64>,
    pub step_time_s: f64,
    /// Pipelined runs: idle fraction of the stages over the step (1 − mean busy time / makespan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bubble: Option<f64>,
    /// Expert migrations after this step (one per rebalanced MoE layer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migration: Vec<MigrationEvent>,
    /// What the migrations of one window back saved, now that the window after them has closed
    /// ([`super::OutcomeTracker`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_outcome: Option<MigrationOutcome>,
    /// The checkpoint saved after this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<SavedCheckpoint>,
    /// Mean next-token cross-entropy (nats) of the held-out split after this step's update, when an
    /// evaluation was due (`--eval-every`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// The model's own held-out metrics at that evaluation ([`StageModel::EVAL_METRICS`](crate::model::StageModel::EVAL_METRICS)).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eval_metrics: BTreeMap<String, f64>,
    /// The run stopped after this step: a rank received this signal (SIGTERM, SIGUSR1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
}

/// One migration of one MoE layer (in every expert group of the layer's stage).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MigrationEvent {
    /// Index of the MoE layer in the model.
    pub layer: usize,
    pub swaps: usize,
    pub experts_moved: u64,
    /// Bytes one expert group moved.
    pub bytes: f64,
    /// Measured wall time of the move, mean over the layer's ranks.
    pub seconds: f64,
    /// The planner's cost model (Table IV's): the busiest rank's bytes over the link bandwidth.
    pub predicted_seconds: f64,
    /// Of the smoothed load the decision weighed (max / mean tokens per rank of the expert group).
    pub imbalance_before: f64,
    pub imbalance_after: f64,
    /// Step time the move was expected to save per step (the busiest rank's routed tokens taken off,
    /// times the platform's seconds per routed token); the window after shows what it saved
    /// ([`StepMetrics::migration_outcome`]).
    pub predicted_gain_per_step_s: f64,
}

/// The realised gain of one check's migrations (one or more MoE layers moved after the same step).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigrationOutcome {
    /// The step after which the experts moved.
    pub moved_after_step: usize,
    /// The MoE layers that moved.
    pub layers: Vec<usize>,
    /// Sum over those layers of the step time the policy expected each move to save.
    pub predicted_gain_per_step_s: f64,
    /// Median step time of the window before and of the window after the moves, and the steps in each.
    pub step_time_before_s: f64,
    pub step_time_after_s: f64,
    pub steps_before: usize,
    pub steps_after: usize,
    /// `step_time_before_s − step_time_after_s`: what the moves saved per step (negative: they cost).
    pub realised_gain_per_step_s: f64,
}

/// A checkpoint a step saved: where, how large (all shards and the manifest), how long it took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SavedCheckpoint {
    pub folder: PathBuf,
    pub bytes: u64,
    pub seconds: f64,
}

/// The `--metrics` file: one JSON line per step, flushed every step, so a run killed later still leaves
/// the lines of the steps it finished. Opened at the first step, so a run that fails before it (a bad
/// checkpoint) leaves the file as it was; a resumed run keeps the lines of the steps before its first.
pub struct MetricsFile {
    path: PathBuf,
    steps_done: usize,
    file: Option<std::io::BufWriter<std::fs::File>>,
    /// The first write error (reported when the run finishes; training goes on).
    error: Option<String>,
}

impl MetricsFile {
    /// Checks that `path` can be a file in an existing folder (the error names `--metrics`); nothing is
    /// written yet.
    pub fn new(path: PathBuf, steps_done: usize) -> Result<Self> {
        let parent = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !parent.is_dir() || path.is_dir() {
            return Err(RuntimeError::file("--metrics", &path, "not a file in an existing folder"));
        }
        Ok(MetricsFile { path, steps_done, file: None, error: None })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the step's line (opening the file at the first one).
    pub fn write(&mut self, m: &StepMetrics) {
        if self.file.is_none() && self.error.is_none() {
            match open_metrics(&self.path, self.steps_done) {
                Ok(f) => self.file = Some(f),
                Err(e) => self.error = Some(format!("{}: {e}", self.path.display())),
            }
        }
        if let Some(f) = self.file.as_mut()
            && let Err(e) =
                writeln!(f, "{}", serde_json::to_string(m).expect("metrics serialise")).and_then(|_| f.flush())
        {
            self.error.get_or_insert(e.to_string());
        }
    }

    /// Flushes the file; the first write error of the run, if any.
    pub fn finish(mut self) -> Result<()> {
        if let Some(f) = self.file.as_mut()
            && let Err(e) = f.flush()
        {
            self.error.get_or_insert(e.to_string());
        }
        self.error.map_or(Ok(()), |e| Err(RuntimeError::invalid("--metrics:", e)))
    }
}

/// Opens the metrics file for a run that continues after `steps_done` steps: from scratch, or (resuming)
/// with the lines of steps `1..=steps_done` kept — rewritten atomically, so the earlier lines survive a crash.
fn open_metrics(path: &Path, steps_done: usize) -> std::io::Result<std::io::BufWriter<std::fs::File>> {
    if steps_done > 0 && path.exists() {
        let keep: String = std::fs::read_to_string(path)?
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| (s as usize) <= steps_done)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        write_atomic(path, keep.as_bytes())?;
        return Ok(std::io::BufWriter::new(std::fs::OpenOptions::new().append(true).open(path)?));
    }
    Ok(std::io::BufWriter::new(std::fs::File::create(path)?))
}
