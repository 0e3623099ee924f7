//! The runtime half of `scripts/calibrate.sh`: what Burn's CPU backend pays beyond GEMMs on this
//! machine, and its real memory.
//!
//! `calibrate_runtime measure --platform BASE.toml --json COSTS.json` — one rank's element-wise, per-op
//! and optimizer costs and the efficiency of its matmuls against BASE's per-rank peak (run one per rank
//! at once, e.g. under `mpirun`, so they share the cores as training ranks do);
//! `calibrate_runtime write --platform IN.toml --costs A.json B.json … --memory-runs RUNS.json --out
//! OUT.toml` — the platform with the mean costs and the memory fitted from whole runs
//! (`[{"params", "activation_bytes", "peak_rss_bytes"}, …]`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use piper::modules::calibrate::Measured;
use piper::planner::atomic::write_atomic;
use piper::planner::platform::{self, GemmTable, MemoryPoint, RuntimeCosts, to_toml, with_runtime};

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
    /// Measure this rank's costs, against the per-rank peak of `--platform` (piper-comm's output).
    Measure {
        #[arg(long)]
        platform: PathBuf,
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
        #[arg(long)]
        out: PathBuf,
    },
}

fn read_json(path: &PathBuf) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn measured_of(path: &PathBuf) -> Result<Measured, String> {
    serde_json::from_value(read_json(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

/// The mean over ranks of each efficiency point. Every file must hold the same shapes and sizes as the
/// first (files from another build or another machine are refused, naming the file).
fn mean_tables(all: &[Measured], files: &[PathBuf]) -> Result<(Vec<GemmTable>, Vec<[f64; 2]>), String> {
    let grid = |m: &Measured| {
        let gemm: Vec<(u64, u64, Vec<f64>)> =
            m.gemm_efficiency.iter().map(|t| (t.n, t.k, t.points.iter().map(|p| p[0]).collect())).collect();
        (gemm, m.attention_efficiency.iter().map(|p| p[0]).collect::<Vec<f64>>())
    };
    if let Some((_, file)) = all.iter().zip(files).find(|(m, _)| grid(m) != grid(&all[0])) {
        return Err(format!(
            "{}: measured other GEMM shapes or sequence lengths than {}; measure every rank with the same build",
            file.display(),
            files[0].display()
        ));
    }
    let n = all.len() as f64;
    let mut gemm = all[0].gemm_efficiency.clone();
    for (t, table) in gemm.iter_mut().enumerate() {
        for (i, point) in table.points.iter_mut().enumerate() {
            point[1] = all.iter().map(|m| m.gemm_efficiency[t].points[i][1]).sum::<f64>() / n;
        }
    }
    let mut attention = all[0].attention_efficiency.clone();
    for (i, point) in attention.iter_mut().enumerate() {
        point[1] = all.iter().map(|m| m.attention_efficiency[i][1]).sum::<f64>() / n;
    }
    Ok((gemm, attention))
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    match a.command {
        Command::Measure { platform: input, json } => {
            piper::modules::runtime::threads::share_cores()?;
            let base = platform::load(&input).map_err(|e| e.to_string())?;
            let peak = base.peak_flops("fp32").map_err(|e| e.to_string())?;
            let measured = piper::modules::calibrate::measure(&burn::tensor::Device::flex().autodiff(), peak);
            let text = serde_json::to_string_pretty(&measured).expect("measurements serialise");
            write_atomic(&json, text.as_bytes()).map_err(|e| format!("{}: {e}", json.display()))?;
            println!("{text}");
        }
        Command::Write { platform: input, costs, memory_runs, out } => {
            let mut base = platform::load(&input).map_err(|e| e.to_string())?;
            let measured: Vec<Measured> = costs.iter().map(measured_of).collect::<Result<_, _>>()?;
            let (gemm, attention) = mean_tables(&measured, &costs)?;
            base.gemm_efficiency = gemm;
            base.attention_efficiency = attention;
            let costs: Vec<RuntimeCosts> = measured.iter().map(|m| m.runtime).collect();
            // More ranks than cores (an oversubscribed CPU box): the time model needs to know.
            let cores = piper::comm::launch::host_cores() as u64;
            base.cores_per_node = (cores < base.gpus_per_node).then_some(cores);
            let runs: Vec<MemoryPoint> = serde_json::from_value(read_json(&memory_runs)?)
                .map_err(|e| format!("{}: {e}", memory_runs.display()))?;
            let calibrated = with_runtime(base, &costs, &runs).map_err(|e| e.to_string())?;
            write_atomic(&out, to_toml(&calibrated).as_bytes()).map_err(|e| format!("{}: {e}", out.display()))?;
            let rc = calibrated.runtime.expect("set above");
            println!(
                "{}: op {:.2} µs, norm {:.2} / rope {:.2} / softmax {:.2} / swiglu {:.2} / element-wise {:.2} ns per element, AdamW {:.2} ns per parameter; memory {:.1} B per parameter, activations ×{:.2}, logits ×{:.2}, fixed {:.3} GiB",
                out.display(),
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
