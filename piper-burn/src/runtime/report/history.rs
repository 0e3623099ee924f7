//! The run's line in the history of training runs (`--history`; see [`piper_planner::history`]),
//! appended by rank 0 at the end: what `piper calibrate --refine` refits the platform from.

use std::path::Path;

use piper_comm::launch::{host_cores, local_ranks};
use piper_planner::history::{HISTORY_VERSION, HistoryRecord, HistoryTarget, append};
use piper_planner::model::ModelSpec;
use piper_planner::run_plan::RunPlan;

use super::summary::RunSummary;
use crate::runtime::plan::priced_config;

/// The history line of a run of `spec` under `plan` that ended with `summary`.
pub fn history_record(spec: &ModelSpec, plan: &RunPlan, summary: &RunSummary) -> HistoryRecord {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    HistoryRecord {
        version: HISTORY_VERSION,
        unix_time_s: now,
        model: spec.clone(),
        plan: plan.clone(),
        config: priced_config(plan),
        cores: host_cores() as u64,
        node_ranks: local_ranks().unwrap_or(1) as u64,
        steps: summary.steps as u64,
        step_time_median_s: summary.step_time_median_s,
        peak_rss_bytes: summary.peak_rss_bytes.iter().copied().max().unwrap_or(0) as f64,
        steal_share: summary.steal_share,
    }
}

/// Appends the run's line to the history `flag` names (`--history`; see [`HistoryTarget::resolve`]),
/// if any. An error leaves the run's result as it is: the caller reports it as a warning.
pub fn append_history(
    flag: Option<&Path>,
    spec: &ModelSpec,
    plan: &RunPlan,
    summary: &RunSummary,
) -> piper_planner::Result<()> {
    match HistoryTarget::resolve(flag) {
        HistoryTarget::File(path) => append(&path, &history_record(spec, plan, summary)),
        HistoryTarget::Off => Ok(()),
    }
}
