//! The one trainer: every rank runs its stage's instruction stream — the planner's
//! [`instructions`](piper_planner::schedule::instructions), the same list the simulator prices — with one
//! handler per instruction. One process is the stream of PP = EP = DP = 1; expert- and data-parallel
//! runs are PP = 1; pipelined runs add the receives and sends between stages.
//!
//! Ranks form the plan's PP × EP × DP grid (`rank = ep + EP·(dp + DP·stage)`). Every rank draws the
//! whole model from the seed (so a seed means the same weights for any layout), keeps its stage's layers
//! and the experts the plan places on it. Each replica (EP·DP of them per stage) takes an equal slice of
//! the global batch, in micro-batches; losses are scaled by 1 / (EP·DP·M), so gradients summed over the
//! replicas equal the one-process gradients of the whole batch.

use std::sync::Arc;
use std::time::Instant;

use burn::prelude::*;
use piper_comm::{Communicator, Topology};
use piper_planner::migration::{expert_bytes, imbalance};
use piper_planner::model::ModelSpec;
use piper_planner::platform::Platform;
use piper_planner::run_plan::RunPlan;
use piper_planner::schedule::instructions;

use super::checkpoint::{self, CheckpointSettings, Resume, RunState, Share};
use super::config::{AuxLossScope, RunConfig};
use super::fingerprint::check_ranks_agree;
use super::migration::{GroupCoords, MigrationEvent, MigrationSettings, Migrator, move_experts};
use super::optim::{AdamW, AdamWSettings};
use super::plan::{check_fits_machine, check_plan};
use super::profile::{self, StepProfile};
use super::reductions::check_token_reductions;
use super::report::{SavedCheckpoint, StepMetrics, peak_rss_bytes};
use super::stage::{Stage, StageShape, StepState};
use crate::corpus::Corpus;
use crate::dispatcher::exchange::ExchangeGroup;
use crate::dispatcher::{AllToAllDispatcher, ExpertPlacement, LocalDispatcher, SharedComm, TokenDispatcher};
use crate::lm::{CausalLm, CausalLmConfig};

/// Everything a run needs besides its data.
pub struct Job<'a> {
    pub spec: &'a ModelSpec,
    /// The Burn model of `spec` (built by the models crate).
    pub model: &'a CausalLmConfig,
    pub run: &'a RunConfig,
    pub plan: &'a RunPlan,
    pub world: &'a dyn Communicator,
    pub topo: &'a Topology,
    /// The platform the plan was priced on (migration's cost prediction uses its intra-node bandwidth).
    pub platform: &'a Platform,
    pub device: &'a Device,
    /// Model FLOPs per token (the planner's count) and the measured peak FLOP/s of one rank: the basis
    /// of the MFU the metrics report.
    pub flops_per_token: f64,
    pub peak_flops: f64,
    /// Where and when to save checkpoints, and the checkpoint to resume from (`--resume`).
    pub checkpoint: &'a CheckpointSettings,
    pub resume: Option<&'a Resume>,
    /// A Hugging Face model folder whose weights the run starts from (`--init-hf`).
    pub init_hf: Option<&'a std::path::Path>,
}

/// What a run leaves: this rank's part of the model, the metrics of every step, each rank's peak RSS.
pub struct Trained {
    pub model: CausalLm,
    pub metrics: Vec<StepMetrics>,
    pub peak_rss_bytes: Vec<u64>,
    /// Expert placement per MoE layer of the whole model.
    pub placements: Vec<ExpertPlacement>,
    /// Seconds this rank took to load its part of the resumed checkpoint.
    pub resume_seconds: Option<f64>,
    /// Where the steady steps' time went on this rank, when the run profiles ([`super::profile`]).
    pub profile: Option<StepProfile>,
}

impl Job<'_> {
    /// Checks the job before any allocation: the plan against the run, model and ranks; the model config
    /// against the spec; the data against the vocabulary; the memory the plan needs against this machine.
    /// [`execute`] calls it first; callers may call it earlier (before printing anything).
    pub fn check(&self, corpus: &dyn Corpus) -> Result<(), String> {
        check_job(self, corpus)
    }
}

fn check_job(job: &Job, corpus: &dyn Corpus) -> Result<(), String> {
    check_plan(job.plan, job.spec, job.run, job.world.size())?;
    let layout = job.plan.layout();
    let sequences = (job.plan.global_batch / (layout.ep * layout.dp * job.plan.num_micro_batches).max(1)) as usize;
    let tokens = sequences
        .checked_mul(job.run.seq_len)
        .ok_or_else(|| format!("--batch-size × --seq-len overflows: {sequences} sequences of {}", job.run.seq_len))?;
    check_token_reductions(job.device, tokens)?;
    if job.model.layers.len() as u64 != job.spec.num_layers {
        return Err(format!(
            "the Burn model has {} layers but the spec {} has {}",
            job.model.layers.len(),
            job.spec.name,
            job.spec.num_layers
        ));
    }
    if corpus.vocab_size() > job.model.vocab_size {
        return Err(format!(
            "the data uses {} token ids but the model's vocabulary has {}",
            corpus.vocab_size(),
            job.model.vocab_size
        ));
    }
    if job.topo.world_size() != job.world.size() {
        return Err(format!(
            "the topology describes {} ranks but the job has {}",
            job.topo.world_size(),
            job.world.size()
        ));
    }
    job.checkpoint.validate()?;
    if job.resume.is_some() && job.init_hf.is_some() {
        return Err("--init-hf and --resume both give the weights; pass one".into());
    }
    if let Some(r) = job.resume {
        let config = serde_json::to_string(job.model).map_err(|e| e.to_string())?;
        r.manifest.check_model(&r.folder, job.spec, &config).map_err(|e| format!("--resume {e}"))?;
        if r.manifest.seed != job.run.seed {
            return Err(format!(
                "--resume {}: the checkpoint was trained with --seed {}, this run has --seed {} (the seed draws the data); pass --seed {}",
                r.folder.display(),
                r.manifest.seed,
                job.run.seed,
                r.manifest.seed
            ));
        }
        if r.manifest.step as usize >= job.run.steps {
            return Err(format!(
                "--resume {}: the checkpoint is at step {}, and --steps {} is the run's total: nothing to train (raise --steps)",
                r.folder.display(),
                r.manifest.step,
                job.run.steps
            ));
        }
    }
    let me = job.world.rank();
    let on_node = job.topo.node_of.iter().filter(|n| **n == job.topo.node_of[me]).count();
    check_fits_machine(job.plan, on_node)
}

/// Runs the plan: `job.run.steps` optimizer steps on this rank's part of the model. Every rank gets the
/// same metrics; `on_step` sees each step's.
pub fn execute(job: &Job, corpus: &mut dyn Corpus, mut on_step: impl FnMut(&StepMetrics)) -> Result<Trained, String> {
    check_job(job, corpus)?;
    let (run, plan, world) = (job.run, job.plan, job.world);
    let json = |v: Result<String, serde_json::Error>| v.map_err(|e| format!("fingerprint: {e}"));
    let mut run_no_seed = run.clone();
    run_no_seed.seed = 0;
    check_ranks_agree(
        world,
        &[
            ("model", json(serde_json::to_string(job.model))?),
            ("run configuration", json(serde_json::to_string(&run_no_seed))?),
            ("seed", run.seed.to_string()),
            ("plan", json(serde_json::to_string(plan))?),
            ("data", corpus.describe()),
            ("checkpoints", format!("{:?}", job.checkpoint)),
            ("resume", format!("{:?}", job.resume.map(|r| (&r.folder, r.manifest.step)))),
            ("init-hf", format!("{:?}", job.init_hf)),
        ],
    )?;

    let layout = plan.layout();
    let (ep, dp, m) = (layout.ep as usize, layout.dp as usize, plan.num_micro_batches as usize);
    let replicas = ep * dp;
    let rank = world.rank();
    let (stage, dp_rank, ep_rank) = {
        let (s, d, e) = layout.coords(rank as u64);
        (s as usize, d as usize, e as usize)
    };
    let stage_plan = &plan.stages[stage];
    let layers = stage_plan.first_layer as usize..(stage_plan.first_layer + stage_plan.num_layers) as usize;
    let is_last = stage + 1 == layout.pp as usize;

    // Groups: the stage (non-expert gradients, the layer's load), the expert group (all-to-all), the
    // expert-data-parallel group (expert gradients).
    let split = |color: usize, name: String| world.split(color as u64, rank as u64, &name).map_err(|e| e.to_string());
    let stage_comm = SharedComm::new(split(stage, format!("stage {stage}"))?);
    let expert_comm = split(stage * dp + dp_rank, format!("expert group {dp_rank} of stage {stage}"))?;
    let expert_dp_comm = split(stage * ep + ep_rank, format!("expert data-parallel group {ep_rank} of stage {stage}"))?;
    let share_load = run.aux_loss_scope == AuxLossScope::Global && replicas > 1;
    let placement = ExpertPlacement::new(plan.expert_placement.iter().map(|r| *r as usize).collect(), ep)?;
    let dispatcher: Option<Arc<dyn TokenDispatcher>> = if ep > 1 {
        Some(Arc::new(AllToAllDispatcher {
            group: ExchangeGroup::new(SharedComm::new(expert_comm), Arc::new(job.topo.clone()), plan.all_to_all),
            local_experts: placement.local_experts(),
            layer_group: share_load.then(|| stage_comm.clone()),
        }))
    } else if share_load {
        Some(Arc::new(LocalDispatcher { layer_group: Some(stage_comm.clone()) }))
    } else {
        None
    };

    let device = job.device.clone().autodiff();
    let model_config = CausalLmConfig { aux_loss_coef: run.aux_loss_coef, ..job.model.clone() };
    let mut model: CausalLm = {
        let _one_at_a_time = crate::init_lock();
        device.seed(run.seed);
        model_config.init(&device)
    };
    let num_moe_total = model.num_moe_layers();
    let experts = placement.num_experts();
    if run.hot_experts > experts {
        return Err(format!("--hot-experts {}: the model has {experts} routed experts", run.hot_experts));
    }
    if run.hot_experts > 0 {
        for block in model.layers.iter_mut().filter_map(|l| l.moe.as_mut()) {
            block.router = block.router.clone().with_hot_experts(run.hot_experts, run.hot_factor);
        }
    }
    // Index (among the model's MoE layers) of this stage's first MoE layer.
    let first_moe = model.layers[..layers.start].iter().filter(|l| l.moe.is_some()).count();
    model.layers = model.layers.drain(layers.clone()).collect();
    // The plan's placement, or a resumed checkpoint's (after its migrations) under the same EP.
    let mut placements: Vec<ExpertPlacement> = vec![placement.clone(); num_moe_total];
    if let Some(r) = job.resume {
        placements = checkpoint::resumed_placements(r, &placements, ep)?;
    }
    if let Some(d) = &dispatcher {
        for (k, block) in model.layers.iter_mut().filter_map(|l| l.moe.as_mut()).enumerate() {
            let routed = block.clone().with_routing(d.clone(), placements[first_moe + k].clone(), ep_rank);
            *block = routed;
        }
    }
    let stage_moe = model.num_moe_layers();
    let mut migrator = match (run.migration && ep > 1, job.spec.moe.is_some()) {
        (true, true) => Some(Migrator::new(
            MigrationSettings {
                threshold: run.migration_threshold.unwrap_or(plan.migration.threshold),
                check_every_steps: run.migration_every.unwrap_or(plan.migration.check_every_steps as usize),
                max_swaps: plan.migration.max_swaps,
                // f32 weights and both AdamW moments.
                bytes_per_expert: expert_bytes(job.spec, 12.0).map_err(|e| e.to_string())?,
                link_gbs: job.platform.topology.intra_node_default_gbs,
            },
            num_moe_total,
            experts,
        )),
        _ => None,
    };
    let coords = GroupCoords { layout, stage: stage as u64, dp: dp_rank as u64, ep: ep_rank };

    let local_batch = run.global_batch / replicas;
    let shape = StageShape {
        index: stage,
        is_last,
        prev: rank.wrapping_sub(replicas),
        next: rank + replicas,
        replicas,
        data_rank: dp_rank * ep + ep_rank,
        dp,
        mbs: local_batch / m,
        seq: run.seq_len,
        d_model: model_config.d_model,
        scale: 1.0 / (replicas * m) as f64,
        num_moe_total,
        first_moe,
        experts,
    };
    let mut optim = AdamW::new(AdamWSettings { weight_decay: run.weight_decay, ..AdamWSettings::default() });
    let share = Share {
        spec: job.spec,
        stage,
        is_last,
        first_layer: layers.start,
        first_moe,
        ep_rank,
        dp_rank,
        data_rank: dp_rank * ep + ep_rank,
    };
    let model_json = serde_json::to_string(job.model).map_err(|e| e.to_string())?;
    let mut start_step = 0;
    let resume_started = Instant::now();
    let mut resume_seconds = None;
    if let Some(dir) = job.init_hf {
        model = checkpoint::init_from_hf(model, &share, &placements, dir)?;
    }
    if let Some(r) = job.resume {
        model = checkpoint::restore(model, &mut optim, &share, &placements, r)?;
        corpus.restore_position(&r.manifest.data).map_err(|e| format!("--resume {}: {e}", r.folder.display()))?;
        if let (Some(m), Some(w)) = (migrator.as_mut(), r.manifest.migration_window.as_ref()) {
            m.restore_window(w.steps as usize, &w.counts)?;
        }
        start_step = r.manifest.step as usize;
        resume_seconds = Some(resume_started.elapsed().as_secs_f64());
    }
    let mut st =
        Stage { shape, model, optim, world, stage_comm, expert_dp_comm, dispatcher, device, grad_clip: run.grad_clip };
    let stream = instructions(plan.schedule, stage as u64, layout.pp, m as u64);
    let tokens_per_step = (run.global_batch * run.seq_len) as f64;
    let mut all = Vec::new();
    // The profile covers the steps the summary's medians do: all but the first three (warm-up).
    let profile_from = start_step + 3.min(run.steps.saturating_sub(start_step + 1));
    let mut profiled_seconds = 0.0;
    for step in start_step..run.steps {
        if step == profile_from && profile::enabled() {
            profile::start_window();
        }
        let start = Instant::now();
        let mut state = st.begin_step(corpus.batch(run.global_batch, run.seq_len + 1), m);
        for instr in &stream {
            st.run(*instr, &mut state, run.learning_rate(step))?;
        }
        let StepState { ce_sum, router_sum, busy, makespan, grad_norm, load, .. } = state;
        // One all-reduce over the world: losses, busy fraction, and every layer's tokens per expert.
        let mut sums = vec![ce_sum / m as f32, router_sum, (1.0 - busy / makespan.max(1e-12)) as f32];
        sums.extend_from_slice(&load);
        world.all_reduce_sum_f32(&mut sums, "loss and load all-reduce").map_err(|e| e.to_string())?;
        let loss = sums[0] as f64 / replicas as f64;
        if !loss.is_finite() {
            return Err(format!("step {step}: the loss is {loss}; lower --lr"));
        }
        let counts: Vec<Vec<usize>> =
            sums[3..].chunks(experts.max(1)).map(|c| c.iter().map(|x| x.round() as usize).collect()).collect();
        let mine_counts = &counts[first_moe..first_moe + stage_moe];
        st.model = st.model.clone().update_router_biases(mine_counts, run.bias_update_rate);
        // Max / mean (the planner's measure of imbalance, 1 for an idle group).
        let max_mean = |v: &[usize]| imbalance(&v.iter().map(|x| *x as f64).collect::<Vec<_>>());
        let dt = start.elapsed().as_secs_f64();
        let flops_per_s = job.flops_per_token * tokens_per_step / dt;
        let metrics = StepMetrics {
            step,
            loss,
            total_loss: loss + sums[1] as f64,
            lr: run.learning_rate(step),
            grad_norm,
            tokens_per_s: tokens_per_step / dt,
            flops_per_s,
            mfu: flops_per_s / (job.peak_flops * world.size() as f64),
            expert_load: counts.iter().map(|c| max_mean(c)).collect(),
            rank_load_max_mean: counts.iter().zip(&placements).map(|(c, p)| max_mean(&p.rank_load(c))).collect(),
            step_time_s: dt,
            bubble: (layout.pp > 1).then(|| sums[2] as f64 / world.size() as f64),
            migration: Vec::new(),
            checkpoint: None,
        };
        let mut metrics = metrics;
        if let Some(m) = migrator.as_mut() {
            m.observe(&counts);
            let (moved, events) =
                migrate(m, st.model.clone(), &mut placements, &mut st.optim, world, &coords, first_moe, replicas)?;
            st.model = moved;
            metrics.migration = events;
        }
        if let Some(dir) = job.checkpoint.dir.as_deref() {
            let every = job.checkpoint.save_every;
            if (every > 0 && (step + 1) % every == 0) || step + 1 == run.steps {
                let window = migrator.as_ref().map(|m| {
                    let (steps, counts) = m.window();
                    piper_planner::checkpoint::MigrationWindow { steps: steps as u64, counts: counts.to_vec() }
                });
                let state = RunState {
                    step: step as u64 + 1,
                    model_config: &model_json,
                    seed: run.seed,
                    plan,
                    data: corpus.position(),
                    placements: &placements,
                    window,
                };
                let started = Instant::now();
                let folder = checkpoint::save(world, &st.model, &st.optim, &share, &state, dir, job.checkpoint.keep)?;
                let bytes = std::fs::read_dir(&folder)
                    .map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
                    .unwrap_or(0);
                metrics.checkpoint = Some(SavedCheckpoint { folder, bytes, seconds: started.elapsed().as_secs_f64() });
            }
        }
        if step >= profile_from {
            profiled_seconds += metrics.step_time_s;
        }
        on_step(&metrics);
        all.push(metrics);
    }
    let rss = piper_comm::collectives::all_gather(world, &[peak_rss_bytes()], "peak memory gather")
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|v| v[0])
        .collect();
    let profile =
        profile::enabled().then(|| StepProfile::collect(run.steps.saturating_sub(profile_from), profiled_seconds));
    Ok(Trained { model: st.model, metrics: all, peak_rss_bytes: rss, placements, resume_seconds, profile })
}

/// The migrations the window calls for: every rank decides the same; the ranks of each layer's stage
/// move its experts; every rank updates its placement table.
#[allow(clippy::too_many_arguments)]
fn migrate(
    migrator: &mut Migrator,
    mut model: CausalLm,
    placements: &mut [ExpertPlacement],
    optim: &mut AdamW,
    world: &dyn Communicator,
    coords: &GroupCoords,
    first_moe: usize,
    stage_ranks: usize,
) -> Result<(CausalLm, Vec<MigrationEvent>), String> {
    let decisions = migrator.decide(placements)?;
    if decisions.is_empty() {
        return Ok((model, Vec::new()));
    }
    if cfg!(debug_assertions) {
        let decided: Vec<(usize, &Vec<u64>)> = decisions.iter().map(|(l, m)| (*l, &m.placement_after)).collect();
        check_ranks_agree(world, &[("migration decision", format!("{decided:?}"))])?;
    }
    let moe_slots: Vec<usize> =
        model.layers.iter().enumerate().filter(|(_, l)| l.moe.is_some()).map(|(i, _)| i).collect();
    let mut seconds = vec![0.0f32; decisions.len()];
    for (k, (layer, m)) in decisions.iter().enumerate() {
        let new = placements[*layer].migrated(&m.placement_after.iter().map(|r| *r as usize).collect::<Vec<_>>())?;
        if let Some(&i) = layer.checked_sub(first_moe).and_then(|j| moe_slots.get(j)) {
            let block = model.layers[i].moe.take().ok_or("an MoE layer without its block")?;
            let (block, secs) = move_experts(block, &placements[*layer], &new, optim, world, coords, *layer)?;
            model.layers[i].moe = Some(block);
            seconds[k] = secs as f32;
        }
        placements[*layer] = new;
    }
    world.all_reduce_sum_f32(&mut seconds, "migration time all-reduce").map_err(|e| e.to_string())?;
    let events = decisions
        .iter()
        .zip(&seconds)
        .map(|((layer, m), s)| MigrationEvent {
            layer: *layer,
            swaps: m.swaps.len(),
            experts_moved: m.experts_moved,
            bytes: m.bytes_moved,
            seconds: *s as f64 / stage_ranks as f64,
            predicted_seconds: m.time_s,
            imbalance_before: m.imbalance_before,
            imbalance_after: m.imbalance_after,
        })
        .collect();
    Ok((model, events))
}
