//! `piper model`.

use piper_planner::Result;
use piper_planner::model::{self, ModelSpec, active_params, param_breakdown, training_flops_per_token};
use serde_json::json;

use crate::table::{count, table};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["preset", "hf_config", "model", "list"])))]
pub struct Args {
    /// A named preset (see --list).
    #[arg(long)]
    preset: Option<String>,
    /// A Hugging Face config.json (mixtral, qwen2_moe, qwen3_moe, deepseek_v2/v3, olmoe, gpt_oss, dbrx, llama4).
    #[arg(long, value_name = "FILE")]
    hf_config: Option<String>,
    /// A preset name or a model file (HF config.json or native spec).
    #[arg(long)]
    model: Option<String>,
    /// List the presets.
    #[arg(long)]
    list: bool,
    /// Sequence length for the attention FLOPs.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=piper_planner::limits::MAX_SEQ_LEN))]
    seq_len: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Print the parsed model as a native spec (JSON, `"model_type": "piper"`), to edit and reuse.
    #[arg(long)]
    spec_json: bool,
}

pub fn run(a: Args) -> Result<String> {
    let mut out = String::new();
    if a.list {
        for name in model::preset_names() {
            outln!(out, "{name}");
        }
        return Ok(out);
    }
    let spec = match (&a.preset, &a.hf_config, &a.model) {
        (Some(p), _, _) => model::preset(p)?,
        (_, Some(f), _) => model::presets::load_model_str(
            &std::fs::read_to_string(f)
                .map_err(|e| piper_planner::Error::file(f.clone(), format!("cannot read: {e}")))?,
            f,
        )?,
        (_, _, Some(m)) => model::resolve_model(m)?,
        _ => unreachable!("clap requires one source"),
    };
    if a.spec_json {
        let mut v = serde_json::to_value(&spec).expect("specs serialise");
        v["model_type"] = "piper".into();
        outln!(out, "{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(out);
    }
    report(&mut out, &spec, a.seq_len, a.json);
    Ok(out)
}

fn report(out: &mut String, spec: &ModelSpec, seq_len: u64, as_json: bool) {
    let params = param_breakdown(spec);
    let total = params.total();
    let active = active_params(spec);
    let flops = training_flops_per_token(spec, seq_len);
    let convention = "Megatron-LM num_floating_point_operations: forward+backward (3x forward GEMMs), causal attention (half of s^2), logits included, router excluded";
    if as_json {
        let doc = json!({
            "name": spec.name,
            "model_type": spec.model_type,
            "seq_len": seq_len,
            "total_params": total,
            "active_params": active,
            "flops_per_token": flops.total(),
            "flops_convention": convention,
            "params": params,
            "flops": flops,
            "layers": {"total": spec.num_layers, "moe": spec.num_moe_layers(), "dense": spec.num_dense_layers(), "mtp": spec.mtp_depth},
        });
        outln!(out, "{}", serde_json::to_string_pretty(&doc).expect("json"));
        return;
    }
    outln!(
        out,
        "{} ({}): {} layers ({} MoE, {} dense), d = {}, vocab = {}",
        spec.name,
        spec.model_type,
        spec.num_layers,
        spec.num_moe_layers(),
        spec.num_dense_layers(),
        spec.hidden_size,
        spec.vocab_size
    );
    if let Some(moe) = &spec.moe {
        outln!(
            out,
            "experts: {} routed (top-{}), {} shared, expert FFN {} ({})",
            moe.num_experts,
            moe.top_k,
            moe.num_shared_experts,
            moe.expert.intermediate_size,
            if moe.expert.gated { "gated, 3 matrices" } else { "plain, 2 matrices" }
        );
    }
    let mut t = table(&["component", "parameters", "share"]);
    let rows = [
        ("embedding", params.embedding),
        ("lm_head", params.lm_head),
        ("attention", params.attention),
        ("dense_mlp", params.dense_mlp),
        ("routed_experts", params.routed_experts),
        ("shared_experts", params.shared_experts),
        ("router", params.router),
        ("norms", params.norms),
        ("mtp", params.mtp),
    ];
    for (name, n) in rows.iter().filter(|(_, n)| *n > 0) {
        t.add_row(vec![name.to_string(), count(*n as f64), format!("{:.1}%", 100.0 * *n as f64 / total as f64)]);
    }
    t.add_row(vec!["total".into(), count(total as f64), "100.0%".into()]);
    t.add_row(vec![
        "active per token".into(),
        count(active as f64),
        format!("{:.1}%", 100.0 * active as f64 / total as f64),
    ]);
    outln!(out, "{t}");
    let mut f = table(&["training FLOPs / token", "value", "share"]);
    let tf = flops.total();
    for (name, v) in [
        ("attention projections", flops.attention_projections),
        ("attention core", flops.attention_core),
        ("dense MLP", flops.dense_mlp),
        ("routed experts", flops.routed_experts),
        ("shared experts", flops.shared_experts),
        ("MTP extra", flops.mtp_extra),
        ("logits", flops.logits),
    ] {
        if v > 0.0 {
            f.add_row(vec![name.to_string(), count(v), format!("{:.1}%", 100.0 * v / tf)]);
        }
    }
    f.add_row(vec![format!("total at seq_len {seq_len}"), count(tf), "100.0%".into()]);
    outln!(out, "{f}");
    outln!(out, "FLOPs: {convention}.");
}
