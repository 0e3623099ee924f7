//! How long the planner takes to search the whole space, side by side for several models and GPU
//! counts (1024 GPUs should take well under a second). Writes JSON to
//! `$CARGO_TARGET_DIR/piper-bench/plan_search.json` (or `target/…`) and prints it.
//!
//! Run: `cargo bench -p piper-planner --bench plan_search`.

use std::time::Instant;

use piper_planner::model::preset;
use piper_planner::planner::{EpDomain, PlanRequest, plan};
use piper_planner::platform;

fn main() {
    let frontier = platform::preset("frontier").unwrap();
    let cases = [
        ("mixtral-8x7b", 1024u64, 1024u64, EpDomain::Node),
        ("deepseek-v3", 1024, 2048, EpDomain::Switch),
        ("piper-1.7t", 1024, 2048, EpDomain::Any),
        ("qwen3-235b-a22b", 256, 512, EpDomain::Node),
    ];
    let mut rows = Vec::new();
    for (model, gpus, batch, domain) in cases {
        let spec = preset(model).unwrap();
        let req = PlanRequest { ep_domain: domain, ..PlanRequest::new(gpus, batch, 4096) };
        let mut times = Vec::new();
        let mut report = None;
        for _ in 0..7 {
            let t = Instant::now();
            report = Some(plan(&spec, &frontier, &req).unwrap());
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let report = report.unwrap();
        rows.push(serde_json::json!({
            "model": model, "gpus": gpus, "global_batch": batch, "ep_domain": format!("{domain:?}"),
            "configurations": report.evaluated, "feasible_top_mfu": report.plans.first().map(|p| p.mfu),
            "median_s": times[times.len() / 2], "min_s": times[0],
        }));
    }
    let doc = serde_json::json!({"bench": "plan_search", "results": rows});
    let text = serde_json::to_string_pretty(&doc).unwrap();
    println!("{text}");
    let dir = std::path::PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()))
        .join("piper-bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plan_search.json"), text).unwrap();
}
