//! From the workers' files to the inputs of the platform fit: the cost tables per thread count (the mean
//! of the copies measured at once), the profiled runs (each summary's profile rows), the memory points
//! (a one-rank run's peak against what the model counts) and step times.

use std::path::Path;

use serde_json::Value;

use super::error::{CalibrateError, Result};
use super::runs::ProfileRun;
use crate::layout::{Layout, Recompute, Schedule, StageSplit, TrainConfig};
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

/// A profiled run of `ranks` ranks (an expert group of `ranks` when more than one) of `threads` threads
/// each, from its summary: the seconds per step of each profile row, and the settings one rank trained.
pub fn profiled_run(
    summary: &Path,
    spec: ModelSpec,
    run: &ProfileRun,
    threads: u64,
    ranks: u64,
) -> Result<ProfiledRun> {
    let doc: Value = read_json(summary)?;
    let rows = doc["profile"]
        .as_array()
        .ok_or_else(|| CalibrateError::file(summary, "has no `profile` rows (the trainer ran without --profile)"))?
        .iter()
        .map(|r| {
            let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            let seconds = r["seconds"].as_f64().filter(|s| s.is_finite() && *s >= 0.0);
            seconds
                .map(|s| (text("phase"), text("op"), s))
                .ok_or_else(|| CalibrateError::file(summary, "a profile row has no finite `seconds`"))
        })
        .collect::<Result<_>>()?;
    // The step's sequences are shared out over the expert group's ranks.
    let cfg = TrainConfig { micro_batch_size: run.batch / ranks, dtype: "fp32".into(), ..TrainConfig::new(run.seq) };
    Ok(ProfiledRun { threads, ep: ranks, spec, cfg, rows })
}

/// A one-rank run's largest peak RSS against what the model counts for it on `base` (16 configured
/// bytes per parameter in fp32, factors 1): parameters, layer activations and logits.
pub fn memory_point(summary: &Path, spec: &ModelSpec, base: &Platform, run: &ProfileRun) -> Result<MemoryPoint> {
    let doc: Value = read_json(summary)?;
    let peak = doc["peak_rss_bytes"]
        .as_array()
        .and_then(|v| v.iter().filter_map(Value::as_f64).reduce(f64::max))
        .ok_or_else(|| CalibrateError::file(summary, "has no `peak_rss_bytes`"))?;
    let cfg = TrainConfig {
        micro_batch_size: run.batch,
        num_micro_batches: 1,
        schedule: Schedule::OneFOneB,
        recompute: Recompute::None,
        dtype: "fp32".into(),
        weight_bytes: 4.0,
        grad_bytes: 4.0,
        optimizer_bytes: 8.0,
        flash_attention: false,
        ..TrainConfig::new(run.seq)
    };
    let layout = Layout { pp: 1, ep: 1, dp: 1 };
    let stage = Footprint::new(spec, base, &layout, &cfg)?.stages(&StageSplit::even(spec.num_layers, 1)).remove(0);
    let logits = stage.activations.logits;
    Ok(MemoryPoint {
        params: stage.params,
        activation_bytes: stage.activation_bytes - logits,
        logits_bytes: logits,
        peak_rss_bytes: peak,
    })
}

/// The median step time a run's summary reports, seconds.
pub fn step_time(summary: &Path) -> Result<f64> {
    let doc: Value = read_json(summary)?;
    doc["step_time_median_s"]
        .as_f64()
        .filter(|t| t.is_finite() && *t > 0.0)
        .ok_or_else(|| CalibrateError::file(summary, "has no positive `step_time_median_s`"))
}

/// Seconds per step of the profile rows of a run's summary that `pick(phase, op)` selects.
pub fn profile_seconds(summary: &Path, pick: impl Fn(&str, &str) -> bool) -> Result<f64> {
    let doc: Value = read_json(summary)?;
    let rows = doc["profile"]
        .as_array()
        .ok_or_else(|| CalibrateError::file(summary, "has no `profile` rows (the trainer ran without --profile)"))?;
    let mut total = 0.0;
    for r in rows {
        let (phase, op) = (r["phase"].as_str().unwrap_or_default(), r["op"].as_str().unwrap_or_default());
        if pick(phase, op) {
            total += r["seconds"]
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| CalibrateError::file(summary, "a profile row has no finite `seconds`"))?;
        }
    }
    Ok(total)
}

/// A rank's forward and backward seconds per step.
pub fn compute_seconds(summary: &Path) -> Result<f64> {
    profile_seconds(summary, |phase, _| phase == "forward" || phase == "backward")
}

/// A rank's gradient all-reduce seconds per step: the `gradients` phase but the norm's square sums.
pub fn allreduce_seconds(summary: &Path) -> Result<f64> {
    profile_seconds(summary, |phase, op| phase == "gradients" && op != "square sum")
}
