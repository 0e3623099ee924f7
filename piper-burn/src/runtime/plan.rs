//! Where a run's plan comes from — a plan file (`piper plan --out`), the planner in memory (`--plan
//! auto`), or layout flags priced by the planner — and the checks that the plan fits the run, the model,
//! the job's ranks and the machine, before any work starts. Every path ends in one
//! [`RunPlan`], which the executor runs.

use piper_planner::comm::A2aAlgo;
use piper_planner::layout::{
    Layout, RUNTIME_DTYPE, Recompute, Schedule, StageSplit, TrainConfig, runtime_train_config,
};
use piper_planner::model::ModelSpec;
use piper_planner::planner::{EpDomain, PlanRequest, plan, price};
use piper_planner::platform::Platform;
use piper_planner::run_plan::{RunPlan, runtime_refusal};

use super::config::RunConfig;
use super::error::{Result, RuntimeError};

/// Largest micro-batch count: each micro-batch takes two of the user tags `0..=MAX_USER_TAG`.
pub const MAX_MICRO_BATCHES: usize = (piper_comm::communicator::MAX_USER_TAG as usize).div_ceil(2);

/// A layout given by flags (`--pp --ep --dp --micro-batches --schedule --split --all-to-all`).
#[derive(Clone, Debug, PartialEq)]
pub struct LayoutFlags {
    pub layout: Layout,
    pub micro_batches: usize,
    pub schedule: Schedule,
    /// Layers per stage (`None`: the even split).
    pub split: Option<StageSplit>,
    pub all_to_all: A2aAlgo,
    /// What the forward keeps (`--recompute`): everything, or each layer's input (`full`).
    pub recompute: Recompute,
}

impl LayoutFlags {
    /// One process: PP = EP = DP = 1, one micro-batch.
    pub fn single() -> Self {
        LayoutFlags {
            layout: Layout { pp: 1, ep: 1, dp: 1 },
            micro_batches: 1,
            schedule: Schedule::OneFOneB,
            split: None,
            all_to_all: A2aAlgo::Flat,
            recompute: Recompute::None,
        }
    }
}

/// The settings the planner prices `plan` with, as the runtime trains it ([`runtime_train_config`]).
pub fn priced_config(plan: &RunPlan) -> TrainConfig {
    runtime_train_config(plan.seq_len, plan.micro_batch_size, plan.num_micro_batches, plan.schedule, plan.recompute)
}

/// The plan for a layout given by flags, priced by the planner on `platform` (its predictions are what
/// the run reports as "predicted").
pub fn plan_from_flags(
    spec: &ModelSpec,
    platform: &Platform,
    run: &RunConfig,
    flags: &LayoutFlags,
    ranks: usize,
) -> Result<RunPlan> {
    run.validate()?;
    let l = flags.layout;
    for (field, v) in [("layout.pp", l.pp), ("layout.ep", l.ep), ("layout.dp", l.dp)] {
        if v == 0 {
            return Err(RuntimeError::invalid(field, "must be ≥ 1"));
        }
    }
    let product = l.pp.checked_mul(l.ep).and_then(|x| x.checked_mul(l.dp));
    if product != Some(ranks as u64) {
        return Err(RuntimeError::invalid(
            "layout.pp",
            format!(
                "{} × `layout.ep` {} × `layout.dp` {} = {} ranks, but the job has {ranks}; launch with mpirun -np {}",
                l.pp,
                l.ep,
                l.dp,
                product.map_or("too many".into(), |p| p.to_string()),
                product.map_or("?".into(), |p| p.to_string())
            ),
        ));
    }
    if !(1..=MAX_MICRO_BATCHES).contains(&flags.micro_batches) {
        return Err(RuntimeError::invalid(
            "micro_batches",
            format!("is {}; it must be in 1..={MAX_MICRO_BATCHES}", flags.micro_batches),
        ));
    }
    l.validate(spec, Some(ranks as u64))?;
    let per_step = (l.ep * l.dp) as usize * flags.micro_batches;
    if !run.global_batch.is_multiple_of(per_step) {
        return Err(RuntimeError::invalid(
            "global_batch",
            format!(
                "{} must be divisible by EP·DP·micro-batches = {}·{}·{} = {per_step} (each rank's micro-batches are equal)",
                run.global_batch, l.ep, l.dp, flags.micro_batches
            ),
        ));
    }
    let split = flags.split.clone().unwrap_or_else(|| StageSplit::even(spec.num_layers, l.pp));
    let cfg = TrainConfig {
        shared_expert_overlap: run.overlap,
        ..runtime_train_config(
            run.seq_len as u64,
            (run.global_batch / per_step) as u64,
            flags.micro_batches as u64,
            flags.schedule,
            flags.recompute,
        )
    };
    let candidate = price(spec, platform, &l, &cfg, flags.all_to_all, &split)?;
    Ok(RunPlan::from_candidate(spec, &platform.name, run.seq_len as u64, RUNTIME_DTYPE, &candidate))
}

/// `--plan auto`: the planner's best layout for `ranks` ranks among those the runtime executes (any PP ×
/// EP × DP, micro-batch count, schedule and recompute mode, f32).
pub fn plan_auto(spec: &ModelSpec, platform: &Platform, run: &RunConfig, ranks: usize) -> Result<RunPlan> {
    run.validate()?;
    let mut req = PlanRequest::new(ranks as u64, run.global_batch as u64, run.seq_len as u64);
    let base = runtime_train_config(run.seq_len as u64, 1, 1, Schedule::OneFOneB, Recompute::None);
    req.base = TrainConfig { shared_expert_overlap: run.overlap, ..base };
    req.schedules = vec![Schedule::OneFOneB, Schedule::GPipe];
    req.recomputes = vec![Recompute::None, Recompute::Selective, Recompute::Full];
    req.algos = vec![A2aAlgo::Flat, A2aAlgo::Halo];
    req.ep_domain = EpDomain::Any;
    req.micro_batch_sizes =
        (1..=run.global_batch as u64).filter(|m| (run.global_batch as u64).is_multiple_of(*m)).collect();
    req.top = usize::MAX;
    let report = plan(spec, platform, &req)?;
    let best =
        report.plans.into_iter().find(|c| c.num_micro_batches as usize <= MAX_MICRO_BATCHES).ok_or_else(|| {
            let reasons: Vec<String> = report.rejected.iter().map(|r| r.reason.clone()).collect();
            RuntimeError::invalid(
                "plan",
                format!("auto: no executable layout for {ranks} ranks ({})", reasons.join("; ")),
            )
        })?;
    Ok(RunPlan::from_candidate(spec, &platform.name, run.seq_len as u64, RUNTIME_DTYPE, &best))
}

/// Checks that `plan` is one this run can execute: the plan's own consistency, then its model,
/// sequence length, batch, rank count, dtype and recomputation against the run. One line, naming the
/// field, for the first mismatch.
pub fn check_plan(plan: &RunPlan, spec: &ModelSpec, run: &RunConfig, ranks: usize) -> Result<()> {
    run.validate()?;
    plan.validate("plan")?;
    if plan.model != spec.name {
        return Err(RuntimeError::invalid(
            "plan: `model`",
            format!(
                "is `{}` but the run trains `{}`; train `{}` or re-plan for this model",
                plan.model, spec.name, plan.model
            ),
        ));
    }
    if plan.split().0.iter().sum::<u64>() != spec.num_layers {
        return Err(RuntimeError::invalid(
            "plan: `stages`",
            format!("cover {:?} layers but {} has {}", plan.split().0, spec.name, spec.num_layers),
        ));
    }
    if plan.expert_placement.len() as u64 != spec.num_experts() {
        return Err(RuntimeError::invalid(
            "plan: `expert_placement`",
            format!("places {} experts but {} has {}", plan.expert_placement.len(), spec.name, spec.num_experts()),
        ));
    }
    if plan.seq_len != run.seq_len as u64 {
        return Err(RuntimeError::invalid(
            "plan: `seq_len`",
            format!("is {} but the run's `seq_len` is {}", plan.seq_len, run.seq_len),
        ));
    }
    if plan.global_batch != run.global_batch as u64 {
        return Err(RuntimeError::invalid(
            "plan: `global_batch`",
            format!("is {} but the run's `global_batch` is {}", plan.global_batch, run.global_batch),
        ));
    }
    if plan.gpus != ranks as u64 {
        return Err(RuntimeError::invalid(
            "plan: `gpus`",
            format!("is {} but the job has {ranks} ranks; launch with mpirun -np {}", plan.gpus, plan.gpus),
        ));
    }
    if let Some((field, why)) = runtime_refusal(&plan.dtype) {
        return Err(RuntimeError::invalid(format!("plan: `{field}`"), why));
    }
    if plan.num_micro_batches as usize > MAX_MICRO_BATCHES {
        return Err(RuntimeError::invalid(
            "plan: `num_micro_batches`",
            format!("is {}; at most {MAX_MICRO_BATCHES}", plan.num_micro_batches),
        ));
    }
    Ok(())
}

/// Refuses a plan whose predicted memory per rank, times the ranks on this node, exceeds the machine's
/// memory (`/proc/meminfo`; skipped where it cannot be read).
pub fn check_fits_machine(plan: &RunPlan, ranks_on_node: usize) -> Result<()> {
    let Some(total_bytes) = super::host::total_memory_bytes().map(|b| b as f64) else {
        return Ok(());
    };
    let per_rank = plan.predicted.peak_memory_bytes();
    let need = per_rank * ranks_on_node as f64;
    if need > total_bytes {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        return Err(RuntimeError::invalid(
            "seq_len",
            format!(
                "{} / `global_batch` {}: the plan predicts {:.1} GiB per rank × {ranks_on_node} ranks on this node = {:.1} GiB, more than this machine's {:.1} GiB; use a shorter `seq_len`, a smaller `global_batch` or more micro-batches",
                plan.seq_len,
                plan.global_batch,
                gib(per_rank),
                gib(need),
                gib(total_bytes)
            ),
        ));
    }
    Ok(())
}
