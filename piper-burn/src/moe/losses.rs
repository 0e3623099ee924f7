//! Router losses: the Switch/Mixtral load-balancing auxiliary loss and the router z-loss, the routing
//! statistics of one forward pass they come from, and their weights in a training loss.
//!
//! Legend: t = tokens, e = experts, k = experts per token.

use burn::prelude::*;

/// Load-balancing loss as Hugging Face's Mixtral `load_balancing_loss_func`: `E · Σ_e f_e · P_e`, with
/// `f_e` the tokens routed to expert e over the tokens (top-k copies counted) and `P_e` the mean router
/// probability of e. Uniform routing gives k; a router sending everything to one expert gives E·k·P_e.
///
/// # Shapes
/// - `probs_te`: softmax over all experts `[t, e]`; `topk_idx_tk`: `[t, k]`
pub fn load_balancing_loss(probs_te: Tensor<2>, topk_idx_tk: Tensor<2, Int>) -> Tensor<1> {
    let [t, e] = probs_te.dims();
    let one_hot_tke: Tensor<3> = topk_idx_tk.one_hot::<3>(e).float();
    let f_e = one_hot_tke.sum_dim(1).sum_dim(0).reshape([e]) / t as f64;
    let p_e = probs_te.mean_dim(0).reshape([e]);
    (f_e * p_e).sum() * e as f64
}

/// The same loss with `f_e` from token counts: `counts_e[e]` copies routed to expert e among
/// `tokens` tokens with `k` copies each. With counts summed over the ranks that share the layer (and
/// `tokens` their total), every rank's term is the global batch's `f_e` against its own `P_e`; the mean
/// of the ranks' terms is then the loss of the whole batch (Megatron's global aux loss).
///
/// # Shapes
/// - `probs_te`: softmax over all experts `[t, e]`
pub fn load_balancing_loss_from_counts(probs_te: Tensor<2>, counts_e: &[usize], tokens: usize) -> Tensor<1> {
    let [_, e] = probs_te.dims();
    let device = probs_te.device();
    let f: Vec<f32> = counts_e.iter().map(|c| *c as f32 / tokens.max(1) as f32).collect();
    let f_e = Tensor::<1>::from_data(TensorData::new(f, [e]), &device);
    let p_e = probs_te.mean_dim(0).reshape([e]);
    (f_e * p_e).sum() * e as f64
}

/// Router z-loss (ST-MoE): mean over tokens of `logsumexp(logits)²`.
///
/// # Shapes
/// - `logits_te`: `[t, e]`
pub fn z_loss(logits_te: Tensor<2>) -> Tensor<1> {
    let max_t1 = logits_te.clone().max_dim(1).detach();
    let lse_t1 = (logits_te - max_t1.clone()).exp().sum_dim(1).log() + max_t1;
    lse_t1.powi_scalar(2).mean()
}

/// Per-layer routing statistics of one forward pass.
#[derive(Debug, Clone)]
pub struct MoeStats {
    /// Load-balancing auxiliary loss (softmax over all experts).
    pub aux_loss: Tensor<1>,
    /// Token copies per expert.
    pub tokens_per_expert: Vec<usize>,
    /// Router logits `[t, e]`.
    pub router_logits_te: Tensor<2>,
}

impl MoeStats {
    /// Router z-loss of these logits (computed on demand: most runs do not weigh it in).
    pub fn z_loss(&self) -> Tensor<1> {
        z_loss(self.router_logits_te.clone())
    }

    /// Max / mean tokens per expert (1 = balanced).
    pub fn imbalance(&self) -> f64 {
        let n = self.tokens_per_expert.len().max(1) as f64;
        let mean = self.tokens_per_expert.iter().sum::<usize>() as f64 / n;
        if mean == 0.0 { 1.0 } else { *self.tokens_per_expert.iter().max().unwrap_or(&0) as f64 / mean }
    }
}

/// The weights of the router losses in a training loss: the load-balancing loss's and the z-loss's.
#[derive(Clone, Copy, Debug)]
pub struct RouterLossWeights {
    pub aux: f64,
    pub z: f64,
}

impl RouterLossWeights {
    /// The router-loss terms of `moe` (some of the model's `num_moe_layers` MoE layers), each weight
    /// divided by the MoE layer count, as in the training loss.
    pub fn terms(&self, moe: &[MoeStats], num_moe_layers: usize) -> Option<Tensor<1>> {
        let n = num_moe_layers.max(1) as f64;
        let mut terms = Vec::new();
        if self.aux > 0.0 {
            terms.extend(moe.iter().map(|m| m.aux_loss.clone() * (self.aux / n)));
        }
        if self.z > 0.0 {
            terms.extend(moe.iter().map(|m| m.z_loss() * (self.z / n)));
        }
        terms.into_iter().reduce(|a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_routing_gives_top_k_and_collapse_is_penalised() {
        let device = Device::flex();
        // 4 tokens, 4 experts, top-1, each token to its own expert with uniform probabilities.
        let probs = Tensor::<2>::full([4, 4], 0.25, &device);
        let idx = Tensor::<2, Int>::from_data(TensorData::new(vec![0i64, 1, 2, 3], [4, 1]), &device);
        let balanced: f32 = load_balancing_loss(probs, idx).into_scalar();
        assert!((balanced - 1.0).abs() < 1e-6);
        // All tokens to expert 0 with probability 1 there: E · 1 · 1 = 4.
        let probs = Tensor::<2>::from_data(TensorData::new([1.0f32, 0.0, 0.0, 0.0].repeat(4), [4, 4]), &device);
        let idx = Tensor::<2, Int>::zeros([4, 1], &device);
        let collapsed: f32 = load_balancing_loss(probs, idx).into_scalar();
        assert!((collapsed - 4.0).abs() < 1e-6);
    }

    #[test]
    fn counts_form_equals_the_one_hot_form() {
        let device = Device::flex();
        let probs = burn::tensor::activation::softmax(
            Tensor::<2>::random([6, 4], burn::tensor::Distribution::Normal(0.0, 1.0), &device),
            1,
        );
        let idx =
            Tensor::<2, Int>::from_data(TensorData::new(vec![0i64, 1, 1, 2, 3, 0, 2, 1, 0, 3, 1, 2], [6, 2]), &device);
        let one_hot: f32 = load_balancing_loss(probs.clone(), idx).into_scalar();
        let counts: f32 = load_balancing_loss_from_counts(probs, &[3, 4, 3, 2], 6).into_scalar();
        assert!((one_hot - counts).abs() < 1e-6 && one_hot.is_finite(), "{one_hot} vs {counts}");
    }

    #[test]
    fn z_loss_matches_the_closed_form() {
        let device = Device::flex();
        let logits = Tensor::<2>::from_data(TensorData::new(vec![0.0f32, 0.0, 100.0, 100.0], [2, 2]), &device);
        let z: f32 = z_loss(logits).into_scalar();
        let l0 = (2.0f32).ln();
        let l1 = 100.0 + (2.0f32).ln();
        assert!((z - (l0 * l0 + l1 * l1) / 2.0).abs() < 1e-2, "{z}");
    }
}
