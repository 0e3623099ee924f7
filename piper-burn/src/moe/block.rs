//! The MoE block: route, permute (dropless, padding-free), dispatch to the experts' ranks, grouped
//! experts, combine, unpermute, plus shared experts (optionally gated, Qwen2-MoE) applied to every token.
//!
//! Legend: b = batch, s = sequence, t = tokens (b · s), d = model width, e = experts, k = top-k,
//! p = permuted rows (t · k).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};

use std::sync::Arc;

use super::dispatcher::{ExpertPlacement, TokenDispatcher};
use super::experts::{GroupedExperts, GroupedExpertsConfig};
use super::losses::{MoeStats, load_balancing_loss_from_counts};
use super::permute::{PermutePlan, permute, unpermute};
use super::router::{Router, RouterConfig, Scoring};
use crate::layers::fused::linear;
use crate::layers::init::normal_linear;
use crate::layers::mlp::{Mlp, MlpConfig};

/// How this block reaches its experts: the dispatcher, and where each expert lives.
#[derive(Clone, Debug)]
pub struct ExpertRouting {
    pub dispatcher: Arc<dyn TokenDispatcher>,
    pub placement: ExpertPlacement,
    /// Position of each expert in the permuted order (rank, then local slot; cached from `placement`).
    positions: Vec<usize>,
}

#[derive(Config, Debug)]
pub struct MoeBlockConfig {
    pub router: RouterConfig,
    /// Width of one routed expert.
    pub expert_ffn: usize,
    /// Shared experts (merged into one MLP of `num_shared · shared_ffn`).
    #[config(default = 0)]
    pub num_shared: usize,
    #[config(default = 0)]
    pub shared_ffn: usize,
    /// A sigmoid gate `d → 1` on the shared experts' output (Qwen2-MoE).
    #[config(default = false)]
    pub shared_gate: bool,
}

#[derive(Module, Debug)]
pub struct MoeBlock {
    pub router: Router,
    pub experts: GroupedExperts,
    pub shared: Option<Mlp>,
    pub shared_gate: Option<Linear>,
    /// The dispatcher and expert placement: `None` when this rank holds every expert and shares the
    /// layer with nobody.
    #[module(skip)]
    pub routing: Option<ExpertRouting>,
}

impl MoeBlockConfig {
    pub fn init(&self, device: &Device) -> MoeBlock {
        let d = self.router.d_model;
        MoeBlock {
            router: self.router.init(device),
            experts: GroupedExpertsConfig::new(self.router.num_experts, d, self.expert_ffn).init(device),
            shared: (self.num_shared > 0).then(|| MlpConfig::new(d, self.num_shared * self.shared_ffn).init(device)),
            shared_gate: (self.num_shared > 0 && self.shared_gate)
                .then(|| normal_linear(LinearConfig::new(d, 1), device)),
            routing: None,
        }
    }
}

impl MoeBlock {
    /// Keeps only the experts `placement` puts on `rank` (in slot order) and reaches the others through
    /// `dispatcher`. With one rank, every expert stays and the dispatcher only shares the layer's load.
    pub fn with_routing(
        mut self,
        dispatcher: Arc<dyn TokenDispatcher>,
        placement: ExpertPlacement,
        rank: usize,
    ) -> Self {
        let e = self.router.num_experts;
        assert_eq!(
            placement.num_experts(),
            e,
            "the placement covers {} experts, the block has {e}",
            placement.num_experts()
        );
        if placement.ranks() > 1 {
            let mine: Vec<i64> = placement.experts_of(rank).into_iter().map(|x| x as i64).collect();
            let device = self.experts.w_gate_edf.val().device();
            let n = mine.len();
            let idx = Tensor::<1, Int>::from_data(TensorData::new(mine, [n]), &device);
            let shard = |p: burn::module::Param<Tensor<3>>| {
                burn::module::Param::from_tensor(p.val().select(0, idx.clone()).detach())
            };
            self.experts.w_gate_edf = shard(self.experts.w_gate_edf);
            self.experts.w_up_edf = shard(self.experts.w_up_edf);
            self.experts.w_down_efd = shard(self.experts.w_down_efd);
        }
        let positions = placement.positions();
        self.routing = Some(ExpertRouting { dispatcher, placement, positions });
        self
    }

    /// Where this block's experts now live (after migration moved them; the weights must have moved
    /// with it). A block without routing keeps every expert and ignores it.
    pub fn set_placement(&mut self, placement: ExpertPlacement) {
        if let Some(r) = self.routing.as_mut() {
            r.positions = placement.positions();
            r.placement = placement;
        }
    }

    /// The shared experts' output (gated where the block has a gate), if the block has shared experts.
    ///
    /// # Shapes
    /// - `x_td`: `[t, d]` → `[t, d]`
    fn shared_forward(&self, x_td: Tensor<2>) -> Option<Tensor<2>> {
        let shared_td = self.shared.as_ref()?.forward(x_td.clone());
        Some(match &self.shared_gate {
            Some(gate) => shared_td * sigmoid(linear(gate, x_td)),
            None => shared_td,
        })
    }

    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward(&self, x_bsd: Tensor<3>) -> (Tensor<3>, MoeStats) {
        let [b, s, d] = x_bsd.dims();
        let t = b * s;
        let x_td = x_bsd.reshape([t, d]);
        let routing = self.router.forward(x_td.clone());
        let num_experts = self.router.num_experts;
        let positions = self.routing.as_ref().map(|r| r.positions.as_slice());
        // Rows sorted by expert position (destination rank, then local slot); counts per position.
        let plan = PermutePlan::with_positions(&routing.topk_idx_tk, num_experts, positions);
        // The shared experts need no routed row: with experts on other ranks they compute while the
        // dispatched rows travel.
        let mut shared_td = None;
        let routed_td = match &self.routing {
            Some(r) if r.placement.ranks() > 1 => {
                let x_pd = permute(x_td.clone(), &plan);
                let mut overlap = || shared_td = self.shared_forward(x_td.clone());
                let (x_qd, handle) = r.dispatcher.dispatch_overlapped(x_pd, &plan.counts_e, &mut overlap);
                let y_qd = self.experts.forward(x_qd, &handle.local_counts);
                unpermute(r.dispatcher.combine(y_qd, &handle), routing.topk_w_tk.clone(), &plan)
            }
            // Every expert on this rank (a one-rank dispatcher only shares the layer's load): permute,
            // experts and unpermute as one operation (fused on the CPU).
            _ => {
                shared_td = self.shared_forward(x_td.clone());
                self.experts.forward_routed(x_td.clone(), routing.topk_w_tk.clone(), &plan)
            }
        };
        let out_td = match shared_td {
            Some(shared_td) => routed_td + shared_td,
            None => routed_td,
        };
        let tokens_per_expert: Vec<usize> = match positions {
            Some(pos) => pos.iter().map(|p| plan.counts_e[*p]).collect(),
            None => plan.counts_e,
        };
        // The load-balancing loss sees the load of every rank that shares the layer (global aux loss).
        let layer_load = match &self.routing {
            Some(r) => r.dispatcher.layer_load(&tokens_per_expert),
            None => tokens_per_expert.clone(),
        };
        let k = routing.topk_idx_tk.dims()[1];
        let layer_tokens = layer_load.iter().sum::<usize>() / k.max(1);
        // The router's scores are this softmax already when it scores by softmax.
        let probs_te = match self.router.scoring {
            Scoring::Softmax => routing.scores_te,
            Scoring::Sigmoid => softmax(routing.logits_te.clone(), 1),
        };
        let stats = MoeStats {
            aux_loss: load_balancing_loss_from_counts(probs_te, &layer_load, layer_tokens),
            tokens_per_expert,
            router_logits_te: routing.logits_te,
        };
        (out_td.reshape([b, s, d]), stats)
    }
}
