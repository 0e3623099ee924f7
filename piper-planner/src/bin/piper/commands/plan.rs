//! `piper plan`.

use piper_planner::Result;
use piper_planner::limits::max_or_zero;
use piper_planner::model::resolve_model;
use piper_planner::planner::{EpDomain, PlanReport, PlanRequest, plan};
use piper_planner::platform::resolve_platform;
use piper_planner::run_plan::{RunPlan, runtime_refusal};
use serde_json::json;

use super::{AlgoArg, RecomputeArg, ScheduleArg, TrainArgs};
use crate::table::{ByteUnit, pct, secs, table};

#[derive(Clone, Copy, clap::ValueEnum)]
enum DomainArg {
    Node,
    Switch,
    Any,
}

#[derive(clap::Args)]
pub struct Args {
    /// Model: preset name or file (HF config.json or native spec).
    #[arg(long)]
    model: String,
    /// Platform: preset (frontier, nvlink-8, local) or TOML file.
    #[arg(long, default_value = "frontier")]
    platform: String,
    /// GPUs (ranks) to use; PP·EP·DP must equal it.
    #[arg(long)]
    gpus: u64,
    /// Sequences per optimizer step.
    #[arg(long)]
    global_batch: u64,
    #[command(flatten)]
    train: TrainArgs,
    /// Micro-batch sizes to try (sequences per rank).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    micro_batch_sizes: Vec<u64>,
    /// Schedules to try.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "1f1b,gpipe")]
    schedules: Vec<ScheduleArg>,
    /// Recomputation options to try.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "none,selective,full")]
    recompute: Vec<RecomputeArg>,
    /// All-to-all algorithms to try.
    #[arg(long = "all-to-all", value_enum, value_delimiter = ',', default_value = "flat,halo")]
    all_to_all: Vec<AlgoArg>,
    /// How far an expert group may reach: node, switch (Piper's locality domain, EP ≤ g · N_h: the GPUs
    /// of the nodes under one switch), any.
    #[arg(long, value_enum, default_value_t = DomainArg::Switch)]
    ep_domain: DomainArg,
    /// Fix the pipeline degree.
    #[arg(long)]
    pp: Option<u64>,
    /// Fix the expert-parallel degree.
    #[arg(long)]
    ep: Option<u64>,
    /// Plans to show.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    top: u64,
    /// Write the best plan, as the runtime reads it, to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Draw the ranked plans' predicted step and peak memory into DIR/plan.png and DIR/plan.svg.
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> Result<String> {
    let mut out = String::new();
    let spec = resolve_model(&a.model)?;
    let platform = resolve_platform(&a.platform)?;
    let base = a.train.config(&platform);
    let req = PlanRequest {
        base: base.clone(),
        micro_batch_sizes: a.micro_batch_sizes.clone(),
        schedules: a.schedules.iter().map(|s| (*s).into()).collect(),
        recomputes: a.recompute.iter().map(|r| (*r).into()).collect(),
        algos: a.all_to_all.iter().map(|x| (*x).into()).collect(),
        ep_domain: match a.ep_domain {
            DomainArg::Node => EpDomain::Node,
            DomainArg::Switch => EpDomain::Switch,
            DomainArg::Any => EpDomain::Any,
        },
        pp: a.pp,
        ep: a.ep,
        top: a.top as usize,
        ..PlanRequest::new(a.gpus, a.global_batch, a.train.seq_len)
    };
    let start = std::time::Instant::now();
    let report = plan(&spec, &platform, &req)?;
    let search_s = start.elapsed().as_secs_f64();
    // The plan file holds the best plan, where the runtime executes it.
    let runnable = report.plans.first().filter(|_| runtime_refusal(&base.dtype).is_none());
    if let (Some(path), None) = (&a.out, runnable) {
        return Err(nothing_to_write(path, &report, &base.dtype));
    }
    if let (Some(path), Some(best)) = (&a.out, runnable) {
        let run = RunPlan::from_candidate(&spec, &platform.name, a.train.seq_len, &base.dtype, best);
        let text = serde_json::to_string_pretty(&run).expect("json");
        piper_planner::atomic::write_atomic(path, text.as_bytes())
            .map_err(|e| piper_planner::Error::file(path.display().to_string(), format!("cannot write: {e}")))?;
    }
    if let Some(dir) = &a.plot {
        let title = format!(
            "{} on {} × {}, global batch {} × {} tokens (rows: PP×EP×DP mbs·M schedule recompute all-to-all)",
            spec.name, a.gpus, platform.name, a.global_batch, a.train.seq_len
        );
        piper_planner::plots::plan::plot_plans(&report.plans, platform.gpu_memory_gib, &title, dir)?;
    }
    if a.json {
        let doc = json!({
            "model": spec.name, "platform": platform.name, "gpus": a.gpus, "global_batch": a.global_batch,
            "seq_len": a.train.seq_len, "evaluated": report.evaluated, "search_s": search_s,
            "plans": report.plans, "rejected": report.rejected,
        });
        outln!(out, "{}", serde_json::to_string_pretty(&doc).expect("json"));
        return Ok(out);
    }
    outln!(
        out,
        "{} on {} × {} ({} GiB each), global batch {} × {} tokens: {} configurations priced in {}",
        spec.name,
        a.gpus,
        platform.name,
        platform.gpu_memory_gib,
        a.global_batch,
        a.train.seq_len,
        report.evaluated,
        secs(search_s)
    );
    if report.plans.is_empty() {
        outln!(out, "no feasible plan: every layout is rejected (below).");
    } else {
        let unit = ByteUnit::for_largest(max_or_zero(report.plans.iter().map(|c| c.peak_memory_bytes)));
        let peak_header = format!("peak {}", unit.0);
        let mut t = table(&[
            "#",
            "PP",
            "EP",
            "DP",
            "mbs",
            "M",
            "schedule",
            "recompute",
            "a2a",
            peak_header.as_str(),
            "step",
            "bubble",
            "a2a share",
            "TFLOP/s/GPU",
            "MFU",
        ]);
        for (i, c) in report.plans.iter().enumerate() {
            t.add_row(vec![
                (i + 1).to_string(),
                c.pp.to_string(),
                c.ep.to_string(),
                c.dp.to_string(),
                c.micro_batch_size.to_string(),
                c.num_micro_batches.to_string(),
                c.schedule.name().into(),
                c.recompute.name().into(),
                c.all_to_all.name().into(),
                unit.of(c.peak_memory_bytes),
                secs(c.step_time_s),
                pct(c.bubble_fraction),
                pct(c.a2a_fraction),
                format!("{:.1}", c.tflops_per_gpu),
                pct(c.mfu),
            ]);
        }
        outln!(out, "{t}");
        let best = &report.plans[0];
        outln!(out, "best split (layers per stage): {:?}", best.split);
    }
    if !report.rejected.is_empty() {
        outln!(out, "rejected:");
        for r in &report.rejected {
            let what = match (r.pp, r.dp) {
                (Some(pp), Some(dp)) => format!("PP={pp} EP={} DP={dp}", r.ep),
                _ => format!("EP={}", r.ep),
            };
            outln!(out, "  {what}: {}", r.reason);
        }
    }
    if let Some((field, why)) = runtime_refusal(&base.dtype).filter(|_| !report.plans.is_empty()) {
        outln!(out, "priced only, the runtime does not run these plans: `{field}` {why}");
    }
    if let (Some(path), Some(_)) = (&a.out, runnable) {
        outln!(out, "plan written to {}", path.display());
    }
    Ok(out)
}

/// `--out` when no plan can be written: an error (exit 2, the file left as it was) naming why.
fn nothing_to_write(path: &std::path::Path, report: &PlanReport, dtype: &str) -> piper_planner::Error {
    let why = match (report.plans.first(), report.rejected.first()) {
        (Some(_), _) => {
            let (field, why) = runtime_refusal(dtype).expect("none runnable");
            format!("no feasible plan is one the runtime runs (`{field}` {why})")
        }
        (None, Some(r)) => format!(
            "nothing is feasible ({} layout(s) rejected, e.g. EP={}: {}); run without --out to see every reason",
            report.rejected.len(),
            r.ep,
            r.reason
        ),
        (None, None) => "nothing is feasible".into(),
    };
    piper_planner::Error::file(path.display().to_string(), format!("no plan written: {why}"))
}
