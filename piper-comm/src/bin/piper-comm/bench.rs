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
    /// Also time an MoE token dispatch with this top-k: flat and HALO on the expanded copies, and the
    /// per-node deduplicating dispatch (0 = skip).
    #[arg(long, default_value_t = 0)]
    dispatch_top_k: usize,
    /// Tokens per rank for --dispatch-top-k.
    #[arg(long, default_value_t = 256)]
    dispatch_tokens: usize,
    /// Bytes per token row for --dispatch-top-k (hidden size × element bytes).
    #[arg(long, default_value_t = 4096)]
    row_bytes: usize,
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
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("`--sizes`: `{s}` is not a size like 1KiB, 64KiB, 1MiB"))
}

pub fn run<C: Communicator>(world: &C, topo: &Topology, a: Args) -> Result<(), String> {
    let algos: Vec<Algo> =
        a.algos.iter().map(|s| Algo::parse(s, "--algos")).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let sizes: Vec<usize> = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<_, _>>()?;
    if !(1..=1_000_000).contains(&a.iters) {
        return Err(format!("`--iters` is {}; it must be in 1..=1000000", a.iters));
    }
    let n = world.size();
    let per_node = topo.nodes().iter().map(Vec::len).max().unwrap_or(1);
    // Send, receive and HALO's relay buffers: about 4 × bytes per peer × ranks, on every rank of a node.
    let memory = piper_comm::collectives::max_receive_bytes();
    for &bytes in &sizes {
        if bytes.checked_mul(4 * n * per_node).is_none_or(|b| b > memory) {
            return Err(format!(
                "`--sizes` {bytes} bytes per peer needs about 4 × {bytes} × {n} ranks × {per_node} ranks per node, more than this machine's {memory} bytes"
            ));
        }
    }
    if a.dispatch_top_k > 0 {
        if a.row_bytes == 0 {
            return Err("`--row-bytes` must be ≥ 1 (hidden size × element bytes)".into());
        }
        let need = a.dispatch_tokens.checked_mul(a.dispatch_top_k).and_then(|x| x.checked_mul(a.row_bytes));
        if need.and_then(|x| x.checked_mul(4 * per_node)).is_none_or(|b| b > memory) {
            return Err(format!(
                "`--dispatch-tokens` {} × top-{} × {} bytes per row, on {per_node} ranks per node, exceeds this machine's {memory} bytes",
                a.dispatch_tokens, a.dispatch_top_k, a.row_bytes
            ));
        }
    }
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
                    times.push(all.iter().map(|v| v[0]).max_by(f64::total_cmp).unwrap_or(f64::NAN));
                }
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let gbps = (n - 1) as f64 * bytes as f64 / median / 1e9;
            results.push(json!({"algo": algo.name(), "bytes_per_peer": bytes, "ranks": n, "ranks_per_node": per_node, "nodes": topo.num_nodes(), "median_s": median, "gbps": gbps}));
        }
    }
    if a.dispatch_top_k > 0 {
        results.extend(dispatch(world, topo, &a)?);
    }
    if world.rank() == 0 {
        println!("{:>10} {:>9} {:>12} {:>10}", "bytes/peer", "algo", "median", "GB/s/rank");
        for r in results.iter().filter(|r| r["bytes_per_peer"].is_number()) {
            println!(
                "{:>10} {:>9} {:>10.1}µs {:>10.3}",
                r["bytes_per_peer"],
                r["algo"].as_str().unwrap(),
                r["median_s"].as_f64().unwrap() * 1e6,
                r["gbps"].as_f64().unwrap()
            );
        }
        for r in results.iter().filter(|r| r["dispatch_top_k"].is_number()) {
            println!(
                "dispatch top-{} {} tokens × {} B: {:>10} {:>10.1}µs, inter-node rows {}",
                r["dispatch_top_k"],
                r["tokens_per_rank"],
                r["row_bytes"],
                r["algo"].as_str().unwrap(),
                r["median_s"].as_f64().unwrap() * 1e6,
                r["inter_node_rows"]
            );
        }
        let doc = json!({"results": results, "note": "median over iterations of the slowest rank; gbps = (ranks − 1) · bytes_per_peer / median_s per rank"});
        if let Some(path) = &a.json {
            piper_planner::atomic::write_atomic(path, serde_json::to_string_pretty(&doc).unwrap().as_bytes())
                .map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Times one MoE dispatch three ways: flat and HALO all-to-all of the expanded token copies, and the
/// deduplicating dispatch. Experts: 4 per rank; each token picks `top_k` distinct experts at random.
fn dispatch<C: Communicator>(world: &C, topo: &Topology, a: &Args) -> Result<Vec<serde_json::Value>, String> {
    use crate::dedup::dispatch_dedup;
    use piper_comm::GroupNodes;
    let n = world.size();
    let me = world.rank();
    let experts = 4 * n;
    if a.dispatch_top_k > experts {
        return Err(format!("`--dispatch-top-k` {} exceeds the {experts} experts (4 per rank)", a.dispatch_top_k));
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ me as u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let dests: Vec<Vec<usize>> = (0..a.dispatch_tokens)
        .map(|_| {
            let mut chosen: Vec<usize> = Vec::new();
            while chosen.len() < a.dispatch_top_k {
                let e = (next() % experts as u64) as usize;
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            chosen.into_iter().map(|e| e / 4).collect()
        })
        .collect();
    let rows = vec![me as u8; a.dispatch_tokens * a.row_bytes];
    // Expanded copies grouped by destination rank (what a flat dispatch sends).
    let mut counts = vec![0usize; n];
    let mut expanded = Vec::new();
    for (d, count) in counts.iter_mut().enumerate() {
        for (t, ds) in dests.iter().enumerate() {
            for _ in ds.iter().filter(|x| **x == d) {
                expanded.extend_from_slice(&rows[t * a.row_bytes..(t + 1) * a.row_bytes]);
                *count += a.row_bytes;
            }
        }
    }
    let layout = GroupNodes::new(world, topo).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for name in ["flat", "halo", "halo-dedup"] {
        let mut times = Vec::new();
        let mut inter = 0usize;
        for it in 0..a.iters + 2 {
            barrier(world, "bench barrier").map_err(|e| e.to_string())?;
            let t = Instant::now();
            match name {
                "flat" => drop(
                    all_to_all_v_bytes(Algo::Flat, world, topo, &expanded, &counts, "dispatch")
                        .map_err(|e| e.to_string())?,
                ),
                "halo" => drop(
                    all_to_all_v_bytes(Algo::Halo, world, topo, &expanded, &counts, "dispatch")
                        .map_err(|e| e.to_string())?,
                ),
                _ => {
                    let (_, _, traffic) = dispatch_dedup(world, &layout, &rows, a.row_bytes, &dests, "dispatch")
                        .map_err(|e| e.to_string())?;
                    inter = traffic.dedup_inter_node_rows;
                }
            }
            let dt = t.elapsed().as_secs_f64();
            if name != "halo-dedup" {
                inter = dests
                    .iter()
                    .flatten()
                    .filter(|d| topo.node_of[world.world_ranks()[**d]] != topo.node_of[world.world_ranks()[me]])
                    .count();
            }
            let all = all_gather(world, &[dt], "bench timing").map_err(|e| e.to_string())?;
            if it >= 2 {
                times.push(all.iter().map(|v| v[0]).max_by(f64::total_cmp).unwrap_or(f64::NAN));
            }
        }
        let inter: usize = all_gather(world, &[inter as u64], "bench traffic")
            .map_err(|e| e.to_string())?
            .iter()
            .map(|v| v[0] as usize)
            .sum();
        times.sort_by(f64::total_cmp);
        out.push(json!({"algo": name, "dispatch_top_k": a.dispatch_top_k, "tokens_per_rank": a.dispatch_tokens, "row_bytes": a.row_bytes,
            "ranks": n, "nodes": topo.num_nodes(), "median_s": times[times.len() / 2], "inter_node_rows": inter}));
    }
    Ok(out)
}
