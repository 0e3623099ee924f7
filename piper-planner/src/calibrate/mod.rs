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
//!    copies at once), the [`runs::EP_RUNS`] as one expert group filling the node, and data-parallel runs
//!    on `cores` and `2 × cores` ranks (time sharing). The profiles book every operation into the step
//!    cost classes; the one-rank runs on every core fit the memory;
//! 4. **fit**: the platform with its tables per thread count, step costs, memory and time-sharing
//!    exponent, written atomically (the previous calibration stays whole until the new one is).

pub mod error;
pub mod fit;
pub mod runs;
pub mod workers;

use std::path::{Path, PathBuf};

pub use error::{CalibrateError, Result};
use runs::{EP_RUNS, PROFILE_STEPS, ProfileRun, STEP_RUNS, TIME_SHARE_ROUNDS, TIME_SHARE_RUN, TIME_SHARE_STEPS};
use workers::{Job, Workers, run_at_once};

use crate::atomic::write_atomic;
use crate::model::resolve_model;
use crate::platform::{
    self, MemoryPoint, Platform, ProfiledRun, ThreadCosts, thread_counts, to_toml, with_runtime, with_step_costs,
    with_time_share,
};

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
}

/// Runs the four steps; `say` hears each step as it starts.
pub fn calibrate(s: &Settings, say: &mut dyn FnMut(&str)) -> Result<Platform> {
    let w = Workers::find(&s.bin_dir)?;
    say(&format!("calibrating {} core(s) with {} and {}", s.cores, w.trainer.display(), w.measurer.display()));
    std::fs::create_dir_all(&s.work).map_err(|e| CalibrateError::file(&s.work, format!("cannot create: {e}")))?;
    say(&format!("1/4 links and memory bandwidth on {} rank(s)", s.link_ranks));
    let base_path = s.work.join("base.toml");
    let args = vec!["links".into(), "--out".into(), base_path.display().to_string()];
    run_at_once(vec![w.under_mpirun("the link measurement".into(), s.link_ranks, &w.measurer, args)], &s.work)?;
    let base = platform::load(&base_path)?;
    let threads = thread_counts(s.cores);
    say(&format!("2/4 the runtime's costs at {threads:?} thread(s) per rank, every core busy"));
    let costs = measure_costs(s, &w, &threads, &base_path)?;
    say(&format!(
        "3/4 {} profiled training runs per thread count, expert-parallel runs, time sharing",
        STEP_RUNS.len()
    ));
    let (mut profiled, memory) = profile_one_rank(s, &w, &threads, &base)?;
    profiled.extend(profile_expert_parallel(s, &w, &threads)?);
    let ratio = time_share_ratio(s, &w)?;
    say("4/4 fitting and writing the platform");
    let fitted = with_runtime(base, s.cores, s.ranks_per_node, costs, &memory)?;
    let fitted = with_time_share(with_step_costs(fitted, &profiled)?, ratio)?;
    if let Some(dir) = s.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| CalibrateError::file(dir, format!("cannot create: {e}")))?;
    }
    write_atomic(&s.out, to_toml(&fitted).as_bytes()).map_err(|e| CalibrateError::file(&s.out, e))?;
    Ok(fitted)
}

/// `cores ÷ threads` copies of `job(copy)` at once, each a process with a pool of `threads` threads.
fn copies_at_once(s: &Settings, threads: u64, job: impl Fn(u64) -> Job) -> Result<()> {
    let jobs = (0..(s.cores / threads).max(1))
        .map(|copy| {
            let mut j = job(copy);
            j.env.push(("RAYON_NUM_THREADS".into(), threads.to_string()));
            j
        })
        .collect();
    run_at_once(jobs, &s.work)
}

fn measure_costs(s: &Settings, w: &Workers, threads: &[u64], base: &Path) -> Result<Vec<ThreadCosts>> {
    let mut all = Vec::new();
    for &t in threads {
        let file = |copy: u64| s.work.join(format!("costs-{t}-{copy}.json"));
        copies_at_once(s, t, |copy| Job {
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
    fit::mean_per_thread_count(all)
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
    ];
    flags.into_iter().flat_map(|(k, v)| [k.to_string(), v]).chain(["--no-progress".to_string()]).collect()
}

/// Every step run at every thread count (copies at once), profiled; the memory points of the runs on
/// every core.
fn profile_one_rank(
    s: &Settings,
    w: &Workers,
    threads: &[u64],
    base: &Platform,
) -> Result<(Vec<ProfiledRun>, Vec<MemoryPoint>)> {
    let (mut profiled, mut memory) = (Vec::new(), Vec::new());
    for (i, run) in STEP_RUNS.iter().enumerate() {
        let model = run.model.arg(&s.work)?;
        let spec = resolve_model(&model)?;
        for &t in threads {
            let summary = |copy: u64| s.work.join(format!("summary-{i}-{t}-{copy}.json"));
            copies_at_once(s, t, |copy| {
                let mut args = train_args(run, &model, PROFILE_STEPS, &summary(copy));
                args.push("--profile".into());
                Job {
                    what: format!("profiled run {} on {t} thread(s)", run.model.name),
                    program: w.trainer.clone(),
                    args,
                    env: Vec::new(),
                }
            })?;
            for copy in 0..(s.cores / t).max(1) {
                profiled.push(fit::profiled_run(&summary(copy), spec.clone(), run, t, 1)?);
            }
            if t == s.cores {
                memory.push(fit::memory_point(&summary(0), &spec, base, run)?);
            }
        }
    }
    Ok((profiled, memory))
}

/// Each expert-parallel run as one expert group of `cores ÷ threads` ranks, for every thread count
/// that makes a group of two or more.
fn profile_expert_parallel(s: &Settings, w: &Workers, threads: &[u64]) -> Result<Vec<ProfiledRun>> {
    let mut profiled = Vec::new();
    for (i, run) in EP_RUNS.iter().enumerate() {
        let model = run.model.arg(&s.work)?;
        let spec = resolve_model(&model)?;
        for &t in threads.iter().filter(|t| s.cores / **t >= 2) {
            let ranks = s.cores / t;
            let summary = s.work.join(format!("summary-ep-{i}-{t}.json"));
            let mut args = train_args(run, &model, PROFILE_STEPS, &summary);
            args.extend(["--ep".into(), ranks.to_string(), "--profile".into()]);
            let what = format!("expert-parallel run {} on {ranks} ranks", run.model.name);
            run_at_once(vec![w.under_mpirun(what, ranks, &w.trainer, args)], &s.work)?;
            profiled.push(fit::profiled_run(&summary, spec.clone(), run, t, ranks)?);
        }
    }
    Ok(profiled)
}

/// Step time of a data-parallel run on `2 × cores` ranks ÷ the same run on `cores` ranks, the median of
/// interleaved rounds.
fn time_share_ratio(s: &Settings, w: &Workers) -> Result<f64> {
    let run = &TIME_SHARE_RUN;
    let model = run.model.arg(&s.work)?;
    let mut ratios = Vec::new();
    for round in 0..TIME_SHARE_ROUNDS {
        let mut times = Vec::new();
        for ranks in [s.cores, 2 * s.cores] {
            let summary = s.work.join(format!("share-{ranks}-{round}.json"));
            let mut args = train_args(run, &model, TIME_SHARE_STEPS, &summary);
            args.extend(["--dp".into(), ranks.to_string()]);
            let what = format!("time-sharing run on {ranks} ranks");
            run_at_once(vec![w.under_mpirun(what, ranks, &w.trainer, args)], &s.work)?;
            times.push(fit::step_time(&summary)?);
        }
        ratios.push(times[1] / times[0]);
    }
    ratios.sort_by(f64::total_cmp);
    let mid = ratios.len() / 2;
    Ok(if ratios.len() % 2 == 0 { (ratios[mid - 1] + ratios[mid]) / 2.0 } else { ratios[mid] })
}
