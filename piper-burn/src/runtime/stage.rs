//! One rank's pipeline stage and one handler per instruction of its stream (`LoadMicroBatch`,
//! `RecvActivation`, `Forward`, `SendActivation`, `RecvGrad`, `Backward`, `SendGrad`, `ReduceGrads`,
//! `OptimizerStep`), in the spirit of DeepSpeed's `_INSTRUCTION_MAP`. Activations go to the next stage
//! and gradients come back with nonblocking point-to-point messages (tags `2i` and `2i + 1` for
//! micro-batch i); a stage's backward is the vector-Jacobian product of its output with the received
//! gradient.

use std::sync::Arc;
use std::time::Instant;

use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::prelude::*;
use piper_comm::communicator::wait_all;
use piper_comm::{Communicator, Pending};
use piper_planner::layout::Recompute;
use piper_planner::schedule::Instr;

use super::error::{Result, RuntimeError, host_f32};
use super::grads::{accumulate, clip_global_norm, parameters, reduce_gradients};
use super::optim::AdamW;
use super::profile;
use crate::layers::recompute::SelectiveRecompute;
use crate::model::StageModel;
use crate::moe::dispatcher::{SharedComm, TokenDispatcher};
use crate::moe::losses::RouterLossWeights;

/// Where a stage sits and the sizes of its micro-batches.
pub(crate) struct StageShape {
    pub index: usize,
    pub is_last: bool,
    /// World ranks of the same replica in the previous and next stage.
    pub prev: usize,
    pub next: usize,
    /// EP·DP replicas per stage, this rank's replica, and the data-parallel degree.
    pub replicas: usize,
    pub data_rank: usize,
    pub dp: usize,
    /// Sequences per micro-batch, tokens per sequence, model width.
    pub mbs: usize,
    pub seq: usize,
    pub d_model: usize,
    /// Loss scale 1 / (EP·DP·M).
    pub scale: f64,
    /// MoE layers of the whole model, this stage's first one, routed experts per layer.
    pub num_moe_total: usize,
    pub first_moe: usize,
    pub experts: usize,
}

/// An instruction's `tracing` span: the schedule's name for it (as `piper predict --trace` names it)
/// and its micro-batch.
fn instr_span(instr: Instr) -> tracing::Span {
    use tracing::info_span;
    match instr {
        Instr::LoadMicroBatch(i) => info_span!("load_micro_batch", micro_batch = i),
        Instr::RecvActivation(i) => info_span!("recv_activation", micro_batch = i),
        Instr::Forward(i) => info_span!("forward", micro_batch = i),
        Instr::SendActivation(i) => info_span!("send_activation", micro_batch = i),
        Instr::RecvGrad(i) => info_span!("recv_grad", micro_batch = i),
        Instr::Backward(i) => info_span!("backward", micro_batch = i),
        Instr::SendGrad(i) => info_span!("send_grad", micro_batch = i),
        Instr::ReduceGrads => info_span!("reduce_grads"),
        Instr::OptimizerStep => info_span!("optimizer_step"),
    }
}

impl StageShape {
    /// Whether this rank reads row `row` of a global batch: the first stage embeds its replica's rows and
    /// the last takes their targets (see [`Stage::load_micro_batch`]); middle stages read none.
    pub fn needs_row(&self, row: usize) -> bool {
        (self.index == 0 || self.is_last) && (row / self.mbs) % self.replicas == self.data_rank
    }
}

/// One rank's stage: its layers, optimizer and groups.
pub(crate) struct Stage<'a, M: StageModel> {
    pub shape: StageShape,
    pub model: M,
    pub router_loss: RouterLossWeights,
    pub optim: AdamW,
    pub world: &'a dyn Communicator,
    /// The stage's EP·DP ranks (non-expert gradients) and this rank's expert-data-parallel group.
    pub stage_comm: SharedComm,
    pub expert_dp_comm: Box<dyn Communicator>,
    pub dispatcher: Option<Arc<dyn TokenDispatcher>>,
    pub device: Device,
    pub grad_clip: f64,
    /// What the forward keeps for the backward: every activation, all but the MLPs' `silu(gate) ⊙ up`
    /// (selective), or each layer's input (full).
    pub recompute: Recompute,
}

/// What a recomputing forward (`--recompute full`, see `super::recompute`) keeps of one micro-batch.
/// Legend: b = sequences of the micro-batch, s = sequence length, d = model width.
pub(crate) struct LayerInputs {
    /// Each layer's input `[b, s, d]`, without autodiff.
    pub inputs_bsd: Vec<Tensor<3>>,
    /// First stage: the embedding's output, with its graph (the token ids are its only saved state).
    pub embedded_bsd: Option<Tensor<3>>,
    /// Last stage: the last layer's output as a leaf of the head's graph.
    pub head_input_bsd: Option<Tensor<3>>,
}

/// What a forward left for its backward.
pub(crate) struct Saved {
    input: Option<Tensor<3>>,
    output: Tensor<3>,
    /// Last stage: the scaled loss; other stages: the router-loss term of the stage's layers (full
    /// recompute: only the last stage's cross-entropy; the layers' terms come back in their recompute).
    pub local_loss: Option<Tensor<1>>,
    /// Full recompute: the layers' inputs.
    pub recompute: Option<LayerInputs>,
}

/// What one step accumulates while its instructions run.
pub(crate) struct StepState<M> {
    ids: Vec<i64>,
    batches: Vec<Option<Tensor<2, Int>>>,
    inputs: Vec<Option<Tensor<3>>>,
    pub out_grads: Vec<Option<Tensor<3>>>,
    pub in_grads: Vec<Option<Tensor<3>>>,
    saved: Vec<Option<Saved>>,
    sends: Vec<Box<dyn Pending>>,
    pub acc: Option<GradientsParams>,
    pub params: Vec<(ParamId, usize, bool)>,
    /// Full recompute: the stage's model without autodiff, for this step's forwards.
    pub frozen: Option<M>,
    /// Cross-entropy summed over micro-batches (last stage) and the scaled router-loss terms.
    pub ce_sum: f32,
    pub router_sum: f32,
    /// Tokens per expert of every MoE layer of the model (this stage's layers filled), over the step.
    pub load: Vec<f32>,
    pub grad_norm: f64,
    /// The clipping factor the optimiser applies to the gradients (1: not clipped).
    pub grad_scale: f64,
    /// Compute time (waits for neighbours excluded) and the time until the last backward.
    pub busy: f64,
    pub makespan: f64,
    start: Instant,
}

pub(super) fn to_bytes(t: Tensor<3>) -> Result<Vec<u8>> {
    Ok(host_f32(t, "a stage boundary tensor")?.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn from_bytes(b: &[u8], shape: [usize; 3], device: &Device) -> Tensor<3> {
    let v: Vec<f32> = b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

pub(super) fn scalar(t: Tensor<1>) -> Result<f32> {
    Ok(host_f32(t, "a loss")?[0])
}

impl<M: StageModel> Stage<'_, M> {
    /// A fresh step over the global batch's token ids `ids` with `m` micro-batches.
    pub fn begin_step(&self, ids: Vec<i64>, m: usize) -> StepState<M> {
        StepState {
            ids,
            params: parameters(&self.model),
            batches: vec![None; m],
            inputs: vec![None; m],
            out_grads: vec![None; m],
            in_grads: vec![None; m],
            saved: (0..m).map(|_| None).collect(),
            sends: Vec::new(),
            acc: None,
            frozen: None,
            ce_sum: 0.0,
            router_sum: 0.0,
            load: vec![0.0; self.shape.num_moe_total * self.shape.experts],
            grad_norm: 0.0,
            grad_scale: 1.0,
            busy: 0.0,
            makespan: 0.0,
            start: Instant::now(),
        }
    }

    /// Runs one instruction (its handler) and books its compute time.
    pub fn run(&mut self, instr: Instr, st: &mut StepState<M>, lr: f64) -> Result<()> {
        let _span = instr_span(instr).entered();
        let t = Instant::now();
        let _phase = profile::phase(match instr {
            Instr::LoadMicroBatch(_) => "load",
            Instr::Forward(_) => "forward",
            Instr::Backward(_) => "backward",
            Instr::RecvActivation(_) | Instr::SendActivation(_) | Instr::RecvGrad(_) | Instr::SendGrad(_) => "p2p",
            Instr::ReduceGrads => "gradients",
            Instr::OptimizerStep => "optimizer",
        });
        let waited = match instr {
            Instr::LoadMicroBatch(i) => self.load_micro_batch(st, i as usize),
            Instr::RecvActivation(i) => self.recv_activation(st, i as usize)?,
            Instr::Forward(i) => self.forward(st, i as usize)?,
            Instr::SendActivation(i) => self.send_activation(st, i as usize)?,
            Instr::RecvGrad(i) => self.recv_grad(st, i as usize)?,
            Instr::Backward(i) => self.backward(st, i as usize)?,
            Instr::SendGrad(i) => self.send_grad(st, i as usize)?,
            Instr::ReduceGrads => return self.reduce_grads(st),
            Instr::OptimizerStep => return self.optimizer_step(st, lr),
        };
        st.busy += t.elapsed().as_secs_f64() - waited;
        Ok(())
    }

    /// Micro-batch i of the step is rows `[i·R·mbs, (i + 1)·R·mbs)` of the global batch, split over the R
    /// = EP·DP replicas: the same sequences whatever the layout, so a layout equals one process with the
    /// same micro-batch count (the load-balancing loss sees one micro-batch at a time, as in Megatron).
    fn load_micro_batch(&self, st: &mut StepState<M>, i: usize) -> f64 {
        let s = &self.shape;
        let first_row = (i * s.replicas + s.data_rank) * s.mbs;
        let rows = st.ids[first_row * (s.seq + 1)..(first_row + s.mbs) * (s.seq + 1)].to_vec();
        st.batches[i] = Some(Tensor::from_data(TensorData::new(rows, [s.mbs, s.seq + 1]), &self.device));
        0.0
    }

    /// Waits for a neighbour's message; returns it and the seconds waited.
    pub(super) fn receive(&self, from: usize, tag: usize, what: &str, i: usize) -> Result<(Tensor<3>, f64)> {
        let s = &self.shape;
        let t = Instant::now();
        let op = format!("stage {} receive {what} of micro-batch {i}", s.index);
        let pending = self.world.irecv(from, tag as u32, s.mbs * s.seq * s.d_model * 4)?;
        let got = wait_all(self.world, vec![pending], &op)?;
        Ok((from_bytes(&got[0], [s.mbs, s.seq, s.d_model], &self.device), t.elapsed().as_secs_f64()))
    }

    fn recv_activation(&self, st: &mut StepState<M>, i: usize) -> Result<f64> {
        let (x, waited) = self.receive(self.shape.prev, 2 * i, "activations", i)?;
        st.inputs[i] = Some(x.require_grad());
        Ok(waited)
    }

    fn forward(&self, st: &mut StepState<M>, i: usize) -> Result<f64> {
        let (s, model) = (&self.shape, &self.model);
        if let Some(d) = &self.dispatcher {
            d.begin_forward();
        }
        let input = st.inputs[i].take();
        let x = match &input {
            Some(x) => x.clone(),
            None => {
                let ids = st.batches[i]
                    .clone()
                    .ok_or(RuntimeError::Internal("schedule bug: forward before its micro-batch"))?;
                model.embed_tokens(ids.narrow(1, 0, s.seq))
            }
        };
        let (out, moe, kept) = match self.recompute {
            Recompute::Full => {
                let (out, moe, kept) = self.forward_keeping_inputs(st, x);
                (out, moe, Some(kept))
            }
            _ => {
                let _selective = SelectiveRecompute::enter(self.recompute == Recompute::Selective);
                let (out, moe) = model.forward_stage(x);
                (out, moe, None)
            }
        };
        for (j, stats) in moe.iter().enumerate() {
            let row = &mut st.load[(s.first_moe + j) * s.experts..(s.first_moe + j + 1) * s.experts];
            for (a, c) in row.iter_mut().zip(&stats.tokens_per_expert) {
                *a += *c as f32;
            }
        }
        let router = self.router_loss.terms(&moe, s.num_moe_total).map(|r| r * s.scale);
        if let Some(r) = &router {
            st.router_sum += scalar(r.clone())?;
        }
        // Recomputed layers add their router terms in their own backward.
        let router = router.filter(|_| kept.is_none());
        let local_loss = if s.is_last {
            let ids =
                st.batches[i].take().ok_or(RuntimeError::Internal("schedule bug: the last stage has no targets"))?;
            let head_in = kept.as_ref().and_then(|k| k.head_input_bsd.clone()).unwrap_or_else(|| out.clone());
            let ce = model.head_loss(head_in, ids.narrow(1, 1, s.seq));
            st.ce_sum += scalar(ce.clone())?;
            Some(match router {
                Some(r) => ce * s.scale + r,
                None => ce * s.scale,
            })
        } else {
            router
        };
        st.saved[i] = Some(Saved { input, output: out, local_loss, recompute: kept });
        Ok(0.0)
    }

    fn send_activation(&self, st: &mut StepState<M>, i: usize) -> Result<f64> {
        let out =
            st.saved[i].as_ref().ok_or(RuntimeError::Internal("schedule bug: send before forward"))?.output.clone();
        let bytes = to_bytes(out.detach())?;
        st.sends.push(self.world.isend(self.shape.next, (2 * i) as u32, bytes)?);
        Ok(0.0)
    }

    fn recv_grad(&self, st: &mut StepState<M>, i: usize) -> Result<f64> {
        let (g, waited) = self.receive(self.shape.next, 2 * i + 1, "gradients", i)?;
        st.out_grads[i] = Some(g);
        Ok(waited)
    }

    fn backward(&self, st: &mut StepState<M>, i: usize) -> Result<f64> {
        let saved = st.saved[i].take().ok_or(RuntimeError::Internal("schedule bug: backward before forward"))?;
        if saved.recompute.is_some() {
            self.backward_recomputing(st, i, saved)?;
            return Ok(0.0);
        }
        let objective = match st.out_grads[i].take() {
            // The vector-Jacobian product of the stage's output with the received gradient.
            Some(g) => {
                let vjp = (saved.output * g).sum();
                match saved.local_loss {
                    Some(r) => vjp + r,
                    None => vjp,
                }
            }
            None => saved
                .local_loss
                .ok_or(RuntimeError::Internal("schedule bug: a middle stage's backward without a gradient"))?,
        };
        let grads = objective.backward();
        if let Some(x) = &saved.input {
            let gx = x.grad(&grads).ok_or(RuntimeError::Internal("the stage input got no gradient"))?;
            st.in_grads[i] = Some(Tensor::from_data(gx.into_data(), &self.device));
        }
        accumulate(&mut st.acc, GradientsParams::from_grads(grads, &self.model), &st.params)?;
        Ok(0.0)
    }

    fn send_grad(&self, st: &mut StepState<M>, i: usize) -> Result<f64> {
        let g = st.in_grads[i].take().ok_or(RuntimeError::Internal("schedule bug: send of a gradient not computed"))?;
        st.sends.push(self.world.isend(self.shape.prev, (2 * i + 1) as u32, to_bytes(g)?)?);
        Ok(0.0)
    }

    /// Waits for the step's sends, sums the gradients over the ranks that hold the same weights, and
    /// finds the global norm and the clipping factor (applied in the optimiser's pass).
    fn reduce_grads(&self, st: &mut StepState<M>) -> Result<()> {
        st.makespan = st.start.elapsed().as_secs_f64();
        let sends = std::mem::take(&mut st.sends);
        wait_all(self.world, sends, &format!("stage {} pipeline sends", self.shape.index))?;
        let grads = st.acc.get_or_insert_with(GradientsParams::new);
        reduce_gradients(grads, &st.params, self.stage_comm.get(), self.expert_dp_comm.as_ref())?;
        (st.grad_norm, st.grad_scale) =
            clip_global_norm(grads, &st.params, self.grad_clip, self.world, self.shape.replicas, self.shape.dp)?;
        Ok(())
    }

    fn optimizer_step(&mut self, st: &mut StepState<M>, lr: f64) -> Result<()> {
        st.frozen = None;
        let grads = st.acc.take().unwrap_or_default();
        // The model by value, not a clone: each old weight is freed as its update is written, instead
        // of every one held until the step ends (4 more bytes per parameter at the step's peak). A
        // panic inside the step aborts the process: it would leave the rank without a model.
        let optim = &mut self.optim;
        replace_with::replace_with_or_abort(&mut self.model, |model| {
            optim.step_scaled(lr, model, &grads, st.grad_scale)
        });
        Ok(())
    }
}
