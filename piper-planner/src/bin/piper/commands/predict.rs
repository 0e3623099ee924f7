//! `piper predict`: the resource model's full answer for one layout — the numbers `piper plan` ranks
//! by and a run's summary prints as "predicted".

use piper_planner::Result;
use piper_planner::planner::price;
use serde_json::json;

use super::{AlgoArg, OneLayout, Resolved};
use crate::table::{bytes, pct, secs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    one: OneLayout,
    /// Expert all-to-all algorithm.
    #[arg(long = "all-to-all", value_enum, default_value_t = AlgoArg::Flat)]
    all_to_all: AlgoArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Write the predicted timeline of one step (one process per stage) as a Chrome/Perfetto trace, in
    /// the format and with the span names of a run's --trace.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> Result<String> {
    let resolved = a.one.resolve()?;
    let Resolved { spec, platform, layout, cfg, split } = &resolved;
    let c = price(spec, platform, layout, cfg, a.all_to_all.into(), split)?;
    let p = c.prediction.as_ref().expect("price() predicts");
    let b = p.breakdown(cfg.num_micro_batches);
    let stage_memory: Vec<f64> = c.stages.iter().map(|s| s.total_bytes).collect();
    if let Some(path) = &a.trace {
        let tail: Vec<(f64, f64)> = p.stages.iter().map(|s| (s.grad_reduce_s, s.optimizer_s)).collect();
        piper_planner::trace::write(path, &piper_planner::trace::predicted(&p.pipeline, &tail, "predicted"))?;
    }
    if a.json {
        let doc = json!({
            "model": spec.name, "platform": platform.name, "layout": layout, "config": cfg,
            "split": split.0, "all_to_all": c.all_to_all,
            "step_time_s": c.step_time_s, "tokens_per_s": c.tokens_per_s, "mfu": c.mfu,
            "tflops_per_gpu": c.tflops_per_gpu, "bubble_fraction": c.bubble_fraction,
            "stage_memory_bytes": stage_memory, "peak_memory_bytes": c.peak_memory_bytes,
            "breakdown": b,
        });
        return Ok(format!("{}\n", serde_json::to_string_pretty(&doc).expect("json")));
    }
    Ok(format!(
        "{}, {} all-to-all, split {:?}\n\
         step {} ({:.0} tokens/s, {:.1} TFLOP/s per GPU, MFU {}), bubble {}, peak memory {} (stage {})\n\
         critical stage {}: compute {}, all-to-all {}, p2p {}, bubble {}, gradient all-reduce {}, optimizer {}, overhead {}\n",
        resolved.headline(),
        c.all_to_all.name(),
        resolved.split.0,
        secs(c.step_time_s),
        c.tokens_per_s,
        c.tflops_per_gpu,
        pct(c.mfu),
        pct(c.bubble_fraction),
        bytes(c.peak_memory_bytes),
        c.peak_memory_stage,
        b.critical_stage,
        secs(b.compute_s),
        secs(b.all_to_all_s),
        secs(b.p2p_s),
        secs(b.bubble_s),
        secs(b.grad_allreduce_s),
        secs(b.optimizer_s),
        secs(b.overhead_s),
    ))
}
