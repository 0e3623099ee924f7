//! Causal language model: embedding, decoder layers, final norm, LM head (tied to the embedding or not),
//! next-token cross-entropy plus the router losses.
//!
//! Legend: b = batch, s = sequence, d = model width, v = vocabulary.

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use super::decoder::{DecoderLayer, DecoderLayerConfig};
use crate::layers::fused::rms_norm;
use crate::layers::init::{draw_now, initializer, normal_param};
use crate::layers::kv_cache::KvCache;
use crate::moe::MoeStats;
use crate::moe::losses::RouterLossWeights;

#[derive(Config, Debug)]
pub struct CausalLmConfig {
    pub vocab_size: usize,
    pub d_model: usize,
    pub layers: Vec<DecoderLayerConfig>,
    #[config(default = false)]
    pub tie_embeddings: bool,
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// Weight of the load-balancing loss in the training loss.
    #[config(default = 0.01)]
    pub aux_loss_coef: f64,
    /// Weight of the router z-loss.
    #[config(default = 0.0)]
    pub z_loss_coef: f64,
    /// Debug: all-zero router weights (degenerate routing, for testing zero-token experts).
    #[config(default = false)]
    pub zero_router: bool,
}

#[derive(Module, Debug)]
pub struct CausalLm {
    pub embed: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// `[d, v]`; `None` when tied to the embedding.
    pub lm_head_dv: Option<Param<Tensor<2>>>,
    pub aux_loss_coef: f64,
    pub z_loss_coef: f64,
}

/// A forward pass's results.
#[derive(Debug, Clone)]
pub struct LmOutput {
    /// `[b, s, v]`
    pub logits_bsv: Tensor<3>,
    /// One entry per MoE layer, in layer order.
    pub moe: Vec<MoeStats>,
}

/// A training step's loss and its parts.
#[derive(Debug, Clone)]
pub struct LmLoss {
    /// Cross-entropy + aux_loss_coef · mean aux loss + z_loss_coef · mean z-loss.
    pub total: Tensor<1>,
    pub cross_entropy: Tensor<1>,
    pub moe: Vec<MoeStats>,
}

impl CausalLmConfig {
    pub fn init(&self, device: &Device) -> CausalLm {
        self.init_part(device, |_, layer| Some(layer))
    }

    /// The model with only the decoder layers `part` keeps, drawn as [`CausalLmConfig::init`] draws the
    /// whole model (same seed, same weights) but one layer at a time: `part(i, layer)` sees layer i right
    /// after it is drawn and returns what to keep of it (`None`: nothing; a rank's share of its experts),
    /// so a rank's memory never holds more than its part and one whole layer.
    pub fn init_part(
        &self,
        device: &Device,
        mut part: impl FnMut(usize, DecoderLayer) -> Option<DecoderLayer>,
    ) -> CausalLm {
        let mut model = self.init_lazy(device);
        // Module order: the embedding, each layer, the final norm, the head.
        draw_now(&model.embed);
        let layers = std::mem::take(&mut model.layers);
        for (i, layer) in layers.into_iter().enumerate() {
            draw_now(&layer);
            model.layers.extend(part(i, layer));
        }
        draw_now(&model.norm);
        draw_now(&model.lm_head_dv);
        if self.zero_router {
            for block in model.layers.iter_mut().filter_map(|l| l.moe.as_mut()) {
                let shape = block.router.gate.weight.dims();
                block.router.gate.weight = Param::from_tensor(Tensor::zeros(shape, device));
            }
        }
        model
    }

    fn init_lazy(&self, device: &Device) -> CausalLm {
        CausalLm {
            embed: EmbeddingConfig::new(self.vocab_size, self.d_model).with_initializer(initializer()).init(device),
            layers: self.layers.iter().map(|l| l.init(device)).collect(),
            norm: RmsNormConfig::new(self.d_model).with_epsilon(self.norm_eps).init(device),
            lm_head_dv: (!self.tie_embeddings).then(|| normal_param([self.d_model, self.vocab_size], device)),
            aux_loss_coef: self.aux_loss_coef,
            z_loss_coef: self.z_loss_coef,
        }
    }
}

impl CausalLm {
    /// Token embeddings. `ids_bs`: `[b, s]` → `[b, s, d]`.
    pub fn embed_tokens(&self, ids_bs: Tensor<2, Int>) -> Tensor<3> {
        self.embed.forward(ids_bs)
    }

    /// Runs the decoder layers `layers` (a pipeline stage's share). `x_bsd`: `[b, s, d]` → `[b, s, d]`,
    /// with the MoE statistics of its MoE layers.
    pub fn forward_layers(&self, mut x_bsd: Tensor<3>, layers: std::ops::Range<usize>) -> (Tensor<3>, Vec<MoeStats>) {
        let mut moe = Vec::new();
        for layer in &self.layers[layers] {
            let (y, stats) = layer.forward(x_bsd);
            x_bsd = y;
            moe.extend(stats);
        }
        (x_bsd, moe)
    }

    /// Final norm and LM head. `x_bsd`: `[b, s, d]` → logits `[b, s, v]`.
    pub fn head(&self, x_bsd: Tensor<3>) -> Tensor<3> {
        let h_bsd = rms_norm(&self.norm, x_bsd);
        let head_dv = match &self.lm_head_dv {
            Some(w) => w.val(),
            // Tied: the `[v, d]` table read transposed in place.
            None => self.embed.weight.val().transpose(),
        };
        kernels_cubecl::linear(h_bsd, head_dv, None)
    }

    /// Mean next-token cross-entropy of logits `[b, s, v]` against `targets_bs` `[b, s]` (one fused pass
    /// forward and one backward: [`kernels_cubecl::cross_entropy`]).
    pub fn cross_entropy(&self, logits_bsv: Tensor<3>, targets_bs: Tensor<2, Int>) -> Tensor<1> {
        let [b, s, v] = logits_bsv.dims();
        let logits = logits_bsv.reshape([b * s, v]);
        kernels_cubecl::cross_entropy(logits, targets_bs.reshape([b * s])).mean()
    }

    /// MoE layers in the model.
    pub fn num_moe_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.moe.is_some()).count()
    }

    /// # Shapes
    /// - `ids_bs`: `[b, s]` token ids → logits `[b, s, v]`
    pub fn forward(&self, ids_bs: Tensor<2, Int>) -> LmOutput {
        let (x_bsd, moe) = self.forward_layers(self.embed_tokens(ids_bs), 0..self.layers.len());
        LmOutput { logits_bsv: self.head(x_bsd), moe }
    }

    /// Logits of the next positions of sequences whose earlier positions are in `cache` (generation:
    /// the prompt once, then one token at a time); the cache takes the new positions.
    ///
    /// # Shapes
    /// - `ids_bs`: `[b, s]` token ids of positions `cache.positions..` → logits `[b, s, v]`
    pub fn forward_cached(&self, ids_bs: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        let (start, s) = (cache.positions, ids_bs.dims()[1]);
        cache.layers.resize(self.layers.len(), None);
        let mut x_bsd = self.embed_tokens(ids_bs);
        for (layer, slot) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x_bsd = layer.forward_cached(x_bsd, slot, start);
        }
        cache.positions += s;
        self.head(x_bsd)
    }

    /// Next-token loss on `ids_bs` (predicting positions 1.. from 0..), plus the router losses.
    pub fn loss(&self, ids_bs: Tensor<2, Int>) -> LmLoss {
        let [_, s] = ids_bs.dims();
        let out = self.forward(ids_bs.clone().narrow(1, 0, s - 1));
        let cross_entropy = self.cross_entropy(out.logits_bsv, ids_bs.narrow(1, 1, s - 1));
        let weights = RouterLossWeights { aux: self.aux_loss_coef, z: self.z_loss_coef };
        let total = match weights.terms(&out.moe, out.moe.len()) {
            Some(r) => cross_entropy.clone() + r,
            None => cross_entropy.clone(),
        };
        LmLoss { total, cross_entropy, moe: out.moe }
    }
}
