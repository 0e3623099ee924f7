//! Causal language model: embedding, decoder layers, final norm, LM head (tied to the embedding or not),
//! next-token cross-entropy plus the router losses.
//!
//! Legend: b = batch, s = sequence, d = model width, v = vocabulary.

use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use crate::decoder::{DecoderLayer, DecoderLayerConfig};
use crate::init::{initializer, normal_param};
use crate::moe::MoeStats;

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

/// Draws every lazily initialised parameter now, in module order, so a seed gives the same weights
/// whatever the first forward pass touches first (and whichever thread it runs on).
struct Materialize;

impl burn::module::ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

impl CausalLmConfig {
    pub fn init(&self, device: &Device) -> CausalLm {
        let model = self.init_lazy(device);
        model.visit(&mut Materialize);
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
    /// # Shapes
    /// - `ids_bs`: `[b, s]` token ids → logits `[b, s, v]`
    pub fn forward(&self, ids_bs: Tensor<2, Int>) -> LmOutput {
        let mut x_bsd = self.embed.forward(ids_bs);
        let mut moe = Vec::new();
        for layer in &self.layers {
            let (y, stats) = layer.forward(x_bsd);
            x_bsd = y;
            moe.extend(stats);
        }
        let h_bsd = self.norm.forward(x_bsd);
        let [b, s, d] = h_bsd.dims();
        let head_dv = match &self.lm_head_dv {
            Some(w) => w.val(),
            None => self.embed.weight.val().transpose(),
        };
        let v = head_dv.dims()[1];
        let logits_bsv = h_bsd.reshape([b * s, d]).matmul(head_dv).reshape([b, s, v]);
        LmOutput { logits_bsv, moe }
    }

    /// Next-token loss on `ids_bs` (predicting positions 1.. from 0..), plus the router losses.
    pub fn loss(&self, ids_bs: Tensor<2, Int>) -> LmLoss {
        let [b, s] = ids_bs.dims();
        let out = self.forward(ids_bs.clone().narrow(1, 0, s - 1));
        let v = out.logits_bsv.dims()[2];
        let logits = out.logits_bsv.reshape([b * (s - 1), v]);
        let targets = ids_bs.narrow(1, 1, s - 1).reshape([b * (s - 1)]);
        let cross_entropy = CrossEntropyLossConfig::new().init(&logits.device()).forward(logits, targets);
        let mut total = cross_entropy.clone();
        if !out.moe.is_empty() {
            let n = out.moe.len() as f64;
            if self.aux_loss_coef > 0.0 {
                let aux = out.moe.iter().map(|m| m.aux_loss.clone()).reduce(|a, b| a + b).expect("non-empty");
                total = total + aux * (self.aux_loss_coef / n);
            }
            if self.z_loss_coef > 0.0 {
                let z = out.moe.iter().map(|m| m.z_loss.clone()).reduce(|a, b| a + b).expect("non-empty");
                total = total + z * (self.z_loss_coef / n);
            }
        }
        LmLoss { total, cross_entropy, moe: out.moe }
    }

    /// Applies DeepSeek-V3's bias update to every router that uses a selection bias.
    pub fn update_router_biases(mut self, moe: &[MoeStats], rate: f64) -> Self {
        let mut stats = moe.iter();
        for layer in self.layers.iter_mut() {
            if let Some(block) = layer.moe.take() {
                let s = stats.next().expect("one MoE stat per MoE layer");
                let router = block.router.update_selection_bias(&s.tokens_per_expert, rate);
                layer.moe = Some(crate::moe::MoeBlock { router, ..block });
            }
        }
        self
    }
}
