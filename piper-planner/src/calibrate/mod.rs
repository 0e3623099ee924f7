//! `piper calibrate`: measure this machine through the runtime's own binaries and write the platform
//! the planner prices with — the paper's loop (micro-benchmark → model → plan). Four steps:
//!
//! 1. **links**: `calibrate_runtime links` on every rank of an `mpirun` launch — the peak, p2p latency
//!    and bandwidth inside a node (and between nodes, on two or more), the memory bandwidth;
//! 2. **costs per thread count**: for every thread count a rank can get (1, 2, 4, …, cores),
//!    `cores ÷ threads` copies of `calibrate_runtime measure` at once (every core busy, as that many
//!    ranks would run): Burn's element-wise passes, the fixed cost of one tensor op, the AdamW step, and
//!    its linear layers', routed experts' and attention core's efficiency by shape;
//! 3. **profiled training**: the [`runs::STEP_RUNS`] at every thread count (`mixtral_train --profile`,
//!    copies at once), the [`runs::EP_RUNS`] as one expert group filling the node, each in two
//!    interleaved rounds (each round a row of the fit: a shared host's speed drifts between them), and
//!    data-parallel runs on `cores` and `2 × cores` ranks (time sharing). The profiles book every
//!    operation into the step cost classes; the second round's one-rank runs on every core, long
//!    enough for the allocator's pools to fill, fit the memory. The CPU time the host gave other
//!    guests meanwhile (steal) is reported;
//! 4. **fit**: the platform with its tables per thread count, step costs, memory and time-sharing
//!    exponent, written atomically (the previous calibration stays whole until the new one is).

pub mod error;
pub mod fit;
pub mod refine;
pub mod runs;
pub mod smooth;
pub mod steal;
pub mod validate;
pub mod workers;

use std::path::{Path, PathBuf};

pub use error::{CalibrateError, Result};
use runs::{
    EP_RUNS, HELD_RUNS, MEMORY_SECONDS, MEMORY_STEPS, MULTI_RANK_STEPS, PROFILE_ROUNDS, PROFILE_STEPS, ProfileRun,
    STEP_RUNS, TIME_SHARE_ROUNDS, TIME_SHARE_RUN,
};
use workers::{Job, Workers, run_at_once};

use crate::atomic::write_atomic;
use crate::model::resolve_model;
use crate::platform::{
    self, DataParallelRuns, MemoryPoint, Platform, ProfiledRun, ThreadCosts, thread_counts, to_toml,
    with_data_parallel, with_runtime, with_step_costs,
};
use crate::stats::median;

/// What to calibrate and where.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The platform file to write.
    pub out: PathBuf,
    /// Where the worker binaries are (`mixtral_train`, `calibrate_runtime`, or their `examples/`).
    pub bin_dir: PathBuf,
    /// A folder for the workers' files (created; left in place).
    pub work: PathBuf,
    /// Cores of this node.
    pub cores: u64,
    /// Ranks of the link measurement.
    pub link_ranks: u64,
    /// Most ranks the platform places on one node.
    pub ranks_per_node: u64,
    /// Keep the measurements already in `work` (a calibration interrupted, or a refit after a change
    /// of the model's classes): only what is missing runs.
    pub reuse: bool,
}

/// Runs the four steps; `say` hears each step as it starts.
pub fn calibrate(s: &Settings, say: &mut dyn FnMut(&str)) -> Result<Platform> {
    let w = Workers::find(&s.bin_dir)?;
    let steal = steal::StealClock::start();
    say(&format!("calibrating {} core(s) with {} and {}", s.cores, w.trainer.display(), w.measurer.display()));
    std::fs::create_dir_all(&s.work).map_err(|e| CalibrateError::file(&s.work, format!("cannot create: {e}")))?;
    say(&format!("1/4 links and memory bandwidth on {} rank(s)", s.link_ranks));
    let base_path = s.work.join("base.toml");
    let args = vec!["links".into(), "--out".into(), base_path.display().to_string()];
    s.run(vec![w.under_mpirun("the link measurement".into(), s.link_ranks, &w.measurer, args)], &[&base_path])?;
    let base = platform::load(&base_path)?;
    let threads = thread_counts(s.cores);
    say(&format!("2/4 the runtime's costs at {threads:?} thread(s) per rank, every core busy"));
    let costs = measure_costs(s, &w, &threads, &base_path)?;
    say(&format!(
        "3/4 {} profiled training runs per thread count, expert-parallel runs, time sharing",
        STEP_RUNS.len()
    ));
    let (mut profiled, memory) = profile_one_rank(s, &w, &threads, &base)?;
    let (expert_parallel, exchange) = profile_expert_parallel(s, &w, &threads, &base)?;
    profiled.extend(expert_parallel);
    let data_parallel = data_parallel_runs(s, &w)?;
    if let Some(share) = steal.share().filter(|_| !s.reuse) {
        say(&steal::report(share, "the calibration"));
    }
    say("4/4 fitting and writing the platform");
    let fitted = with_runtime(base, s.cores, s.ranks_per_node, costs, &memory, &exchange)?;
    let fitted = with_data_parallel(with_step_costs(fitted, &profiled)?, data_parallel)?;
    if let Some(dir) = s.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| CalibrateError::file(dir, format!("cannot create: {e}")))?;
    }
    write_atomic(&s.out, to_toml(&fitted).as_bytes()).map_err(|e| CalibrateError::file(&s.out, e))?;
    Ok(fitted)
}

impl Settings {
    /// Runs `jobs` at once, unless reusing and every file they write is already there.
    fn run(&self, jobs: Vec<Job>, writes: &[&Path]) -> Result<()> {
        if self.reuse && writes.iter().all(|p| p.is_file()) {
            return Ok(());
        }
        run_at_once(jobs, &self.work)
    }

    /// `cores ÷ threads` copies of `job(copy)` at once, each a process with a pool of `threads`
    /// threads, writing `file(copy)`.
    fn copies_at_once(&self, threads: u64, file: impl Fn(u64) -> PathBuf, job: impl Fn(u64) -> Job) -> Result<()> {
        let copies: Vec<u64> = (0..(self.cores / threads).max(1)).collect();
        let jobs = copies
            .iter()
            .map(|&copy| {
                let mut j = job(copy);
                j.env.push(("RAYON_NUM_THREADS".into(), threads.to_string()));
                j
            })
            .collect();
        let files: Vec<PathBuf> = copies.iter().map(|&c| file(c)).collect();
        self.run(jobs, &files.iter().map(PathBuf::as_path).collect::<Vec<_>>())
    }
}

fn measure_costs(s: &Settings, w: &Workers, threads: &[u64], base: &Path) -> Result<Vec<ThreadCosts>> {
    let mut all = Vec::new();
    for &t in threads {
        let file = |copy: u64| s.work.join(format!("costs-{t}-{copy}.json"));
        s.copies_at_once(t, file, |copy| Job {
            what: format!("the {t}-thread cost measurement"),
            program: w.measurer.clone(),
            args: ["measure", "--platform", &base.display().to_string(), "--threads", &t.to_string()]
                .into_iter()
                .map(String::from)
                .chain(["--json".into(), file(copy).display().to_string()])
                .collect(),
            env: Vec::new(),
        })?;
        for copy in 0..(s.cores / t).max(1) {
            all.push(fit::read_json(&file(copy))?);
        }
    }
    let mut costs = fit::mean_per_thread_count(all)?;
    for c in &mut costs {
        c.experts_efficiency = smooth::smooth_experts(&c.experts_efficiency);
    }
    Ok(costs)
}

/// The trainer's flags for a short run of `run` writing `summary`.
fn train_args(run: &ProfileRun, model: &str, steps: u64, summary: &Path) -> Vec<String> {
    let flags = [
        ("--preset", model.to_string()),
        ("--steps", steps.to_string()),
        ("--batch-size", run.batch.to_string()),
        ("--seq-len", run.seq.to_string()),
        ("--warmup", "1".into()),
        ("--log-every", "0".into()),
        ("--summary", summary.display().to_string()),
        ("--micro-batches", run.micro_batches.to_string()),
        ("--schedule", if run.micro_batches > 1 { "gpipe" } else { "1f1b" }.into()),
        // The calibration's runs are its fit, not history to refine it with.
        ("--history", "off".into()),
    ];
    workers::trainer_args(flags, &[])
}

/// Profiled runs, and memory points with the threads of the rank that measured each.
type ProfiledAndMemory = (Vec<ProfiledRun>, Vec<(u64, MemoryPoint)>);

/// Every step run at every thread count (copies at once), profiled, in [`PROFILE_ROUNDS`] interleaved
/// rounds, each round a row of the fit (the machine's speed drifts between rounds; the fit takes their
/// middle, as a run's median step does). The memory points of the last round's runs, each with its
/// rank's threads: a rank of several threads (and a lone core's rank) runs [`memory_steps`], as it grows
/// its allocator pools over its first steps; a rank of one thread on a node of several cores runs the
/// profiled run's [`PROFILE_STEPS`], as it computes on its own thread and its peak is steady by then (a
/// data-parallel `heldout11-qwen3` rank of one thread: 214 MiB after 8, 30 and 100 steps, AMD EPYC Zen 4).
fn profile_one_rank(s: &Settings, w: &Workers, threads: &[u64], base: &Platform) -> Result<ProfiledAndMemory> {
    let summary =
        |i: usize, t: u64, copy: u64, round: usize| s.work.join(format!("summary-{i}-{t}-{copy}-{round}.json"));
    let last = PROFILE_ROUNDS - 1;
    for round in 0..PROFILE_ROUNDS {
        for (i, run) in STEP_RUNS.iter().enumerate() {
            let model = run.model.arg(&s.work)?;
            for &t in threads {
                // The last round's runs measure memory too: long enough to reach the steady state of
                // the allocator's pools, as a long run does.
                let steps = match round {
                    r if r == last && (t > 1 || t == s.cores) && run.memory => {
                        memory_steps(fit::RunSummary::read(&summary(i, t, 0, 0))?.step_s)
                    }
                    _ => PROFILE_STEPS,
                };
                s.copies_at_once(
                    t,
                    |copy| summary(i, t, copy, round),
                    |copy| {
                        let mut args = train_args(run, &model, steps, &summary(i, t, copy, round));
                        args.push("--profile".into());
                        Job {
                            what: format!("profiled run {} on {t} thread(s)", run.model.name),
                            program: w.trainer.clone(),
                            args,
                            env: Vec::new(),
                        }
                    },
                )?;
            }
        }
    }
    let (mut profiled, mut memory) = (Vec::new(), Vec::new());
    for (i, run) in STEP_RUNS.iter().enumerate() {
        let spec = resolve_model(&run.model.arg(&s.work)?)?;
        for &t in threads {
            for copy in 0..(s.cores / t).max(1) {
                for round in 0..PROFILE_ROUNDS {
                    let read = fit::RunSummary::read(&summary(i, t, copy, round))?;
                    profiled.push(fit::profiled_run(&read, spec.clone(), run, t, 1)?);
                    if run.memory && round == last {
                        memory.push((t, fit::memory_point(&read, &spec, base, run, 1)?));
                    }
                }
            }
        }
    }
    memory.extend(held_memory(s, w, base, |i| summary(i, s.cores, 0, 0))?);
    Ok((profiled, memory))
}

/// The memory points of the [`HELD_RUNS`] on every core, each as long as its step run's memory run.
fn held_memory(
    s: &Settings,
    w: &Workers,
    base: &Platform,
    step_summary: impl Fn(usize) -> PathBuf,
) -> Result<Vec<(u64, MemoryPoint)>> {
    let mut memory = Vec::new();
    for (i, micro_batches) in HELD_RUNS {
        let run = ProfileRun { micro_batches, ..STEP_RUNS[i] };
        let model = run.model.arg(&s.work)?;
        let steps = memory_steps(fit::RunSummary::read(&step_summary(i))?.step_s);
        let file = s.work.join(format!("summary-held-{i}-{micro_batches}.json"));
        let args = train_args(&run, &model, steps, &file);
        let what = format!("memory run {} with {micro_batches} micro-batches held", run.model.name);
        s.copies_at_once(
            s.cores,
            |_| file.clone(),
            |_| Job { what: what.clone(), program: w.trainer.clone(), args: args.clone(), env: Vec::new() },
        )?;
        let spec = resolve_model(&model)?;
        memory.push((s.cores, fit::memory_point(&fit::RunSummary::read(&file)?, &spec, base, &run, 1)?));
    }
    Ok(memory)
}

/// Steps of a memory run whose first round's step took `step_s`: about [`MEMORY_SECONDS`], within
/// `PROFILE_STEPS..=MEMORY_STEPS`.
fn memory_steps(step_s: f64) -> u64 {
    ((MEMORY_SECONDS / step_s) as u64).clamp(PROFILE_STEPS, MEMORY_STEPS)
}

/// Each expert-parallel run as one expert group of `cores ÷ threads` ranks, for every thread count
/// that makes a group of two or more, in [`PROFILE_ROUNDS`] interleaved rounds (each a row of the fit),
/// each right after its paired fused run: the same model and tokens per rank as `cores ÷ threads`
/// one-rank copies at once, on the same cores (see [`StepRun::baseline_s`](crate::platform::StepRun)).
/// With them, the memory point of each run's last round, with the threads of its ranks.
fn profile_expert_parallel(s: &Settings, w: &Workers, threads: &[u64], base: &Platform) -> Result<ProfiledAndMemory> {
    let groups: Vec<u64> = threads.iter().copied().filter(|t| s.cores / t >= 2).collect();
    let summary = |i: usize, t: u64, round: usize| s.work.join(format!("summary-ep-{i}-{t}-{round}.json"));
    let paired =
        |i: usize, t: u64, copy: u64, round: usize| s.work.join(format!("summary-fused-{i}-{t}-{copy}-{round}.json"));
    for round in 0..PROFILE_ROUNDS {
        for (i, run) in EP_RUNS.iter().enumerate() {
            let model = run.model.arg(&s.work)?;
            for &t in &groups {
                let ranks = s.cores / t;
                let fused = ProfileRun { batch: run.batch / ranks, ..*run };
                s.copies_at_once(
                    t,
                    |copy| paired(i, t, copy, round),
                    |copy| {
                        let mut args = train_args(&fused, &model, MULTI_RANK_STEPS, &paired(i, t, copy, round));
                        args.push("--profile".into());
                        let what = format!("fused run {} on {t} thread(s)", run.model.name);
                        Job { what, program: w.trainer.clone(), args, env: Vec::new() }
                    },
                )?;
                let path = summary(i, t, round);
                let mut args = train_args(run, &model, MULTI_RANK_STEPS, &path);
                args.extend(["--ep".into(), ranks.to_string(), "--profile".into()]);
                let what = format!("expert-parallel run {} on {ranks} ranks", run.model.name);
                s.run(vec![w.under_mpirun(what, ranks, &w.trainer, args)], &[&path])?;
            }
        }
    }
    let (mut profiled, mut exchange) = (Vec::new(), Vec::new());
    for (i, run) in EP_RUNS.iter().enumerate() {
        let spec = resolve_model(&run.model.arg(&s.work)?)?;
        for &t in &groups {
            for round in 0..PROFILE_ROUNDS {
                let read = fit::RunSummary::read(&summary(i, t, round))?;
                if round == PROFILE_ROUNDS - 1 {
                    exchange.push((t, fit::memory_point(&read, &spec, base, run, s.cores / t)?));
                }
                let copies = (0..s.cores / t)
                    .map(|copy| fit::RunSummary::read(&paired(i, t, copy, round))?.compute_seconds())
                    .collect::<Result<Vec<f64>>>()?;
                let baseline_s = copies.iter().sum::<f64>() / copies.len() as f64;
                let run = fit::profiled_run(&read, spec.clone(), run, t, s.cores / t)?;
                profiled.push(ProfiledRun { baseline_s: Some(baseline_s), ..run });
            }
        }
    }
    Ok((profiled, exchange))
}

/// Data-parallel runs on `cores` and `2 × cores` ranks, profiled, in interleaved rounds: the ratio of
/// their step times (time sharing), and on `cores` ranks the gradient reduction over a rank's forward +
/// backward seconds, medians over the rounds.
fn data_parallel_runs(s: &Settings, w: &Workers) -> Result<DataParallelRuns> {
    let run = &TIME_SHARE_RUN;
    let model = run.model.arg(&s.work)?;
    let (mut ratios, mut sync) = (Vec::new(), Vec::new());
    for round in 0..TIME_SHARE_ROUNDS {
        let mut steps = Vec::new();
        for ranks in [s.cores, 2 * s.cores] {
            let summary = s.work.join(format!("share-{ranks}-{round}.json"));
            let mut args = train_args(run, &model, MULTI_RANK_STEPS, &summary);
            args.extend(["--dp".into(), ranks.to_string(), "--profile".into()]);
            let what = format!("data-parallel run on {ranks} ranks");
            s.run(vec![w.under_mpirun(what, ranks, &w.trainer, args)], &[&summary])?;
            let read = fit::RunSummary::read(&summary)?;
            steps.push(read.step_s);
            if ranks == s.cores {
                sync.push(read.allreduce_seconds()? / read.compute_seconds()?);
            }
        }
        ratios.push(steps[1] / steps[0]);
    }
    let median_of = |v: &[f64], what: &str| {
        median(v).ok_or_else(|| CalibrateError::Worker {
            what: format!("data-parallel runs on {} and {} ranks", s.cores, 2 * s.cores),
            why: format!("no {what} to take the median of ({v:?}); rerun `piper calibrate`"),
        })
    };
    Ok(DataParallelRuns {
        step_ratio: median_of(&ratios, "step-time ratio")?,
        replica_sync: median_of(&sync, "gradient-reduction share")?,
    })
}
