//! The MoE block: route, dispatch (dropless, padding-free), grouped experts, combine, plus shared
//! experts (optionally gated, Qwen2-MoE) applied to every token.
//!
//! Legend: b = batch, s = sequence, t = tokens (b · s), d = model width, e = experts, k = top-k,
//! p = permuted rows (t · k).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};

use crate::dispatch::{DispatchPlan, combine, permute};
use crate::experts::{GroupedExperts, GroupedExpertsConfig};
use crate::init::normal_linear;
use crate::losses::{load_balancing_loss, z_loss};
use crate::mlp::{Mlp, MlpConfig};
use crate::router::{Router, RouterConfig};

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
}

/// Per-layer routing statistics of one forward pass.
#[derive(Debug, Clone)]
pub struct MoeStats {
    /// Load-balancing auxiliary loss (softmax over all experts).
    pub aux_loss: Tensor<1>,
    /// Router z-loss.
    pub z_loss: Tensor<1>,
    /// Token copies per expert.
    pub tokens_per_expert: Vec<usize>,
    /// Router logits `[t, e]`.
    pub router_logits_te: Tensor<2>,
}

impl MoeStats {
    /// Max / mean tokens per expert (1 = balanced).
    pub fn imbalance(&self) -> f64 {
        let n = self.tokens_per_expert.len().max(1) as f64;
        let mean = self.tokens_per_expert.iter().sum::<usize>() as f64 / n;
        if mean == 0.0 { 1.0 } else { *self.tokens_per_expert.iter().max().unwrap_or(&0) as f64 / mean }
    }
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
        }
    }
}

impl MoeBlock {
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward(&self, x_bsd: Tensor<3>) -> (Tensor<3>, MoeStats) {
        let [b, s, d] = x_bsd.dims();
        let t = b * s;
        let x_td = x_bsd.reshape([t, d]);
        let routing = self.router.forward(x_td.clone());
        let plan = DispatchPlan::new(&routing.topk_idx_tk, self.experts.num_experts());
        let y_pd = self.experts.forward(permute(x_td.clone(), &plan), &plan.counts_e);
        let mut out_td = combine(y_pd, routing.topk_w_tk.clone(), &plan, t);
        if let Some(shared) = &self.shared {
            let mut shared_td = shared.forward(x_td.clone());
            if let Some(gate) = &self.shared_gate {
                shared_td = shared_td * sigmoid(gate.forward(x_td));
            }
            out_td = out_td + shared_td;
        }
        let probs_te = softmax(routing.logits_te.clone(), 1);
        let stats = MoeStats {
            aux_loss: load_balancing_loss(probs_te, routing.topk_idx_tk),
            z_loss: z_loss(routing.logits_te.clone()),
            tokens_per_expert: plan.counts_e,
            router_logits_te: routing.logits_te,
        };
        (out_td.reshape([b, s, d]), stats)
    }
}
