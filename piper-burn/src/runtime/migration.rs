//! Expert migration at run time (Piper §VI-A): watch the tokens each expert receives, and when an
//! expert group's ranks stay imbalanced beyond the policy's threshold and a move pays for itself
//! (`piper_planner::migration_payoff`: the imbalance holds over consecutive windows, and the step time
//! saved over the horizon exceeds the move's cost), move the fewest experts — weights and AdamW moments —
//! between the ranks of the group, as the planner's hill climbing decides on the smoothed load.
//!
//! Every rank sees the same counts (all-reduced each step over the world) and runs the same
//! deterministic decision, so no coordination round is needed; debug builds check a fingerprint of
//! the decision. The move is point-to-point inside each expert group (each data-parallel replica's
//! group moves its own copies), then the layer's placement table changes so the dispatcher sends the next
//! tokens to the new owner. The model's function is unchanged.

use std::time::Instant;

use burn::module::{Param, ParamId};
use burn::prelude::*;
use piper_comm::Communicator;
use piper_comm::communicator::{MAX_USER_TAG, Pending, wait_all};
use piper_planner::layout::Layout;
use piper_planner::migration::Migration;
use piper_planner::migration_payoff::{LayerEvidence, PayoffSettings, Verdict};

use super::config::MigrationDecision;
use super::error::{Result, RuntimeError, host_f32};
use super::fault;
use super::fingerprint::check_ranks_agree;
use super::optim::AdamW;
use super::report::MigrationEvent;
use crate::model::StageModel;
use crate::moe::MoeBlock;
use crate::moe::dispatcher::ExpertPlacement;

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
    /// Bytes moved per expert (weights and both moments) and the rate a rank moves them at (the link
    /// and the host staging, [`MigrationSettings::staged_gbs`]), for the prediction.
    pub bytes_per_expert: f64,
    pub link_gbs: f64,
    /// Seconds one routed token costs the rank holding its expert (forward and backward), from the
    /// platform: what a move saves per token taken off the busiest rank.
    pub seconds_per_token: f64,
    pub decision: MigrationDecision,
}

impl MigrationSettings {
    /// Checks in a row the imbalance must hold before a move.
    pub const PERSIST_WINDOWS: u32 = 2;
    /// Weight of the newest window in the smoothed load.
    pub const SMOOTHING: f64 = 0.5;
    /// Windows a move must pay for itself within.
    pub const HORIZON_WINDOWS: usize = 4;

    /// Copies of each moved byte through host memory: read out of its weight or moment tensor, packed
    /// into the message, unpacked on arrival, written into the new owner's tensor.
    pub const HOST_COPIES: f64 = 4.0;

    /// The rate (GB/s) one rank moves expert bytes at: each byte crosses the link once and is copied
    /// [`Self::HOST_COPIES`] times at the host's memory bandwidth, so the seconds per byte add.
    pub fn staged_gbs(link_gbs: f64, memory_gbs: f64) -> f64 {
        1.0 / (1.0 / link_gbs + Self::HOST_COPIES / memory_gbs)
    }

    /// The decision's settings (`piper_planner::migration_payoff`); the threshold rule is the same
    /// decision on the window alone (no smoothing, one check) with a horizon no move fails to pay within.
    pub fn payoff(&self) -> PayoffSettings {
        let payoff = PayoffSettings {
            threshold: self.threshold,
            persist_windows: Self::PERSIST_WINDOWS,
            smoothing: Self::SMOOTHING,
            seconds_per_token: self.seconds_per_token,
            horizon_steps: (Self::HORIZON_WINDOWS * self.check_every_steps) as f64,
            fixed_cost_s: 0.0,
        };
        match self.decision {
            MigrationDecision::Payoff => payoff,
            MigrationDecision::Threshold => {
                PayoffSettings { persist_windows: 1, smoothing: 1.0, horizon_steps: 1e12, ..payoff }
            }
        }
    }
}

/// Counts over the window, the evidence across windows, and the decision.
pub struct Migrator {
    pub settings: MigrationSettings,
    window: Vec<Vec<f64>>,
    steps_in_window: usize,
    evidence: Vec<LayerEvidence>,
}

/// Where the run is when a window closes: this stage's first MoE layer, the ranks per stage (the
/// events' times are their mean) and the steps left in the run.
pub struct Progress {
    pub first_moe: usize,
    pub stage_ranks: usize,
    pub steps_left: usize,
}

impl Migrator {
    pub fn new(settings: MigrationSettings, num_moe_layers: usize, experts: usize) -> Self {
        Migrator {
            settings,
            window: vec![vec![0.0; experts]; num_moe_layers],
            steps_in_window: 0,
            evidence: vec![LayerEvidence::default(); num_moe_layers],
        }
    }

    /// The policy's evidence per MoE layer (for a checkpoint).
    pub fn evidence(&self) -> &[LayerEvidence] {
        &self.evidence
    }

    /// The counts summed since the last check, and the steps they cover (for a checkpoint).
    pub fn window(&self) -> (usize, &[Vec<f64>]) {
        (self.steps_in_window, &self.window)
    }

    /// Continues a saved window and evidence (none: a checkpoint from before the policy kept any); the
    /// error says when their shapes do not fit this model.
    pub fn restore_window(&mut self, steps: usize, counts: &[Vec<f64>], evidence: &[LayerEvidence]) -> Result<()> {
        if counts.len() != self.window.len() || counts.iter().zip(&self.window).any(|(a, b)| a.len() != b.len()) {
            return Err(RuntimeError::invalid(
                "the checkpoint's migration window",
                "does not fit this model's MoE layers",
            ));
        }
        let sized = |v: &Vec<f64>, n: usize| v.is_empty() || v.len() == n;
        let fits = evidence.len() == self.window.len()
            && evidence
                .iter()
                .zip(&self.window)
                .all(|(e, w)| sized(&e.tokens_per_step, w.len()) && sized(&e.last_window, w.len()));
        if !evidence.is_empty() && !fits {
            return Err(RuntimeError::invalid(
                "the checkpoint's migration evidence",
                "does not fit this model's MoE layers",
            ));
        }
        self.window = counts.to_vec();
        self.steps_in_window = steps;
        if !evidence.is_empty() {
            self.evidence = evidence.to_vec();
        }
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

    /// At the end of a window: each layer's evidence takes the window in, and the layers whose
    /// imbalance has held and whose move pays (with `steps_left` steps to run) get the planner's hill
    /// climbing on their smoothed load. The same on every rank. Starts a new window.
    pub fn decide(&mut self, placements: &[ExpertPlacement], steps_left: usize) -> Result<Vec<(usize, Decision)>> {
        if self.steps_in_window < self.settings.check_every_steps {
            return Ok(Vec::new());
        }
        let (s, payoff) = (&self.settings, self.settings.payoff());
        // The threshold rule moves whenever the window calls for it, however few steps are left.
        let steps_left = match s.decision {
            MigrationDecision::Payoff => steps_left as f64,
            MigrationDecision::Threshold => f64::INFINITY,
        };
        let mut out = Vec::new();
        for (layer, ((loads, placement), evidence)) in
            self.window.iter().zip(placements).zip(&mut self.evidence).enumerate()
        {
            if placement.ranks() < 2 {
                continue;
            }
            evidence.observe(loads, self.steps_in_window, payoff.smoothing);
            let verdict = evidence
                .weigh(
                    &placement.ranks_of(),
                    placement.ranks() as u64,
                    &payoff,
                    s.max_swaps,
                    s.bytes_per_expert,
                    s.link_gbs,
                    steps_left,
                )
                .map_err(|source| RuntimeError::Migration { layer, source })?;
            if let Verdict::Move { migration, gain_per_step_s, cost_s } = verdict {
                out.push((layer, Decision { migration, gain_per_step_s, cost_s }));
            }
        }
        for w in self.window.iter_mut() {
            w.iter_mut().for_each(|x| *x = 0.0);
        }
        self.steps_in_window = 0;
        Ok(out)
    }
}

/// A move the policy decided: the planner's swaps, and the step time it is expected to save per step
/// and to cost once.
pub struct Decision {
    pub migration: Migration,
    pub gain_per_step_s: f64,
    pub cost_s: f64,
}

/// Where this rank sits, for the move.
pub struct GroupCoords {
    pub layout: Layout,
    pub stage: u64,
    pub dp: u64,
    pub ep: usize,
}

/// The migrations the window calls for, carried out: every rank decides the same; the ranks of each
/// layer's stage move its experts; every rank updates its placement table. `first_moe` is the index of
/// this stage's first MoE layer, `stage_ranks` the ranks per stage (the events' times are their mean).
#[allow(clippy::too_many_arguments)]
pub fn migrate<M: StageModel>(
    migrator: &mut Migrator,
    mut model: M,
    placements: &mut [ExpertPlacement],
    optim: &mut AdamW,
    world: &dyn Communicator,
    coords: &GroupCoords,
    at: Progress,
) -> Result<(M, Vec<MigrationEvent>)> {
    let decisions = migrator.decide(placements, at.steps_left)?;
    if decisions.is_empty() {
        return Ok((model, Vec::new()));
    }
    if cfg!(debug_assertions) {
        let decided: Vec<(usize, &Vec<u64>)> =
            decisions.iter().map(|(l, d)| (*l, &d.migration.placement_after)).collect();
        check_ranks_agree(world, &[("migration decision", format!("{decided:?}"))])?;
    }
    let num_blocks = model.moe_blocks().len();
    let mut seconds = vec![0.0f32; decisions.len()];
    for (k, (layer, d)) in decisions.iter().enumerate() {
        let m = &d.migration;
        let new = placements[*layer].migrated(&m.placement_after.iter().map(|r| *r as usize).collect::<Vec<_>>())?;
        if let Some(j) = layer.checked_sub(at.first_moe).filter(|j| *j < num_blocks) {
            let mut blocks = model.moe_blocks_mut();
            let block = blocks.swap_remove(j);
            let (moved, secs) = move_experts(block.clone(), &placements[*layer], &new, optim, world, coords, *layer)?;
            *block = moved;
            seconds[k] = secs as f32;
        }
        placements[*layer] = new;
    }
    world.all_reduce_sum_f32(&mut seconds, "migration time all-reduce")?;
    let events = decisions
        .iter()
        .zip(&seconds)
        .map(|((layer, d), s)| MigrationEvent {
            layer: *layer,
            swaps: d.migration.swaps.len(),
            experts_moved: d.migration.experts_moved,
            bytes: d.migration.bytes_moved,
            seconds: *s as f64 / at.stage_ranks as f64,
            predicted_seconds: d.migration.time_s,
            imbalance_before: d.migration.imbalance_before,
            imbalance_after: d.migration.imbalance_after,
            predicted_gain_per_step_s: d.gain_per_step_s,
        })
        .collect();
    Ok((model, events))
}

/// One MoE block's three expert weights `[e, r, c]`, read and written one local slot at a time with
/// their AdamW moments: only the slots whose expert leaves or arrives pass through host memory.
struct ExpertSlots {
    ids: [ParamId; 3],
    /// The weights, off the autodiff graph (the block gets them back as fresh parameters).
    weights: [Tensor<3>; 3],
    /// Elements of one expert's slice of each weight.
    per_slot: [usize; 3],
    /// Per weight, the (local slot, values) of each arrived expert.
    arrived: [Vec<(usize, Vec<f32>)>; 3],
}

impl ExpertSlots {
    fn of(block: &MoeBlock) -> Self {
        let x = &block.experts;
        let ids = [x.w_gate_edf.id, x.w_up_edf.id, x.w_down_efd.id];
        let weights = [x.w_gate_edf.val().inner(), x.w_up_edf.val().inner(), x.w_down_efd.val().inner()];
        let per_slot = weights.each_ref().map(|w| w.dims()[1] * w.dims()[2]);
        ExpertSlots { ids, weights, per_slot, arrived: Default::default() }
    }

    /// Floats one expert's message carries: its slice of each weight and both moments.
    fn payload_floats(&self) -> usize {
        3 * self.per_slot.iter().sum::<usize>()
    }

    /// The message of the expert in local `slot`: per weight, its values and both moments (zeros
    /// before the optimizer's first step, as on every rank).
    fn payload(&self, slot: usize, opt: &AdamW) -> Result<Vec<u8>> {
        let mut out: Vec<u8> = Vec::with_capacity(4 * self.payload_floats());
        for t in 0..3 {
            let [_, r, c] = self.weights[t].dims();
            let values = host_f32(self.weights[t].clone().slice([slot..slot + 1, 0..r, 0..c]), "expert weights")?;
            out.extend_from_slice(bytemuck::cast_slice(&values));
            let range = slot * self.per_slot[t]..(slot + 1) * self.per_slot[t];
            match opt.host_range(self.ids[t], range)? {
                Some((m, v)) => [m, v].iter().for_each(|x| out.extend_from_slice(bytemuck::cast_slice(x))),
                None => out.resize(out.len() + 8 * self.per_slot[t], 0),
            }
        }
        Ok(out)
    }

    /// Writes an arriving expert's message into local `slot`: the moments' slices now, the weights'
    /// when the block is rebuilt.
    fn receive(&mut self, slot: usize, message: &[u8], opt: &mut AdamW) {
        let floats: Vec<f32> = bytemuck::pod_collect_to_vec(message);
        let mut at = 0;
        for t in 0..3 {
            let n = self.per_slot[t];
            let (m, v) = (&floats[at + n..at + 2 * n], &floats[at + 2 * n..at + 3 * n]);
            opt.assign_range(self.ids[t], slot * n, m, v);
            self.arrived[t].push((slot, floats[at..at + n].to_vec()));
            at += 3 * n;
        }
    }

    /// The block with the arrived experts written into their slots of the weights (same parameter ids).
    fn install(self, mut block: MoeBlock) -> MoeBlock {
        let ExpertSlots { ids, weights: [gate, up, down], arrived: [to_gate, to_up, to_down], .. } = self;
        let param = |t: usize, w: Tensor<3>, slices: Vec<(usize, Vec<f32>)>| {
            let ([_, r, c], device) = (w.dims(), w.device());
            let w = slices.into_iter().fold(w, |w, (slot, x)| {
                w.slice_assign([slot..slot + 1, 0..r, 0..c], Tensor::from_data(TensorData::new(x, [1, r, c]), &device))
            });
            Param::initialized(ids[t], Tensor::from_inner(w).require_grad())
        };
        block.experts.w_gate_edf = param(0, gate, to_gate);
        block.experts.w_up_edf = param(1, up, to_up);
        block.experts.w_down_efd = param(2, down, to_down);
        block
    }
}

/// Moves this rank's share of one layer's migration: sends each expert leaving this rank (its three
/// weight slices and their AdamW moments) to its new owner, receives the arriving ones into the slots
/// they leave free (experts that stay are not touched), and writes those slots of the block's expert
/// weights and of the optimizer's moments, then the placement. Returns the block and the seconds it took.
pub fn move_experts(
    block: MoeBlock,
    old: &ExpertPlacement,
    new: &ExpertPlacement,
    opt: &mut AdamW,
    world: &dyn Communicator,
    at: &GroupCoords,
    layer: usize,
) -> Result<(MoeBlock, f64)> {
    fault::in_migration(world.rank());
    let start = Instant::now();
    let e = old.num_experts();
    if e + TAG_BASE as usize > MAX_USER_TAG as usize {
        return Err(RuntimeError::MigrationTags { experts: e, tags: MAX_USER_TAG - TAG_BASE });
    }
    let mut slots = ExpertSlots::of(&block);
    let world_rank = |ep: usize| at.layout.rank(at.stage, at.dp, ep as u64) as usize;
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    // (index in `pending`, expert) of each receive.
    let mut arriving: Vec<(usize, usize)> = Vec::new();
    for x in (0..e).filter(|x| old.rank_of(*x) != new.rank_of(*x)) {
        let (from, to, tag) = (old.rank_of(x), new.rank_of(x), TAG_BASE + x as u32);
        if to == at.ep {
            arriving.push((pending.len(), x));
            pending.push(world.irecv(world_rank(from), tag, slots.payload_floats() * 4)?);
        } else if from == at.ep {
            pending.push(world.isend(world_rank(to), tag, slots.payload(old.slot_of(x), opt)?)?);
        }
    }
    let received = wait_all(world, pending, &format!("expert migration of MoE layer {layer}"))?;
    for &(i, x) in &arriving {
        slots.receive(new.slot_of(x), &received[i], opt);
    }
    let mut block = slots.install(block);
    block.set_placement(new.clone());
    Ok((block, start.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::MigrationSettings;

    #[test]
    fn a_staged_move_pays_the_link_once_and_each_host_copy() {
        // 1 GB over a 10 GB/s link with 4 copies at 40 GB/s: 0.1 s + 4 × 0.025 s.
        let gbs = MigrationSettings::staged_gbs(10.0, 40.0);
        assert!((1.0 / gbs - 0.2).abs() < 1e-12, "{gbs}");
        // Host memory far faster than the link: the link's rate.
        assert!((MigrationSettings::staged_gbs(10.0, 1e12) - 10.0).abs() < 1e-6);
    }
}
