//! `piper memory`.

use piper_planner::Result;
use piper_planner::layout::{Layout, StageSplit};
use piper_planner::memory::Footprint;
use piper_planner::model::resolve_model;
use piper_planner::platform::resolve_platform;
use serde_json::json;

use super::{RecomputeArg, ScheduleArg, TrainArgs};
use crate::table::{gib, table};

#[derive(clap::Args)]
pub struct Args {
    /// Model: preset name or file (HF config.json or native spec).
    #[arg(long)]
    model: String,
    /// Platform: preset (frontier, nvlink-8, local) or TOML file.
    #[arg(long, default_value = "frontier")]
    platform: String,
    /// Pipeline stages.
    #[arg(long, default_value_t = 1)]
    pp: u64,
    /// Expert-parallel ranks per expert group (must divide the routed experts).
    #[arg(long, default_value_t = 1)]
    ep: u64,
    /// Data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    dp: u64,
    /// Sequences per micro-batch per rank.
    #[arg(long, default_value_t = 1)]
    micro_batch_size: u64,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    num_micro_batches: u64,
    #[arg(long, value_enum, default_value_t = ScheduleArg::OneFOneB)]
    schedule: ScheduleArg,
    #[arg(long, value_enum, default_value_t = RecomputeArg::None)]
    recompute: RecomputeArg,
    /// Layers per stage, e.g. 15,16,16,14 (default: even, remainder on the last stages).
    #[arg(long)]
    split: Option<String>,
    #[command(flatten)]
    train: TrainArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<String> {
    let mut out = String::new();
    let spec = resolve_model(&a.model)?;
    let platform = resolve_platform(&a.platform)?;
    let layout = Layout { pp: a.pp, ep: a.ep, dp: a.dp };
    layout.validate(&spec, None)?;
    let cfg = piper_planner::layout::TrainConfig {
        micro_batch_size: a.micro_batch_size,
        num_micro_batches: a.num_micro_batches,
        schedule: a.schedule.into(),
        recompute: a.recompute.into(),
        ..a.train.config()
    };
    cfg.validate_for(&layout)?;
    let split = match &a.split {
        Some(s) => StageSplit::parse(s, spec.num_layers, a.pp)?,
        None => StageSplit::even(spec.num_layers, a.pp),
    };
    let stages = Footprint::new(&spec, &platform, &layout, &cfg)?.stages(&split);
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
    outln!(
        out,
        "{} on {}: PP={} EP={} DP={}, micro-batch {}×{} tokens, M={}, {}, recompute {}; GiB per GPU (capacity {})",
        spec.name,
        platform.name,
        a.pp,
        a.ep,
        a.dp,
        a.micro_batch_size,
        a.train.seq_len,
        a.num_micro_batches,
        cfg.schedule.name(),
        cfg.recompute.name(),
        gib(cap)
    );
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
        "stage {} activations (GiB): attention {}, scores {}, routed experts {}, shared {}, dense MLP {}, router {}, MLP input {}, checkpoints {}, recompute working set {}, logits {}",
        peak.stage,
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
