//! Parameter counts and training FLOPs of a [`ModelSpec`].
//!
//! FLOPs follow Megatron-LM's `num_floating_point_operations` (megatron/training/training.py): forward +
//! backward = 3 × forward GEMM FLOPs, causal attention counts half of the s² score and context GEMMs,
//! logits are included, the router and element-wise work are not.

use serde::Serialize;

use super::spec::{Attention, LayerKind, Mlp, ModelSpec, QkNorm};

/// Parameters by component (the names are part of `piper model --json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ParamBreakdown {
    pub embedding: u64,
    pub lm_head: u64,
    pub attention: u64,
    pub dense_mlp: u64,
    pub routed_experts: u64,
    pub shared_experts: u64,
    pub router: u64,
    pub norms: u64,
    pub mtp: u64,
}

impl ParamBreakdown {
    pub fn total(&self) -> u64 {
        self.embedding
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.router
            + self.norms
            + self.mtp
    }
}

/// The parameters of one decoder layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LayerParams {
    pub attention: u64,
    pub norms: u64,
    pub dense_mlp: u64,
    /// All `E` routed experts of the layer.
    pub routed_experts: u64,
    /// One routed expert (0 for a dense layer).
    pub per_expert: u64,
    pub shared_experts: u64,
    pub router: u64,
}

impl LayerParams {
    /// Parameters replicated on every expert-parallel rank (all but the routed experts).
    pub fn non_expert(&self) -> u64 {
        self.attention + self.norms + self.dense_mlp + self.shared_experts + self.router
    }

    pub fn total(&self) -> u64 {
        self.non_expert() + self.routed_experts
    }
}

/// Parameters of one MLP over hidden size `d`.
pub fn mlp_params(d: u64, mlp: &Mlp) -> u64 {
    let f = mlp.intermediate_size;
    let bias = if mlp.bias { (mlp.matrices() - 1) * f + d } else { 0 };
    mlp.matrices() * d * f + bias
}

/// Attention parameters of one layer, including its internal q/k/kv norms.
pub fn attention_params(spec: &ModelSpec) -> u64 {
    let d = spec.hidden_size;
    match spec.attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, qkv_bias, o_bias, qk_norm, sinks } => {
            let q = num_heads * head_dim;
            let kv = num_kv_heads * head_dim;
            let mut p = d * q + 2 * d * kv + q * d;
            if qkv_bias {
                p += q + 2 * kv;
            }
            if o_bias {
                p += d;
            }
            p += match qk_norm {
                QkNorm::None => 0,
                QkNorm::PerHead => 2 * head_dim,
                QkNorm::PerProjection => q + kv,
            };
            if sinks {
                p += num_heads;
            }
            p
        }
        Attention::Mla { num_heads: h, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let qk = qk_nope_head_dim + qk_rope_head_dim;
            let q = match q_lora_rank {
                Some(r) => d * r + r + r * h * qk, // q_a_proj, q_a_layernorm, q_b_proj
                None => d * h * qk,
            };
            let kv = d * (kv_lora_rank + qk_rope_head_dim)
                + kv_lora_rank
                + kv_lora_rank * h * (qk_nope_head_dim + v_head_dim);
            q + kv + h * v_head_dim * d
        }
    }
}

/// Parameters of one decoder layer of the given kind.
pub fn layer_params(spec: &ModelSpec, kind: LayerKind) -> LayerParams {
    let d = spec.hidden_size;
    let mut p = LayerParams { attention: attention_params(spec), norms: 2 * spec.norm.params(d), ..Default::default() };
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => {
            p.per_expert = mlp_params(d, &moe.expert);
            p.routed_experts = moe.num_experts * p.per_expert;
            p.shared_experts = moe.num_shared_experts * mlp_params(d, &moe.shared_expert())
                + if moe.shared_expert_gate { d } else { 0 };
            p.router = d * moe.num_experts + if moe.router_bias { moe.num_experts } else { 0 };
        }
        _ => p.dense_mlp = spec.dense_mlp.as_ref().map_or(0, |m| mlp_params(d, m)),
    }
    p
}

/// Parameters of one multi-token-prediction module without the embedding and head it shares with the
/// main model: enorm, hnorm, the `2d → d` projection, one decoder layer and the shared head's norm.
pub fn mtp_module_params(spec: &ModelSpec) -> u64 {
    let d = spec.hidden_size;
    3 * spec.norm.params(d) + 2 * d * d + layer_params(spec, spec.mtp_layer_kind()).total()
}

/// An upper bound on the parameter count, in `f64` so that it cannot wrap: what [`ModelSpec::validate`]
/// compares with [`crate::limits::MAX_PARAMS`] before any exact `u64` count is formed. Each term is
/// at least its exact counterpart (every layer priced as the larger of dense and MoE, MTP modules
/// as layers plus their `2d → d` projection), and with the spec's field bounds each factor is exact.
pub fn params_upper_bound(spec: &ModelSpec) -> f64 {
    let d = spec.hidden_size as f64;
    let dense = spec.dense_mlp.as_ref().map_or(0.0, |m| mlp_params(spec.hidden_size, m) as f64);
    let moe = spec.moe.as_ref().map_or(0.0, |m| {
        let e = m.num_experts as f64 * mlp_params(spec.hidden_size, &m.expert) as f64;
        let shared = m.num_shared_experts as f64 * mlp_params(spec.hidden_size, &m.shared_expert()) as f64;
        e + shared + (d + 1.0) * (m.num_experts as f64 + 1.0)
    });
    let layer = attention_params(spec) as f64 + 4.0 * d + dense.max(moe);
    let layers = spec.num_layers as f64 + spec.mtp_depth as f64;
    layers * layer + spec.mtp_depth as f64 * (2.0 * d * d + 6.0 * d) + 2.0 * spec.vocab_size as f64 * d + 2.0 * d
}

/// Total parameters by component.
pub fn param_breakdown(spec: &ModelSpec) -> ParamBreakdown {
    let d = spec.hidden_size;
    let mut b = ParamBreakdown {
        embedding: spec.vocab_size * d,
        lm_head: if spec.tie_embeddings { 0 } else { spec.vocab_size * d },
        norms: spec.norm.params(d), // final norm
        mtp: spec.mtp_depth * mtp_module_params(spec),
        ..Default::default()
    };
    for kind in &spec.layers {
        let l = layer_params(spec, *kind);
        b.attention += l.attention;
        b.norms += l.norms;
        b.dense_mlp += l.dense_mlp;
        b.routed_experts += l.routed_experts;
        b.shared_experts += l.shared_experts;
        b.router += l.router;
    }
    b
}

/// Parameters one token uses: everything but the `E − k` routed experts it is not sent to (in every MoE
/// layer, including MTP modules). The input embedding is counted, as Mistral does.
pub fn active_params(spec: &ModelSpec) -> u64 {
    let total = param_breakdown(spec).total();
    let Some(moe) = &spec.moe else { return total };
    let per_expert = mlp_params(spec.hidden_size, &moe.expert);
    let mtp_moe = if spec.mtp_layer_kind() == LayerKind::Moe { spec.mtp_depth } else { 0 };
    total - (spec.num_moe_layers() + mtp_moe) * (moe.num_experts - moe.top_k) * per_expert
}

/// Training (forward + backward) FLOPs per token by component, Megatron-LM convention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FlopsBreakdown {
    /// q/k/v/o projections (MLA: its low-rank projections and their norms, as Megatron counts them).
    pub attention_projections: f64,
    /// Causal score and context GEMMs (half of the s × s matrix).
    pub attention_core: f64,
    pub dense_mlp: f64,
    pub routed_experts: f64,
    pub shared_experts: f64,
    /// MTP enorm/hnorm/final norm and the `2d → d` projection (its decoder layer is counted above).
    pub mtp_extra: f64,
    /// LM head, once per prediction depth.
    pub logits: f64,
}

impl FlopsBreakdown {
    pub fn total(&self) -> f64 {
        self.attention_projections
            + self.attention_core
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.mtp_extra
            + self.logits
    }
}

/// Forward FLOPs per token of one layer's attention: (projections, causal core) at sequence length `s`.
pub fn attention_forward_flops(spec: &ModelSpec, seq_len: u64) -> (f64, f64) {
    let d = spec.hidden_size as f64;
    let s = seq_len as f64;
    match spec.attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, .. } => {
            let (h, g, dh) = (num_heads as f64, num_kv_heads as f64, head_dim as f64);
            // q and o: 2·(2·d·h·dh); k and v: 2·(2·d·g·dh); core: 2·s·h·dh·(QK + AV)/2.
            (4.0 * d * h * dh + 4.0 * d * g * dh, 2.0 * s * h * dh)
        }
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let (h, kv, nope, rope, v) = (
                num_heads as f64,
                kv_lora_rank as f64,
                qk_nope_head_dim as f64,
                qk_rope_head_dim as f64,
                v_head_dim as f64,
            );
            let q_term = match q_lora_rank {
                None => d * h * (nope + rope),
                Some(r) => r as f64 * (d + h * (nope + rope) + 1.0),
            };
            let proj = q_term + kv * (d + h * (nope + v) + 1.0) + d * rope + h * v * d;
            let core = s * h * (nope + rope) / 2.0 + s * h * v / 2.0;
            (2.0 * proj, 2.0 * core)
        }
    }
}

/// Forward FLOPs per token of one MLP (2 FLOPs per multiply-add, biases ignored).
pub fn mlp_forward_flops(d: u64, mlp: &Mlp) -> f64 {
    2.0 * (mlp.matrices() * d * mlp.intermediate_size) as f64
}

/// Forward FLOPs per token of the MLP part of a layer: (dense, routed experts × k, shared experts).
pub fn mlp_part_forward_flops(spec: &ModelSpec, kind: LayerKind) -> (f64, f64, f64) {
    let d = spec.hidden_size;
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => (
            0.0,
            moe.top_k as f64 * mlp_forward_flops(d, &moe.expert),
            moe.num_shared_experts as f64 * mlp_forward_flops(d, &moe.shared_expert()),
        ),
        _ => (spec.dense_mlp.as_ref().map_or(0.0, |m| mlp_forward_flops(d, m)), 0.0, 0.0),
    }
}

/// Training FLOPs per token at sequence length `seq_len` (Megatron-LM convention).
pub fn training_flops_per_token(spec: &ModelSpec, seq_len: u64) -> FlopsBreakdown {
    const TRAIN: f64 = 3.0; // forward, backward data-gradient, backward weight-gradient
    let d = spec.hidden_size as f64;
    let (proj, core) = attention_forward_flops(spec, seq_len);
    let mut b = FlopsBreakdown::default();
    let mtp_kind = spec.mtp_layer_kind();
    let kinds = spec.layers.iter().copied().chain(std::iter::repeat_n(mtp_kind, spec.mtp_depth as usize));
    for kind in kinds {
        b.attention_projections += TRAIN * proj;
        b.attention_core += TRAIN * core;
        let (dense, routed, shared) = mlp_part_forward_flops(spec, kind);
        b.dense_mlp += TRAIN * dense;
        b.routed_experts += TRAIN * routed;
        b.shared_experts += TRAIN * shared;
    }
    let mtp = spec.mtp_depth as f64;
    b.mtp_extra = TRAIN * 2.0 * mtp * (3.0 * d + 2.0 * d * d);
    b.logits = TRAIN * 2.0 * d * spec.vocab_size as f64 * (mtp + 1.0);
    b
}
