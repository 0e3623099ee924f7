//! Setting up one rank of a job, and resuming it: the rank's place in the PP × EP × DP grid
//! (`rank = ep + EP·(dp + DP·stage)`), its communicator groups, the token dispatcher, its stage's part of
//! the model — every rank draws the whole model from the seed (so a seed means the same weights for any
//! layout), then keeps its stage's layers and the experts the plan places on it — the optimizer, expert
//! migration, and the step's instruction stream.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use burn::module::Param;
use burn::prelude::*;
use piper_comm::Communicator;
use piper_planner::migration::expert_bytes;
use piper_planner::model::{LayerKind, ModelSpec};
use piper_planner::schedule::{Instr, instructions};

use super::checkpoint::{Share, init_from_hf, restore, resumed_placements};
use super::config::AuxLossScope;
use super::error::{Result, RuntimeError};
use super::job::Job;
use super::migration::{GroupCoords, MigrationSettings, Migrator};
use super::optim::{AdamW, AdamWSettings};
use super::stage::{Stage, StageShape};
use crate::corpus::Corpus;
use crate::model::stage_model::{ExpertRoutes, StageModel, StageModelConfig, StagePart};
use crate::moe::dispatcher::exchange::ExchangeGroup;
use crate::moe::dispatcher::{AllToAllDispatcher, ExpertPlacement, LocalDispatcher, SharedComm, TokenDispatcher};
use crate::moe::losses::RouterLossWeights;

/// One rank's part of a running job: its stage and what the step loop needs around it.
pub(crate) struct RankRun<'a, M: StageModel> {
    pub stage: Stage<'a, M>,
    /// Where this rank's part of the model sits (what it saves and loads).
    pub share: Share,
    pub coords: GroupCoords,
    /// Expert placement of every MoE layer of the model (migration changes them).
    pub placements: Vec<ExpertPlacement>,
    pub migrator: Option<Migrator>,
    /// The instructions of one step on this stage: the planner's stream, the one its simulator prices.
    pub stream: Vec<Instr>,
    pub micro_batches: usize,
    /// The Burn model's configuration, as checkpoints record it.
    pub model_json: String,
}

/// Where a rank sits in the plan's grid, and the sizes that follow from it.
struct Place {
    stage: usize,
    dp_rank: usize,
    ep_rank: usize,
    /// The stage's layers (global indices).
    layers: Range<usize>,
    pp: usize,
    ep: usize,
    dp: usize,
    micro_batches: usize,
}

/// The communicator groups of a rank: its stage's EP·DP ranks (non-expert gradients, the layer's
/// load), its expert group (the all-to-all) and its expert-data-parallel group (expert gradients).
struct Groups {
    stage: SharedComm,
    expert: Box<dyn Communicator>,
    expert_dp: Box<dyn Communicator>,
}

impl<'a, M: StageModel> RankRun<'a, M> {
    /// Sets the rank up: groups, dispatcher, its stage of the model `config` describes, optimizer,
    /// migration, stream.
    pub fn new<C: StageModelConfig<Model = M>>(job: &Job<'a>, config: &C) -> Result<Self> {
        let at = Place::of(job);
        let groups = Groups::split(job.world, &at)?;
        let placement = ExpertPlacement::new(job.plan.expert_placement.iter().map(|r| *r as usize).collect(), at.ep)?;
        let experts = placement.num_experts();
        let dispatcher = dispatcher(job, groups.expert, &groups.stage, &placement);
        let device = job.device.clone().autodiff();
        let is_moe: Vec<bool> = job.spec.layers.iter().map(|k| *k == LayerKind::Moe).collect();
        let num_moe_total = is_moe.iter().filter(|m| **m).count();
        let first_moe = is_moe[..at.layers.start].iter().filter(|m| **m).count();
        // The plan's placement, or a resumed checkpoint's (after its migrations) under the same EP.
        let mut placements = vec![placement; num_moe_total];
        if let Some(r) = &job.resume {
            placements = resumed_placements(r, &placements, at.ep)?;
        }
        let part = StagePart {
            layers: at.layers.clone(),
            is_moe,
            is_first: at.stage == 0,
            is_last: at.stage + 1 == at.pp,
            routes: dispatcher.as_ref().map(|d| ExpertRoutes {
                dispatcher: d,
                placements: &placements,
                ep_rank: at.ep_rank,
            }),
        };
        let model = draw_stage(job, config, &device, &part)?;
        drop(part);
        let shape = at.stage_shape(job, job.spec.hidden_size as usize, num_moe_total, first_moe, experts);
        let optim = AdamW::new(AdamWSettings::from(&job.run));
        Ok(RankRun {
            share: at.share(job, first_moe),
            coords: GroupCoords {
                layout: job.plan.layout(),
                stage: at.stage as u64,
                dp: at.dp_rank as u64,
                ep: at.ep_rank,
            },
            migrator: migrator(job, num_moe_total, experts, at.ep)?,
            placements,
            stream: instructions(job.plan.schedule, at.stage as u64, at.pp as u64, at.micro_batches as u64),
            micro_batches: at.micro_batches,
            model_json: serde_json::to_string(config).map_err(RuntimeError::json("model config"))?,
            stage: Stage {
                shape,
                model,
                router_loss: RouterLossWeights { aux: job.aux_loss_coef(), z: config.z_loss_coef() },
                optim,
                world: job.world,
                stage_comm: groups.stage,
                expert_dp_comm: groups.expert_dp,
                dispatcher,
                device,
                grad_clip: job.run.grad_clip,
                recompute: job.plan.recompute,
            },
        })
    }

    /// Loads the weights the job starts from — a Hugging Face folder, or a checkpoint with its optimizer
    /// state, data position and migration window — and returns the first step to train and, when
    /// resuming, the seconds the load took.
    pub fn resume(&mut self, job: &Job, corpus: &mut dyn Corpus) -> Result<(usize, Option<f64>)> {
        if let Some(dir) = &job.init_hf {
            self.stage.model = init_from_hf(self.stage.model.clone(), &self.share, &self.placements, dir)?;
        }
        let Some(r) = &job.resume else { return Ok((0, None)) };
        let started = Instant::now();
        let model = self.stage.model.clone();
        self.stage.model = restore(model, &mut self.stage.optim, &self.share, &self.placements, r)?;
        corpus.restore_position(&r.manifest.data).map_err(|e| RuntimeError::file("resume", &r.folder, e))?;
        if let (Some(m), Some(w)) = (self.migrator.as_mut(), r.manifest.migration_window.as_ref()) {
            m.restore_window(w.steps as usize, &w.counts, &w.evidence)?;
        }
        Ok((r.manifest.step as usize, Some(started.elapsed().as_secs_f64())))
    }
}

impl Place {
    fn of(job: &Job) -> Self {
        let layout = job.plan.layout();
        let (stage, dp, ep) = layout.coords(job.world.rank() as u64);
        let s = &job.plan.stages[stage as usize];
        Place {
            stage: stage as usize,
            dp_rank: dp as usize,
            ep_rank: ep as usize,
            layers: s.first_layer as usize..(s.first_layer + s.num_layers) as usize,
            pp: layout.pp as usize,
            ep: layout.ep as usize,
            dp: layout.dp as usize,
            micro_batches: job.plan.num_micro_batches as usize,
        }
    }

    /// EP·DP replicas per stage, each taking an equal slice of the global batch.
    fn replicas(&self) -> usize {
        self.ep * self.dp
    }

    fn data_rank(&self) -> usize {
        self.dp_rank * self.ep + self.ep_rank
    }

    fn stage_shape(
        &self,
        job: &Job,
        d_model: usize,
        num_moe_total: usize,
        first_moe: usize,
        experts: usize,
    ) -> StageShape {
        let (replicas, m, rank) = (self.replicas(), self.micro_batches, job.world.rank());
        StageShape {
            index: self.stage,
            is_last: self.stage + 1 == self.pp,
            prev: rank.wrapping_sub(replicas),
            next: rank + replicas,
            replicas,
            data_rank: self.data_rank(),
            dp: self.dp,
            mbs: job.run.global_batch / replicas / m,
            seq: job.run.seq_len,
            d_model,
            scale: 1.0 / (replicas * m) as f64,
            num_moe_total,
            first_moe,
            experts,
        }
    }

    fn share(&self, job: &Job, first_moe: usize) -> Share {
        Share {
            spec: job.spec.clone(),
            stage: self.stage,
            is_last: self.stage + 1 == self.pp,
            first_layer: self.layers.start,
            first_moe,
            ep_rank: self.ep_rank,
            dp_rank: self.dp_rank,
            data_rank: self.data_rank(),
        }
    }
}

impl Groups {
    /// Collective over the world, in the same order on every rank.
    fn split(world: &dyn Communicator, at: &Place) -> Result<Self> {
        let (rank, stage, dp_rank, ep_rank) = (world.rank() as u64, at.stage, at.dp_rank, at.ep_rank);
        let split = |color: usize, name: String| world.split(color as u64, rank, &name);
        Ok(Groups {
            stage: SharedComm::new(split(stage, format!("stage {stage}"))?),
            expert: split(stage * at.dp + dp_rank, format!("expert group {dp_rank} of stage {stage}"))?,
            expert_dp: split(
                stage * at.ep + ep_rank,
                format!("expert data-parallel group {ep_rank} of stage {stage}"),
            )?,
        })
    }
}

/// How the MoE blocks reach their experts: an all-to-all over the expert group (EP > 1), a local
/// dispatcher that only shares the layer's load (the global load-balancing loss over EP·DP > 1
/// replicas), or none (every expert here, each rank its own load).
fn dispatcher(
    job: &Job,
    expert_comm: Box<dyn Communicator>,
    stage_comm: &SharedComm,
    placement: &ExpertPlacement,
) -> Option<Arc<dyn TokenDispatcher>> {
    let layout = job.plan.layout();
    let share_load = job.run.aux_loss_scope == AuxLossScope::Global && layout.ep * layout.dp > 1;
    let layer_group = share_load.then(|| stage_comm.clone());
    if layout.ep > 1 {
        Some(Arc::new(AllToAllDispatcher {
            group: ExchangeGroup::new(SharedComm::new(expert_comm), Arc::new(job.topo.clone()), job.plan.all_to_all),
            local_experts: placement.local_experts(),
            layer_group,
            overlap: job.run.overlap,
        }))
    } else if share_load {
        Some(Arc::new(LocalDispatcher { layer_group }))
    } else {
        None
    }
}

/// The rank's part of the model, drawn with the run's seed (one rank at a time where ranks are threads)
/// as `config` draws it, checked against the job's spec; then every MoE block keeps this rank's experts
/// and reaches the others through the expert group's dispatcher, with the run's skewed
/// (`--hot-experts`) or zeroed routers.
fn draw_stage<C: StageModelConfig>(job: &Job, config: &C, device: &Device, part: &StagePart) -> Result<C::Model> {
    if config.num_layers() as u64 != job.spec.num_layers {
        let why =
            format!("has {} decoder layers; the spec's `num_layers` is {}", config.num_layers(), job.spec.num_layers);
        return Err(RuntimeError::invalid("the model", why));
    }
    let mut model = {
        let _one_at_a_time = crate::init_lock();
        device.seed(job.run.seed);
        config.init_stage(part, device)
    };
    check_stage(&model, &job.spec, part)?;
    let moe_layers: Vec<usize> = part.layers.clone().filter(|i| part.is_moe[*i]).collect();
    for (block, layer) in model.moe_blocks_mut().into_iter().zip(moe_layers) {
        *block = part.place_experts(layer, block.clone());
        if job.run.hot_experts > 0 {
            block.router = block.router.clone().with_hot_experts(job.run.hot_experts, job.run.hot_factor);
        }
        if job.run.zero_router {
            let gate = &mut block.router.gate.weight;
            *gate = Param::from_tensor(Tensor::zeros(gate.dims(), device));
        }
    }
    Ok(model)
}

/// The stage `part` of a model is the one the spec describes (what the planner priced): its layer
/// count, which of them are MoE, and each MoE block's experts, top-k and widths. The error names the
/// spec's field.
fn check_stage<M: StageModel>(model: &M, spec: &ModelSpec, part: &StagePart) -> Result<()> {
    let refuse = |why: String| Err(RuntimeError::invalid("the model", why));
    let (first, last) = (part.layers.start, part.layers.end);
    if model.num_layers() != part.layers.len() {
        return refuse(format!(
            "its stage of layers {first}..{last} holds {} decoder layers; the spec (`num_layers` {}) puts {} there",
            model.num_layers(),
            spec.num_layers,
            part.layers.len()
        ));
    }
    let blocks = model.moe_blocks();
    let moe_here = part.layers.clone().filter(|i| part.is_moe[*i]).count();
    if blocks.len() != moe_here {
        return refuse(format!(
            "layers {first}..{last} hold {} MoE blocks; the spec's `layers` make {moe_here} of them MoE",
            blocks.len()
        ));
    }
    let Some(moe) = spec.moe.as_ref() else { return Ok(()) };
    for (k, block) in blocks.into_iter().enumerate() {
        let [_, d, f] = block.experts.w_gate_edf.dims();
        let found = [
            ("moe.num_experts", block.router.num_experts as u64, moe.num_experts),
            ("moe.top_k", block.router.top_k as u64, moe.top_k),
            ("hidden_size", d as u64, spec.hidden_size),
            ("moe.expert.intermediate_size", f as u64, moe.expert.intermediate_size),
        ];
        if let Some((field, got, want)) = found.into_iter().find(|(_, got, want)| got != want) {
            return refuse(format!(
                "its MoE block {k} of layers {first}..{last} has {got} where the spec's `{field}` is {want}"
            ));
        }
    }
    Ok(())
}

/// Expert migration when the run asks for it and experts are spread over ranks: the plan's policy with
/// the run's overrides; what one expert's move costs (f32 weights and both AdamW moments) over the
/// platform's intra-node bandwidth and through host memory.
fn migrator(job: &Job, num_moe_total: usize, experts: usize, ep: usize) -> Result<Option<Migrator>> {
    if !job.run.migration || ep < 2 || job.spec.moe.is_none() {
        return Ok(None);
    }
    let (run, policy) = (&job.run, &job.plan.migration);
    let settings = MigrationSettings {
        threshold: run.migration_threshold.unwrap_or(policy.threshold),
        check_every_steps: run.migration_every.unwrap_or(policy.check_every_steps as usize),
        max_swaps: policy.max_swaps,
        bytes_per_expert: expert_bytes(&job.spec, 12.0)?,
        link_gbs: MigrationSettings::staged_gbs(job.platform.topology.intra_node_default_gbs, job.platform.memory_gbs),
        seconds_per_token: seconds_per_routed_token(job, ep)?,
        decision: run.migration_decision,
    };
    settings.payoff().validate()?;
    Ok(Some(Migrator::new(settings, num_moe_total, experts)))
}

/// Seconds one routed token costs the rank holding its expert, forward and backward: 3 × 2·m·d·f FLOPs
/// at the platform's peak and its expert efficiency for this plan's tokens per expert.
fn seconds_per_routed_token(job: &Job, ep: usize) -> Result<f64> {
    let moe = job.spec.moe.as_ref().ok_or(RuntimeError::Internal("migration of a model without MoE layers"))?;
    let (d, f) = (job.spec.hidden_size, moe.expert.intermediate_size);
    let ranks_on_node = (job.world.size() as u64).clamp(1, job.platform.gpus_per_node.max(1));
    let platform = job.platform.for_node_ranks(ranks_on_node);
    let tokens_per_expert =
        (job.plan.micro_batch_size * job.plan.seq_len * moe.top_k) as f64 * ep as f64 / moe.num_experts as f64;
    let rate = platform.peak_flops("fp32")? * platform.experts_efficiency(tokens_per_expert, f, d);
    Ok(6.0 * moe.expert.matrices() as f64 * (d * f) as f64 / rate)
}
