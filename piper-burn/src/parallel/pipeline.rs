//! Pipelined hybrid parallelism: ranks form a PP × EP × DP grid (`rank = ep + EP·(dp + DP·stage)`).
//! Each stage runs its layers for M micro-batches in the order of the schedule's op list — the same
//! GPipe / 1F1B lists the planner simulates (`piper_planner::schedule::ops`). Activations go to the
//! next stage and gradients come back with nonblocking point-to-point messages; a stage's backward is
//! the vector-Jacobian product of its output with the received gradient. Gradients accumulate over the
//! micro-batches, then are summed over the stage's EP·DP ranks (non-expert weights) or its
//! expert-data-parallel group (expert weights) before the optimizer step.

use std::ops::Range;
use std::time::Instant;

use burn::grad_clipping::GradientClippingConfig;
use burn::module::{Module, ParamId};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use piper_comm::alltoall::Algo;
use piper_comm::communicator::wait_all;
use piper_comm::{Communicator, Pending, Topology};
use piper_planner::layout::{Schedule, StageSplit};
use piper_planner::schedule::{Op, ops};

use crate::corpus::Corpus;
use crate::lm::{CausalLm, CausalLmConfig};
use crate::moe::ExpertGroup;
use crate::parallel::exchange::{GroupGuard, register_group, reset_chain};
use crate::parallel::train::{Collect, global_load, reduce_gradients};
use crate::train::{StepMetrics, TrainConfig, learning_rate};

/// A full layout with micro-batching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineLayout {
    pub pp: usize,
    pub ep: usize,
    pub dp: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    pub schedule: Schedule,
    /// Layers per stage (`None`: even split, remainder on the last stages).
    pub split: Option<Vec<usize>>,
}

/// What a forward op left for its backward.
struct Saved {
    input: Option<Tensor<3>>,
    output: Tensor<3>,
    /// Last stage: the scaled loss; other stages: the router-loss term of the stage's layers.
    local_loss: Option<Tensor<1>>,
    moe: Vec<crate::moe::MoeStats>,
}

fn to_bytes(t: Tensor<3>) -> Result<Vec<u8>, String> {
    let v: Vec<f32> = t.into_data().convert::<f32>().try_into_vec::<f32>().map_err(|e| format!("{e:?}"))?;
    Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn from_bytes(b: &[u8], shape: [usize; 3], device: &Device) -> Tensor<3> {
    let v: Vec<f32> = b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

fn accumulate(acc: &mut Option<GradientsParams>, mut new: GradientsParams, params: &[(ParamId, usize)]) {
    let Some(a) = acc.as_mut() else {
        *acc = Some(new);
        return;
    };
    for &(id, dims) in params {
        macro_rules! add {
            ($d:literal) => {{
                if let Some(g) = new.remove::<$d>(id) {
                    let sum = match a.remove::<$d>(id) {
                        Some(prev) => prev + g,
                        None => g,
                    };
                    a.register::<$d>(id, sum);
                }
            }};
        }
        match dims {
            1 => add!(1),
            2 => add!(2),
            3 => add!(3),
            _ => {}
        }
    }
}

/// Trains with pipeline stages. Every rank gets the same metrics (losses averaged over data ranks).
#[allow(clippy::too_many_arguments)]
pub fn train_pipelined(
    model_config: &CausalLmConfig,
    corpus: &mut dyn Corpus,
    c: &TrainConfig,
    world: &dyn Communicator,
    topo: &Topology,
    layout: &PipelineLayout,
    algo: Algo,
    device: &Device,
    flops_per_token: f64,
    peak_flops: f64,
    mut on_step: impl FnMut(&StepMetrics),
) -> Result<Vec<StepMetrics>, String> {
    let (pp, ep, dp, m) = (layout.pp, layout.ep, layout.dp, layout.micro_batches);
    let ranks = pp * ep * dp;
    let num_layers = model_config.layers.len();
    if pp == 0 || ep == 0 || dp == 0 || m == 0 {
        return Err("--pp, --ep, --dp and --micro-batches must be ≥ 1".into());
    }
    if world.size() != ranks {
        return Err(format!("--pp {pp} × --ep {ep} × --dp {dp} = {ranks} ranks, but the job has {}", world.size()));
    }
    if pp > num_layers {
        return Err(format!("--pp {pp} > {num_layers} layers"));
    }
    let replicas = ep * dp;
    if !c.batch_size.is_multiple_of(replicas * m) {
        return Err(format!(
            "--batch-size {} must be divisible by EP·DP·micro-batches = {}",
            c.batch_size,
            replicas * m
        ));
    }
    if let Some(e) = model_config.layers.iter().find_map(|l| l.moe.as_ref()).map(|x| x.router.num_experts)
        && e % ep != 0
    {
        return Err(format!("--ep {ep} must divide the {e} experts"));
    }
    let split = match &layout.split {
        Some(s) => StageSplit(s.iter().map(|x| *x as u64).collect()),
        None => StageSplit::even(num_layers as u64, pp as u64),
    };
    split.validate(num_layers as u64, pp as u64).map_err(|e| e.to_string())?;
    let rank = world.rank();
    let (ep_rank, dp_rank, stage) = (rank % ep, (rank / ep) % dp, rank / replicas);
    let first = split.starts()[stage] as usize;
    let layers: Range<usize> = first..first + split.0[stage] as usize;
    let (is_first, is_last) = (stage == 0, stage == pp - 1);

    let stage_comm = world.split(stage as u64, rank as u64, &format!("stage {stage}")).map_err(|e| e.to_string())?;
    let expert_comm = world
        .split((stage * dp + dp_rank) as u64, rank as u64, &format!("expert group {dp_rank} of stage {stage}"))
        .map_err(|e| e.to_string())?;
    let expert_dp_comm = world
        .split(
            (stage * ep + ep_rank) as u64,
            rank as u64,
            &format!("expert data-parallel group {ep_rank} of stage {stage}"),
        )
        .map_err(|e| e.to_string())?;
    let handle = register_group(expert_comm, topo.clone(), algo);
    let _release = GroupGuard(handle);

    let device = device.clone().autodiff();
    let mut model: CausalLm = {
        let _one = crate::parallel::init_lock();
        device.seed(c.seed);
        model_config.init(&device)
    };
    // Every rank draws the whole model (so a seed means the same weights for any layout), then keeps
    // only its stage's layers (and only its experts of them).
    let num_moe = model.num_moe_layers();
    model.layers = model.layers.drain(layers.clone()).collect();
    let layers = 0..model.layers.len();
    if ep > 1 {
        for layer in model.layers.iter_mut() {
            if let Some(block) = layer.moe.take() {
                layer.moe = Some(block.into_expert_parallel(ExpertGroup { handle, rank: ep_rank, size: ep }));
            }
        }
    }
    let mut optim = AdamWConfig::new()
        .with_beta_2(0.95)
        .with_weight_decay(c.weight_decay as f32)
        .with_grad_clipping((c.grad_clip > 0.0).then_some(GradientClippingConfig::Norm(c.grad_clip as f32)))
        .init();
    let local_batch = c.batch_size / replicas;
    let mbs = local_batch / m;
    let seq = c.seq_len - 1;
    let d = model_config.d_model;
    let scale = 1.0 / (replicas * m) as f64;
    let (prev, next) = (rank.wrapping_sub(replicas), rank + replicas);
    let op_list = ops(layout.schedule, stage as u64, pp as u64, m as u64);
    let tokens_per_step = (c.batch_size * seq) as f64;
    let mut all = Vec::with_capacity(c.steps);
    for step in 0..c.steps {
        let start = Instant::now();
        let ids = corpus.batch(c.batch_size, c.seq_len);
        let data_rank = dp_rank * ep + ep_rank;
        let mine = &ids[data_rank * local_batch * c.seq_len..(data_rank + 1) * local_batch * c.seq_len];
        let micro = |i: usize| -> Tensor<2, Int> {
            let rows = mine[i * mbs * c.seq_len..(i + 1) * mbs * c.seq_len].to_vec();
            Tensor::from_data(TensorData::new(rows, [mbs, c.seq_len]), &device)
        };
        let mut saved: Vec<Option<Saved>> = (0..m).map(|_| None).collect();
        let mut sends: Vec<Box<dyn Pending>> = Vec::new();
        let mut acc: Option<GradientsParams> = None;
        let mut ce_sum = 0.0f32;
        let mut moe_all = Vec::new();
        let mut params = Collect(Vec::new());
        model.visit(&mut params);
        // Time spent computing (ops minus the waits for neighbours' messages): the measured bubble.
        let mut busy = 0.0f64;
        let pipeline_start = Instant::now();
        for op in &op_list {
            let op_start = Instant::now();
            let mut waited = 0.0f64;
            match *op {
                Op::Forward(i) => {
                    let i = i as usize;
                    reset_chain(handle);
                    let ids_bs = micro(i);
                    let input = if is_first {
                        None
                    } else {
                        let w = Instant::now();
                        let got = wait_all(
                            world,
                            vec![world.irecv(prev, (2 * i) as u32, mbs * seq * d * 4).map_err(|e| e.to_string())?],
                            &format!("stage {stage} receive activations of micro-batch {i}"),
                        )
                        .map_err(|e| e.to_string())?;
                        waited += w.elapsed().as_secs_f64();
                        Some(from_bytes(&got[0], [mbs, seq, d], &device).require_grad())
                    };
                    let x = match &input {
                        Some(x) => x.clone(),
                        None => model.embed_tokens(ids_bs.clone().narrow(1, 0, seq)),
                    };
                    let (out, moe) = model.forward_layers(x, layers.clone());
                    let router = model.router_losses(&moe, num_moe).map(|r| r * scale);
                    let local_loss = if is_last {
                        let ce = model.cross_entropy(model.head(out.clone()), ids_bs.narrow(1, 1, seq));
                        ce_sum += ce.clone().into_scalar::<f32>();
                        Some(match router {
                            Some(r) => ce * scale + r,
                            None => ce * scale,
                        })
                    } else {
                        sends.push(
                            world
                                .isend(next, (2 * i) as u32, to_bytes(out.clone().detach())?)
                                .map_err(|e| e.to_string())?,
                        );
                        router
                    };
                    saved[i] = Some(Saved { input, output: out, local_loss, moe });
                }
                Op::Backward(i) => {
                    let i = i as usize;
                    let s = saved[i]
                        .take()
                        .ok_or_else(|| format!("schedule bug: backward of micro-batch {i} before its forward"))?;
                    let objective = if is_last {
                        s.local_loss.expect("the last stage keeps its loss")
                    } else {
                        let w = Instant::now();
                        let got = wait_all(
                            world,
                            vec![world.irecv(next, (2 * i + 1) as u32, mbs * seq * d * 4).map_err(|e| e.to_string())?],
                            &format!("stage {stage} receive gradients of micro-batch {i}"),
                        )
                        .map_err(|e| e.to_string())?;
                        waited += w.elapsed().as_secs_f64();
                        let g = from_bytes(&got[0], [mbs, seq, d], &device);
                        let vjp = (s.output * g).sum();
                        match s.local_loss {
                            Some(r) => vjp + r,
                            None => vjp,
                        }
                    };
                    let grads = objective.backward();
                    if let Some(x) = &s.input {
                        let gx = x.grad(&grads).ok_or("the stage input got no gradient")?;
                        let gx: Tensor<3> = Tensor::from_data(gx.into_data(), &device);
                        sends.push(world.isend(prev, (2 * i + 1) as u32, to_bytes(gx)?).map_err(|e| e.to_string())?);
                    }
                    accumulate(&mut acc, GradientsParams::from_grads(grads, &model), &params.0);
                    moe_all.extend(s.moe);
                }
            }
            busy += op_start.elapsed().as_secs_f64() - waited;
        }
        let makespan = pipeline_start.elapsed().as_secs_f64();
        wait_all(world, sends, &format!("stage {stage} pipeline sends")).map_err(|e| e.to_string())?;
        let mut grads = acc.unwrap_or_default();
        reduce_gradients(&mut grads, &model, &*stage_comm, &*expert_dp_comm)?;
        let lr = learning_rate(c, step);
        model = optim.step(lr, model, grads);
        // Only this stage's routers change: their load, summed over micro-batches and the stage's ranks.
        let stage_moe = model.layers[layers.clone()].iter().filter(|l| l.moe.is_some()).count();
        let mut per_layer: Vec<crate::moe::MoeStats> = moe_all.iter().take(stage_moe).cloned().collect();
        for (j, s) in moe_all.iter().enumerate().skip(stage_moe) {
            let acc = &mut per_layer[j % stage_moe].tokens_per_expert;
            for (a, b) in acc.iter_mut().zip(&s.tokens_per_expert) {
                *a += b;
            }
        }
        model =
            model.update_router_biases_from(layers.start, &global_load(&per_layer, &*stage_comm)?, c.bias_update_rate);
        let mut sums = [ce_sum / m as f32, (1.0 - busy / makespan.max(1e-12)) as f32];
        world.all_reduce_sum_f32(&mut sums, "loss all-reduce").map_err(|e| e.to_string())?;
        let loss = sums[0] as f64 / replicas as f64;
        let bubble = sums[1] as f64 / ranks as f64;
        if !loss.is_finite() {
            return Err(format!("step {step}: the loss is {loss}; lower --lr"));
        }
        let dt = start.elapsed().as_secs_f64();
        let flops_per_s = flops_per_token * tokens_per_step / dt;
        let metrics = StepMetrics {
            step,
            loss,
            total_loss: loss,
            lr,
            tokens_per_s: tokens_per_step / dt,
            flops_per_s,
            mfu: flops_per_s / (peak_flops * ranks as f64),
            expert_load: moe_all.iter().map(|s| s.imbalance()).collect(),
            step_time_s: dt,
            bubble: Some(bubble),
        };
        on_step(&metrics);
        all.push(metrics);
    }
    Ok(all)
}
