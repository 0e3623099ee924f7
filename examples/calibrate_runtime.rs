//! The measuring worker of `piper calibrate` (which launches it; it is not a command of its own).
//!
//! `calibrate_runtime links --out BASE.toml` — under mpirun, every rank at once: the peak, the links
//! inside a node and between nodes, and the memory bandwidth (`piper_comm::calibrate`);
//! `calibrate_runtime measure --platform BASE.toml --threads T --json COSTS.json` — as one rank of T
//! threads, Burn's CPU backend's element-wise, per-op and optimizer costs and its matmuls' efficiency
//! by shape (`piper_burn::calibrate`; `piper calibrate` runs cores ÷ T of them at once, as ranks run).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use piper::comm::Topology;
use piper::comm::calibrate::measure_links;
use piper::comm::launch::{host_cores, init_world, threads_per_rank};
use piper::planner::atomic::write_atomic;
use piper::planner::platform::{self, to_toml};

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
    /// Measure the peak, the links and the memory bandwidth on every rank of the launch.
    Links {
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure the runtime's costs as a rank of `--threads` threads, against the peak of `--platform`.
    Measure {
        #[arg(long)]
        platform: PathBuf,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
        threads: u64,
        #[arg(long)]
        json: PathBuf,
    },
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    match a.command {
        Command::Links { out } => {
            let world = init_world()?;
            let topo = Topology::detect(world.comm.as_ref())?;
            if let Some(links) = measure_links(world.comm.as_ref(), &topo, "local")? {
                write_atomic(&out, to_toml(&links.platform).as_bytes())
                    .map_err(|e| format!("{}: {e}", out.display()))?;
                println!("{}", links.summary);
            }
        }
        Command::Measure { platform: input, threads, json } => {
            let base = platform::load(&input).map_err(|e| e.to_string())?;
            // The links' peak is per rank of `gpus_per_node` ranks sharing the cores.
            let rank_threads = threads_per_rank(host_cores(), base.gpus_per_node as usize) as f64;
            let core_peak = base.peak_flops("fp32").map_err(|e| e.to_string())? / rank_threads;
            let measured = piper::modules::calibrate::measure_rank(threads, core_peak)?;
            let text = serde_json::to_string_pretty(&measured).expect("measurements serialise");
            write_atomic(&json, text.as_bytes()).map_err(|e| format!("{}: {e}", json.display()))?;
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
