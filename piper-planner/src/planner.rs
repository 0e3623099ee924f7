//! The planner: enumerate PP × EP × DP layouts, micro-batch sizes and counts, schedules, recomputation
//! and all-to-all algorithms; reject what cannot work with the reason; rank the rest by predicted MFU.
//!
//! Constraints (Piper §V): PP·EP·DP = GPUs, EP | E, PP ≤ L, the expert group inside the fast local domain
//! (a node by default), the global batch divisible into micro-batches, and the peak stage memory within
//! the GPU's memory.

use serde::Serialize;

use crate::comm::{A2aAlgo, GroupShape};
use crate::error::{Error, Result};
use crate::layout::{Layout, Recompute, Schedule, StageSplit, TrainConfig, divisors};
use crate::memory::{Footprint, StageMemory};
use crate::model::ModelSpec;
use crate::platform::{GIB, Platform};
use crate::split::balanced_split;
use crate::time::{CostModel, StepPrediction};

/// How far an expert group may reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EpDomain {
    /// Inside one node (all-to-all never leaves the node).
    Node,
    /// Inside one switch: Piper's locality domain, EP ≤ g · N_h (the GPUs of the nodes under one switch).
    /// The default, as in the paper.
    Switch,
    /// Anywhere.
    Any,
}

/// What to plan for and which options to search.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    pub gpus: u64,
    /// Sequences per optimizer step.
    pub global_batch: u64,
    /// Sequence length, dtype, bytes per parameter, ZeRO-1, flash attention, imbalance (its micro-batch,
    /// schedule and recompute fields are ignored: those are searched).
    pub base: TrainConfig,
    pub micro_batch_sizes: Vec<u64>,
    pub schedules: Vec<Schedule>,
    pub recomputes: Vec<Recompute>,
    pub algos: Vec<A2aAlgo>,
    pub ep_domain: EpDomain,
    /// Fix any of the degrees.
    pub pp: Option<u64>,
    pub ep: Option<u64>,
    /// Plans to return.
    pub top: usize,
}

impl PlanRequest {
    /// Searches everything for `gpus` GPUs and a global batch.
    pub fn new(gpus: u64, global_batch: u64, seq_len: u64) -> Self {
        PlanRequest {
            gpus,
            global_batch,
            base: TrainConfig::new(seq_len),
            micro_batch_sizes: vec![1, 2, 4, 8],
            schedules: vec![Schedule::OneFOneB, Schedule::GPipe],
            recomputes: vec![Recompute::None, Recompute::Selective, Recompute::Full],
            algos: vec![A2aAlgo::Flat, A2aAlgo::Halo],
            ep_domain: EpDomain::Switch,
            pp: None,
            ep: None,
            top: 10,
        }
    }
}

/// A feasible plan with its prediction.
#[derive(Clone, Debug, Serialize)]
pub struct PlanCandidate {
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
    pub micro_batch_size: u64,
    pub num_micro_batches: u64,
    pub schedule: Schedule,
    pub recompute: Recompute,
    pub all_to_all: A2aAlgo,
    /// Layers per stage.
    pub split: Vec<u64>,
    pub peak_memory_bytes: f64,
    pub peak_memory_stage: u64,
    pub step_time_s: f64,
    pub mfu: f64,
    pub tflops_per_gpu: f64,
    pub tokens_per_s: f64,
    pub bubble_fraction: f64,
    /// Share of the slowest stage's busy time spent in expert all-to-all.
    pub a2a_fraction: f64,
    #[serde(skip)]
    pub stages: Vec<StageMemory>,
    #[serde(skip)]
    pub prediction: Option<StepPrediction>,
}

impl PlanCandidate {
    pub fn layout(&self) -> Layout {
        Layout { pp: self.pp, ep: self.ep, dp: self.dp }
    }
}

/// A layout (or a part of one) that cannot work, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rejection {
    pub pp: Option<u64>,
    pub ep: u64,
    pub dp: Option<u64>,
    pub reason: String,
}

/// The planner's answer.
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    pub plans: Vec<PlanCandidate>,
    pub rejected: Vec<Rejection>,
    /// Configurations priced (memory and time).
    pub evaluated: u64,
}

/// Prices one configuration: its best split (time-balanced within memory, or the even split), memory and
/// predicted step. `Err(reason)` when no split fits in memory.
pub fn evaluate(
    spec: &ModelSpec,
    platform: &Platform,
    layout: &Layout,
    cfg: &TrainConfig,
    algo: A2aAlgo,
) -> Result<std::result::Result<PlanCandidate, (f64, String)>> {
    let cap = platform.gpu_memory_bytes();
    let footprint = Footprint::new(spec, platform, layout, cfg)?;
    let cost = CostModel::new(spec, platform, layout, cfg, algo)?;
    let even = StageSplit::even(spec.num_layers, layout.pp);
    let even_mem = footprint.stages(&even);
    let even_fits = even_mem.iter().all(|s| s.total_bytes <= cap);
    let balanced =
        if layout.pp > 1 { balanced_split(&cost, &footprint, spec.num_layers, layout.pp, cap) } else { None };
    let mut options: Vec<(StageSplit, StepPrediction)> = Vec::new();
    if even_fits {
        let p = cost.predict(&even);
        options.push((even.clone(), p));
    }
    if let Some(split) = balanced.filter(|s| *s != even) {
        let p = cost.predict(&split);
        options.push((split, p));
    }
    let Some((split, prediction)) = options.into_iter().min_by(|a, b| a.1.step_time_s.total_cmp(&b.1.step_time_s))
    else {
        let worst = even_mem.iter().max_by(|a, b| a.total_bytes.total_cmp(&b.total_bytes)).expect("pp ≥ 1");
        let reason = format!(
            "stage {} needs {:.1} GiB > {:.1} GiB (even split; no balanced split fits) at mbs={}, M={}, {}, recompute={}",
            worst.stage,
            worst.total_bytes / GIB,
            cap / GIB,
            cfg.micro_batch_size,
            cfg.num_micro_batches,
            cfg.schedule.name(),
            cfg.recompute.name()
        );
        return Ok(Err((worst.total_bytes, reason)));
    };
    Ok(Ok(candidate(layout, cfg, algo, &split, footprint.stages(&split), prediction)))
}

/// Prices one configuration with a given stage split, without searching or checking memory (what the
/// runtime reports as "predicted" for a layout the user fixed by hand).
pub fn price(
    spec: &ModelSpec,
    platform: &Platform,
    layout: &Layout,
    cfg: &TrainConfig,
    algo: A2aAlgo,
    split: &StageSplit,
) -> Result<PlanCandidate> {
    layout.validate(spec, None)?;
    cfg.validate_for(layout)?;
    split.validate(spec.num_layers, layout.pp)?;
    if cfg.expert_imbalance > layout.ep as f64 {
        // The busiest of EP expert ranks holds at most all the tokens: EP × the mean.
        return Err(Error::invalid(
            "training config",
            "--expert-imbalance",
            format!(
                "is {} but EP = {}: the busiest expert rank holds at most EP × the mean tokens; pass at most {}",
                cfg.expert_imbalance, layout.ep, layout.ep
            ),
        ));
    }
    let footprint = Footprint::new(spec, platform, layout, cfg)?;
    let prediction = CostModel::new(spec, platform, layout, cfg, algo)?.predict(split);
    Ok(candidate(layout, cfg, algo, split, footprint.stages(split), prediction))
}

fn candidate(
    layout: &Layout,
    cfg: &TrainConfig,
    algo: A2aAlgo,
    split: &StageSplit,
    stages: Vec<StageMemory>,
    prediction: StepPrediction,
) -> PlanCandidate {
    let peak = stages.iter().max_by(|a, b| a.total_bytes.total_cmp(&b.total_bytes)).expect("pp ≥ 1");
    let slowest = prediction
        .stages
        .iter()
        .max_by(|a, b| (a.forward_s + a.backward_s).total_cmp(&(b.forward_s + b.backward_s)))
        .expect("pp ≥ 1");
    PlanCandidate {
        pp: layout.pp,
        ep: layout.ep,
        dp: layout.dp,
        micro_batch_size: cfg.micro_batch_size,
        num_micro_batches: cfg.num_micro_batches,
        schedule: cfg.schedule,
        recompute: cfg.recompute,
        all_to_all: algo,
        split: split.0.clone(),
        peak_memory_bytes: peak.total_bytes,
        peak_memory_stage: peak.stage,
        step_time_s: prediction.step_time_s,
        mfu: prediction.mfu,
        tflops_per_gpu: prediction.tflops_per_gpu,
        tokens_per_s: prediction.tokens_per_s,
        bubble_fraction: prediction.pipeline.bubble_fraction,
        a2a_fraction: slowest.a2a_s / (slowest.forward_s + slowest.backward_s).max(f64::MIN_POSITIVE),
        stages,
        prediction: Some(prediction),
    }
}

/// Searches the space and ranks the feasible plans by predicted MFU.
pub fn plan(spec: &ModelSpec, platform: &Platform, req: &PlanRequest) -> Result<PlanReport> {
    check_request(platform, req)?;
    let mut report = PlanReport { plans: Vec::new(), rejected: Vec::new(), evaluated: 0 };
    for ep in divisors(req.gpus).into_iter().filter(|e| req.ep.is_none_or(|x| x == *e)) {
        if let Some(reason) = ep_rejection(spec, platform, req, ep) {
            report.rejected.push(Rejection { pp: None, ep, dp: None, reason });
            continue;
        }
        for pp in divisors(req.gpus / ep).into_iter().filter(|p| req.pp.is_none_or(|x| x == *p)) {
            let layout = Layout { pp, ep, dp: req.gpus / ep / pp };
            let rejection = match layout_rejection(spec, req, &layout) {
                Some(reason) => Some(reason),
                None => search_layout(spec, platform, req, &layout, &mut report)?,
            };
            if let Some(reason) = rejection {
                report.rejected.push(Rejection { pp: Some(pp), ep, dp: Some(layout.dp), reason });
            }
        }
    }
    report.plans.sort_by(|a, b| b.mfu.total_cmp(&a.mfu));
    report.plans.truncate(req.top);
    Ok(report)
}

/// The request's own sizes, lists and fixed degrees, before any layout is priced.
fn check_request(platform: &Platform, req: &PlanRequest) -> Result<()> {
    crate::limits::count("plan", "--gpus", req.gpus, 1, crate::limits::MAX_GPUS)?;
    crate::limits::count("plan", "--global-batch", req.global_batch, 1, crate::limits::MAX_BATCH)?;
    req.base.validate()?;
    let tokens = [("global batch", req.global_batch), ("seq-len", req.base.seq_len)];
    crate::limits::product("plan", "tokens per step", &tokens, crate::limits::MAX_STEP_TOKENS)?;
    for &mbs in &req.micro_batch_sizes {
        crate::limits::count("plan", "--micro-batch-sizes", mbs, 1, crate::limits::MAX_BATCH)?;
    }
    if req.micro_batch_sizes.is_empty() || req.schedules.is_empty() || req.recomputes.is_empty() || req.algos.is_empty()
    {
        return Err(Error::invalid(
            "plan",
            "--micro-batch-sizes/--schedules/--recompute/--all-to-all",
            "each needs at least one value",
        ));
    }
    for (flag, fixed) in [("--pp", req.pp), ("--ep", req.ep)] {
        if let Some(v) = fixed
            && (v == 0 || !req.gpus.is_multiple_of(v))
        {
            let options: Vec<String> = divisors(req.gpus).iter().map(u64::to_string).collect();
            return Err(Error::invalid(
                "plan",
                flag,
                format!("{v} must divide --gpus {}; try one of {}", req.gpus, options.join(", ")),
            ));
        }
    }
    platform.peak_flops(&req.base.dtype)?;
    Ok(())
}

/// Why no layout with expert-parallel degree `ep` can work: it does not divide the routed experts, or
/// its expert group leaves the locality domain the request allows.
fn ep_rejection(spec: &ModelSpec, platform: &Platform, req: &PlanRequest, ep: u64) -> Option<String> {
    let experts = spec.num_experts().max(1);
    if ep > 1 && !experts.is_multiple_of(ep) {
        return Some(format!("EP = {ep} does not divide the {experts} routed experts"));
    }
    let g = platform.gpus_per_node;
    let domain = match req.ep_domain {
        EpDomain::Node => g,
        EpDomain::Switch => g * platform.nodes_per_switch(),
        EpDomain::Any => u64::MAX,
    };
    if ep > domain {
        let hint = match req.ep_domain {
            EpDomain::Node => "pass --ep-domain switch (or any) to allow it",
            _ => "pass --ep-domain any to allow it",
        };
        let nodes = GroupShape::new(platform, 0, ep, 1).num_nodes();
        return Some(format!(
            "expert group of {ep} ranks spans {nodes} nodes, beyond the fast local domain of {domain} GPUs; {hint}"
        ));
    }
    None
}

/// Why `layout` cannot work whatever its micro-batches: more stages than layers, or a global batch the
/// data-parallel ranks cannot share evenly.
fn layout_rejection(spec: &ModelSpec, req: &PlanRequest, layout: &Layout) -> Option<String> {
    if layout.pp > spec.num_layers {
        return Some(format!("PP = {} > {} layers", layout.pp, spec.num_layers));
    }
    let replicas = layout.ep * layout.dp;
    if !req.global_batch.is_multiple_of(replicas) {
        return Some(format!(
            "global batch {} is not divisible by EP·DP = {replicas} data-parallel ranks",
            req.global_batch
        ));
    }
    None
}

/// Prices every micro-batch size, schedule, recomputation and all-to-all algorithm of `layout` into
/// `report`; the reason it was rejected when no option fits (the closest to fitting named).
fn search_layout(
    spec: &ModelSpec,
    platform: &Platform,
    req: &PlanRequest,
    layout: &Layout,
    report: &mut PlanReport,
) -> Result<Option<String>> {
    let per_replica = req.global_batch / (layout.ep * layout.dp);
    let mut best_fail: Option<(f64, String)> = None;
    let mut found = false;
    // HALO equals flat inside one node: price it once.
    let crosses_nodes = GroupShape::new(platform, 0, layout.ep, 1).num_nodes() > 1;
    let algos: Vec<A2aAlgo> =
        if crosses_nodes { req.algos.clone() } else { req.algos.iter().take(1).copied().collect() };
    let mut too_many: Option<String> = None;
    for &mbs in req.micro_batch_sizes.iter().filter(|m| per_replica.is_multiple_of(**m)) {
        if let Err(e) = crate::layout::pipeline_pairs(layout.pp, per_replica / mbs) {
            too_many = Some(format!("micro-batch size {mbs}: {e}"));
            continue;
        }
        for &schedule in &req.schedules {
            // Each algorithm's plan without recompute (step, memory): a selective plan equal to it keeps
            // and recomputes nothing more (no dense MLP, no shared expert, flash attention) and is not
            // offered twice.
            let mut without: Vec<Option<(f64, f64)>> = vec![None; algos.len()];
            for &recompute in &req.recomputes {
                let cfg = TrainConfig {
                    micro_batch_size: mbs,
                    num_micro_batches: per_replica / mbs,
                    schedule,
                    recompute,
                    ..req.base.clone()
                };
                for (a, &algo) in algos.iter().enumerate() {
                    report.evaluated += 1;
                    match evaluate(spec, platform, layout, &cfg, algo)? {
                        Ok(c)
                            if recompute == Recompute::Selective
                                && without[a] == Some((c.step_time_s, c.peak_memory_bytes)) => {}
                        Ok(c) => {
                            if recompute == Recompute::None {
                                without[a] = Some((c.step_time_s, c.peak_memory_bytes));
                            }
                            found = true;
                            report.plans.push(c);
                        }
                        Err((bytes, reason)) => {
                            if best_fail.as_ref().is_none_or(|(b, _)| bytes < *b) {
                                best_fail = Some((bytes, reason));
                            }
                        }
                    }
                }
            }
        }
    }
    if found {
        return Ok(None);
    }
    Ok(Some(match (best_fail, too_many) {
        (Some((_, r)), _) => format!("every option runs out of memory; the closest: {r}"),
        (None, Some(r)) => r,
        (None, None) => format!(
            "no micro-batch size in {:?} divides the {per_replica} sequences per data-parallel rank",
            req.micro_batch_sizes
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;
    use crate::platform;

    /// Selective recompute is offered where it changes something: a DeepSeek-style model's dense layer
    /// and shared expert; on a Mixtral-style model with flash attention (nothing but routed experts,
    /// which recompute their activation in every mode) it would repeat each plan without recompute.
    #[test]
    fn selective_plans_appear_only_where_they_differ() {
        let p = platform::preset("local").unwrap();
        let mut req = PlanRequest { top: 1000, ..PlanRequest::new(2, 16, 63) };
        // What the runtime runs (as `piper plan` on this platform): fp32, fused attention, routed
        // experts that recompute their activation.
        req.base.dtype = "fp32".into();
        req.base.flash_attention = true;
        req.base.expert_activation_recomputed = true;
        let selective = |model: &str| {
            let report = plan(&preset(model).unwrap(), &p, &req).unwrap();
            assert!(report.plans.iter().any(|c| c.recompute == Recompute::None), "{model}");
            report.plans.iter().filter(|c| c.recompute == Recompute::Selective).count()
        };
        assert_eq!(selective("tiny"), 0);
        assert!(selective("tiny-deepseek") > 0);
    }

    #[test]
    fn plans_respect_every_constraint() {
        let spec = preset("mixtral-8x7b").unwrap();
        let p = platform::preset("frontier").unwrap();
        let report = plan(&spec, &p, &PlanRequest { top: 1000, ..PlanRequest::new(64, 256, 4096) }).unwrap();
        assert!(!report.plans.is_empty());
        for c in &report.plans {
            assert_eq!(c.pp * c.ep * c.dp, 64);
            assert_eq!(8 % c.ep, 0);
            assert!(c.ep <= 8);
            assert!(c.peak_memory_bytes <= 64.0 * GIB);
            assert_eq!(c.micro_batch_size * c.num_micro_batches * c.ep * c.dp, 256);
            assert_eq!(c.split.iter().sum::<u64>(), 32);
            assert!(c.mfu > 0.0 && c.mfu < 1.0);
        }
        assert!(report.plans.windows(2).all(|w| w[0].mfu >= w[1].mfu));
        // EP = 16, 32, 64 do not divide 8 experts.
        assert!(
            report.rejected.iter().any(|r| r.ep == 16 && r.reason.contains("does not divide the 8 routed experts"))
        );
        // PP = 1 cannot hold 47B parameters at 16 B each on 64 GiB.
        assert!(
            report
                .rejected
                .iter()
                .any(|r| r.pp == Some(1) && r.reason.contains("needs") && r.reason.contains("> 64.0 GiB"))
        );
    }

    #[test]
    fn ep_domain_bounds_the_expert_group() {
        let spec = preset("deepseek-v3").unwrap();
        let p = platform::preset("frontier").unwrap();
        let req = PlanRequest { ep: Some(32), pp: Some(16), ..PlanRequest::new(512, 512, 4096) };
        // The default is Piper's domain: the 4 nodes of one switch (g · N_h = 32 GPUs).
        assert_eq!(req.ep_domain, EpDomain::Switch);
        let allowed = plan(&spec, &p, &req).unwrap();
        assert!(!allowed.plans.is_empty() && allowed.plans.iter().all(|c| c.ep == 32));
        let node = plan(&spec, &p, &PlanRequest { ep_domain: EpDomain::Node, ..req.clone() }).unwrap();
        assert!(node.plans.is_empty());
        assert!(
            node.rejected[0].reason.contains("spans 4 nodes") && node.rejected[0].reason.contains("--ep-domain switch")
        );
        let wide = PlanRequest { ep: Some(64), pp: Some(8), ..req };
        let beyond = plan(&spec, &p, &wide).unwrap();
        assert!(beyond.plans.is_empty() && beyond.rejected[0].reason.contains("--ep-domain any"), "{beyond:?}");
    }
}
