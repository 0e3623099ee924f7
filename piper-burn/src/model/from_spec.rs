//! The Burn model of a planner [`ModelSpec`] — the type the resource model reads from a Hugging Face
//! `config.json` or a preset — so the model the planner sizes is the model that trains. Families:
//! Mixtral (softmax top-2), Qwen2/3-MoE and OLMoE (q/k norms, renormalised top-k, gated shared expert)
//! and DeepSeek-V2/V3 (MLA, fine-grained and shared experts, sigmoid scores with a selection bias,
//! group-limited routing, routed scaling, dense first layers). What the planner counts but piper-burn
//! would build differently is refused, naming the field — never approximated.

use piper_planner::model::{Attention, LayerKind, ModelSpec, Moe, Norm, QkNorm, ScoreFunction};

use super::causal_lm::CausalLmConfig;
use super::decoder::DecoderLayerConfig;
use crate::layers::attention::AttentionConfig;
use crate::layers::mla::MlaConfig;
use crate::layers::mlp::MlpConfig;
use crate::moe::MoeBlockConfig;
use crate::moe::router::{GroupScore, RouterConfig, Scoring};

/// Why a spec cannot be built as a Burn model (yet): the model, the field and what is missing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("model `{model}`: `{field}` {why}")]
pub struct Unsupported {
    pub model: String,
    pub field: String,
    pub why: String,
}

impl CausalLmConfig {
    /// The Burn configuration of `spec`; the error names the first field piper-burn cannot build.
    pub fn from_spec(spec: &ModelSpec) -> Result<Self, Unsupported> {
        let unsupported =
            |field: &str, why: &str| Unsupported { model: spec.name.clone(), field: field.into(), why: why.into() };
        if spec.norm != Norm::RmsNorm {
            return Err(unsupported("norm", "LayerNorm (DBRX) is not implemented in piper-burn yet (RMSNorm only)"));
        }
        if spec.model_type.starts_with("llama4") {
            return Err(unsupported(
                "model_type",
                "llama4: chunked and NoPE attention layers and its sigmoid input-scaling router are not implemented in piper-burn yet",
            ));
        }
        let eps = spec.norm_eps.unwrap_or(1e-6);
        let (attention, mla) = attention_config(spec).map_err(|(f, why)| unsupported(f, why))?;
        let mut layers = Vec::new();
        for kind in &spec.layers {
            let layer =
                DecoderLayerConfig::new().with_attention(attention.clone()).with_mla(mla.clone()).with_norm_eps(eps);
            layers.push(match (kind, &spec.moe) {
                (LayerKind::Moe, Some(moe)) => {
                    layer.with_moe(Some(moe_config(spec, moe).map_err(|(f, why)| unsupported(f, why))?))
                }
                _ => {
                    let mlp = spec
                        .dense_mlp
                        .as_ref()
                        .ok_or_else(|| unsupported("intermediate_size", "is needed for dense layers"))?;
                    if !mlp.gated {
                        return Err(unsupported("dense_mlp", "must be a gated (SwiGLU) MLP in piper-burn"));
                    }
                    layer.with_dense(Some(MlpConfig::new(width(spec.hidden_size), width(mlp.intermediate_size))))
                }
            });
        }
        if spec.mtp_depth > 0 {
            return Err(unsupported(
                "num_nextn_predict_layers",
                "(multi-token prediction) is not implemented in piper-burn yet",
            ));
        }
        Ok(CausalLmConfig::new(width(spec.vocab_size), width(spec.hidden_size), layers)
            .with_tie_embeddings(spec.tie_embeddings)
            .with_norm_eps(eps))
    }
}

/// A validated spec's count as a width (specs are bounded far below `usize::MAX`).
fn width(v: u64) -> usize {
    v as usize
}

/// `(field, why)` of a part piper-burn cannot build.
type Refusal = (&'static str, &'static str);

/// Grouped-query attention or MLA, as the spec's attention says.
fn attention_config(spec: &ModelSpec) -> Result<(Option<AttentionConfig>, Option<MlaConfig>), Refusal> {
    let d = width(spec.hidden_size);
    let eps = spec.norm_eps.unwrap_or(1e-6);
    let theta = spec.rope_theta.unwrap_or(10000.0);
    match &spec.attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, qkv_bias, o_bias, qk_norm, sinks } => {
            if *o_bias || *sinks {
                return Err((
                    "attention_bias",
                    "(an o_proj bias and attention sinks, gpt-oss) is not implemented in piper-burn yet",
                ));
            }
            let a = AttentionConfig::new(d, width(*num_heads), width(*num_kv_heads), width(*head_dim))
                .with_rope_theta(theta)
                .with_qk_norm(*qk_norm != QkNorm::None)
                .with_qk_norm_whole(*qk_norm == QkNorm::PerProjection)
                .with_qkv_bias(*qkv_bias)
                .with_clip_qkv(spec.clip_qkv)
                .with_norm_eps(eps);
            Ok((Some(a), None))
        }
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let m = MlaConfig::new(
                d,
                width(*num_heads),
                width(*kv_lora_rank),
                width(*qk_nope_head_dim),
                width(*qk_rope_head_dim),
                width(*v_head_dim),
            )
            .with_q_lora_rank(q_lora_rank.map(width))
            .with_rope_theta(theta)
            .with_rope_interleave(spec.rope_interleave.unwrap_or(true))
            .with_norm_eps(eps);
            Ok((None, Some(m)))
        }
    }
}

/// The MoE block of an MoE layer: router (scoring, groups, bias, scaling), routed and shared experts.
fn moe_config(spec: &ModelSpec, moe: &Moe) -> Result<MoeBlockConfig, Refusal> {
    if !moe.expert.gated || moe.expert.bias {
        return Err(("expert", "must be a bias-free gated (SwiGLU) MLP in piper-burn"));
    }
    let scoring = match moe.score_function {
        ScoreFunction::Softmax => Scoring::Softmax,
        ScoreFunction::Sigmoid => Scoring::Sigmoid,
    };
    if moe.router_bias && scoring == Scoring::Softmax {
        return Err(("router_bias", "on a softmax router (gpt-oss) is not implemented in piper-burn yet"));
    }
    let router = RouterConfig::new(width(spec.hidden_size), width(moe.num_experts), width(moe.top_k))
        .with_scoring(scoring)
        .with_norm_topk_prob(moe.norm_topk_prob)
        .with_num_groups(moe.n_group.map(width))
        .with_topk_groups(moe.topk_group.map(width))
        .with_group_score(if spec.model_type == "deepseek_v2" { GroupScore::Max } else { GroupScore::TopTwoSum })
        .with_routed_scaling(moe.routed_scaling_factor.unwrap_or(1.0))
        .with_selection_bias(moe.router_bias);
    let shared = moe.shared_expert();
    Ok(MoeBlockConfig::new(router, width(moe.expert.intermediate_size))
        .with_num_shared(width(moe.num_shared_experts))
        .with_shared_ffn(width(shared.intermediate_size))
        .with_shared_gate(moe.shared_expert_gate))
}

#[cfg(test)]
mod tests {
    use burn::module::Module;
    use burn::prelude::*;
    use piper_planner::model::preset;

    use super::*;

    #[test]
    fn presets_build_and_count_the_planners_parameters() {
        // The Burn model has exactly the parameters the planner counts, except DeepSeek's selection bias,
        // which the planner counts (HF stores it as a parameter) and piper-burn keeps as a non-trained
        // constant updated from the load.
        for name in ["tiny", "tiny-qwen3", "tiny-deepseek"] {
            let spec = preset(name).unwrap();
            let model = CausalLmConfig::from_spec(&spec).unwrap().init(&Device::flex());
            let b = piper_planner::model::param_breakdown(&spec);
            let bias = spec.moe.as_ref().filter(|m| m.router_bias).map_or(0, |m| m.num_experts * spec.num_moe_layers());
            assert_eq!(model.num_params(), (b.total() - bias) as usize, "{name}");
        }
    }

    #[test]
    fn unsupported_specs_name_the_field() {
        let refusal = |name: &str| CausalLmConfig::from_spec(&preset(name).unwrap()).unwrap_err().to_string();
        let err = refusal("deepseek-v3");
        assert!(err.contains("`num_nextn_predict_layers`"), "{err}");
        let err = refusal("gpt-oss-20b");
        assert!(err.contains("`attention_bias`"), "{err}");
        // Parts piper-burn would build differently: DBRX's LayerNorm, Llama 4's attention and router.
        let err = refusal("dbrx");
        assert!(err.contains("`norm` LayerNorm (DBRX)"), "{err}");
        for name in ["llama4-scout", "llama4-maverick"] {
            let err = refusal(name);
            assert!(err.contains("`model_type` llama4"), "{err}");
        }
    }
}
