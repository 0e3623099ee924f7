//! [`ModelBuilder`]: a [`ModelSpec`] of one family (Mixtral, Qwen3-MoE, DeepSeek) from the few numbers a
//! model author chooses; everything else follows the family's conventions. Derived sizes are derived
//! when the spec is built, never kept from a default: `head_dim` is `hidden_size / num_heads` unless set,
//! the DeepSeek attention's ranks follow `hidden_size`. [`ModelBuilder::build`] validates once.
//!
//! ```
//! use piper_planner::model::ModelSpec;
//!
//! let spec = ModelSpec::mixtral("my-moe")
//!     .hidden_size(128)
//!     .layers(4)
//!     .heads(8, 2)
//!     .vocab_size(1024)
//!     .experts(8, 2)
//!     .expert_ffn(256)
//!     .build()?;
//! assert_eq!(spec.num_experts(), 8);
//! // head_dim follows the width: 128 / 8.
//! assert!(matches!(spec.attention, piper_planner::model::Attention::Gqa { head_dim: 16, .. }));
//! # Ok::<(), piper_planner::Error>(())
//! ```

use super::spec::{Attention, Mlp, ModelSpec, Moe, Norm, QkNorm, ScoreFunction};
use crate::error::{Error, Result};

/// The families a [`ModelBuilder`] builds, each as its Hugging Face model type arranges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Mixtral: grouped-query attention, SwiGLU experts, softmax top-k, every layer MoE.
    Mixtral,
    /// Qwen3-MoE: Mixtral's layout with per-head query/key norms and renormalised top-k.
    Qwen3Moe,
    /// DeepSeek-V3: multi-head latent attention, dense first layers, shared experts, sigmoid scores with
    /// a selection bias, group-limited routing, a routed scaling factor.
    DeepSeek,
}

/// A model spec under construction; see the [module documentation](self).
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build()`"]
pub struct ModelBuilder {
    family: Family,
    name: String,
    hidden_size: u64,
    num_layers: u64,
    vocab_size: u64,
    num_heads: u64,
    num_kv_heads: u64,
    head_dim: Option<u64>,
    /// DeepSeek: grouped-query instead of latent attention.
    gqa: bool,
    num_experts: u64,
    top_k: u64,
    expert_ffn: u64,
    shared_experts: u64,
    dense_layers: u64,
    dense_ffn: Option<u64>,
    tie_embeddings: bool,
    rope_theta: Option<f64>,
    norm_eps: Option<f64>,
    router_aux_loss_coef: Option<f64>,
}

impl ModelSpec {
    /// A Mixtral-style model (defaults: d 64, 2 layers, 4/2 heads, 256 tokens, 8 experts top-2 of width 128).
    pub fn mixtral(name: &str) -> ModelBuilder {
        ModelBuilder::new(Family::Mixtral, name)
    }

    /// A Qwen3-MoE-style model (defaults as [`ModelSpec::mixtral`], with 16 experts top-4 of width 64).
    pub fn qwen3_moe(name: &str) -> ModelBuilder {
        ModelBuilder::new(Family::Qwen3Moe, name).experts(16, 4).expert_ffn(64)
    }

    /// A DeepSeek-V3-style model (defaults: 3 layers, the first dense of width 3·d; 32 experts of width 32,
    /// top-6 in 4 groups of which a token uses 2; one shared expert; routed outputs scaled by 2.5).
    pub fn deepseek(name: &str) -> ModelBuilder {
        ModelBuilder::new(Family::DeepSeek, name)
            .layers(3)
            .dense_layers(1)
            .experts(32, 6)
            .expert_ffn(32)
            .shared_experts(1)
    }
}

impl ModelBuilder {
    /// The family's defaults.
    pub fn new(family: Family, name: &str) -> Self {
        ModelBuilder {
            family,
            name: name.into(),
            hidden_size: 64,
            num_layers: 2,
            vocab_size: 256,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: None,
            gqa: false,
            num_experts: 8,
            top_k: 2,
            expert_ffn: 128,
            shared_experts: 0,
            dense_layers: 0,
            dense_ffn: None,
            tie_embeddings: false,
            rope_theta: None,
            norm_eps: None,
            router_aux_loss_coef: None,
        }
    }

    /// Model width `d`.
    pub fn hidden_size(mut self, d: u64) -> Self {
        self.hidden_size = d;
        self
    }

    /// Decoder layers `L`.
    pub fn layers(mut self, n: u64) -> Self {
        self.num_layers = n;
        self
    }

    pub fn vocab_size(mut self, v: u64) -> Self {
        self.vocab_size = v;
        self
    }

    /// Query heads and key/value heads (DeepSeek's latent attention has one key/value per query head, and
    /// ignores `num_kv_heads`).
    pub fn heads(mut self, num_heads: u64, num_kv_heads: u64) -> Self {
        (self.num_heads, self.num_kv_heads) = (num_heads, num_kv_heads);
        self
    }

    /// Width of one attention head (default `hidden_size / num_heads`).
    pub fn head_dim(mut self, h: u64) -> Self {
        self.head_dim = Some(h);
        self
    }

    /// DeepSeek: grouped-query attention instead of latent attention (cheaper on a CPU).
    pub fn gqa_attention(mut self) -> Self {
        self.gqa = true;
        self
    }

    /// Routed experts `E` per MoE layer and experts per token `k`.
    pub fn experts(mut self, num_experts: u64, top_k: u64) -> Self {
        (self.num_experts, self.top_k) = (num_experts, top_k);
        self
    }

    /// Inner width `f` of one routed expert (and of a shared one).
    pub fn expert_ffn(mut self, f: u64) -> Self {
        self.expert_ffn = f;
        self
    }

    /// Shared experts every token passes through.
    pub fn shared_experts(mut self, n: u64) -> Self {
        self.shared_experts = n;
        self
    }

    /// The first `n` layers are dense (a gated MLP of width [`dense_ffn`](Self::dense_ffn)).
    pub fn dense_layers(mut self, n: u64) -> Self {
        self.dense_layers = n;
        self
    }

    /// Inner width of the dense layers' MLP (default 3·`hidden_size`).
    pub fn dense_ffn(mut self, f: u64) -> Self {
        self.dense_ffn = Some(f);
        self
    }

    /// The LM head shares the embedding's matrix.
    pub fn tie_embeddings(mut self, tie: bool) -> Self {
        self.tie_embeddings = tie;
        self
    }

    pub fn rope_theta(mut self, theta: f64) -> Self {
        self.rope_theta = Some(theta);
        self
    }

    pub fn norm_eps(mut self, eps: f64) -> Self {
        self.norm_eps = Some(eps);
        self
    }

    /// Weight of the load-balancing loss in the training loss (Hugging Face's `router_aux_loss_coef`);
    /// a run may still override it.
    pub fn router_aux_loss_coef(mut self, coef: f64) -> Self {
        self.router_aux_loss_coef = Some(coef);
        self
    }

    /// The spec, validated; the error names the field and the fix.
    pub fn build(self) -> Result<ModelSpec> {
        let src = format!("model `{}`", self.name.escape_debug());
        if self.dense_layers > self.num_layers {
            let why = format!("is {} but the model has {} layers", self.dense_layers, self.num_layers);
            return Err(Error::invalid(src, "dense_layers", why));
        }
        let spec = ModelSpec {
            name: self.name.clone(),
            model_type: "piper".into(),
            hidden_size: self.hidden_size,
            num_layers: self.num_layers,
            vocab_size: self.vocab_size,
            tie_embeddings: self.tie_embeddings,
            attention: self.attention(&src)?,
            norm: Norm::RmsNorm,
            dense_mlp: (self.dense_layers > 0).then(|| gated(self.dense_ffn.unwrap_or(3 * self.hidden_size))),
            moe: Some(self.moe()),
            layers: ModelSpec::layer_pattern(self.num_layers, self.dense_layers, 1, 0, &[]),
            mtp_depth: 0,
            rope_theta: self.rope_theta,
            norm_eps: self.norm_eps,
            rope_interleave: None,
            clip_qkv: None,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Head width: given, or the model width over the heads (which must divide it).
    fn head_dim_of(&self, src: &str) -> Result<u64> {
        if let Some(h) = self.head_dim {
            return Ok(h);
        }
        if self.num_heads == 0 || !self.hidden_size.is_multiple_of(self.num_heads) {
            let why = format!(
                "{} heads do not divide hidden_size {}; choose a head count that does, or set head_dim",
                self.num_heads, self.hidden_size
            );
            return Err(Error::invalid(src, "num_attention_heads", why));
        }
        Ok(self.hidden_size / self.num_heads)
    }

    fn attention(&self, src: &str) -> Result<Attention> {
        let head_dim = self.head_dim_of(src)?;
        if self.family == Family::DeepSeek && !self.gqa {
            // DeepSeek-V3's proportions: no query compression at this size, a latent of d/2, the rotary part
            // half of a head.
            return Ok(Attention::Mla {
                num_heads: self.num_heads,
                q_lora_rank: None,
                kv_lora_rank: (self.hidden_size / 2).max(1),
                qk_nope_head_dim: head_dim,
                qk_rope_head_dim: (head_dim / 2).max(2) & !1,
                v_head_dim: head_dim,
            });
        }
        let qk_norm = if self.family == Family::Qwen3Moe { QkNorm::PerHead } else { QkNorm::None };
        Ok(Attention::Gqa {
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm,
            sinks: false,
        })
    }

    fn moe(&self) -> Moe {
        let mut moe = Moe::softmax(self.num_experts, self.top_k, gated(self.expert_ffn), true);
        moe.num_shared_experts = self.shared_experts;
        moe.router_aux_loss_coef = self.router_aux_loss_coef;
        if self.family == Family::DeepSeek {
            moe.score_function = ScoreFunction::Sigmoid;
            moe.router_bias = true;
            // Groups of the experts, of which a token may use half (DeepSeek-V3: 8 groups, 4 used).
            let groups = [4, 2, 1].into_iter().find(|g| self.num_experts.is_multiple_of(*g)).unwrap_or(1);
            moe.n_group = Some(groups);
            moe.topk_group = Some(groups.div_ceil(2));
            moe.routed_scaling_factor = Some(2.5);
        }
        moe
    }
}

fn gated(intermediate_size: u64) -> Mlp {
    Mlp { intermediate_size, gated: true, bias: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LayerKind, preset};

    #[test]
    fn family_defaults_equal_the_tiny_presets() {
        assert_eq!(ModelSpec::mixtral("tiny").build().unwrap(), preset("tiny").unwrap());
        assert_eq!(ModelSpec::qwen3_moe("tiny-qwen3").build().unwrap(), preset("tiny-qwen3").unwrap());
        let deepseek = ModelSpec::deepseek("tiny-deepseek").gqa_attention().build().unwrap();
        assert_eq!(deepseek, preset("tiny-deepseek").unwrap());
    }

    #[test]
    fn head_dim_follows_the_width_unless_set() {
        let head = |b: ModelBuilder| match b.build().unwrap().attention {
            Attention::Gqa { head_dim, .. } | Attention::Mla { v_head_dim: head_dim, .. } => head_dim,
        };
        assert_eq!(head(ModelSpec::mixtral("m").hidden_size(256)), 64);
        assert_eq!(head(ModelSpec::mixtral("m").hidden_size(256).heads(8, 8)), 32);
        assert_eq!(head(ModelSpec::mixtral("m").hidden_size(256).head_dim(48)), 48);
        assert_eq!(head(ModelSpec::deepseek("d").hidden_size(128)), 32);
    }

    #[test]
    fn deepseek_keeps_its_family_traits() {
        let spec = ModelSpec::deepseek("d").layers(4).dense_layers(2).experts(16, 4).build().unwrap();
        assert_eq!(spec.layers, [LayerKind::Dense, LayerKind::Dense, LayerKind::Moe, LayerKind::Moe]);
        assert_eq!(spec.dense_mlp.as_ref().map(|m| m.intermediate_size), Some(192));
        let moe = spec.moe.as_ref().unwrap();
        assert_eq!((moe.score_function, moe.n_group, moe.topk_group), (ScoreFunction::Sigmoid, Some(4), Some(2)));
        assert!(matches!(spec.attention, Attention::Mla { kv_lora_rank: 32, qk_rope_head_dim: 8, .. }));
    }

    /// The load-balancing weight goes out in a transformers config and comes back; a config without one
    /// leaves it to the run.
    #[test]
    fn the_load_balancing_weight_round_trips_through_a_transformers_config() {
        let spec = ModelSpec::mixtral("m").router_aux_loss_coef(0.02).build().unwrap();
        let mut config = crate::hf::mixtral_config(&spec).unwrap();
        assert_eq!(config["router_aux_loss_coef"], 0.02);
        config["_name_or_path"] = "m".into();
        let back = crate::hf::from_hf_config(&config, "m").unwrap();
        assert_eq!(back.moe.as_ref().unwrap().router_aux_loss_coef, Some(0.02));
        config.as_object_mut().unwrap().remove("router_aux_loss_coef");
        let back = crate::hf::from_hf_config(&config, "m").unwrap();
        assert_eq!(back.moe.as_ref().unwrap().router_aux_loss_coef, None);
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_field() {
        let field = |b: ModelBuilder| match b.build() {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(field(ModelSpec::mixtral("m").hidden_size(100).heads(8, 2)), "num_attention_heads");
        assert_eq!(field(ModelSpec::mixtral("m").heads(0, 0)), "num_attention_heads");
        assert_eq!(field(ModelSpec::mixtral("m").layers(2).dense_layers(3)), "dense_layers");
        assert_eq!(field(ModelSpec::mixtral("m").experts(4, 5)), "num_experts_per_tok");
        assert_eq!(field(ModelSpec::mixtral("m").router_aux_loss_coef(f64::NAN)), "router_aux_loss_coef");
    }
}
