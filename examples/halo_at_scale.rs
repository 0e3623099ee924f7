//! HALO vs flat all-to-all at Frontier scale, on paper: the planner's communication model fed with the
//! `frontier` platform (8 GCDs and 4 NICs per node, 4 nodes per switch, 128 per dragonfly group), one
//! expert group spanning 16–512 nodes, 4 KiB–16 MiB per peer — on the preset's own figures, and with
//! the per-message NIC cost fitted to the paper's trend (`paper::with_papers_message_costs`). Prints a
//! table and writes JSON.
//!
//! `cargo run --release --example halo_at_scale -- [--json FILE]`

use piper::planner::comm::{A2aAlgo, GroupShape, all_to_all_s};
use piper::planner::{paper, platform};

fn main() {
    let json_path = std::env::args().skip_while(|a| a != "--json").nth(1);
    let own = platform::preset("frontier").expect("frontier preset");
    let fitted = paper::with_papers_message_costs(&own);
    let sizes = [4096.0, 65536.0, 1048576.0, 16.0 * 1048576.0];
    let mut rows = Vec::new();
    println!(
        "{:>6} {:>6} {:>10} {:>12} {:>12} {:>8} {:>14}",
        "nodes", "ranks", "bytes/peer", "flat", "halo", "speedup", "paper-fitted"
    );
    for nodes in [16u64, 32, 64, 128, 256, 512] {
        let ranks = nodes * own.gpus_per_node;
        let time = |p: &platform::Platform, b: f64, algo| all_to_all_s(p, &GroupShape::new(p, 0, ranks, 1), b, algo);
        for b in sizes {
            let (flat, halo) = (time(&own, b, A2aAlgo::Flat), time(&own, b, A2aAlgo::Halo));
            let fitted_speedup = time(&fitted, b, A2aAlgo::Flat) / time(&fitted, b, A2aAlgo::Halo);
            println!(
                "{nodes:>6} {ranks:>6} {b:>10} {:>10.3}ms {:>10.3}ms {:>7.2}x {fitted_speedup:>13.2}x",
                flat * 1e3,
                halo * 1e3,
                flat / halo
            );
            rows.push(serde_json::json!({"nodes": nodes, "ranks": ranks, "bytes_per_peer": b, "flat_s": flat,
                "halo_s": halo, "speedup": flat / halo, "speedup_with_papers_message_costs": fitted_speedup}));
        }
    }
    if let Some(path) = json_path {
        let text = serde_json::to_string_pretty(&serde_json::json!({"platform": "frontier", "results": rows})).unwrap();
        if let Err(e) = piper::planner::atomic::write_atomic(std::path::Path::new(&path), text.as_bytes()) {
            eprintln!("error: {path}: {e}");
            std::process::exit(2);
        }
    }
}
