//! What a run tells its user: per-step metrics (a progress bar, log lines, a JSON-lines file), the run
//! summary (`--summary FILE.json`, written atomically) and the plan-versus-measured report, plus the
//! fault injection the failure tests use.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use piper_planner::run_plan::{Predicted, RunPlan};
use serde::Serialize;

pub use piper_planner::atomic::write_atomic;

/// What one step did (every rank gets the same numbers).
#[derive(Clone, Debug, Serialize)]
pub struct StepMetrics {
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub migration: Vec<super::migration::MigrationEvent>,
    /// The checkpoint saved after this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<SavedCheckpoint>,
}

/// A checkpoint a step saved: where, how large (all shards and the manifest), how long it took.
#[derive(Clone, Debug, Serialize)]
pub struct SavedCheckpoint {
    pub folder: PathBuf,
    pub bytes: u64,
    pub seconds: f64,
}

/// Where the per-step output goes.
#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    /// One JSON line per step (rank 0).
    pub metrics: Option<PathBuf>,
    /// A log line every N steps (0: none).
    pub log_every: usize,
    /// A progress bar (else plain lines).
    pub progress: bool,
    /// The first step this run trains (a resumed run's): an existing metrics file keeps its lines of
    /// earlier steps and continues after them.
    pub first_step: usize,
}

/// Shows each step on rank 0 and records it; triggers injected faults on any rank.
pub struct Reporter {
    lead: bool,
    steps: usize,
    bar: ProgressBar,
    /// Opened at the first step, so a run that fails before it (a bad checkpoint) leaves the file as it was.
    metrics: Option<std::io::BufWriter<std::fs::File>>,
    metrics_path: Option<PathBuf>,
    options: ReportOptions,
    write_error: Option<String>,
    fault: Fault,
}

impl Reporter {
    /// Checks where the metrics file goes (rank 0; the error names `--metrics`); it is written from the
    /// first step on.
    pub fn new(options: ReportOptions, rank: usize, steps: usize) -> Result<Self, String> {
        let lead = rank == 0;
        let metrics_path = options.metrics.clone().filter(|_| lead);
        if let Some(p) = &metrics_path {
            let parent = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if !parent.is_dir() || p.is_dir() {
                return Err(format!("--metrics {}: not a file in an existing folder", p.display()));
            }
        }
        let bar = if options.progress && lead { ProgressBar::new(steps as u64) } else { ProgressBar::hidden() };
        bar.set_position(options.first_step as u64);
        bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"));
        Ok(Reporter {
            lead,
            steps,
            bar,
            metrics: None,
            metrics_path,
            options,
            write_error: None,
            fault: Fault::from_env(rank),
        })
    }

    /// Rank 0: a line in the bar's scroll-back (or on stdout without a bar).
    pub fn println(&self, line: &str) {
        if self.lead {
            if self.options.progress { self.bar.println(line) } else { println!("{line}") }
        }
    }

    pub fn observe(&mut self, m: &StepMetrics) {
        self.fault.maybe_trigger(m.step);
        if !self.lead {
            return;
        }
        self.bar.inc(1);
        self.bar.set_message(format!(
            "loss {:.4} | {:.0} tok/s | {:.2} GFLOP/s | MFU {:.1}%",
            m.loss,
            m.tokens_per_s,
            m.flops_per_s / 1e9,
            100.0 * m.mfu
        ));
        if self.metrics.is_none()
            && let Some(p) = self.metrics_path.take()
        {
            match open_metrics(&p, self.options.first_step) {
                Ok(f) => self.metrics = Some(f),
                Err(e) => {
                    self.write_error.get_or_insert(format!("{}: {e}", p.display()));
                }
            }
        }
        // Flushed every step: a run killed later still leaves the lines of the steps it finished.
        if let Some(f) = self.metrics.as_mut()
            && let Err(e) =
                writeln!(f, "{}", serde_json::to_string(m).expect("metrics serialise")).and_then(|_| f.flush())
        {
            self.write_error.get_or_insert(e.to_string());
        }
        if let Some(c) = &m.checkpoint {
            self.println(&format!(
                "step {:>5}  checkpoint: {} ({:.1} MiB) in {:.2} s",
                m.step,
                c.folder.display(),
                c.bytes as f64 / (1u64 << 20) as f64,
                c.seconds
            ));
        }
        for e in &m.migration {
            self.println(&format!(
                "step {:>5}  migration: MoE layer {} moved {} experts ({} swaps, {:.1} KiB) in {:.2} ms ({:.2} ms predicted); rank load max/mean {:.2} → {:.2}",
                m.step,
                e.layer,
                e.experts_moved,
                e.swaps,
                e.bytes / 1024.0,
                e.seconds * 1e3,
                e.predicted_seconds * 1e3,
                e.imbalance_before,
                e.imbalance_after
            ));
        }
        let every = self.options.log_every;
        if every > 0 && (m.step.is_multiple_of(every) || m.step + 1 == self.steps) {
            let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
            self.println(&format!(
                "step {:>5}  loss {:.4}  lr {:.2e}  {:.0} tok/s  expert load max/mean per layer [{}]  per rank [{}]",
                m.step,
                m.loss,
                m.lr,
                m.tokens_per_s,
                fmt(&m.expert_load),
                fmt(&m.rank_load_max_mean)
            ));
        }
    }

    /// Clears the bar and flushes the metrics file.
    pub fn finish(mut self) -> Result<(), String> {
        self.bar.finish_and_clear();
        if let Some(f) = self.metrics.as_mut()
            && let Err(e) = f.flush()
        {
            self.write_error.get_or_insert(e.to_string());
        }
        match self.write_error {
            Some(e) => Err(format!("--metrics: {e}")),
            None => Ok(()),
        }
    }
}

/// `{"pp", "ep", "dp"}` of the summary.
#[derive(Clone, Debug, Serialize)]
pub struct SummaryLayout {
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
}

/// The run summary (`--summary FILE.json`), rank 0.
#[derive(Clone, Debug, Serialize)]
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
    pub bubble_measured: Option<f64>,
    pub predicted: Predicted,
    pub predicted_peak_memory_bytes: f64,
    /// Expert migrations over the run, their total wall time and its share of the run's time.
    pub migrations: usize,
    pub migration_seconds: f64,
    pub migration_share: f64,
    /// Final expert → rank placement of every MoE layer (after migrations).
    pub placement: Vec<Vec<u64>>,
    /// Mean loss of the last (up to) 10 steps.
    pub final_loss: f64,
    pub first_loss: f64,
    pub platform: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

impl RunSummary {
    /// From the plan and what the run left (metrics of every step, each rank's peak RSS, the final
    /// placements). `flops_per_token` converts tokens/s into the platform MFU.
    pub fn new(plan: &RunPlan, trained: &super::executor::Trained, flops_per_token: f64) -> Self {
        let metrics = &trained.metrics;
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
            peak_rss_bytes: trained.peak_rss_bytes.clone(),
            migrations: metrics.iter().map(|m| m.migration.len()).sum(),
            migration_seconds,
            migration_share: if run_seconds > 0.0 { migration_seconds / run_seconds } else { 0.0 },
            placement: trained.placements.iter().map(|p| p.ranks_of()).collect(),
            bubble_measured: (plan.pp > 1).then(|| median(steady.iter().filter_map(|m| m.bubble).collect())),
            predicted: plan.predicted.clone(),
            predicted_peak_memory_bytes: plan.predicted.peak_memory_bytes(),
            final_loss: tail.iter().map(|m| m.loss).sum::<f64>() / tail.len().max(1) as f64,
            first_loss: metrics.first().map_or(f64::NAN, |m| m.loss),
            platform: plan.platform.clone(),
        }
    }

    /// Predicted beside measured, one line each.
    pub fn plan_vs_measured(&self) -> Vec<String> {
        let err = |measured: f64, predicted: f64| 100.0 * (predicted - measured) / measured;
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let p = &self.predicted;
        let rss = self.peak_rss_bytes.iter().copied().max().unwrap_or(0) as f64;
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
                "memory per rank: {:.3} GiB predicted (incl. the platform's framework overhead), {:.3} GiB peak RSS measured (largest rank, {:+.0}%)",
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
        if self.migrations > 0 {
            lines.push(format!(
                "expert migration: {} layer moves, {:.3} s in all ({:.2}% of the run)",
                self.migrations,
                self.migration_seconds,
                100.0 * self.migration_share
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

    /// Writes the summary as JSON, atomically.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        write_atomic(path, json.as_bytes()).map_err(|e| format!("--summary {}: {e}", path.display()))
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
            "plan ({} platform): PP={} × EP={} × DP={}, {} micro-batches ({}), split {:?}, {} all-to-all, global batch {}; predicted step {:.2} ms, {:.0} tokens/s, bubble {:.1}%, peak memory {:.3} GiB, MFU {:.1}%",
            plan.platform,
            plan.pp,
            plan.ep,
            plan.dp,
            plan.num_micro_batches,
            plan.schedule.name(),
            plan.split().0,
            plan.all_to_all.name(),
            plan.global_batch,
            p.step_time_s * 1e3,
            p.tokens_per_s,
            100.0 * p.bubble_fraction,
            p.peak_memory_bytes() / (1u64 << 30) as f64,
            100.0 * p.mfu
        ),
    ]
}

/// Opens the metrics file for a run whose first step is `first_step`: from scratch, or (resuming) with the
/// lines of steps before it kept — rewritten atomically, so the earlier lines survive a crash.
fn open_metrics(path: &Path, first_step: usize) -> std::io::Result<std::io::BufWriter<std::fs::File>> {
    if first_step > 0 && path.exists() {
        let keep: String = std::fs::read_to_string(path)?
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| (s as usize) < first_step)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        write_atomic(path, keep.as_bytes())?;
        return Ok(std::io::BufWriter::new(std::fs::OpenOptions::new().append(true).open(path)?));
    }
    Ok(std::io::BufWriter::new(std::fs::File::create(path)?))
}

/// Peak resident memory of this process (`VmHWM`), bytes; 0 where it cannot be read.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("VmHWM"))?.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Fault injection for the failure tests: `PIPER_FAULT_RANK=r PIPER_FAULT_STEP=s PIPER_FAULT=exit|hang`
/// makes rank r exit (or stop answering) after step s; `PIPER_FAULT=hang-in-migration` makes rank r stop
/// answering when its first expert migration starts (see [`hang_in_migration`]).
struct Fault {
    step: Option<usize>,
    hang: bool,
}

impl Fault {
    fn from_env(rank: usize) -> Self {
        let mine = std::env::var("PIPER_FAULT_RANK").ok().and_then(|r| r.parse::<usize>().ok()) == Some(rank);
        let step = std::env::var("PIPER_FAULT_STEP").ok().and_then(|s| s.parse::<usize>().ok()).filter(|_| mine);
        let hang = std::env::var("PIPER_FAULT").is_ok_and(|v| v == "hang");
        Fault { step: step.filter(|_| std::env::var("PIPER_FAULT").is_ok_and(|v| v == "hang" || v == "exit")), hang }
    }

    fn maybe_trigger(&self, step: usize) {
        if self.step == Some(step) {
            if self.hang {
                eprintln!("fault injection: this rank stops answering after step {step}");
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
            eprintln!("fault injection: this rank exits after step {step}");
            std::process::exit(17);
        }
    }
}

/// The fault point of `PIPER_FAULT=hang-in-migration` on `PIPER_FAULT_RANK` (a peer that dies while
/// experts move: the others must name it within the timeout).
pub fn hang_in_migration(world_rank: usize) {
    let mine = std::env::var("PIPER_FAULT_RANK").ok().and_then(|r| r.parse::<usize>().ok()) == Some(world_rank);
    if mine && std::env::var("PIPER_FAULT").is_ok_and(|v| v == "hang-in-migration") {
        eprintln!("fault injection: this rank stops answering in expert migration");
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// The fault point of `PIPER_FAULT=kill-in-save PIPER_FAULT_STEP=s` (on `PIPER_FAULT_RANK`, default
/// every rank): the process sends itself SIGKILL after writing its shard of the checkpoint of step `s`,
/// before the checkpoint is committed — what a node failure mid-save looks like.
pub fn fault_in_save(world_rank: usize, step: u64) {
    let rank_ok = std::env::var("PIPER_FAULT_RANK").map_or(true, |r| r.parse::<usize>().ok() == Some(world_rank));
    let step_ok = std::env::var("PIPER_FAULT_STEP").ok().and_then(|s| s.parse::<u64>().ok()) == Some(step);
    if rank_ok && step_ok && std::env::var("PIPER_FAULT").is_ok_and(|v| v == "kill-in-save") {
        eprintln!("fault injection: SIGKILL in the middle of saving the checkpoint of step {step}");
        let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
