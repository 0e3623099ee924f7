//! Gradients across micro-batches and ranks: accumulation over a step's micro-batches, the sum over the
//! ranks that hold the same weights (a stage's EP × DP ranks for non-expert weights, its
//! expert-data-parallel group for expert weights), and clipping by the global norm over the whole model
//! on all ranks (as `torch.nn.utils.clip_grad_norm_` on one process).

use burn::module::{ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use piper_comm::Communicator;

use super::error::{Result, RuntimeError, host_f32};
use crate::model::StageModel;

/// Parameter ids and ranks of every float parameter.
pub struct Collect(pub Vec<(ParamId, usize)>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push((param.id, D));
    }
}

/// Every float parameter of `model`: (id, rank, is an expert weight).
pub fn parameters<M: StageModel>(model: &M) -> Vec<(ParamId, usize, bool)> {
    let mut all = Collect(Vec::new());
    model.visit(&mut all);
    let experts: Vec<ParamId> = model
        .moe_blocks()
        .into_iter()
        .flat_map(|m| [m.experts.w_gate_edf.id, m.experts.w_up_edf.id, m.experts.w_down_efd.id])
        .collect();
    all.0.into_iter().map(|(id, d)| (id, d, experts.contains(&id))).collect()
}

macro_rules! by_rank {
    ($dims:expr, $f:ident, $($arg:expr),*) => {
        match $dims {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            _ => Err(RuntimeError::Internal("a parameter of more than 3 dimensions")),
        }
    };
}

fn add<const D: usize>(acc: &mut GradientsParams, new: &mut GradientsParams, id: ParamId) -> Result<()> {
    if let Some(g) = new.remove::<D>(id) {
        let sum = match acc.remove::<D>(id) {
            Some(prev) => prev + g,
            None => g,
        };
        acc.register::<D>(id, sum);
    }
    Ok(())
}

/// Adds a micro-batch's gradients to the step's.
pub fn accumulate(
    acc: &mut Option<GradientsParams>,
    mut new: GradientsParams,
    params: &[(ParamId, usize, bool)],
) -> Result<()> {
    let Some(a) = acc.as_mut() else {
        *acc = Some(new);
        return Ok(());
    };
    for &(id, dims, _) in params {
        by_rank!(dims, add, a, &mut new, id)?;
    }
    Ok(())
}

fn reduce<const D: usize>(grads: &mut GradientsParams, id: ParamId, comm: &dyn Communicator) -> Result<()> {
    let Some(g) = grads.remove::<D>(id) else { return Ok(()) };
    let device = g.device();
    let shape = g.shape();
    let mut v = host_f32(g, "a gradient")?;
    comm.all_reduce_sum_f32(&mut v, "gradient all-reduce")?;
    grads.register::<D>(id, Tensor::<D>::from_data(TensorData::new(v, shape), &device));
    Ok(())
}

/// Sums every gradient over the ranks that hold the same weights: `dense` for non-expert weights,
/// `expert` (the expert-data-parallel group) for expert weights.
pub fn reduce_gradients(
    grads: &mut GradientsParams,
    params: &[(ParamId, usize, bool)],
    dense: &dyn Communicator,
    expert: &dyn Communicator,
) -> Result<()> {
    for &(id, dims, is_expert) in params {
        let comm = if is_expert { expert } else { dense };
        if comm.size() > 1 {
            by_rank!(dims, reduce, grads, id, comm)?;
        }
    }
    Ok(())
}

fn square_sum<const D: usize>(grads: &GradientsParams, id: ParamId, out: &mut f64) -> Result<()> {
    if let Some(g) = grads.get::<D>(id) {
        let v = host_f32(kernels_cubecl::square_sum(g), "a gradient's sum of squares")?;
        *out += v[0] as f64;
    }
    Ok(())
}

/// Global gradient norm over the model's parameters on every rank, and the factor that clips it to
/// `max_norm` (1 when `max_norm` is 0 or not exceeded): `(norm, factor)`. The optimiser multiplies the
/// gradients by the factor in its own pass ([`super::optim::AdamW::step_scaled`]) instead of a pass here. After [`reduce_gradients`], a non-expert gradient is the same on
/// the `dense_copies` ranks of its stage and an expert gradient on its `expert_copies` expert-data-parallel
/// ranks: each rank adds its squares divided by the copies, so the sum over `world` counts each weight once.
pub fn clip_global_norm(
    grads: &GradientsParams,
    params: &[(ParamId, usize, bool)],
    max_norm: f64,
    world: &dyn Communicator,
    dense_copies: usize,
    expert_copies: usize,
) -> Result<(f64, f64)> {
    let (mut dense, mut expert) = (0.0f64, 0.0f64);
    for &(id, dims, is_expert) in params {
        by_rank!(dims, square_sum, grads, id, if is_expert { &mut expert } else { &mut dense })?;
    }
    let mut sq = [(dense / dense_copies as f64 + expert / expert_copies as f64) as f32];
    world.all_reduce_sum_f32(&mut sq, "gradient norm all-reduce")?;
    let norm = (sq[0] as f64).sqrt();
    if !norm.is_finite() {
        return Err(RuntimeError::GradientNorm { norm });
    }
    // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when the norm exceeds max_norm.
    let factor = if max_norm > 0.0 && norm > max_norm { max_norm / (norm + 1e-6) } else { 1.0 };
    Ok((norm, factor))
}
