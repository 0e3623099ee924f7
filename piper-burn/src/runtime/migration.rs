//! Expert migration at run time (Piper §VI-A): watch the tokens each expert receives, and when an
//! expert group's ranks are imbalanced beyond the policy's threshold, move the fewest experts — weights
//! and AdamW moments — between the ranks of the group, as the planner's hill climbing decides.
//!
//! Every rank sees the same counts (all-reduced each step over the world) and runs the same
//! deterministic decision, so no coordination round is needed; debug builds check a fingerprint of
//! the decision. The move is point-to-point inside each expert group (each data-parallel replica's
//! group moves its own copies), then the layer's placement table changes so dispatch sends the next
//! tokens to the new owner. The model's function is unchanged.

use std::time::Instant;

use burn::module::{Param, ParamId};
use burn::prelude::*;
use piper_comm::Communicator;
use piper_comm::communicator::{MAX_USER_TAG, Pending, wait_all};
use piper_planner::layout::Layout;
use piper_planner::migration::{Migration, rebalance};
use serde::Serialize;

use super::optim::AdamW;
use crate::dispatcher::ExpertPlacement;
use crate::moe::MoeBlock;

/// Migration messages use tags `TAG_BASE + expert` (no pipeline message is in flight between steps).
const TAG_BASE: u32 = 8192;

/// The policy a run follows (the plan's, with the command line's overrides).
#[derive(Clone, Debug, PartialEq)]
pub struct MigrationSettings {
    /// Rebalance a layer whose max/mean tokens per rank of the expert group exceeds this.
    pub threshold: f64,
    /// Steps between checks; the counts are summed over them.
    pub check_every_steps: usize,
    /// Hill-climbing swaps per rebalancing.
    pub max_swaps: u64,
    /// Bytes moved per expert (weights and both moments) and the link bandwidth, for the prediction.
    pub bytes_per_expert: f64,
    pub link_gbs: f64,
}

/// One migration of one MoE layer (in every expert group of the layer's stage), as the metrics report it.
#[derive(Clone, Debug, Serialize)]
pub struct MigrationEvent {
    /// Index of the MoE layer in the model.
    pub layer: usize,
    pub swaps: usize,
    pub experts_moved: u64,
    /// Bytes one expert group moved.
    pub bytes: f64,
    /// Measured wall time of the move, mean over the layer's ranks.
    pub seconds: f64,
    /// The planner's cost model (Table IV's): the busiest rank's bytes over the link bandwidth.
    pub predicted_seconds: f64,
    pub imbalance_before: f64,
    pub imbalance_after: f64,
}

/// Counts over the window and the decision.
pub struct Migrator {
    pub settings: MigrationSettings,
    window: Vec<Vec<f64>>,
    steps_in_window: usize,
}

impl Migrator {
    pub fn new(settings: MigrationSettings, num_moe_layers: usize, experts: usize) -> Self {
        Migrator { settings, window: vec![vec![0.0; experts]; num_moe_layers], steps_in_window: 0 }
    }

    /// The counts summed since the last check, and the steps they cover (for a checkpoint).
    pub fn window(&self) -> (usize, &[Vec<f64>]) {
        (self.steps_in_window, &self.window)
    }

    /// Continues a saved window; the error says when its shape does not fit this model.
    pub fn restore_window(&mut self, steps: usize, counts: &[Vec<f64>]) -> Result<(), String> {
        if counts.len() != self.window.len() || counts.iter().zip(&self.window).any(|(a, b)| a.len() != b.len()) {
            return Err("the checkpoint's migration window does not fit this model's MoE layers".into());
        }
        self.window = counts.to_vec();
        self.steps_in_window = steps;
        Ok(())
    }

    /// Adds a step's tokens per expert (every MoE layer of the model, summed over all ranks).
    pub fn observe(&mut self, counts: &[Vec<usize>]) {
        for (w, c) in self.window.iter_mut().zip(counts) {
            for (a, b) in w.iter_mut().zip(c) {
                *a += *b as f64;
            }
        }
        self.steps_in_window += 1;
    }

    /// At the end of a window: for each layer whose rank imbalance exceeds the threshold, the planner's
    /// hill climbing on its expert group. The same on every rank. Starts a new window.
    pub fn decide(&mut self, placements: &[ExpertPlacement]) -> Result<Vec<(usize, Migration)>, String> {
        if self.steps_in_window < self.settings.check_every_steps {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (layer, (loads, placement)) in self.window.iter().zip(placements).enumerate() {
            if placement.ranks() < 2 {
                continue;
            }
            let s = &self.settings;
            let m = rebalance(
                loads,
                &placement.ranks_of(),
                placement.ranks() as u64,
                s.max_swaps,
                s.bytes_per_expert,
                s.link_gbs,
            )
            .map_err(|e| format!("expert migration of MoE layer {layer}: {e}"))?;
            if m.imbalance_before > s.threshold && m.experts_moved > 0 {
                out.push((layer, m));
            }
        }
        for w in self.window.iter_mut() {
            w.iter_mut().for_each(|x| *x = 0.0);
        }
        self.steps_in_window = 0;
        Ok(out)
    }
}

/// Where this rank sits, for the move.
pub struct GroupCoords {
    pub layout: Layout,
    pub stage: u64,
    pub dp: u64,
    pub ep: usize,
}

fn host<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, String> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().map_err(|e| format!("{e:?}"))
}

/// Moves this rank's share of one layer's migration: sends each expert leaving this rank (its three
/// weight slices and their AdamW moments) to its new owner, receives the arriving ones into the slots
/// they leave free, and rewrites the block's expert weights, the optimizer's moments and the placement.
/// Returns the block and the seconds it took.
pub fn move_experts(
    mut block: MoeBlock,
    old: &ExpertPlacement,
    new: &ExpertPlacement,
    opt: &mut AdamW,
    world: &dyn Communicator,
    at: &GroupCoords,
    layer: usize,
) -> Result<(MoeBlock, f64), String> {
    super::report::hang_in_migration(world.rank());
    let start = Instant::now();
    let e = old.num_experts();
    if e + TAG_BASE as usize > MAX_USER_TAG as usize {
        return Err(format!("expert migration: {e} experts exceed the {} message tags", MAX_USER_TAG - TAG_BASE));
    }
    let me = at.ep;
    let ids: [ParamId; 3] = [block.experts.w_gate_edf.id, block.experts.w_up_edf.id, block.experts.w_down_efd.id];
    let weights = [block.experts.w_gate_edf.val(), block.experts.w_up_edf.val(), block.experts.w_down_efd.val()];
    let shapes: Vec<[usize; 3]> = weights.iter().map(|w| w.dims()).collect();
    let device = weights[0].device();
    let per_slot: Vec<usize> = shapes.iter().map(|s| s[1] * s[2]).collect();
    // Host copies: the weights and both moments of each of the three tensors.
    let mut w_host: Vec<Vec<f32>> = Vec::new();
    let mut m_host: Vec<Vec<f32>> = Vec::new();
    let mut v_host: Vec<Vec<f32>> = Vec::new();
    for (i, w) in weights.into_iter().enumerate() {
        let values = host(w.inner())?;
        let n = values.len();
        let (m, v) = opt.host(ids[i]).unwrap_or_else(|| (vec![0.0; n], vec![0.0; n]));
        w_host.push(values);
        m_host.push(m);
        v_host.push(v);
    }
    let world_rank = |ep: usize| at.layout.rank(at.stage, at.dp, ep as u64) as usize;
    let op = format!("expert migration of MoE layer {layer}");
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    // (index in `pending`, expert) of each receive.
    let mut arriving: Vec<(usize, usize)> = Vec::new();
    let payload_floats: usize = 3 * per_slot.iter().sum::<usize>();
    for x in 0..e {
        let (from, to) = (old.rank_of(x), new.rank_of(x));
        if from == to {
            continue;
        }
        if to == me {
            arriving.push((pending.len(), x));
            pending.push(
                world.irecv(world_rank(from), TAG_BASE + x as u32, payload_floats * 4).map_err(|e| e.to_string())?,
            );
        } else if from == me {
            let slot = old.slot_of(x);
            let mut payload: Vec<u8> = Vec::with_capacity(payload_floats * 4);
            for t in 0..3 {
                let r = slot * per_slot[t]..(slot + 1) * per_slot[t];
                for src in [&w_host[t], &m_host[t], &v_host[t]] {
                    payload.extend(src[r.clone()].iter().flat_map(|f| f.to_le_bytes()));
                }
            }
            pending.push(world.isend(world_rank(to), TAG_BASE + x as u32, payload).map_err(|e| e.to_string())?);
        }
    }
    let received = wait_all(world, pending, &op).map_err(|e| e.to_string())?;
    for &(i, x) in &arriving {
        let floats: Vec<f32> =
            received[i].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let slot = new.slot_of(x);
        let mut at_float = 0;
        for t in 0..3 {
            let r = slot * per_slot[t]..(slot + 1) * per_slot[t];
            for dst in [&mut w_host[t], &mut m_host[t], &mut v_host[t]] {
                dst[r.clone()].copy_from_slice(&floats[at_float..at_float + per_slot[t]]);
                at_float += per_slot[t];
            }
        }
    }
    // Experts that stay keep their slots: their rows are already in place.
    let param = |t: usize, values: Vec<f32>| -> Param<Tensor<3>> {
        let tensor = Tensor::<3>::from_data(TensorData::new(values, shapes[t]), &device).require_grad();
        Param::initialized(ids[t], tensor)
    };
    let [w_gate, w_up, w_down] = [0, 1, 2].map(|t| std::mem::take(&mut w_host[t]));
    block.experts.w_gate_edf = param(0, w_gate);
    block.experts.w_up_edf = param(1, w_up);
    block.experts.w_down_efd = param(2, w_down);
    for t in 0..3 {
        opt.replace(ids[t], std::mem::take(&mut m_host[t]), std::mem::take(&mut v_host[t]));
    }
    block.set_placement(new.clone());
    Ok((block, start.elapsed().as_secs_f64()))
}
