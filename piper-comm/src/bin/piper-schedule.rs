//! `piper-schedule`: records an all-to-all algorithm's message schedule from the real code (an
//! in-process world of `--nodes` × `--ranks-per-node` ranks, every rank sending the same bytes to every
//! peer), checks that it replays, and writes one text file per rank for the SMPI replayer
//! (`scripts/simulate-alltoall.sh`). With `--platform`, also prints the planner's predicted time of the
//! all-to-all at each `--bytes` as JSON lines, for the simulation to be compared with.

use std::path::PathBuf;
use std::process::exit;

use clap::Parser;
use piper_comm::schedule::{check, record_uniform, write_rank};
use piper_comm::{Algo, Topology};
use piper_planner::comm::{A2aAlgo, GroupShape, all_to_all_s};
use serde_json::json;

#[derive(Parser)]
#[command(name = "piper-schedule", version)]
struct Cli {
    /// flat, pairwise or halo.
    #[arg(long)]
    algo: String,
    #[arg(long)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    ranks_per_node: usize,
    /// Folder for rank-<r>.txt (created).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A preset name or platform file: print the planner's model of the all-to-all.
    #[arg(long)]
    platform: Option<String>,
    /// Bytes per peer for the model and the replay check, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    bytes: Vec<u64>,
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    exit(2)
}

fn main() {
    let cli = Cli::parse();
    let algo = Algo::parse(&cli.algo, "--algo").unwrap_or_else(|e| fail(&e.to_string()));
    if cli.nodes == 0 || cli.ranks_per_node == 0 {
        fail("--nodes and --ranks-per-node must be ≥ 1");
    }
    if let Some(b) = cli.bytes.iter().find(|b| **b == 0) {
        fail(&format!("--bytes {b}: every size must be ≥ 1 byte per peer"));
    }
    let ranks =
        cli.nodes.checked_mul(cli.ranks_per_node).unwrap_or_else(|| fail("--nodes × --ranks-per-node overflows"));
    let topo = Topology::uniform(ranks, cli.ranks_per_node).unwrap_or_else(|e| fail(&e.to_string()));
    if let Some(dir) = &cli.out {
        let schedule = record_uniform(algo, &topo).unwrap_or_else(|e| fail(&e.to_string()));
        for b in &cli.bytes {
            check(&schedule, *b).unwrap_or_else(|e| fail(&format!("at {b} bytes per peer: {e}")));
        }
        std::fs::create_dir_all(dir).unwrap_or_else(|e| fail(&format!("--out {}: {e}", dir.display())));
        for r in 0..ranks {
            let path = dir.join(format!("rank-{r}.txt"));
            std::fs::write(&path, write_rank(&schedule, r))
                .unwrap_or_else(|e| fail(&format!("writing {}: {e}", path.display())));
        }
    }
    if let Some(name) = &cli.platform {
        let platform = piper_planner::platform::resolve_platform(name).unwrap_or_else(|e| fail(&e.to_string()));
        if platform.gpus_per_node != cli.ranks_per_node as u64 {
            fail(&format!(
                "--ranks-per-node {} differs from the platform's {} GPUs per node",
                cli.ranks_per_node, platform.gpus_per_node
            ));
        }
        let shape = GroupShape::new(&platform, 0, ranks as u64, 1);
        for b in &cli.bytes {
            let model = |a: A2aAlgo| all_to_all_s(&platform, &shape, *b as f64, a);
            // The planner weighs flat and HALO (pairwise is priced as flat) and keeps the faster.
            let auto = if model(A2aAlgo::Halo) < model(A2aAlgo::Flat) { A2aAlgo::Halo } else { A2aAlgo::Flat };
            let row = json!({"bytes_per_peer": b, "model_s": model(algo), "auto": auto == algo});
            println!("{row}");
        }
    }
}
