//! All-to-all algorithms side by side in one run: uniform blocks of 1 KiB–16 MiB per peer, median over
//! iterations of the slowest rank's time, JSON out.

use std::time::Instant;

use piper_comm::alltoall::{Algo, all_to_all_v_bytes};
use piper_comm::collectives::{all_gather, barrier};
use piper_comm::{Communicator, Topology};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Algorithms, comma separated (flat, pairwise, halo).
    #[arg(long, value_delimiter = ',', default_value = "flat,halo")]
    algos: Vec<String>,
    /// Bytes per peer, comma separated, with KiB/MiB suffixes.
    #[arg(long, value_delimiter = ',', default_value = "1KiB,64KiB,1MiB,16MiB")]
    sizes: Vec<String>,
    /// Timed iterations per (algorithm, size), after 2 warm-up iterations.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Write the results here (rank 0).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// Parses `64KiB`, `1MiB`, `512`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = if let Some(x) = s.strip_suffix("MiB") {
        (x, 1 << 20)
    } else if let Some(x) = s.strip_suffix("KiB") {
        (x, 1 << 10)
    } else if let Some(x) = s.strip_suffix("GiB") {
        (x, 1 << 30)
    } else {
        (s, 1)
    };
    num.trim()
        .parse::<usize>()
        .map(|v| v * mult)
        .map_err(|_| format!("`--sizes`: `{s}` is not a size like 1KiB, 64KiB, 1MiB"))
}

pub fn run<C: Communicator>(world: &C, topo: &Topology, a: Args) -> Result<(), String> {
    let algos: Vec<Algo> =
        a.algos.iter().map(|s| Algo::parse(s)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let sizes: Vec<usize> = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<_, _>>()?;
    if a.iters == 0 {
        return Err("`--iters` must be ≥ 1".into());
    }
    let n = world.size();
    let per_node = topo.nodes().iter().map(Vec::len).max().unwrap_or(1);
    let mut results = Vec::new();
    for &bytes in &sizes {
        let send = vec![world.rank() as u8; bytes * n];
        let counts = vec![bytes; n];
        for &algo in &algos {
            let mut times = Vec::with_capacity(a.iters);
            for it in 0..a.iters + 2 {
                barrier(world, "bench barrier").map_err(|e| e.to_string())?;
                let t = Instant::now();
                all_to_all_v_bytes(algo, world, topo, &send, &counts, "bench all-to-all").map_err(|e| e.to_string())?;
                let dt = t.elapsed().as_secs_f64();
                let all = all_gather(world, &[dt], "bench timing").map_err(|e| e.to_string())?;
                if it >= 2 {
                    times.push(all.iter().map(|v| v[0]).fold(0.0, f64::max));
                }
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let gbps = (n - 1) as f64 * bytes as f64 / median / 1e9;
            results.push(json!({"algo": algo.name(), "bytes_per_peer": bytes, "ranks": n, "ranks_per_node": per_node, "nodes": topo.num_nodes(), "median_s": median, "gbps": gbps}));
        }
    }
    if world.rank() == 0 {
        println!("{:>10} {:>9} {:>12} {:>10}", "bytes/peer", "algo", "median", "GB/s/rank");
        for r in &results {
            println!(
                "{:>10} {:>9} {:>10.1}µs {:>10.3}",
                r["bytes_per_peer"],
                r["algo"].as_str().unwrap(),
                r["median_s"].as_f64().unwrap() * 1e6,
                r["gbps"].as_f64().unwrap()
            );
        }
        let doc = json!({"results": results, "note": "median over iterations of the slowest rank; gbps = (ranks − 1) · bytes_per_peer / median_s per rank"});
        if let Some(path) = &a.json {
            std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap())
                .map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
        }
    }
    Ok(())
}
