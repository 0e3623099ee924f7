//! `piper memory`.

use piper_planner::Result;
use piper_planner::limits::max_or_zero;
use piper_planner::memory::Footprint;
use serde_json::json;

use super::{OneLayout, Resolved};
use crate::table::{ByteUnit, table};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    one: OneLayout,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<String> {
    let mut out = String::new();
    let resolved = a.one.resolve()?;
    let Resolved { spec, platform, layout, cfg, split } = &resolved;
    let stages = Footprint::new(spec, platform, layout, cfg)?.stages(split);
    let cap = platform.gpu_memory_bytes();
    if a.json {
        let doc = json!({
            "model": spec.name, "platform": platform.name, "layout": layout, "config": cfg,
            "gpu_memory_bytes": cap,
            "fits": stages.iter().all(|s| s.total_bytes <= cap),
            "stages": stages,
        });
        outln!(out, "{}", serde_json::to_string_pretty(&doc).expect("json"));
        return Ok(out);
    }
    let unit = ByteUnit::for_largest(max_or_zero(stages.iter().map(|s| s.total_bytes)));
    let gib = |b: f64| unit.of(b);
    outln!(out, "{}; {} per GPU (capacity {})", resolved.headline(), unit.0, gib(cap));
    let mut t = table(&[
        "stage",
        "layers",
        "in flight",
        "params",
        "grads",
        "optimizer",
        "activations",
        "overhead",
        "total",
        "fits",
    ]);
    for s in &stages {
        t.add_row(vec![
            s.stage.to_string(),
            format!("{}..{}", s.first_layer, s.first_layer + s.num_layers),
            s.in_flight.to_string(),
            gib(s.params_bytes),
            gib(s.grads_bytes),
            gib(s.optimizer_bytes),
            gib(s.activation_bytes),
            gib(s.overhead_bytes),
            gib(s.total_bytes),
            if s.total_bytes <= cap { "yes".into() } else { format!("NO (+{})", gib(s.total_bytes - cap)) },
        ]);
    }
    outln!(out, "{t}");
    let peak = stages.iter().max_by(|x, y| x.total_bytes.total_cmp(&y.total_bytes)).expect("pp ≥ 1");
    let act = &peak.activations;
    outln!(
        out,
        "stage {} activations ({}): attention {}, scores {}, routed experts {}, shared {}, dense MLP {}, router {}, MLP input {}, checkpoints {}, recompute working set {}, logits {}",
        peak.stage,
        unit.0,
        gib(act.attention),
        gib(act.attention_scores),
        gib(act.routed_experts),
        gib(act.shared_experts),
        gib(act.dense_mlp),
        gib(act.router),
        gib(act.mlp_input),
        gib(act.checkpoints),
        gib(act.recompute_working_set),
        gib(act.logits)
    );
    Ok(out)
}
