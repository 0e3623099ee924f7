//! Token-choice top-k router: softmax scores (Mixtral, Qwen3-MoE; optional renormalisation of the top-k)
//! or sigmoid scores with a per-expert selection bias and no auxiliary loss (DeepSeek-V3), optional
//! group-limited selection, and a routed scaling factor.
//!
//! Legend: t = tokens, d = model width, e = experts, k = experts per token, n = expert groups.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};
use serde::{Deserialize, Serialize};

use crate::layers::fused::linear;
use crate::layers::init::normal_linear;

/// How router logits become scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scoring {
    Softmax,
    Sigmoid,
}

/// How groups are ranked under group-limited routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupScore {
    /// Highest expert score in the group (DeepSeek-V2 `group_limited_greedy`).
    Max,
    /// Sum of the two highest (biased) scores in the group (DeepSeek-V3 `noaux_tc`).
    TopTwoSum,
}

#[derive(Config, Debug)]
pub struct RouterConfig {
    pub d_model: usize,
    pub num_experts: usize,
    pub top_k: usize,
    #[config(default = "Scoring::Softmax")]
    pub scoring: Scoring,
    /// Divide the top-k weights by their sum.
    #[config(default = true)]
    pub norm_topk_prob: bool,
    /// Group-limited routing: experts in `num_groups` groups, each token picks from `topk_groups`.
    #[config(default = "None")]
    pub num_groups: Option<usize>,
    #[config(default = "None")]
    pub topk_groups: Option<usize>,
    #[config(default = "GroupScore::TopTwoSum")]
    pub group_score: GroupScore,
    /// Multiplier on the routing weights.
    #[config(default = 1.0)]
    pub routed_scaling: f64,
    /// A per-expert bias added to the scores for selection only, updated from the load instead of by
    /// gradients (DeepSeek-V3's auxiliary-loss-free balancing).
    #[config(default = false)]
    pub selection_bias: bool,
}

#[derive(Module, Debug)]
pub struct Router {
    pub gate: Linear,
    /// Selection bias `[e]` (zeros when disabled); a constant of the module, not a parameter.
    pub bias_e: Tensor<1>,
    pub num_experts: usize,
    pub top_k: usize,
    #[module(skip)]
    pub scoring: Scoring,
    pub norm_topk_prob: bool,
    pub num_groups: usize,
    pub topk_groups: usize,
    #[module(skip)]
    pub group_score: GroupScore,
    pub routed_scaling: f64,
    pub selection_bias: bool,
    /// A fixed, untrained bias `[e]` on the logits that skews the routing (`--hot-experts`, a workload
    /// for expert migration); `None` normally.
    #[module(skip)]
    pub skew_e: Option<Tensor<1>>,
}

/// What the router decided for a batch of tokens.
#[derive(Debug, Clone)]
pub struct Routing {
    /// Raw logits `[t, e]` (z-loss).
    pub logits_te: Tensor<2>,
    /// Scores `[t, e]` (softmax or sigmoid, without the selection bias).
    pub scores_te: Tensor<2>,
    /// Selected experts `[t, k]`.
    pub topk_idx_tk: Tensor<2, Int>,
    /// Their combine weights `[t, k]` (differentiable).
    pub topk_w_tk: Tensor<2>,
}

impl RouterConfig {
    pub fn init(&self, device: &Device) -> Router {
        assert!(
            self.top_k >= 1 && self.top_k <= self.num_experts,
            "top_k = {} must be in 1..={}",
            self.top_k,
            self.num_experts
        );
        let num_groups = self.num_groups.unwrap_or(1);
        assert!(
            num_groups >= 1 && self.num_experts.is_multiple_of(num_groups),
            "num_groups = {num_groups} must divide {} experts",
            self.num_experts
        );
        Router {
            gate: normal_linear(LinearConfig::new(self.d_model, self.num_experts), device),
            bias_e: Tensor::zeros([self.num_experts], device),
            num_experts: self.num_experts,
            top_k: self.top_k,
            scoring: self.scoring,
            norm_topk_prob: self.norm_topk_prob,
            num_groups,
            topk_groups: self.topk_groups.unwrap_or(num_groups),
            group_score: self.group_score,
            routed_scaling: self.routed_scaling,
            selection_bias: self.selection_bias,
            skew_e: None,
        }
    }
}

impl Router {
    /// Makes experts `0..hot` draw about `factor` times their balanced share of tokens: adds `ln factor`
    /// to their logits (a fixed bias, not trained).
    pub fn with_hot_experts(mut self, hot: usize, factor: f64) -> Self {
        let device = self.gate.weight.val().device();
        let skew: Vec<f32> = (0..self.num_experts).map(|e| if e < hot { factor.ln() as f32 } else { 0.0 }).collect();
        self.skew_e = Some(Tensor::from_data(TensorData::new(skew, [self.num_experts]), &device));
        self
    }

    /// # Shapes
    /// - `x_td`: `[t, d]`
    pub fn forward(&self, x_td: Tensor<2>) -> Routing {
        let [t, _] = x_td.dims();
        let (e, k) = (self.num_experts, self.top_k);
        let mut logits_te = linear(&self.gate, x_td);
        if let Some(skew_e) = &self.skew_e {
            logits_te = logits_te + skew_e.clone().unsqueeze_dim(0);
        }
        if matches!(self.scoring, Scoring::Softmax) && !self.selection_bias && self.topk_groups >= self.num_groups {
            // Plain softmax top-k (Mixtral, Qwen): the fused gating kernel.
            let scores_te = softmax(logits_te.clone(), 1);
            let (mut topk_w_tk, topk_idx_tk) =
                kernels_cubecl::topk_softmax(logits_te.clone(), k, self.norm_topk_prob && k > 1);
            if self.routed_scaling != 1.0 {
                topk_w_tk = topk_w_tk * self.routed_scaling;
            }
            return Routing { logits_te, scores_te, topk_idx_tk, topk_w_tk };
        }
        if matches!(self.scoring, Scoring::Sigmoid) && self.topk_groups >= self.num_groups {
            // Sigmoid scores with an optional selection bias, no group limit (DeepSeek-V3 with one
            // group): the fused gating kernel.
            let scores_te = sigmoid(logits_te.clone());
            let bias_e = if self.selection_bias { self.bias_e.clone() } else { self.bias_e.zeros_like() };
            let (mut topk_w_tk, topk_idx_tk) =
                kernels_cubecl::topk_sigmoid(logits_te.clone(), bias_e, k, self.norm_topk_prob && k > 1);
            if self.routed_scaling != 1.0 {
                topk_w_tk = topk_w_tk * self.routed_scaling;
            }
            return Routing { logits_te, scores_te, topk_idx_tk, topk_w_tk };
        }
        let scores_te = match self.scoring {
            Scoring::Softmax => softmax(logits_te.clone(), 1),
            Scoring::Sigmoid => sigmoid(logits_te.clone()),
        };
        // Selection uses detached scores plus the bias; weights come from the scores themselves.
        let mut select_te = scores_te.clone().detach();
        if self.selection_bias {
            select_te = select_te + self.bias_e.clone().unsqueeze::<2>();
        }
        if self.topk_groups < self.num_groups {
            let n = self.num_groups;
            let per = e / n;
            let grouped_tnp = select_te.clone().reshape([t, n, per]);
            let group_tn = match self.group_score {
                GroupScore::Max => grouped_tnp.max_dim(2).reshape([t, n]),
                GroupScore::TopTwoSum => grouped_tnp.topk(2.min(per), 2).sum_dim(2).reshape([t, n]),
            };
            let (_, keep_tg) = group_tn.topk_with_indices(self.topk_groups, 1);
            let keep_tn = Tensor::<2>::zeros([t, n], &keep_tg.device()).scatter(
                1,
                keep_tg.clone(),
                Tensor::ones(keep_tg.dims(), &keep_tg.device()),
                burn::tensor::IndexingUpdateOp::Add,
            );
            let mask_te = keep_tn.unsqueeze_dim::<3>(2).expand([t, n, per]).reshape([t, e]).lower_elem(0.5);
            select_te = select_te.mask_fill(mask_te, f32::NEG_INFINITY);
        }
        let (_, topk_idx_tk) = select_te.topk_with_indices(k, 1);
        let mut topk_w_tk = scores_te.clone().gather(1, topk_idx_tk.clone());
        if self.norm_topk_prob && k > 1 {
            let denom_t1 = topk_w_tk.clone().sum_dim(1) + 1e-20;
            topk_w_tk = topk_w_tk / denom_t1;
        }
        if self.routed_scaling != 1.0 {
            topk_w_tk = topk_w_tk * self.routed_scaling;
        }
        Routing { logits_te, scores_te, topk_idx_tk, topk_w_tk }
    }

    /// DeepSeek-V3's auxiliary-loss-free update: raise the bias of under-loaded experts and lower that
    /// of over-loaded ones by `rate` (`b_e += rate · sign(mean load − load_e)`).
    pub fn update_selection_bias(mut self, tokens_per_expert: &[usize], rate: f64) -> Self {
        if !self.selection_bias || tokens_per_expert.is_empty() {
            return self;
        }
        let mean = tokens_per_expert.iter().sum::<usize>() as f64 / tokens_per_expert.len() as f64;
        let sign = |x: f64| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        };
        let step: Vec<f32> = tokens_per_expert.iter().map(|l| (rate * sign(mean - *l as f64)) as f32).collect();
        let device = self.bias_e.device();
        self.bias_e = self.bias_e + Tensor::<1>::from_data(TensorData::new(step, [tokens_per_expert.len()]), &device);
        self
    }
}
