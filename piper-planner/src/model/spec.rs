//! `ModelSpec`: the architecture facts the resource model needs, for dense and MoE decoder-only
//! transformers (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3 with MLA and MTP, OLMoE, gpt-oss, DBRX, Llama 4).
//!
//! Vocabulary: `d` = hidden size, `f` = FFN width of one expert (or of the dense MLP), `E` = routed experts
//! per MoE layer, `k` = experts per token (top-k), `L` = decoder layers.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;

/// Self-attention variant of every decoder layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attention {
    /// Multi-head (`num_kv_heads == num_heads`) or grouped-query attention.
    Gqa {
        num_heads: u64,
        num_kv_heads: u64,
        head_dim: u64,
        /// Bias on the q, k and v projections (Qwen2-MoE, gpt-oss).
        #[serde(default)]
        qkv_bias: bool,
        /// Bias on the output projection (gpt-oss).
        #[serde(default)]
        o_bias: bool,
        /// Learned RMSNorm weights on queries and keys.
        #[serde(default)]
        qk_norm: QkNorm,
        /// One learned attention-sink logit per head (gpt-oss).
        #[serde(default)]
        sinks: bool,
    },
    /// DeepSeek multi-head latent attention (low-rank q and kv with a decoupled rotary part).
    Mla {
        num_heads: u64,
        /// `None`: queries are projected directly from the hidden state (DeepSeek-V2-Lite).
        q_lora_rank: Option<u64>,
        kv_lora_rank: u64,
        qk_nope_head_dim: u64,
        qk_rope_head_dim: u64,
        v_head_dim: u64,
    },
}

/// Where learned query/key norms sit, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    #[default]
    None,
    /// One weight vector of `head_dim` for q and one for k, shared by all heads (Qwen3).
    PerHead,
    /// Weights over the whole q projection and the whole k projection (OLMoE).
    PerProjection,
}

/// A feed-forward block: gated (SwiGLU-style, 3 matrices) or plain (2 matrices).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mlp {
    /// Inner width `f`.
    pub intermediate_size: u64,
    /// Gated linear unit: up, gate and down matrices (3·d·f); otherwise up and down (2·d·f).
    pub gated: bool,
    /// Biases on the projections (gpt-oss experts).
    #[serde(default)]
    pub bias: bool,
}

impl Mlp {
    /// Number of `d × f` weight matrices.
    pub fn matrices(&self) -> u64 {
        if self.gated { 3 } else { 2 }
    }
}

/// How the router scores experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreFunction {
    Softmax,
    Sigmoid,
}

/// The mixture-of-experts block of an MoE layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    /// Routed experts per layer, `E`.
    pub num_experts: u64,
    /// Routed experts per token, `k`.
    pub top_k: u64,
    /// One routed expert.
    pub expert: Mlp,
    /// Shared experts applied to every token.
    #[serde(default)]
    pub num_shared_experts: u64,
    /// Width of one shared expert (`None`: same as a routed expert).
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<u64>,
    /// A `d → 1` sigmoid gate on the shared-expert output (Qwen2-MoE).
    #[serde(default)]
    pub shared_expert_gate: bool,
    /// Bias on the router logits (gpt-oss) or per-expert score-correction bias (DeepSeek-V3).
    #[serde(default)]
    pub router_bias: bool,
    pub score_function: ScoreFunction,
    /// Renormalise the top-k weights to sum to one.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Group-limited routing: experts in `n_group` groups, tokens may use `topk_group` of them.
    #[serde(default)]
    pub n_group: Option<u64>,
    #[serde(default)]
    pub topk_group: Option<u64>,
    /// Multiplier on the routed output (DeepSeek).
    #[serde(default)]
    pub routed_scaling_factor: Option<f64>,
    /// Weight of the load-balancing loss in the training loss (Hugging Face's `router_aux_loss_coef`);
    /// `None`: the runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_aux_loss_coef: Option<f64>,
}

impl Moe {
    /// A plain softmax top-k block of `num_experts` routed experts: no shared experts, bias, groups or
    /// scaling (the families that have them set those fields).
    pub fn softmax(num_experts: u64, top_k: u64, expert: Mlp, norm_topk_prob: bool) -> Moe {
        Moe {
            num_experts,
            top_k,
            expert,
            num_shared_experts: 0,
            shared_expert_intermediate_size: None,
            shared_expert_gate: false,
            router_bias: false,
            score_function: ScoreFunction::Softmax,
            norm_topk_prob,
            n_group: None,
            topk_group: None,
            routed_scaling_factor: None,
            router_aux_loss_coef: None,
        }
    }

    /// The shared-expert MLP (same activation as the routed ones).
    pub fn shared_expert(&self) -> Mlp {
        Mlp {
            intermediate_size: self.shared_expert_intermediate_size.unwrap_or(self.expert.intermediate_size),
            gated: self.expert.gated,
            bias: false,
        }
    }
}

/// Normalisation layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    RmsNorm,
    /// LayerNorm; `bias: false` as in DBRX.
    LayerNorm {
        bias: bool,
    },
}

impl Norm {
    /// Parameters of one norm over `d` features.
    pub fn params(&self, d: u64) -> u64 {
        match self {
            Norm::RmsNorm | Norm::LayerNorm { bias: false } => d,
            Norm::LayerNorm { bias: true } => 2 * d,
        }
    }
}

/// The MLP kind of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    Dense,
    Moe,
}

/// An MoE (or dense) decoder-only transformer, as far as parameters, FLOPs and memory go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    /// Hugging Face `model_type` it was read from, or `piper` for native presets.
    pub model_type: String,
    /// `d`.
    pub hidden_size: u64,
    /// `L`: decoder layers, not counting multi-token-prediction modules.
    pub num_layers: u64,
    pub vocab_size: u64,
    /// Input embedding and LM head share one matrix.
    pub tie_embeddings: bool,
    pub attention: Attention,
    pub norm: Norm,
    /// MLP of dense layers (`None` if every layer is MoE).
    pub dense_mlp: Option<Mlp>,
    /// MoE block of MoE layers (`None` for a dense model).
    pub moe: Option<Moe>,
    /// Kind of each of the `L` layers.
    pub layers: Vec<LayerKind>,
    /// DeepSeek-V3 multi-token-prediction depth (extra modules after the last layer).
    #[serde(default)]
    pub mtp_depth: u64,
    /// Rotary embedding base (`rope_theta`), when the config gives one.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Normalisation epsilon (`rms_norm_eps`), when the config gives one.
    #[serde(default)]
    pub norm_eps: Option<f64>,
    /// Rotary dims stored interleaved (`rope_interleave`, DeepSeek-V3), when the config says.
    #[serde(default)]
    pub rope_interleave: Option<bool>,
    /// Queries, keys and values clamped to ±this after their projections (OLMoE's and DBRX's `clip_qkv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_qkv: Option<f64>,
}

impl ModelSpec {
    /// Builds the per-layer pattern: the first `first_k_dense` layers dense, then layer `i` is MoE when
    /// `(i - offset) % every == 0`, and any layer in `force_dense` is dense.
    pub fn layer_pattern(
        num_layers: u64,
        first_k_dense: u64,
        every: u64,
        offset: u64,
        force_dense: &[u64],
    ) -> Vec<LayerKind> {
        (0..num_layers)
            .map(|i| {
                let moe = i >= first_k_dense
                    && i >= offset
                    && (i - offset).is_multiple_of(every.max(1))
                    && !force_dense.contains(&i);
                if moe { LayerKind::Moe } else { LayerKind::Dense }
            })
            .collect()
    }

    pub fn num_moe_layers(&self) -> u64 {
        self.layers.iter().filter(|k| **k == LayerKind::Moe).count() as u64
    }

    pub fn num_dense_layers(&self) -> u64 {
        self.num_layers - self.num_moe_layers()
    }

    /// Routed experts per MoE layer (0 for a dense model).
    pub fn num_experts(&self) -> u64 {
        self.moe.as_ref().map_or(0, |m| m.num_experts)
    }

    /// The kind of layer an MTP module uses: Megatron's convention, the same as the last decoder layer.
    pub fn mtp_layer_kind(&self) -> LayerKind {
        *self.layers.last().unwrap_or(&LayerKind::Dense)
    }

    /// The same model without its multi-token-prediction modules: what transformers runs (its DeepSeek-V3
    /// has no MTP module and ignores those weights), and what trains with `--mtp-loss-weight 0`.
    pub fn without_mtp(&self) -> ModelSpec {
        ModelSpec { mtp_depth: 0, ..self.clone() }
    }

    /// The spec a training run builds for `--mtp-loss-weight` (`None`: not given). MTP modules are not
    /// implemented in the runtime yet, so a model with them trains only with an explicit weight of 0,
    /// without them; the error names the config field and the flag.
    pub fn for_training(&self, mtp_loss_weight: Option<f64>) -> Result<ModelSpec> {
        let src = format!("model `{}`", self.name);
        if let Some(w) = mtp_loss_weight {
            limits::number(&src, "--mtp-loss-weight", w, 0.0, 1e3)?;
        }
        match (self.mtp_depth, mtp_loss_weight) {
            (0, Some(w)) if w > 0.0 => Err(Error::invalid(
                src,
                "--mtp-loss-weight",
                format!(
                    "is {w}, but the model has no multi-token-prediction module (num_nextn_predict_layers = 0); drop the flag"
                ),
            )),
            (0, _) => Ok(self.clone()),
            (_, Some(0.0)) => Ok(self.without_mtp()),
            (depth, _) => Err(Error::invalid(
                src,
                "num_nextn_predict_layers",
                format!(
                    "= {depth}: multi-token prediction is not implemented in piper-burn yet; pass --mtp-loss-weight 0 to train without the MTP module{} (transformers also runs DeepSeek-V3 without it)",
                    if depth > 1 { "s" } else { "" }
                ),
            )),
        }
    }

    /// Attention heads.
    pub fn num_heads(&self) -> u64 {
        match self.attention {
            Attention::Gqa { num_heads, .. } | Attention::Mla { num_heads, .. } => num_heads,
        }
    }
}
