//! `piper migrate`.

use piper_planner::migration::{expert_bytes, expert_bytes_as, rebalance, worst_case_bytes_per_gpu_with};
use piper_planner::model::resolve_model;
use piper_planner::{Error, Result};
use serde::Deserialize;
use serde_json::json;

use crate::table::{count, secs, table};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["loads", "worst_case"])))]
pub struct Args {
    /// JSON file: {"loads": [tokens per expert], "placement": [rank of each expert], "ranks": N?,
    /// "model": NAME?}. Loads are summed over the measurement window.
    #[arg(long, value_name = "FILE")]
    loads: Option<String>,
    /// Piper's Table IV: every expert of one layer changes rank.
    #[arg(long)]
    worst_case: bool,
    /// Model whose expert size prices the move (preset or file); overrides the loads file's "model".
    #[arg(long)]
    model: Option<String>,
    /// Bytes of one expert (instead of a model).
    #[arg(long)]
    expert_bytes: Option<f64>,
    /// Ranks in the expert group (default: the loads file's "ranks", else 1 + the largest placement).
    #[arg(long)]
    ranks: Option<u64>,
    /// GPUs in the expert group for --worst-case.
    #[arg(long, default_value_t = 8)]
    group_size: u64,
    /// Hill-climbing iterations (swaps) at most.
    #[arg(long, default_value_t = 64)]
    max_iterations: u64,
    /// Link bandwidth per GPU in GB/s (gigabytes per second, as the paper's "50 GB/s").
    #[arg(long, default_value_t = 50.0)]
    link_gbps: f64,
    /// Bytes moved per expert parameter: weight + gradient + optimizer states (Piper: 16).
    #[arg(long, default_value_t = 16.0)]
    bytes_per_param: f64,
    /// Price each expert as this many d × f matrices instead of the model's own MLP (Piper's Table IV
    /// prices every expert as 3, "48·d·f"; GLaM's real experts have 2).
    #[arg(long)]
    expert_matrices: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadsFile {
    loads: Vec<f64>,
    placement: Vec<u64>,
    #[serde(default)]
    ranks: Option<u64>,
    #[serde(default)]
    model: Option<String>,
}

pub fn run(a: Args) -> Result<String> {
    let mut out = String::new();
    piper_planner::limits::positive("migrate", "--link-gbps", a.link_gbps, 1e6)?;
    if a.worst_case {
        let name = a.model.as_deref().ok_or_else(|| {
            Error::missing("migrate --worst-case", "--model", Some("the model whose experts move".into()))
        })?;
        let spec = resolve_model(name)?;
        let per_expert = expert_bytes_as(&spec, a.expert_matrices, a.bytes_per_param)?;
        let bytes = worst_case_bytes_per_gpu_with(spec.num_experts(), per_expert, a.group_size)?;
        let time_s = bytes / (a.link_gbps * 1e9);
        let gib = bytes / (1u64 << 30) as f64;
        // Table IV divides its printed size by the link's GB/s: GiB ÷ GB/s for most rows.
        let table_iv_time_s = gib / a.link_gbps;
        if a.json {
            outln!(out, "{}", serde_json::to_string_pretty(&json!({"model": spec.name, "group_size": a.group_size, "link_gbps": a.link_gbps, "expert_bytes": per_expert, "bytes_per_gpu": bytes, "gib_per_gpu": gib, "gb_per_gpu": bytes / 1e9, "time_s": time_s, "table_iv_time_s": table_iv_time_s})).expect("json"));
        } else {
            outln!(
                out,
                "{}: all {} experts of one layer change rank in a group of {} GPUs: {} bytes ({:.3} GiB, {:.3} GB) per GPU, {} at {} GB/s ({} in Table IV's units, GiB ÷ GB/s)",
                spec.name,
                spec.num_experts(),
                a.group_size,
                count(bytes),
                gib,
                bytes / 1e9,
                secs(time_s),
                a.link_gbps,
                secs(table_iv_time_s)
            );
        }
        return Ok(out);
    }
    let path = a.loads.as_deref().expect("clap requires --loads or --worst-case");
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read: {e}")))?;
    let file: LoadsFile = serde_json::from_str(&text).map_err(|e| {
        Error::file(path, format!("not a loads file ({e}); expected {{\"loads\": [...], \"placement\": [...]}}"))
    })?;
    let experts = file.placement.len() as u64;
    let ranks = match (a.ranks.or(file.ranks), file.placement.iter().max()) {
        (Some(r), _) => r,
        (None, None) => 1,
        (None, Some(&top)) if top < experts => top + 1,
        (None, Some(&top)) => {
            // Every rank holds an expert, so the largest rank is below the experts' count.
            return Err(Error::invalid(
                path,
                "placement",
                format!(
                    "holds rank {top}, but {experts} experts fill at most {experts} ranks (counted from 0); fix the placement"
                ),
            ));
        }
    };
    let per_expert = match (a.expert_bytes, a.model.as_ref().or(file.model.as_ref())) {
        (Some(b), _) => b,
        (None, Some(m)) => expert_bytes(&resolve_model(m)?, a.bytes_per_param)?,
        (None, None) => {
            return Err(Error::missing(
                path,
                "model",
                Some("give \"model\" in the file, or --model / --expert-bytes, to price the move".into()),
            ));
        }
    };
    let m = rebalance(&file.loads, &file.placement, ranks, a.max_iterations, per_expert, a.link_gbps)?;
    if a.json {
        outln!(out, "{}", serde_json::to_string_pretty(&m).expect("json"));
        return Ok(out);
    }
    outln!(
        out,
        "{} experts on {} ranks: imbalance (max/mean tokens per rank) {:.3} → {:.3} with {} swaps; {} experts move, {} bytes, {} at {} GB/s",
        file.loads.len(),
        ranks,
        m.imbalance_before,
        m.imbalance_after,
        m.swaps.len(),
        m.experts_moved,
        count(m.bytes_moved),
        secs(m.time_s),
        a.link_gbps
    );
    let mut t = table(&["swap", "expert out", "from rank", "expert in", "to rank"]);
    for (i, s) in m.swaps.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            s.expert_out.to_string(),
            s.from_rank.to_string(),
            s.expert_in.to_string(),
            s.to_rank.to_string(),
        ]);
    }
    if !m.swaps.is_empty() {
        outln!(out, "{t}");
    }
    Ok(out)
}
