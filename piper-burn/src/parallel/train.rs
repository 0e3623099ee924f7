//! Expert- and data-parallel training step (one pipeline stage): ranks form an EP × DP grid
//! (`rank = ep + EP · dp`); every rank processes its own slice of the global batch; experts are sharded
//! over each expert group and reached through the differentiable all-to-all; gradients are summed over
//! all ranks for non-expert weights and over the expert-data-parallel group for expert weights, after
//! each rank scaled its loss by 1 / (EP · DP) — so the update equals the one-process update on the
//! whole batch.

use std::time::Instant;

use burn::grad_clipping::GradientClippingConfig;
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use piper_comm::alltoall::Algo;
use piper_comm::{Communicator, Topology};

use crate::corpus::Corpus;
use crate::lm::{CausalLm, CausalLmConfig};
use crate::moe::ExpertGroup;
use crate::parallel::exchange::{GroupGuard, register_group, reset_chain};
use crate::train::{StepMetrics, TrainConfig, learning_rate};

/// Expert- and data-parallel degrees (pipeline stages: see the issue tracker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub ep: usize,
    pub dp: usize,
}

/// Parameter ids and ranks of every float parameter.
pub(crate) struct Collect(pub(crate) Vec<(ParamId, usize)>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push((param.id, D));
    }
}

pub(crate) fn expert_param_ids(model: &CausalLm) -> Vec<ParamId> {
    model
        .layers
        .iter()
        .filter_map(|l| l.moe.as_ref())
        .flat_map(|m| [m.experts.w_gate_edf.id, m.experts.w_up_edf.id, m.experts.w_down_efd.id])
        .collect()
}

fn reduce<const D: usize>(grads: &mut GradientsParams, id: ParamId, comm: &dyn Communicator) -> Result<(), String> {
    let Some(g) = grads.remove::<D>(id) else { return Ok(()) };
    let device = g.device();
    let shape = g.shape();
    let mut v: Vec<f32> = g.into_data().convert::<f32>().try_into_vec::<f32>().map_err(|e| format!("{e:?}"))?;
    comm.all_reduce_sum_f32(&mut v, "gradient all-reduce").map_err(|e| e.to_string())?;
    grads.register::<D>(id, Tensor::<D>::from_data(TensorData::new(v, shape), &device));
    Ok(())
}

/// Sums every gradient over the ranks that hold the same weights: `dense` for non-expert weights,
/// `expert` (the expert-data-parallel group) for expert weights.
pub(crate) fn reduce_gradients(
    grads: &mut GradientsParams,
    model: &CausalLm,
    dense: &dyn Communicator,
    expert: &dyn Communicator,
) -> Result<(), String> {
    let mut params = Collect(Vec::new());
    model.visit(&mut params);
    let expert_ids = expert_param_ids(model);
    for (id, dims) in params.0 {
        let comm = if expert_ids.contains(&id) { expert } else { dense };
        match dims {
            1 => reduce::<1>(grads, id, comm)?,
            2 => reduce::<2>(grads, id, comm)?,
            3 => reduce::<3>(grads, id, comm)?,
            d => return Err(format!("unexpected {d}-D parameter")),
        }
    }
    Ok(())
}

/// Tokens per expert summed over all ranks, so selection-bias updates see the global load (as the
/// one-process run does).
pub(crate) fn global_load(
    moe: &[crate::moe::MoeStats],
    world: &dyn Communicator,
) -> Result<Vec<crate::moe::MoeStats>, String> {
    if world.size() == 1 || moe.is_empty() {
        return Ok(moe.to_vec());
    }
    let mut counts: Vec<f32> = moe.iter().flat_map(|m| m.tokens_per_expert.iter().map(|c| *c as f32)).collect();
    world.all_reduce_sum_f32(&mut counts, "expert load all-reduce").map_err(|e| e.to_string())?;
    let mut at = 0;
    Ok(moe
        .iter()
        .map(|m| {
            let n = m.tokens_per_expert.len();
            let tokens_per_expert = counts[at..at + n].iter().map(|c| *c as usize).collect();
            at += n;
            crate::moe::MoeStats { tokens_per_expert, ..m.clone() }
        })
        .collect())
}

/// Trains with `layout` over `world` (whose size must be EP · DP). Every rank gets the same metrics
/// (losses are averaged over the ranks). `c.batch_size` is the global batch. Returns this rank's model
/// (its own expert shards) and the metrics.
#[allow(clippy::too_many_arguments)]
pub fn train_parallel(
    model_config: &CausalLmConfig,
    corpus: &mut dyn Corpus,
    c: &TrainConfig,
    world: &dyn Communicator,
    topo: &Topology,
    layout: Layout,
    algo: Algo,
    device: &Device,
    flops_per_token: f64,
    peak_flops: f64,
    mut on_step: impl FnMut(&StepMetrics),
) -> Result<(CausalLm, Vec<StepMetrics>), String> {
    let ranks = layout.ep * layout.dp;
    if c.seq_len < 2 || c.batch_size == 0 || c.steps == 0 {
        return Err("--seq-len must be ≥ 2, --batch-size and --steps ≥ 1".into());
    }
    if world.size() != ranks {
        return Err(format!(
            "--ep {} × --dp {} = {ranks} ranks, but the job has {}; start it with that many ranks",
            layout.ep,
            layout.dp,
            world.size()
        ));
    }
    if !c.batch_size.is_multiple_of(ranks) {
        return Err(format!(
            "--batch-size {} must be divisible by EP·DP = {ranks} (each rank takes an equal slice)",
            c.batch_size
        ));
    }
    let experts = model_config.layers.iter().find_map(|l| l.moe.as_ref()).map(|m| m.router.num_experts);
    if let Some(e) = experts {
        if e % layout.ep != 0 {
            return Err(format!("--ep {} must divide the {e} experts", layout.ep));
        }
    } else if layout.ep > 1 {
        return Err("--ep > 1 needs an MoE model".into());
    }
    if corpus.vocab_size() > model_config.vocab_size {
        return Err(format!(
            "the data uses {} token ids but the model's vocabulary has {}",
            corpus.vocab_size(),
            model_config.vocab_size
        ));
    }
    let rank = world.rank();
    let (ep_rank, dp_rank) = (rank % layout.ep, rank / layout.ep);
    let expert_group_comm =
        world.split(dp_rank as u64, rank as u64, &format!("expert group {dp_rank}")).map_err(|e| e.to_string())?;
    let expert_dp_comm = world
        .split(ep_rank as u64, rank as u64, &format!("expert data-parallel group {ep_rank}"))
        .map_err(|e| e.to_string())?;
    if topo.world_size() != world.size() {
        return Err(format!("the topology describes {} ranks but the job has {}", topo.world_size(), world.size()));
    }
    let handle = register_group(expert_group_comm, topo.clone(), algo);
    let _release = GroupGuard(handle);

    let device = device.clone().autodiff();
    // The seed may be global to the backend: ranks that are threads of one process initialise one at
    // a time, so every rank draws the same initial weights.
    let mut model = {
        let _one_at_a_time = crate::parallel::init_lock();
        device.seed(c.seed);
        model_config.init(&device)
    };
    if layout.ep > 1 {
        for layer in model.layers.iter_mut() {
            if let Some(block) = layer.moe.take() {
                layer.moe = Some(block.into_expert_parallel(ExpertGroup { handle, rank: ep_rank, size: layout.ep }));
            }
        }
    }
    let mut optim = AdamWConfig::new()
        .with_beta_2(0.95)
        .with_weight_decay(c.weight_decay as f32)
        .with_grad_clipping((c.grad_clip > 0.0).then_some(GradientClippingConfig::Norm(c.grad_clip as f32)))
        .init();
    let local_batch = c.batch_size / ranks;
    let tokens_per_step = (c.batch_size * (c.seq_len - 1)) as f64;
    let mut all = Vec::with_capacity(c.steps);
    for step in 0..c.steps {
        let start = Instant::now();
        let ids = corpus.batch(c.batch_size, c.seq_len);
        let mine = ids[rank * local_batch * c.seq_len..(rank + 1) * local_batch * c.seq_len].to_vec();
        let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(mine, [local_batch, c.seq_len]), &device);
        reset_chain(handle);
        let out = model.loss(ids_bs);
        let mut losses = [out.cross_entropy.clone().into_scalar::<f32>(), out.total.clone().into_scalar::<f32>()];
        world.all_reduce_sum_f32(&mut losses, "loss all-reduce").map_err(|e| e.to_string())?;
        let (loss, total_loss) = (losses[0] as f64 / ranks as f64, losses[1] as f64 / ranks as f64);
        if !loss.is_finite() {
            return Err(format!("step {step}: the loss is {loss}; lower --lr"));
        }
        let mut grads = GradientsParams::from_grads((out.total / ranks as f64).backward(), &model);
        reduce_gradients(&mut grads, &model, world, &*expert_dp_comm)?;
        let lr = learning_rate(c, step);
        model = optim.step(lr, model, grads);
        model = model.update_router_biases(&global_load(&out.moe, world)?, c.bias_update_rate);
        let dt = start.elapsed().as_secs_f64();
        let flops_per_s = flops_per_token * tokens_per_step / dt;
        let m = StepMetrics {
            step,
            loss,
            total_loss,
            lr,
            tokens_per_s: tokens_per_step / dt,
            flops_per_s,
            mfu: flops_per_s / (peak_flops * ranks as f64),
            expert_load: out.moe.iter().map(|s| s.imbalance()).collect(),
            step_time_s: dt,
            bubble: None,
        };
        on_step(&m);
        all.push(m);
    }
    Ok((model, all))
}
