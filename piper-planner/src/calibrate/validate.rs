//! `piper validate`: the resource model checks itself on this machine. The planner's best runnable plans
//! for a model and a rank count train for a few steps each under `mpirun`, in interleaved rounds; each
//! plan's median step time and peak memory are set against its prediction, and the first choice against
//! the fastest measured (regret), with the rank correlation of predicted and measured times.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{CalibrateError, Result};
use super::workers::{Job, Workers, trainer_args};
use crate::layout::{Recompute, Schedule, TrainConfig};
use crate::model::resolve_model;
use crate::planner::{PlanCandidate, PlanRequest, plan};
use crate::platform::Platform;
use crate::platform::step_costs::WorkClass;
use crate::run_plan::{RunPlan, runtime_refusal};
use crate::stats::median_or_nan;

/// What to validate.
#[derive(Clone, Debug)]
pub struct ValidateSettings {
    /// The model as the trainer's `--preset` and the planner take it.
    pub model: String,
    pub gpus: u64,
    pub global_batch: u64,
    /// Sequence length, dtype and the other settings the plans are priced with.
    pub base: TrainConfig,
    /// Plans to run: the best runnable ones, ranked by predicted step time.
    pub top: usize,
    pub rounds: usize,
    pub steps: u64,
    pub bin_dir: PathBuf,
    pub work: PathBuf,
}

/// One plan's prediction and measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Checked {
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
    pub micro_batch_size: u64,
    pub num_micro_batches: u64,
    pub schedule: Schedule,
    pub predicted_step_s: f64,
    /// The median over rounds of each run's median step time.
    pub measured_step_s: f64,
    /// (slowest − fastest round) ÷ the median.
    pub spread: f64,
    pub predicted_peak_bytes: f64,
    /// The median over rounds of the largest rank's peak RSS.
    pub measured_peak_bytes: f64,
}

/// The whole check.
#[derive(Clone, Debug, Serialize)]
pub struct Validation {
    pub model: String,
    pub platform: String,
    pub gpus: u64,
    pub rounds: usize,
    /// In the planner's order: the first is its choice.
    pub plans: Vec<Checked>,
    /// The first choice's measured time ÷ the fastest measured − 1.
    pub regret: f64,
    /// Spearman's rank correlation of predicted and measured step times (NaN for fewer than 2 plans).
    pub rank_correlation: f64,
    /// CPU time other guests of the host took during the runs ([`super::steal`]); `None` off Linux.
    pub steal_share: Option<f64>,
    /// Where one rank's step goes, class by class: profiled runs of the first choice's micro-batch on
    /// one rank holding the whole model, on every core and (a CPU platform's) with the threads of a
    /// rank of the checked runs, each priced with the step costs of its thread count (empty where the
    /// platform has no step costs or the runs failed).
    pub classes: Vec<ClassCheck>,
}

/// One class of work of a profiled one-rank step: the seconds the model prices and the seconds the
/// runtime booked to it.
#[derive(Clone, Debug, Serialize)]
pub struct ClassCheck {
    /// Threads of the rank (absent: the trainer sized its pool itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u64>,
    pub class: WorkClass,
    pub predicted_s: f64,
    pub measured_s: f64,
}

/// Plans, runs and compares; `say` hears each run as it starts.
pub fn validate(s: &ValidateSettings, platform: &Platform, say: &mut dyn FnMut(&str)) -> Result<Validation> {
    let w = Workers::find(&s.bin_dir)?;
    std::fs::create_dir_all(&s.work).map_err(|e| CalibrateError::file(&s.work, format!("cannot create: {e}")))?;
    let spec = resolve_model(&s.model)?;
    let plans = runnable_plans(s, platform)?;
    let mut files = Vec::new();
    for (i, c) in plans.iter().enumerate() {
        let run = RunPlan::from_candidate(&spec, &platform.name, s.base.seq_len, &s.base.dtype, c);
        let path = s.work.join(format!("plan-{i}.json"));
        let text = serde_json::to_string_pretty(&run).expect("a plan serialises");
        std::fs::write(&path, text).map_err(|e| CalibrateError::file(&path, format!("cannot write: {e}")))?;
        files.push(path);
    }
    let steal = super::steal::StealClock::start();
    let mut summaries = vec![Vec::new(); plans.len()];
    for round in 0..s.rounds {
        for (i, c) in plans.iter().enumerate() {
            say(&format!(
                "round {}/{}: PP={} EP={} DP={} mbs={} M={} {}",
                round + 1,
                s.rounds,
                c.pp,
                c.ep,
                c.dp,
                c.micro_batch_size,
                c.num_micro_batches,
                c.schedule.name()
            ));
            let summary = s.work.join(format!("summary-{i}-{round}.json"));
            let args = plan_run_args(s, &files[i], &summary);
            let what = format!("the run of plan {} ({} ranks)", i + 1, s.gpus);
            super::workers::run_at_once(vec![w.under_mpirun(what, s.gpus, &w.trainer, args)], &s.work)?;
            summaries[i].push(measured(&summary)?);
        }
    }
    let checked: Vec<Checked> = plans.iter().zip(&summaries).map(|(c, m)| compare(c, m)).collect();
    // A diagnosis beside the check: where it cannot run (the whole model does not fit one rank), the
    // plans' results stand and it says why.
    let classes = check_classes(s, platform, &w, plans[0].micro_batch_size, say).unwrap_or_else(|e| {
        say(&format!("no class-by-class check: {e}"));
        Vec::new()
    });
    let steal_share = steal.share();
    if let Some(share) = steal_share {
        say(&super::steal::report(share, "the runs"));
    }
    Ok(Validation { steal_share, classes, ..summarise(s, platform, checked) })
}

/// One rank holding the whole model trains `sequences` sequences a step with `--profile`; each class's
/// booked seconds per step against what the platform's step costs price for that rank. On a CPU
/// platform, for a rank on every core and for a rank of the checked runs (its share of the cores, with
/// `cores ÷ threads` copies at once, every core busy as the calibration measured it), where they
/// differ. Nothing for a thread count without step costs.
fn check_classes(
    s: &ValidateSettings,
    platform: &Platform,
    w: &Workers,
    sequences: u64,
    say: &mut dyn FnMut(&str),
) -> Result<Vec<ClassCheck>> {
    let spec = resolve_model(&s.model)?;
    let cfg = TrainConfig { micro_batch_size: sequences, num_micro_batches: 1, ..s.base.clone() };
    let mut checks = Vec::new();
    for threads in checked_thread_counts(platform, s.gpus) {
        let copies = match (threads, platform.cores_per_node) {
            (Some(t), Some(cores)) => cores / t,
            _ => 1,
        };
        let seen = platform.for_node_ranks(copies);
        let Some(costs) = seen.step_costs else { continue };
        let on = threads.map_or(String::new(), |t| format!(" of {t} thread(s), {copies} at once"));
        say(&format!("profiled run: one rank{on}, {sequences} sequence(s) a step"));
        let reads = profiled_copies(s, w, sequences, threads, copies)?;
        let work = crate::class_work::class_work(&spec, &seen, &cfg, 1)?;
        for (class, predicted_s) in costs.class_seconds(&work) {
            let mut measured_s = 0.0;
            for read in &reads {
                measured_s += read.profile_seconds(|phase, op| WorkClass::of(phase, op) == Some(class))?;
            }
            checks.push(ClassCheck { threads, class, predicted_s, measured_s: measured_s / reads.len() as f64 });
        }
    }
    Ok(checks)
}

/// The thread counts of the ranks [`check_classes`] profiles: every core, and a rank of `ranks` on a
/// node, where the platform has thread counts; else one run of the trainer's own sizing (`None`).
fn checked_thread_counts(platform: &Platform, ranks: u64) -> Vec<Option<u64>> {
    let Some(cores) = platform.cores_per_node.filter(|_| !platform.threads.is_empty()) else { return vec![None] };
    let node_ranks = ranks.min(platform.gpus_per_node);
    let own = crate::platform::threads_per_rank(cores, node_ranks);
    let mut counts = vec![Some(cores)];
    if own != cores {
        counts.push(Some(own));
    }
    counts
}

/// `copies` one-rank profiled runs at once, each of `threads` threads (`None`: the trainer's sizing
/// under `mpirun`), and their summaries.
fn profiled_copies(
    s: &ValidateSettings,
    w: &Workers,
    sequences: u64,
    threads: Option<u64>,
    copies: u64,
) -> Result<Vec<super::fit::RunSummary>> {
    let summary = |copy: u64| s.work.join(format!("summary-classes-{}-{copy}.json", threads.unwrap_or(0)));
    let jobs = (0..copies)
        .map(|copy| {
            let flags = [
                ("--preset", s.model.clone()),
                ("--batch-size", sequences.to_string()),
                ("--seq-len", s.base.seq_len.to_string()),
                ("--steps", s.steps.to_string()),
                ("--warmup", "2".into()),
                ("--migration", "off".into()),
                ("--log-every", "0".into()),
                ("--history", "off".into()),
                ("--summary", summary(copy).display().to_string()),
            ];
            let args = trainer_args(flags, &["--profile"]);
            let what = format!("the profiled one-rank run {}", copy + 1);
            match threads {
                Some(t) => {
                    let env = vec![("RAYON_NUM_THREADS".to_string(), t.to_string())];
                    Job { what, program: w.trainer.clone(), args, env }
                }
                None => w.under_mpirun(what, 1, &w.trainer, args),
            }
        })
        .collect();
    super::workers::run_at_once(jobs, &s.work)?;
    (0..copies).map(|copy| super::fit::RunSummary::read(&summary(copy))).collect()
}

/// The best runnable plans (no recomputation, the runtime's dtype, flat all-to-all), one per layout,
/// micro-batching and schedule (one schedule without a pipeline: they run the same).
fn runnable_plans(s: &ValidateSettings, platform: &Platform) -> Result<Vec<PlanCandidate>> {
    let spec = resolve_model(&s.model)?;
    let req = PlanRequest {
        base: s.base.clone(),
        recomputes: vec![Recompute::None],
        algos: vec![crate::comm::A2aAlgo::Flat],
        top: 10_000,
        ..PlanRequest::new(s.gpus, s.global_batch, s.base.seq_len)
    };
    let report = plan(&spec, platform, &req)?;
    let mut seen = std::collections::HashSet::new();
    let plans: Vec<PlanCandidate> = report
        .plans
        .into_iter()
        .filter(|_| runtime_refusal(&s.base.dtype).is_none())
        .filter(|c| {
            let schedule = if c.pp > 1 { Some(c.schedule) } else { None };
            seen.insert((c.pp, c.ep, c.dp, c.micro_batch_size, c.num_micro_batches, schedule))
        })
        .take(s.top)
        .collect();
    if plans.is_empty() {
        let why = report.rejected.first().map_or("no layout is feasible".to_string(), |r| r.reason.clone());
        return Err(CalibrateError::Worker {
            what: "the planner".into(),
            why: format!("no plan the runtime runs: {why}"),
        });
    }
    Ok(plans)
}

/// The trainer's flags for a short run of the plan in `plan` writing `summary`.
fn plan_run_args(s: &ValidateSettings, plan: &Path, summary: &Path) -> Vec<String> {
    let flags = [
        ("--plan", plan.display().to_string()),
        ("--preset", s.model.clone()),
        ("--steps", s.steps.to_string()),
        ("--warmup", "2".into()),
        ("--migration", "off".into()),
        ("--log-every", "0".into()),
        ("--summary", summary.display().to_string()),
    ];
    trainer_args(flags, &[])
}

/// A run's median step time and its largest rank's peak RSS.
fn measured(summary: &Path) -> Result<(f64, f64)> {
    let read = super::fit::RunSummary::read(summary)?;
    Ok((read.step_s, read.peak_rss_bytes))
}

fn compare(c: &PlanCandidate, rounds: &[(f64, f64)]) -> Checked {
    let steps: Vec<f64> = rounds.iter().map(|r| r.0).collect();
    // Every round's step and peak are positive numbers (`RunSummary::read` refuses others).
    let step = median_or_nan(&steps);
    let (lo, hi) = steps.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
    Checked {
        pp: c.pp,
        ep: c.ep,
        dp: c.dp,
        micro_batch_size: c.micro_batch_size,
        num_micro_batches: c.num_micro_batches,
        schedule: c.schedule,
        predicted_step_s: c.step_time_s,
        measured_step_s: step,
        spread: (hi - lo) / step,
        predicted_peak_bytes: c.peak_memory_bytes,
        measured_peak_bytes: median_or_nan(&rounds.iter().map(|r| r.1).collect::<Vec<_>>()),
    }
}

fn summarise(s: &ValidateSettings, platform: &Platform, plans: Vec<Checked>) -> Validation {
    let measured: Vec<f64> = plans.iter().map(|p| p.measured_step_s).collect();
    let predicted: Vec<f64> = plans.iter().map(|p| p.predicted_step_s).collect();
    let fastest = measured.iter().copied().fold(f64::INFINITY, f64::min);
    Validation {
        model: s.model.clone(),
        platform: platform.name.clone(),
        gpus: s.gpus,
        rounds: s.rounds,
        regret: measured[0] / fastest - 1.0,
        rank_correlation: spearman(&predicted, &measured),
        steal_share: None,
        classes: Vec::new(),
        plans,
    }
}

/// Spearman's rank correlation (ties broken by order; NaN for fewer than two values or no spread).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let ranks = |x: &[f64]| {
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
        let mut r = vec![0.0; x.len()];
        for (pos, i) in order.into_iter().enumerate() {
            r[i] = pos as f64;
        }
        r
    };
    if a.len() != b.len() || a.len() < 2 {
        return f64::NAN;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let mean = (a.len() - 1) as f64 / 2.0;
    let num: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let den = (ra.iter().map(|x| (x - mean).powi(2)).sum::<f64>() * rb.iter().map(|y| (y - mean).powi(2)).sum::<f64>())
        .sqrt();
    if den > 0.0 { num / den } else { f64::NAN }
}

#[cfg(test)]
mod tests {
    use super::spearman;

    #[test]
    fn spearman_follows_the_textbook_cases() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), 1.0);
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), -1.0);
        // d = (0, 1, -1, 0): 1 - 6·2 / (4·15) = 0.8.
        assert!((spearman(&[1.0, 2.0, 3.0, 4.0], &[1.0, 3.0, 2.0, 4.0]) - 0.8).abs() < 1e-12);
        assert!(spearman(&[1.0], &[1.0]).is_nan() && spearman(&[1.0, 2.0], &[1.0]).is_nan());
    }
}
