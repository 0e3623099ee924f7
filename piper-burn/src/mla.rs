//! DeepSeek multi-head latent attention (MLA): queries through an optional low-rank bottleneck, keys and
//! values from one compressed latent, and a decoupled rotary part shared by all heads' keys.
//!
//! Legend: b = batch, s = sequence, d = model width, h = heads, n = no-rope head dim, r = rope head
//! dim, v = value head dim, q = query latent rank, c = key/value latent rank.

use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use crate::fused_layers::{linear, rms_norm};
use crate::init::normal_linear;
use crate::rope::{RotaryEmbedding, RotaryEmbeddingConfig};

#[derive(Config, Debug)]
pub struct MlaConfig {
    pub d_model: usize,
    pub num_heads: usize,
    /// `None`: queries come straight from the hidden state.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    #[config(default = 10000.0)]
    pub rope_theta: f64,
    /// The rotary dims are stored interleaved (pairs side by side), as DeepSeek-V3's checkpoints.
    #[config(default = true)]
    pub rope_interleave: bool,
    #[config(default = 1e-6)]
    pub norm_eps: f64,
}

#[derive(Module, Debug)]
pub struct Mla {
    pub q_proj: Option<Linear>,
    pub q_a_proj: Option<Linear>,
    pub q_a_norm: Option<RmsNorm>,
    pub q_b_proj: Option<Linear>,
    pub kv_a_proj: Linear,
    pub kv_a_norm: RmsNorm,
    pub kv_b_proj: Linear,
    pub o_proj: Linear,
    pub rope: RotaryEmbedding,
    pub num_heads: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub rope_interleave: bool,
}

impl MlaConfig {
    pub fn init(&self, device: &Device) -> Mla {
        let h = self.num_heads;
        let qk = self.qk_nope_head_dim + self.qk_rope_head_dim;
        let lin = |i, o| normal_linear(LinearConfig::new(i, o), device);
        let (q_proj, q_a_proj, q_a_norm, q_b_proj) = match self.q_lora_rank {
            None => (Some(lin(self.d_model, h * qk)), None, None, None),
            Some(r) => (
                None,
                Some(lin(self.d_model, r)),
                Some(RmsNormConfig::new(r).with_epsilon(self.norm_eps).init(device)),
                Some(lin(r, h * qk)),
            ),
        };
        Mla {
            q_proj,
            q_a_proj,
            q_a_norm,
            q_b_proj,
            kv_a_proj: lin(self.d_model, self.kv_lora_rank + self.qk_rope_head_dim),
            kv_a_norm: RmsNormConfig::new(self.kv_lora_rank).with_epsilon(self.norm_eps).init(device),
            kv_b_proj: lin(self.kv_lora_rank, h * (self.qk_nope_head_dim + self.v_head_dim)),
            o_proj: lin(h * self.v_head_dim, self.d_model),
            rope: RotaryEmbeddingConfig::new(self.qk_rope_head_dim).with_theta(self.rope_theta).init(),
            num_heads: h,
            kv_lora_rank: self.kv_lora_rank,
            qk_nope_head_dim: self.qk_nope_head_dim,
            qk_rope_head_dim: self.qk_rope_head_dim,
            v_head_dim: self.v_head_dim,
            rope_interleave: self.rope_interleave,
        }
    }
}

impl Mla {
    /// Rotary embedding of the queries' and keys' rope parts; interleaved dims (x0, x1, x2, x3, …) are
    /// first regrouped to halves (x0, x2, …, x1, x3, …), as transformers' `apply_rotary_pos_emb_interleave`.
    fn rotate(&self, q_bshr: Tensor<4>, k_bs1r: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let halves = |x: Tensor<4>| {
            if !self.rope_interleave {
                return x;
            }
            let [b, s, h, r] = x.dims();
            x.reshape([b, s, h, r / 2, 2]).swap_dims(3, 4).reshape([b, s, h, r])
        };
        self.rope.forward_qk(halves(q_bshr), halves(k_bs1r))
    }

    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward(&self, x_bsd: Tensor<3>) -> Tensor<3> {
        let [b, s, _] = x_bsd.dims();
        let (h, n, r, v) = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim);
        let q_bsx = match (&self.q_proj, &self.q_a_proj, &self.q_a_norm, &self.q_b_proj) {
            (Some(q), _, _, _) => linear(q, x_bsd.clone()),
            (None, Some(a), Some(norm), Some(bp)) => linear(bp, rms_norm(norm, linear(a, x_bsd.clone()))),
            _ => unreachable!("set at init"),
        };
        let q_bshx = q_bsx.reshape([b, s, h, n + r]);
        let q_nope = q_bshx.clone().narrow(3, 0, n);
        let ckv_bsx = linear(&self.kv_a_proj, x_bsd);
        let latent_bsc = ckv_bsx.clone().narrow(2, 0, self.kv_lora_rank);
        let k_rope_bs1r = ckv_bsx.narrow(2, self.kv_lora_rank, r).reshape([b, s, 1, r]);
        let (q_rope, k_rope_bs1r) = self.rotate(q_bshx.narrow(3, n, r), k_rope_bs1r);
        let kv_bshx = linear(&self.kv_b_proj, rms_norm(&self.kv_a_norm, latent_bsc)).reshape([b, s, h, n + v]);
        let k_nope = kv_bshx.clone().narrow(3, 0, n);
        let v_bshv = kv_bshx.narrow(3, n, v);
        let q = Tensor::cat(vec![q_nope, q_rope], 3);
        let k = Tensor::cat(vec![k_nope, k_rope_bs1r.expand([b, s, h, r])], 3);
        let out_bshv = kernels_cubecl::causal_attention(q, k, v_bshv, 1.0 / ((n + r) as f32).sqrt());
        linear(&self.o_proj, out_bshv.reshape([b, s, h * v]))
    }
}
