//! `piper-comm`: multi-rank self-test and all-to-all benchmark, run under
//! `mpirun` / `srun`.

mod bench;
mod dedup;
mod selftest;

use clap::{Parser, Subcommand};
use piper_comm::{Communicator, Topology};

/// Piper's communication layer, exercised for real: run me under mpirun or srun.
///
/// `selftest` checks every all-to-all algorithm against a host-side reference on random, skewed, zero and
/// empty counts; `bench` times the algorithms side by side and writes JSON (`piper calibrate` measures
/// the platform). Nodes are detected from host name + network namespace, Slurm's SLURM_NODEID, or forced with
/// --ranks-per-node (emulation).
#[derive(Parser)]
#[command(name = "piper-comm", version)]
struct Cli {
    /// Ranks per node (overrides detection; for emulating nodes on one machine).
    #[arg(long, global = true)]
    ranks_per_node: Option<usize>,
    /// Timeout of every blocking operation, seconds.
    #[arg(long, global = true, default_value_t = 60.0)]
    timeout_s: f64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Selftest(selftest::Args),
    Bench(bench::Args),
}

fn main() {
    let cli = Cli::parse();
    let (_runtime, mut world, _) = match piper_comm::mpi_backend::init() {
        Ok(x) => x,
        Err(e) => fail(&e.to_string()),
    };
    match piper_comm::communicator::parse_timeout(&cli.timeout_s.to_string(), "--timeout-s") {
        Ok(t) => world.set_timeout(t),
        Err(e) => fail(&e.to_string()),
    }
    let topo = match cli.ranks_per_node {
        Some(r) => Topology::uniform(world.size(), r),
        None => Topology::detect(&world),
    };
    let topo = topo.unwrap_or_else(|e| fail(&e.to_string()));
    let result = match cli.command {
        Command::Selftest(a) => selftest::run(&world, &topo, a),
        Command::Bench(a) => bench::run(&world, &topo, a),
    };
    if let Err(e) = result {
        let place = if e.contains("on world rank") { String::new() } else { format!("world rank {}: ", world.rank()) };
        fail(&format!("{place}{e}"));
    }
}

/// Prints one error line and ends this rank without MPI_Finalize (mpirun then ends the job).
fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(3);
}
