//! The run's opening description, its summary (`--summary FILE.json`, rank 0, written atomically) and
//! the plan-versus-measured lines it ends with.

use std::collections::BTreeMap;
use std::path::Path;

use piper_planner::atomic::write_atomic;
use piper_planner::calibrate::steal::STEAL_WARN;
use piper_planner::run_plan::{Predicted, RunPlan};
use serde::{Deserialize, Serialize};

use super::metrics::{MigrationOutcome, StepMetrics};
use crate::runtime::error::{Result, RuntimeError};

/// `{"pp", "ep", "dp"}` of the summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SummaryLayout {
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
}

/// The run summary (`--summary FILE.json`), rank 0.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSummary {
    pub layout: SummaryLayout,
    pub micro_batches: u64,
    pub schedule: String,
    pub all_to_all: String,
    pub steps: usize,
    /// Median over the steps after the first three (allocation, warm-up).
    pub step_time_median_s: f64,
    pub tokens_per_s: f64,
    /// Against the platform's peak (the planner's basis, comparable with `predicted.mfu`).
    pub mfu: f64,
    /// Against the peak measured on this machine at start-up.
    pub mfu_measured_peak: f64,
    pub peak_rss_bytes: Vec<u64>,
    /// Each rank's peak of the bytes its heap held for the program (tensors and buffers), where its
    /// allocator counts them (`piper::alloc`); the peak RSS adds what the allocator keeps beside them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peak_heap_bytes: Vec<u64>,
    pub bubble_measured: Option<f64>,
    pub predicted: Predicted,
    pub predicted_peak_memory_bytes: f64,
    /// Expert migrations over the run, their total wall time and its share of the run's time.
    pub migrations: usize,
    pub migration_seconds: f64,
    pub migration_share: f64,
    /// What each check's migrations saved per step, measured one window later, beside the prediction.
    #[serde(default)]
    pub migration_outcomes: Vec<MigrationOutcome>,
    /// Final expert → rank placement of every MoE layer (after migrations).
    pub placement: Vec<Vec<u64>>,
    /// Mean loss of the last (up to) 10 steps.
    pub final_loss: f64,
    pub first_loss: f64,
    /// The last held-out loss (`--eval-every`), nats per token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// The model's own metrics at the last evaluation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eval_metrics: BTreeMap<String, f64>,
    pub platform: String,
    /// Rank 0's profile of the steady steps, with `--profile`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profile: Vec<crate::runtime::profile::ProfileRow>,
    /// CPU time the host gave other guests while the steps ran (Linux `steal`; rank 0's host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steal_share: Option<f64>,
}

/// The median of a steady-state column, NaN for none (or for a NaN in it).
fn median(v: Vec<f64>) -> f64 {
    piper_planner::stats::median_or_nan(&v)
}

impl RunSummary {
    /// From the plan and what the run left: the metrics of every step, each rank's peak RSS and the final
    /// placement of every MoE layer (expert → rank). `flops_per_token` converts tokens/s into the
    /// platform MFU.
    pub fn new(
        plan: &RunPlan,
        metrics: &[StepMetrics],
        peak_rss_bytes: &[u64],
        placements: Vec<Vec<u64>>,
        flops_per_token: f64,
    ) -> Self {
        // fold from +0.0: an empty f64 `sum()` is −0.0.
        let migration_seconds = metrics.iter().flat_map(|m| &m.migration).map(|e| e.seconds).fold(0.0, |a, b| a + b);
        let run_seconds: f64 = metrics.iter().map(|m| m.step_time_s).sum::<f64>() + migration_seconds;
        let steady = &metrics[metrics.len().min(3).min(metrics.len().saturating_sub(1))..];
        let step_time = median(steady.iter().map(|m| m.step_time_s).collect());
        let tokens_per_s = median(steady.iter().map(|m| m.tokens_per_s).collect());
        // The platform's peak per GPU: the plan's achieved TFLOP/s over its MFU.
        let platform_peak =
            if plan.predicted.mfu > 0.0 { plan.predicted.tflops_per_gpu * 1e12 / plan.predicted.mfu } else { f64::NAN };
        let tail = &metrics[metrics.len().saturating_sub(10)..];
        RunSummary {
            layout: SummaryLayout { pp: plan.pp, ep: plan.ep, dp: plan.dp },
            micro_batches: plan.num_micro_batches,
            schedule: plan.schedule.name().into(),
            all_to_all: plan.all_to_all.name().into(),
            steps: metrics.len(),
            step_time_median_s: step_time,
            tokens_per_s,
            mfu: tokens_per_s * flops_per_token / (plan.gpus as f64 * platform_peak),
            mfu_measured_peak: median(steady.iter().map(|m| m.mfu).collect()),
            peak_rss_bytes: peak_rss_bytes.to_vec(),
            peak_heap_bytes: Vec::new(),
            migrations: metrics.iter().map(|m| m.migration.len()).sum(),
            migration_seconds,
            migration_share: if run_seconds > 0.0 { migration_seconds / run_seconds } else { 0.0 },
            migration_outcomes: metrics.iter().filter_map(|m| m.migration_outcome.clone()).collect(),
            placement: placements,
            bubble_measured: (plan.pp > 1).then(|| median(steady.iter().filter_map(|m| m.bubble).collect())),
            predicted: plan.predicted.clone(),
            predicted_peak_memory_bytes: plan.predicted.peak_memory_bytes(),
            final_loss: tail.iter().map(|m| m.loss).sum::<f64>() / tail.len().max(1) as f64,
            first_loss: metrics.first().map_or(f64::NAN, |m| m.loss),
            eval_loss: metrics.iter().rev().find_map(|m| m.eval_loss),
            eval_metrics: metrics
                .iter()
                .rev()
                .find(|m| m.eval_loss.is_some())
                .map_or_else(Default::default, |m| m.eval_metrics.clone()),
            platform: plan.platform.clone(),
            profile: Vec::new(),
            steal_share: None,
        }
    }

    /// Predicted beside measured, one line each.
    pub fn plan_vs_measured(&self) -> Vec<String> {
        let err = |measured: f64, predicted: f64| 100.0 * (predicted - measured) / measured;
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let p = &self.predicted;
        let rss = self.peak_rss_bytes.iter().copied().max().unwrap_or(0) as f64;
        let heap = match self.peak_heap_bytes.iter().copied().max() {
            Some(b) => format!("; heap peak {:.3} GiB", gib(b as f64)),
            None => String::new(),
        };
        let mut lines = vec![
            format!(
                "plan vs measured ({} platform): step {:.2} ms predicted, {:.2} ms measured ({:+.0}%); {:.0} tokens/s predicted, {:.0} measured ({:+.0}%)",
                self.platform,
                p.step_time_s * 1e3,
                self.step_time_median_s * 1e3,
                err(self.step_time_median_s, p.step_time_s),
                p.tokens_per_s,
                self.tokens_per_s,
                err(self.tokens_per_s, p.tokens_per_s)
            ),
            format!(
                "memory per rank: {:.3} GiB predicted (incl. the platform's framework overhead), {:.3} GiB peak RSS measured (largest rank, {:+.0}%){heap}",
                gib(self.predicted_peak_memory_bytes),
                gib(rss),
                err(rss, self.predicted_peak_memory_bytes)
            ),
            format!(
                "MFU against the platform's peak: {:.1}% predicted, {:.1}% measured",
                100.0 * p.mfu,
                100.0 * self.mfu
            ),
        ];
        if let Some(share) = self.steal_share.filter(|s| *s > STEAL_WARN) {
            lines.push(format!(
                "measured while other guests of this virtual machine's host took {:.0}% of its CPU time (steal): the measured times are slower than the machine alone",
                100.0 * share
            ));
        }
        if self.migrations > 0 {
            lines.push(format!(
                "expert migration: {} layer moves, {:.3} s in all ({:.2}% of the run)",
                self.migrations,
                self.migration_seconds,
                100.0 * self.migration_share
            ));
        }
        for o in &self.migration_outcomes {
            lines.push(format!(
                "  moves after step {}: step {:.2} → {:.2} ms, {:.2} ms/step saved ({:.2} predicted)",
                o.moved_after_step,
                o.step_time_before_s * 1e3,
                o.step_time_after_s * 1e3,
                o.realised_gain_per_step_s * 1e3,
                o.predicted_gain_per_step_s * 1e3
            ));
        }
        if let Some(b) = self.bubble_measured {
            lines.push(format!(
                "pipeline bubble: {:.1}% predicted, {:.1}% measured",
                100.0 * p.bubble_fraction,
                100.0 * b
            ));
        }
        lines
    }

    /// Reads a summary [`RunSummary::write`] wrote.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| RuntimeError::file("summary", path, e))?;
        serde_json::from_str(&text).map_err(|e| RuntimeError::file("summary", path, e))
    }

    /// Writes the summary as JSON, atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(RuntimeError::json("summary"))?;
        write_atomic(path, json.as_bytes()).map_err(|e| RuntimeError::file("--summary", path, e))
    }
}

/// The lines a run starts with: the model, the data, the backend's measured peak and the plan.
pub fn describe_run(
    spec: &piper_planner::model::ModelSpec,
    plan: &RunPlan,
    data: &str,
    backend: &str,
    peak_flops: f64,
) -> Vec<String> {
    use piper_planner::model::{active_params, param_breakdown, training_flops_per_token};
    let p = &plan.predicted;
    vec![
        format!(
            "model {}: {} layers, d={}, {} params ({} active per token), {:.2} MFLOP/token (train, Megatron convention)",
            spec.name,
            spec.num_layers,
            spec.hidden_size,
            param_breakdown(spec).total(),
            active_params(spec),
            training_flops_per_token(spec, plan.seq_len).total() / 1e6
        ),
        format!("data: {data}"),
        format!(
            "backend {backend}; measured peak (f32 GEMM 1024³) {:.1} GFLOP/s — MFU is relative to it",
            peak_flops / 1e9
        ),
        format!(
            "plan ({} platform): PP={} × EP={} × DP={}, {} micro-batches ({}), split {:?}, {} all-to-all, recompute {}, global batch {}; predicted step {:.2} ms, {:.0} tokens/s, bubble {:.1}%, peak memory {:.3} GiB, MFU {:.1}%",
            plan.platform,
            plan.pp,
            plan.ep,
            plan.dp,
            plan.num_micro_batches,
            plan.schedule.name(),
            plan.split().0,
            plan.all_to_all.name(),
            plan.recompute.name(),
            plan.global_batch,
            p.step_time_s * 1e3,
            p.tokens_per_s,
            100.0 * p.bubble_fraction,
            p.peak_memory_bytes() / (1u64 << 30) as f64,
            100.0 * p.mfu
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
        assert!(median(vec![1.0, 2.0, f64::NAN]).is_nan());
    }
}
