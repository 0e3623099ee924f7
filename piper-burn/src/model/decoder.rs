//! A pre-norm decoder layer: `x + attn(norm(x))`, then `+ ffn(norm(·))` with a dense MLP or an MoE block.
//!
//! Legend: b = batch, s = sequence, d = model width.

use burn::nn::{RmsNorm, RmsNormConfig};
use burn::prelude::*;

use crate::layers::attention::{Attention, AttentionConfig};
use crate::layers::fused::rms_norm;
use crate::layers::kv_cache::LayerCache;
use crate::layers::mla::{Mla, MlaConfig};
use crate::layers::mlp::{Mlp, MlpConfig};
use crate::moe::{MoeBlock, MoeBlockConfig, MoeStats};

#[derive(Config, Debug)]
pub struct DecoderLayerConfig {
    /// Exactly one of `attention` (MHA/GQA) and `mla` (DeepSeek latent attention).
    #[config(default = "None")]
    pub attention: Option<AttentionConfig>,
    #[config(default = "None")]
    pub mla: Option<MlaConfig>,
    /// Exactly one of `dense` and `moe`.
    #[config(default = "None")]
    pub dense: Option<MlpConfig>,
    #[config(default = "None")]
    pub moe: Option<MoeBlockConfig>,
    #[config(default = 1e-6)]
    pub norm_eps: f64,
}

#[derive(Module, Debug)]
pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub attention: Option<Attention>,
    pub mla: Option<Mla>,
    pub post_attention_norm: RmsNorm,
    pub dense: Option<Mlp>,
    pub moe: Option<MoeBlock>,
}

impl DecoderLayerConfig {
    pub fn init(&self, device: &Device) -> DecoderLayer {
        assert!(
            self.dense.is_some() != self.moe.is_some(),
            "a decoder layer needs exactly one of a dense MLP and an MoE block"
        );
        assert!(
            self.attention.is_some() != self.mla.is_some(),
            "a decoder layer needs exactly one of attention and MLA"
        );
        let d =
            self.attention.as_ref().map(|a| a.d_model).or(self.mla.as_ref().map(|m| m.d_model)).expect("checked above");
        DecoderLayer {
            input_norm: RmsNormConfig::new(d).with_epsilon(self.norm_eps).init(device),
            attention: self.attention.as_ref().map(|c| c.init(device)),
            mla: self.mla.as_ref().map(|c| c.init(device)),
            post_attention_norm: RmsNormConfig::new(d).with_epsilon(self.norm_eps).init(device),
            dense: self.dense.as_ref().map(|c| c.init(device)),
            moe: self.moe.as_ref().map(|c| c.init(device)),
        }
    }
}

impl DecoderLayer {
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`, with the MoE statistics of an MoE layer
    pub fn forward(&self, x_bsd: Tensor<3>) -> (Tensor<3>, Option<MoeStats>) {
        let normed = rms_norm(&self.input_norm, x_bsd.clone());
        let attended = match (&self.attention, &self.mla) {
            (Some(a), _) => a.forward(normed),
            (_, Some(m)) => m.forward(normed),
            _ => unreachable!("checked at init"),
        };
        self.feed_forward(x_bsd + attended)
    }

    /// The forward of positions `start..start + s` whose earlier positions' keys and values are in
    /// `slot` (generation); appends theirs.
    ///
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward_cached(&self, x_bsd: Tensor<3>, slot: &mut Option<LayerCache>, start: usize) -> Tensor<3> {
        let normed = rms_norm(&self.input_norm, x_bsd.clone());
        let attended = match (&self.attention, &self.mla) {
            (Some(a), _) => a.forward_cached(normed, slot, start),
            (_, Some(m)) => m.forward_cached(normed, slot, start),
            _ => unreachable!("checked at init"),
        };
        self.feed_forward(x_bsd + attended).0
    }

    /// The second half: `h + ffn(norm(h))`.
    fn feed_forward(&self, h_bsd: Tensor<3>) -> (Tensor<3>, Option<MoeStats>) {
        let normed = rms_norm(&self.post_attention_norm, h_bsd.clone());
        match (&self.dense, &self.moe) {
            (Some(mlp), _) => (h_bsd + mlp.forward(normed), None),
            (_, Some(moe)) => {
                let (y, stats) = moe.forward(normed);
                (h_bsd + y, Some(stats))
            }
            _ => unreachable!("checked at init"),
        }
    }
}
