//! Causal self-attention with grouped-query heads, rotary embedding and optional per-head q/k RMSNorm
//! (Qwen3).
//!
//! Legend: b = batch, s = sequence, d = model width, h = query heads, g = key/value heads,
//! k = head dim.

use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use crate::init::normal_linear;
use crate::rope::{RotaryEmbedding, RotaryEmbeddingConfig};

#[derive(Config, Debug)]
pub struct AttentionConfig {
    pub d_model: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    #[config(default = 10000.0)]
    pub rope_theta: f64,
    /// RMSNorm over each head's queries and keys before the rotation (Qwen3).
    #[config(default = false)]
    pub qk_norm: bool,
    #[config(default = 1e-6)]
    pub norm_eps: f64,
}

#[derive(Module, Debug)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: RotaryEmbedding,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionConfig {
    pub fn init(&self, device: &Device) -> Attention {
        assert!(
            self.num_kv_heads > 0 && self.num_heads.is_multiple_of(self.num_kv_heads),
            "num_kv_heads = {} must divide num_heads = {}",
            self.num_kv_heads,
            self.num_heads
        );
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let norm = || RmsNormConfig::new(self.head_dim).with_epsilon(self.norm_eps).init(device);
        Attention {
            q_proj: normal_linear(LinearConfig::new(self.d_model, q), device),
            k_proj: normal_linear(LinearConfig::new(self.d_model, kv), device),
            v_proj: normal_linear(LinearConfig::new(self.d_model, kv), device),
            o_proj: normal_linear(LinearConfig::new(q, self.d_model), device),
            q_norm: self.qk_norm.then(norm),
            k_norm: self.qk_norm.then(norm),
            rope: RotaryEmbeddingConfig::new(self.head_dim).with_theta(self.rope_theta).init(),
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
        }
    }
}

impl Attention {
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward(&self, x_bsd: Tensor<3>) -> Tensor<3> {
        let [b, s, _] = x_bsd.dims();
        let (h, g, k) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let heads = |t: Tensor<3>, n: usize| t.reshape([b, s, n, k]).swap_dims(1, 2);
        let mut q_bhsk = heads(self.q_proj.forward(x_bsd.clone()), h);
        let mut k_bgsk = heads(self.k_proj.forward(x_bsd.clone()), g);
        let v_bgsk = heads(self.v_proj.forward(x_bsd), g);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q_bhsk = qn.forward(q_bhsk);
            k_bgsk = kn.forward(k_bgsk);
        }
        let q_bhsk = self.rope.forward(q_bhsk);
        let k_bgsk = self.rope.forward(k_bgsk);
        // Query head i reads key/value head i / (h / g), as Hugging Face's repeat_kv.
        let repeat = |t: Tensor<4>| t.unsqueeze_dim::<5>(2).expand([b, g, h / g, s, k]).reshape([b, h, s, k]);
        let (k_bhsk, v_bhsk) = (repeat(k_bgsk), repeat(v_bgsk));
        let scores_bhss = q_bhsk.matmul(k_bhsk.swap_dims(2, 3)) / (k as f64).sqrt();
        // `tril_mask` is true outside the lower triangle (diagonal included): exactly the future positions.
        let future_ss = Tensor::<2, Bool>::tril_mask([s, s], 0, &scores_bhss.device());
        let scores_bhss = scores_bhss.mask_fill(future_ss.unsqueeze::<4>().expand([b, h, s, s]), f32::NEG_INFINITY);
        let probs_bhss = burn::tensor::activation::softmax(scores_bhss, 3);
        let out_bhsk = probs_bhss.matmul(v_bhsk);
        self.o_proj.forward(out_bhsk.swap_dims(1, 2).reshape([b, s, h * k]))
    }
}
