//! DeepSeek multi-head latent attention (MLA): queries through an optional low-rank bottleneck, keys and
//! values from one compressed latent, and a decoupled rotary part shared by all heads' keys.
//!
//! Legend: b = batch, s = sequence, d = model width, h = heads, n = no-rope head dim, r = rope head
//! dim, v = value head dim, q = query latent rank, c = key/value latent rank.

use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use crate::layers::fused::{linear, rms_norm};
use crate::layers::init::normal_linear;
use crate::layers::kv_cache::{LayerCache, attend, extend};
use crate::layers::rope::{RotaryEmbedding, RotaryEmbeddingConfig};

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
    /// `layer`'s output columns `start..start + len` of each of its `heads` blocks of `width`, as one
    /// linear layer over a view of its weight (and bias): a slice of a projection costs a copy of the
    /// small weight, not of the activations, and its gradient lands in the weight's. With `halves`, the
    /// slice's interleaved pairs (x0, x1, x2, x3, …) come out regrouped to halves (x0, x2, …, x1, x3, …),
    /// as transformers' `apply_rotary_pos_emb_interleave` regroups the rotary dims.
    ///
    /// # Shapes
    /// - `x_bsi`: `[b, s, i]` → `[b, s, heads · len]`
    #[allow(clippy::too_many_arguments)]
    fn project(
        layer: &Linear,
        x_bsi: Tensor<3>,
        heads: usize,
        width: usize,
        start: usize,
        len: usize,
        halves: bool,
    ) -> Tensor<3> {
        let cols = |t_ix: Tensor<2>| {
            let rows = t_ix.dims()[0];
            let part = t_ix.reshape([rows, heads, width]).narrow(2, start, len);
            let part = if halves {
                part.reshape([rows, heads, len / 2, 2]).swap_dims(2, 3)
            } else {
                part.reshape([rows, heads, 1, len])
            };
            part.reshape([rows, heads * len])
        };
        let w_io = cols(layer.weight.val());
        let b_o = layer.bias.as_ref().map(|b| cols(b.val().unsqueeze_dim::<2>(0)).squeeze_dim::<1>(0));
        kernels_cubecl::linear(x_bsi, w_io, b_o)
    }

    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward(&self, x_bsd: Tensor<3>) -> Tensor<3> {
        let [b, s, _] = x_bsd.dims();
        let (q, k, v_bshv) = self.qkv_at(x_bsd, 0);
        let out_bshv = kernels_cubecl::causal_attention(q, k, v_bshv, self.scale());
        linear(&self.o_proj, out_bshv.reshape([b, s, self.num_heads * self.v_head_dim]))
    }

    /// The forward of positions `start..start + s` of sequences whose earlier positions are in `slot`
    /// (generation; the cache holds the per-head keys and values the latent expands to); appends theirs.
    ///
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward_cached(&self, x_bsd: Tensor<3>, slot: &mut Option<LayerCache>, start: usize) -> Tensor<3> {
        let [b, s, _] = x_bsd.dims();
        let (q, k, v_bshv) = self.qkv_at(x_bsd, start);
        let (k_bthk, v_bthv) = extend(slot, k, v_bshv);
        let out_bshv = attend(q, k_bthk, v_bthv, start, self.scale());
        linear(&self.o_proj, out_bshv.reshape([b, s, self.num_heads * self.v_head_dim]))
    }

    fn scale(&self) -> f32 {
        1.0 / ((self.qk_nope_head_dim + self.qk_rope_head_dim) as f32).sqrt()
    }

    /// Rotated queries and keys (no-rope and rope parts side by side) and values of positions
    /// `start..start + s`.
    ///
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, h, n + r]`, `[b, s, h, n + r]`, `[b, s, h, v]`
    fn qkv_at(&self, x_bsd: Tensor<3>, start: usize) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, s, _] = x_bsd.dims();
        let (h, n, r, v) = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim);
        let (c, halves) = (self.kv_lora_rank, self.rope_interleave);
        let (q_layer, xq_bsi) = match (&self.q_proj, &self.q_a_proj, &self.q_a_norm, &self.q_b_proj) {
            (Some(q), _, _, _) => (q, x_bsd.clone()),
            (None, Some(a), Some(norm), Some(bp)) => (bp, rms_norm(norm, linear(a, x_bsd.clone()))),
            _ => unreachable!("set at init"),
        };
        let q_nope = Self::project(q_layer, xq_bsi.clone(), h, n + r, 0, n, false).reshape([b, s, h, n]);
        let q_rope = Self::project(q_layer, xq_bsi, h, n + r, n, r, halves).reshape([b, s, h, r]);
        let latent_bsc = Self::project(&self.kv_a_proj, x_bsd.clone(), 1, c + r, 0, c, false);
        let k_rope_bs1r = Self::project(&self.kv_a_proj, x_bsd, 1, c + r, c, r, halves).reshape([b, s, 1, r]);
        let (q_rope, k_rope_bs1r) = self.rope.forward_qk_at(q_rope, k_rope_bs1r, start);
        let latent_bsc = rms_norm(&self.kv_a_norm, latent_bsc);
        let k_nope = Self::project(&self.kv_b_proj, latent_bsc.clone(), h, n + v, 0, n, false).reshape([b, s, h, n]);
        let v_bshv = Self::project(&self.kv_b_proj, latent_bsc, h, n + v, n, v, false).reshape([b, s, h, v]);
        (kernels_cubecl::concat_heads(q_nope, q_rope), kernels_cubecl::concat_heads(k_nope, k_rope_bs1r), v_bshv)
    }
}
