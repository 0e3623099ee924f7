//! The runtime half of `scripts/calibrate.sh`: what Burn's CPU backend pays on this machine per thread
//! count of a rank, and its real memory.
//!
//! `calibrate_runtime threads` — the thread counts a rank can get here (1, 2, 4, …, cores);
//! `calibrate_runtime measure --platform BASE.toml --threads T --json COSTS.json` — as one rank of T
//! threads, the runtime's element-wise, per-op and optimizer costs and its matmuls' efficiency (run
//! cores ÷ T of them at once, as ranks would run; BASE, piper-comm's output, gives the peak);
//! `calibrate_runtime write --platform BASE.toml --costs COSTS.json … --memory-runs RUNS.json
//! [--ranks-per-node N] --out OUT.toml` — the platform with those costs (the mean per thread count) and
//! the memory fitted from whole runs (`[{"params", "activation_bytes", "logits_bytes", "peak_rss_bytes"}, …]`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use piper::comm::launch::{host_cores, threads_per_rank};
use piper::planner::atomic::write_atomic;
use piper::planner::layout::TrainConfig;
use piper::planner::model::resolve_model;
use piper::planner::platform::{
    self, MemoryPoint, ProfiledRun, ThreadCosts, to_toml, with_runtime, with_step_costs, with_time_share,
};

/// mimalloc, never purging freed pages (see `piper::alloc`).
#[global_allocator]
static ALLOCATOR: piper::alloc::Allocator = piper::alloc::Allocator;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the thread counts to measure, one per line.
    Threads,
    /// Measure the runtime's costs as a rank of `--threads` threads, against the peak of `--platform`.
    Measure {
        #[arg(long)]
        platform: PathBuf,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
        threads: u64,
        #[arg(long)]
        json: PathBuf,
    },
    /// Write the platform with the measured costs and the fitted memory.
    Write {
        #[arg(long)]
        platform: PathBuf,
        #[arg(long, num_args = 1.., required = true)]
        costs: Vec<PathBuf>,
        #[arg(long)]
        memory_runs: PathBuf,
        /// Profiled runs: `[{"threads", "model", "batch", "seq", "summary", "ep"?}, …]` (`summary` a
        /// `mixtral_train --profile --summary` file; `ep` the expert group of an expert-parallel run).
        #[arg(long)]
        step_runs: PathBuf,
        /// Step time of a data-parallel run on 2 × cores ranks ÷ the same run on cores ranks.
        #[arg(long)]
        time_share_ratio: Option<f64>,
        /// Most ranks the platform places on one node (they share its cores and memory); default: 2 × cores.
        #[arg(long)]
        ranks_per_node: Option<u64>,
        #[arg(long)]
        out: PathBuf,
    },
}

/// The JSON file at `path`, parsed as `T`; errors name the file.
macro_rules! read_json {
    ($path:expr, $t:ty) => {{
        let path: &PathBuf = $path;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        serde_json::from_str::<$t>(&text).map_err(|e| format!("{}: {e}", path.display()))?
    }};
}

/// The profiled runs of `--step-runs`, each with its model and the profile rows of its summary.
fn profiled_runs(path: &PathBuf) -> Result<Vec<ProfiledRun>, Box<dyn std::error::Error>> {
    let files = read_json!(path, Vec<serde_json::Value>);
    let mut runs = Vec::new();
    for f in files {
        let count = |k: &str| f[k].as_u64().ok_or_else(|| format!("{}: `{k}` must be a count", path.display()));
        let (threads, batch, seq) = (count("threads")?, count("batch")?, count("seq")?);
        let ep = f["ep"].as_u64().unwrap_or(1);
        if ep == 0 || batch % ep != 0 {
            return Err(format!(
                "{}: `batch` {batch} must be a multiple of `ep` {ep} (sequences per step)",
                path.display()
            )
            .into());
        }
        let model = f["model"].as_str().ok_or_else(|| format!("{}: `model` must be a string", path.display()))?;
        let summary_path = PathBuf::from(f["summary"].as_str().unwrap_or_default());
        let summary = read_json!(&summary_path, serde_json::Value);
        let rows = summary["profile"]
            .as_array()
            .ok_or_else(|| format!("{}: no `profile` (run mixtral_train with --profile)", summary_path.display()))?
            .iter()
            .map(|r| {
                let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
                (text("phase"), text("op"), r["seconds"].as_f64().unwrap_or(f64::NAN))
            })
            .collect();
        // `batch` is the step's sequences: each rank of an expert group trains its share.
        let cfg = TrainConfig { micro_batch_size: batch / ep, dtype: "fp32".into(), ..TrainConfig::new(seq) };
        runs.push(ProfiledRun { threads, ep, spec: resolve_model(model)?, cfg, rows });
    }
    Ok(runs)
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let cores = host_cores();
    match a.command {
        Command::Threads => {
            for t in piper::modules::calibrate::thread_counts(cores) {
                println!("{t}");
            }
        }
        Command::Measure { platform: input, threads, json } => {
            let base = platform::load(&input).map_err(|e| e.to_string())?;
            // piper-comm's peak is per rank of `gpus_per_node` ranks sharing the cores.
            let rank_threads = threads_per_rank(cores, base.gpus_per_node as usize) as f64;
            let core_peak = base.peak_flops("fp32").map_err(|e| e.to_string())? / rank_threads;
            let measured = piper::modules::calibrate::measure_rank(threads, core_peak)?;
            let text = serde_json::to_string_pretty(&measured).expect("measurements serialise");
            write_atomic(&json, text.as_bytes()).map_err(|e| format!("{}: {e}", json.display()))?;
        }
        Command::Write { platform: input, costs, memory_runs, step_runs, time_share_ratio, ranks_per_node, out } => {
            let base = platform::load(&input).map_err(|e| e.to_string())?;
            let mut runs: Vec<ThreadCosts> = Vec::new();
            for path in &costs {
                runs.push(read_json!(path, ThreadCosts));
            }
            runs.sort_by_key(|r| r.threads);
            let threads = runs
                .chunk_by(|a, b| a.threads == b.threads)
                .map(|group| {
                    piper::modules::calibrate::mean_of(group).ok_or_else(|| {
                        format!(
                            "--costs: the {}-thread files measured other shapes; measure them with one build",
                            group[0].threads
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let runs = read_json!(&memory_runs, Vec<MemoryPoint>);
            let ranks = ranks_per_node.unwrap_or(2 * cores as u64);
            let calibrated = with_runtime(base, cores as u64, ranks, threads, &runs).map_err(|e| e.to_string())?;
            let profiled = profiled_runs(&step_runs)?;
            let mut calibrated = with_step_costs(calibrated, &profiled).map_err(|e| e.to_string())?;
            if let Some(ratio) = time_share_ratio {
                calibrated = with_time_share(calibrated, ratio).map_err(|e| e.to_string())?;
            }
            write_atomic(&out, to_toml(&calibrated).as_bytes()).map_err(|e| format!("{}: {e}", out.display()))?;
            let rc = calibrated.runtime.expect("set above");
            println!(
                "{}: {} cores, up to {ranks} ranks per node; one thread: op {:.2} µs, norm {:.2} / rope {:.2} / softmax {:.2} / swiglu {:.2} / element-wise {:.2} ns per element, AdamW {:.2} ns per parameter; memory {:.1} B per parameter, activations ×{:.2}, logits ×{:.2}, fixed {:.3} GiB",
                out.display(),
                cores,
                rc.op_overhead_us,
                rc.norm_ns,
                rc.rope_ns,
                rc.softmax_ns,
                rc.swiglu_ns,
                rc.elementwise_ns,
                rc.optimizer_ns_per_param,
                rc.bytes_per_param,
                rc.activation_factor,
                rc.logits_factor,
                calibrated.framework_overhead_gib
            );
        }
    }
    Ok(())
}

fn main() {
    piper::alloc::keep_freed_pages();
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
