//! From the workers' files to the inputs of the platform fit: the cost tables per thread count (the mean
//! of the copies measured at once), the profiled runs (each summary's profile rows), the memory points
//! (a one-rank run's peak against what the model counts) and step times, each summary read once.

use std::path::Path;

use serde_json::Value;

use super::error::{CalibrateError, Result};
use super::runs::ProfileRun;
use crate::layout::{Layout, Recompute, Schedule, StageSplit, TrainConfig, runtime_train_config};
use crate::memory::Footprint;
use crate::model::ModelSpec;
use crate::platform::{MemoryPoint, Platform, ProfiledRun, ThreadCosts, mean_of};

/// A JSON file a worker wrote.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| CalibrateError::file(path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| CalibrateError::file(path, format!("not what a worker writes: {e}")))
}

/// One set of costs per thread count: the mean of the copies measured at once.
pub fn mean_per_thread_count(mut all: Vec<ThreadCosts>) -> Result<Vec<ThreadCosts>> {
    all.sort_by_key(|c| c.threads);
    all.chunk_by(|a, b| a.threads == b.threads)
        .map(|group| {
            mean_of(group).ok_or_else(|| CalibrateError::Worker {
                what: format!("the {}-thread cost measurements", group[0].threads),
                why: "the copies measured other shapes; rebuild the workers and calibrate again".into(),
            })
        })
        .collect()
}

/// What the calibration and validation read of a trainer's `--summary` file, read once.
pub struct RunSummary {
    pub path: std::path::PathBuf,
    /// The median step time, seconds.
    pub step_s: f64,
    /// The largest rank's peak RSS.
    pub peak_rss_bytes: f64,
    /// Seconds per step of each profile row (`phase`, `op`); `None` without `--profile`.
    profile: Option<Vec<(String, String, f64)>>,
}

impl RunSummary {
    pub fn read(path: &Path) -> Result<Self> {
        let doc: Value = read_json(path)?;
        let step_s = doc["step_time_median_s"]
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| CalibrateError::file(path, "has no positive `step_time_median_s`"))?;
        let peak_rss_bytes = doc["peak_rss_bytes"]
            .as_array()
            .and_then(|v| v.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
            .filter(|v| v.iter().all(|b| b.is_finite() && *b > 0.0))
            .and_then(|v| v.into_iter().reduce(f64::max))
            .ok_or_else(|| CalibrateError::file(path, "has no positive `peak_rss_bytes`"))?;
        let profile = match doc["profile"].as_array() {
            None => None,
            Some(rows) => Some(rows.iter().map(|r| profile_row(path, r)).collect::<Result<_>>()?),
        };
        Ok(RunSummary { path: path.to_path_buf(), step_s, peak_rss_bytes, profile })
    }

    /// The profile rows; an error when the trainer ran without `--profile`.
    pub fn profile(&self) -> Result<&[(String, String, f64)]> {
        self.profile.as_deref().ok_or_else(|| {
            CalibrateError::file(&self.path, "has no `profile` rows (the trainer ran without --profile)")
        })
    }

    /// Seconds per step of the profile rows that `pick(phase, op)` selects.
    pub fn profile_seconds(&self, pick: impl Fn(&str, &str) -> bool) -> Result<f64> {
        Ok(self.profile()?.iter().filter(|(phase, op, _)| pick(phase, op)).map(|r| r.2).sum())
    }

    /// A rank's forward and backward seconds per step.
    pub fn compute_seconds(&self) -> Result<f64> {
        self.profile_seconds(|phase, _| phase == "forward" || phase == "backward")
    }

    /// A rank's gradient reduction seconds per step: the `gradients` phase but the norm's square sums.
    pub fn allreduce_seconds(&self) -> Result<f64> {
        self.profile_seconds(|phase, op| phase == "gradients" && op != "square sum")
    }
}

fn profile_row(path: &Path, r: &Value) -> Result<(String, String, f64)> {
    let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
    let seconds = r["seconds"].as_f64().filter(|s| s.is_finite() && *s >= 0.0);
    seconds
        .map(|s| (text("phase"), text("op"), s))
        .ok_or_else(|| CalibrateError::file(path, "a profile row has no finite `seconds`"))
}

/// A profiled run of `ranks` ranks (an expert group of `ranks` when more than one) of `threads` threads
/// each: the seconds per step of each profile row, and the settings one rank trained.
pub fn profiled_run(
    summary: &RunSummary,
    spec: ModelSpec,
    run: &ProfileRun,
    threads: u64,
    ranks: u64,
) -> Result<ProfiledRun> {
    let rows = summary.profile()?.to_vec();
    // The step's sequences are shared out over the expert group's ranks.
    let cfg = TrainConfig { micro_batch_size: run.batch / ranks, dtype: "fp32".into(), ..TrainConfig::new(run.seq) };
    Ok(ProfiledRun { threads, ep: ranks, spec, cfg, rows, baseline_s: None })
}

/// A run's largest peak RSS against what the model counts for that rank on `base` (as the runtime
/// trains: [`runtime_train_config`]; factors 1): parameters, and one micro-batch's layer
/// activations and logits, with the micro-batches it holds. `ep`: the ranks of its expert group (1:
/// a one-rank run), which share out the run's sequences and its experts.
pub fn memory_point(
    summary: &RunSummary,
    spec: &ModelSpec,
    base: &Platform,
    run: &ProfileRun,
    ep: u64,
) -> Result<MemoryPoint> {
    let sequences = run.batch / run.micro_batches / ep;
    let cfg = runtime_train_config(run.seq, sequences, 1, Schedule::OneFOneB, Recompute::None);
    let layout = Layout { pp: 1, ep, dp: 1 };
    let stage = Footprint::new(spec, base, &layout, &cfg)?.stages(&StageSplit::even(spec.num_layers, 1)).remove(0);
    let logits = stage.activations.logits;
    Ok(MemoryPoint {
        params: stage.params,
        activation_bytes: stage.activation_bytes - logits,
        logits_bytes: logits,
        in_flight: run.micro_batches as f64,
        peak_rss_bytes: summary.peak_rss_bytes,
    })
}
