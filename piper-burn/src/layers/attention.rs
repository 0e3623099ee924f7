//! Causal self-attention with grouped-query heads, rotary embedding, optional q/k RMSNorm per head
//! (Qwen3) or over the whole projections (OLMoE), q/k/v biases (Qwen2-MoE) and q/k/v clamping (OLMoE's
//! `clip_qkv`). The rotation and the causal softmax attention are fused operations
//! ([`kernels_cubecl::rotary`], [`kernels_cubecl::causal_attention`]) that keep no `s × s` tensor.
//!
//! Legend: b = batch, s = sequence, d = model width, h = query heads, g = key/value heads,
//! k = head dim, q = h·k, v = g·k.

use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use crate::layers::fused::{linear, rms_norm};
use crate::layers::init::{normal_linear, normal_linear_with_bias};
use crate::layers::kv_cache::{LayerCache, attend, extend};
use crate::layers::rope::{RotaryEmbedding, RotaryEmbeddingConfig};

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
    /// With `qk_norm`: one RMSNorm over the whole q (h·k wide) and k (g·k wide) projections instead of
    /// each head's (OLMoE).
    #[config(default = false)]
    pub qk_norm_whole: bool,
    /// Biases on the q, k and v projections (Qwen2-MoE).
    #[config(default = false)]
    pub qkv_bias: bool,
    /// Clamp queries, keys and values to ±this after their projections (and q/k norms), as OLMoE's
    /// `clip_qkv`.
    #[config(default = "None")]
    pub clip_qkv: Option<f64>,
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
    /// The norms span the whole projections (OLMoE), not each head.
    pub qk_norm_whole: bool,
    pub clip_qkv: Option<f64>,
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
        let norm = |width: usize| RmsNormConfig::new(width).with_epsilon(self.norm_eps).init(device);
        let (q_norm_width, k_norm_width) = if self.qk_norm_whole { (q, kv) } else { (self.head_dim, self.head_dim) };
        let proj = |out: usize| normal_linear_with_bias(LinearConfig::new(self.d_model, out), self.qkv_bias, device);
        Attention {
            q_proj: proj(q),
            k_proj: proj(kv),
            v_proj: proj(kv),
            o_proj: normal_linear(LinearConfig::new(q, self.d_model), device),
            q_norm: self.qk_norm.then(|| norm(q_norm_width)),
            k_norm: self.qk_norm.then(|| norm(k_norm_width)),
            qk_norm_whole: self.qk_norm && self.qk_norm_whole,
            clip_qkv: self.clip_qkv,
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
        let (q_bshk, k_bsgk, v_bsgk) = self.qkv(x_bsd);
        let (q_bshk, k_bsgk) = self.rope.forward_qk(q_bshk, k_bsgk);
        // Query head i reads key/value head i / (h / g), as Hugging Face's repeat_kv.
        let out_bshk = kernels_cubecl::causal_attention(q_bshk, k_bsgk, v_bsgk, self.scale());
        linear(&self.o_proj, out_bshk.reshape([b, s, self.num_heads * self.head_dim]))
    }

    /// The forward of positions `start..start + s` of sequences whose earlier positions are in `slot`
    /// (generation); appends theirs.
    ///
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward_cached(&self, x_bsd: Tensor<3>, slot: &mut Option<LayerCache>, start: usize) -> Tensor<3> {
        let [b, s, _] = x_bsd.dims();
        let (q_bshk, k_bsgk, v_bsgk) = self.qkv(x_bsd);
        let (q_bshk, k_bsgk) = self.rope.forward_qk_at(q_bshk, k_bsgk, start);
        let (k_btgk, v_btgk) = extend(slot, k_bsgk, v_bsgk);
        let out_bshk = attend(q_bshk, k_btgk, v_btgk, start, self.scale());
        linear(&self.o_proj, out_bshk.reshape([b, s, self.num_heads * self.head_dim]))
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Queries, keys and values before the rotation: projected, normed, clamped.
    ///
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, h, k]`, `[b, s, g, k]`, `[b, s, g, k]`
    fn qkv(&self, x_bsd: Tensor<3>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, s, _] = x_bsd.dims();
        let (h, g, k) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let mut q_bsq = linear(&self.q_proj, x_bsd.clone());
        let mut k_bsv = linear(&self.k_proj, x_bsd.clone());
        let mut v_bsv = linear(&self.v_proj, x_bsd);
        let per_head_norms = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) if self.qk_norm_whole => {
                q_bsq = rms_norm(qn, q_bsq);
                k_bsv = rms_norm(kn, k_bsv);
                None
            }
            (Some(qn), Some(kn)) => Some((qn, kn)),
            _ => None,
        };
        if let Some(c) = self.clip_qkv {
            q_bsq = q_bsq.clamp(-c, c);
            k_bsv = k_bsv.clamp(-c, c);
            v_bsv = v_bsv.clamp(-c, c);
        }
        let mut q_bshk = q_bsq.reshape([b, s, h, k]);
        let mut k_bsgk = k_bsv.reshape([b, s, g, k]);
        let v_bsgk = v_bsv.reshape([b, s, g, k]);
        if let Some((qn, kn)) = per_head_norms {
            q_bshk = rms_norm(qn, q_bshk);
            k_bsgk = rms_norm(kn, k_bsgk);
        }
        (q_bshk, k_bsgk, v_bsgk)
    }
}
