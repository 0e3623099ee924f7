//! Train a small Mixtral-style MoE language model and watch it learn.
//!
//! `cargo run --release --example mixtral_train` trains the `tiny` preset on a seeded synthetic grammar
//! whose entropy rate is known, so the best possible loss is printed beside the achieved one. `--data
//! FILE` trains on any UTF-8 text (byte-level tokens); `--metrics FILE.jsonl` writes a JSON line per step,
//! `--summary FILE.json` the run summary, `--profile` where the time of a step goes.
//!
//! Multi-rank (built with `--features mpi`): `mpirun -np 4 target/release/examples/mixtral_train --plan
//! plan.json` runs the plan `piper plan --out plan.json` wrote; `--plan auto` asks the planner; `--pp
//! --ep --dp --micro-batches --schedule` give the layout by hand. Every layout trains the same model:
//! the loss curve equals the one-process run's. Policy lives in `piper_burn::runtime`.

use clap::{CommandFactory, Parser, ValueEnum};
use piper::comm::Topology;
use piper::comm::launch::init_world;
use piper::modules::runtime::cli::{self, ResolvedRun, RunArgs};
use piper::modules::runtime::report::describe_run;
use piper::modules::runtime::run_file::{expand_config, run_file_beside, write_run_file};
use piper::modules::runtime::threads::ThreadShare;
use piper::modules::runtime::{self, Job, Reporter};
use piper::planner::model::training_flops_per_token;

#[derive(Clone, Copy, Debug, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Backend {
    Flex,
    Ndarray,
    Wgpu,
    Rocm,
}

/// mimalloc, never purging freed pages (see `piper::alloc`).
#[global_allocator]
static ALLOCATOR: piper::alloc::Allocator = piper::alloc::Allocator;

/// Train an MoE language model, on one process or under mpirun.
#[derive(Parser, Debug, serde::Serialize)]
#[command(version, allow_negative_numbers = true, args_override_self = true)]
struct Args {
    #[command(flatten)]
    #[serde(flatten)]
    run: RunArgs,
    #[arg(long, value_enum, default_value_t = Backend::Flex)]
    backend: Backend,
}
fn device(backend: Backend) -> Result<burn::tensor::Device, String> {
    match backend {
        Backend::Flex => Ok(burn::tensor::Device::flex()),
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        Backend::Ndarray => Ok(burn::tensor::Device::ndarray()),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => Ok(burn::tensor::Device::wgpu(Default::default())),
        #[cfg(feature = "rocm")]
        Backend::Rocm => Ok(burn::tensor::Device::rocm(0usize)),
        #[allow(unreachable_patterns)]
        other => {
            Err(format!("--backend {other:?} is not compiled in: rebuild with `--features {other:?}`").to_lowercase())
        }
    }
}

fn run(
    a: Args,
    world: &dyn piper::comm::Communicator,
    threads: Option<ThreadShare>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ResolvedRun { spec, platform, config, plan, checkpoint, resume, init_hf } = a.run.resolve(world.size())?;
    let log = runtime::log::LogFilter::resolve(a.run.log.as_deref())?;
    let mut corpus = a.run.corpus(spec.vocab_size as usize, &config)?;
    let device = device(a.backend)?;
    let peak_flops = a.run.peak_tflops.map_or_else(|| runtime::measure_peak_flops(&device), |t| t * 1e12);
    let flops_per_token = training_flops_per_token(&spec, config.seq_len as u64).total();
    let job = Job {
        spec,
        run: config,
        plan,
        world,
        topo: Topology::detect(world)?,
        platform,
        device,
        flops_per_token,
        peak_flops,
        checkpoint,
        resume,
        init_hf,
        schedule: None,
    };
    job.check(corpus.as_ref()).map_err(cli::as_flags)?;
    let (spec, config, plan) = (&job.spec, &job.run, &job.plan);
    let steps_done = job.resume.as_ref().map_or(0, |r| r.manifest.step as usize);
    let mut reporter = Reporter::new(a.run.report_options(steps_done), world.rank(), config.steps)?;
    if let (Some(metrics), 0) = (&a.run.metrics, world.rank()) {
        write_run_file(&run_file_beside(metrics), &a)?;
    }
    if let Some(r) = &job.resume {
        reporter.println(&format!("resuming from {} after step {steps_done}", r.folder.display()));
    }
    for line in describe_run(spec, plan, &corpus.describe(), &format!("{:?}", a.backend), peak_flops) {
        reporter.println(&line);
    }
    if let Some(note) = job.uncalibrated_note() {
        reporter.println(&note);
    }
    match threads {
        Some(t) => reporter.println(&format!("threads: {} per rank ({})", t.threads, t.why)),
        None => reporter.println("threads: as RAYON_NUM_THREADS says"),
    }
    if a.run.profile {
        runtime::profile::enable();
    }
    let recorder = match (a.run.trace.as_deref(), log) {
        (Some(out), log) => Some(runtime::trace::TraceRecorder::start(out, log)?),
        (None, log) => {
            log.map(runtime::log::LogFilter::install).transpose()?;
            None
        }
    };
    let trained = runtime::execute(&job, corpus.as_mut(), |m| reporter.observe(m)).map_err(cli::as_flags)?;
    reporter.finish()?;
    if let Some(recorder) = recorder
        && let Some(path) = recorder.finish(world, &runtime::trace::rank_name(plan, world.rank()))?
    {
        println!("timeline written to {} (open it in ui.perfetto.dev)", path.display().to_string().escape_debug());
    }
    if let (Some(p), 0) = (&trained.profile, world.rank()) {
        p.table().iter().for_each(|l| println!("{l}"));
    }
    if let (Some(s), 0) = (trained.resume_seconds, world.rank()) {
        println!("resumed in {s:.2} s (rank 0's part of the checkpoint)");
    }
    let summary = trained.summary(plan, flops_per_token);
    if world.rank() == 0 {
        summary.plan_vs_measured().iter().for_each(|l| println!("{l}"));
        let best = corpus.best_loss();
        let gap = best.map_or(String::new(), |b| format!(", best possible {b:.4} (gap {:.4})", summary.final_loss - b));
        println!(
            "first loss {:.4}, final loss (mean of the last steps) {:.4}{gap}",
            summary.first_loss, summary.final_loss
        );
        if let Some(l) = summary.eval_loss {
            println!("held-out loss {l:.4} (perplexity {:.2}) after the last step", l.exp());
        }
        let mfu = 100.0 * summary.mfu_measured_peak;
        println!("median {:.0} tokens/s, MFU {mfu:.1}% of the measured peak × ranks", summary.tokens_per_s);
        if let Some(path) = &a.run.summary {
            summary.write(path)?;
        }
        if let Some(dir) = &a.run.plots {
            let m = a.run.metrics.as_deref();
            match runtime::report::plots::write_run_plots(dir, m, &trained.metrics, best) {
                Ok(_) => println!("pictures written to {}", dir.display().to_string().escape_debug()),
                Err(e) => eprintln!("warning: the pictures were not drawn: {e}"),
            }
        }
        if let Err(e) = runtime::report::append_history(a.run.history.as_deref(), spec, plan, &summary) {
            eprintln!("warning: the run's line in the history was not kept: {e}");
        }
    }
    Ok(())
}

fn main() {
    piper::alloc::keep_freed_pages();
    let args = expand_config(std::env::args_os().collect(), &Args::command()).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    let args = Args::parse_from(args);
    // A failed collective panics inside the autodiff graph with a message naming the operation, group
    // and missing ranks: print it and leave at once — unwinding would reach MPI_Finalize, which waits
    // for the missing rank.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        eprintln!("error: {}", msg.unwrap_or_else(|| info.to_string()));
        std::process::exit(3);
    }));
    let world = init_world().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    // Before anything starts the thread pool: ranks on one host (as MPI counts them) share its cores.
    let threads = piper::modules::runtime::threads::share_cores(world.local_ranks).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    if let Err(e) = run(args, world.comm.as_ref(), threads) {
        eprintln!("error: {e}");
        // Leave without finalising MPI: the other ranks may be gone or stuck.
        std::process::exit(2);
    }
}
