//! # piper-models
//!
//! Model definitions built from the planner's [`ModelSpec`] — the same type the resource model reads
//! from a Hugging Face `config.json` or a preset — so a model the planner sizes is the model that trains.
//! Families: Mixtral (softmax top-2), Qwen3-MoE (per-head q/k norms, renormalised top-k) and
//! DeepSeek-style (fine-grained experts, shared experts, sigmoid scores with a selection bias,
//! group-limited routing, routed scaling, dense first layers).

use piper_burn::CausalLmConfig;
pub mod eval;
pub mod hf_weights;

use piper_burn::attention::AttentionConfig;
use piper_burn::decoder::DecoderLayerConfig;
use piper_burn::mla::MlaConfig;
use piper_burn::mlp::MlpConfig;
use piper_burn::moe::MoeBlockConfig;
use piper_burn::router::{GroupScore, RouterConfig, Scoring};
use piper_planner::model::{Attention, LayerKind, ModelSpec, Norm, QkNorm, ScoreFunction};

pub use piper_planner::model::{preset, resolve_model};

/// Why a spec cannot be built as a Burn model (yet).
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported {
    pub model: String,
    pub field: String,
    pub why: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "model `{}`: `{}` {}", self.model, self.field, self.why)
    }
}

impl std::error::Error for Unsupported {}

/// The Burn configuration of a spec.
pub fn lm_config(spec: &ModelSpec) -> Result<CausalLmConfig, Unsupported> {
    let unsupported =
        |field: &str, why: &str| Unsupported { model: spec.name.clone(), field: field.into(), why: why.into() };
    let to = |v: u64| v as usize;
    // What the planner counts but piper-burn would build differently: refused, never approximated.
    if spec.norm != Norm::RmsNorm {
        return Err(unsupported("norm", "LayerNorm (DBRX) is not implemented in piper-burn yet (RMSNorm only)"));
    }
    if spec.model_type.starts_with("llama4") {
        return Err(unsupported(
            "model_type",
            "llama4: chunked and NoPE attention layers and its sigmoid input-scaling router are not implemented in piper-burn yet",
        ));
    }
    let d = to(spec.hidden_size);
    let eps = spec.norm_eps.unwrap_or(1e-6);
    let (attention, mla) = match &spec.attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, qkv_bias, o_bias, qk_norm, sinks } => {
            if *o_bias || *sinks {
                return Err(unsupported(
                    "attention_bias",
                    "(an o_proj bias and attention sinks, gpt-oss) is not implemented in piper-burn yet",
                ));
            }
            let a = AttentionConfig::new(d, to(*num_heads), to(*num_kv_heads), to(*head_dim))
                .with_rope_theta(spec.rope_theta.unwrap_or(10000.0))
                .with_qk_norm(*qk_norm != QkNorm::None)
                .with_qk_norm_whole(*qk_norm == QkNorm::PerProjection)
                .with_qkv_bias(*qkv_bias)
                .with_clip_qkv(spec.clip_qkv)
                .with_norm_eps(eps);
            (Some(a), None)
        }
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let m = MlaConfig::new(
                d,
                to(*num_heads),
                to(*kv_lora_rank),
                to(*qk_nope_head_dim),
                to(*qk_rope_head_dim),
                to(*v_head_dim),
            )
            .with_q_lora_rank(q_lora_rank.map(to))
            .with_rope_theta(spec.rope_theta.unwrap_or(10000.0))
            .with_rope_interleave(spec.rope_interleave.unwrap_or(true))
            .with_norm_eps(eps);
            (None, Some(m))
        }
    };
    let mut layers = Vec::new();
    for kind in &spec.layers {
        let layer =
            DecoderLayerConfig::new().with_attention(attention.clone()).with_mla(mla.clone()).with_norm_eps(eps);
        let layer = match (kind, &spec.moe) {
            (LayerKind::Moe, Some(moe)) => {
                if !moe.expert.gated || moe.expert.bias {
                    return Err(unsupported("expert", "must be a bias-free gated (SwiGLU) MLP in piper-burn"));
                }
                let scoring = match moe.score_function {
                    ScoreFunction::Softmax => Scoring::Softmax,
                    ScoreFunction::Sigmoid => Scoring::Sigmoid,
                };
                if moe.router_bias && scoring == Scoring::Softmax {
                    return Err(unsupported(
                        "router_bias",
                        "on a softmax router (gpt-oss) is not implemented in piper-burn yet",
                    ));
                }
                let router = RouterConfig::new(d, to(moe.num_experts), to(moe.top_k))
                    .with_scoring(scoring)
                    .with_norm_topk_prob(moe.norm_topk_prob)
                    .with_num_groups(moe.n_group.map(to))
                    .with_topk_groups(moe.topk_group.map(to))
                    .with_group_score(if spec.model_type == "deepseek_v2" {
                        GroupScore::Max
                    } else {
                        GroupScore::TopTwoSum
                    })
                    .with_routed_scaling(moe.routed_scaling_factor.unwrap_or(1.0))
                    .with_selection_bias(moe.router_bias);
                let shared = moe.shared_expert();
                layer.with_moe(Some(
                    MoeBlockConfig::new(router, to(moe.expert.intermediate_size))
                        .with_num_shared(to(moe.num_shared_experts))
                        .with_shared_ffn(to(shared.intermediate_size))
                        .with_shared_gate(moe.shared_expert_gate),
                ))
            }
            _ => {
                let mlp = spec
                    .dense_mlp
                    .as_ref()
                    .ok_or_else(|| unsupported("intermediate_size", "is needed for dense layers"))?;
                if !mlp.gated {
                    return Err(unsupported("dense_mlp", "must be a gated (SwiGLU) MLP in piper-burn"));
                }
                layer.with_dense(Some(MlpConfig::new(d, to(mlp.intermediate_size))))
            }
        };
        layers.push(layer);
    }
    if spec.mtp_depth > 0 {
        return Err(unsupported(
            "num_nextn_predict_layers",
            "(multi-token prediction) is not implemented in piper-burn yet",
        ));
    }
    Ok(CausalLmConfig::new(to(spec.vocab_size), d, layers).with_tie_embeddings(spec.tie_embeddings).with_norm_eps(eps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use burn::prelude::*;

    #[test]
    fn presets_build_and_count_the_planners_parameters() {
        // The Burn model has exactly the parameters the planner counts, except DeepSeek's selection bias,
        // which the planner counts (HF stores it as a parameter) and piper-burn keeps as a non-trained
        // constant updated from the load.
        for name in ["tiny", "tiny-qwen3", "tiny-deepseek"] {
            let spec = preset(name).unwrap();
            let model = lm_config(&spec).unwrap().init(&Device::flex());
            let b = piper_planner::model::param_breakdown(&spec);
            let bias = spec.moe.as_ref().filter(|m| m.router_bias).map_or(0, |m| m.num_experts * spec.num_moe_layers());
            assert_eq!(model.num_params(), (b.total() - bias) as usize, "{name}");
        }
    }

    #[test]
    fn unsupported_specs_name_the_field() {
        let err = lm_config(&preset("deepseek-v3").unwrap()).unwrap_err().to_string();
        assert!(err.contains("`num_nextn_predict_layers`"), "{err}");
        let err = lm_config(&preset("gpt-oss-20b").unwrap()).unwrap_err().to_string();
        assert!(err.contains("`attention_bias`"), "{err}");
        // Built differently rather than refused before: DBRX's LayerNorm, Llama 4's attention and router.
        let err = lm_config(&preset("dbrx").unwrap()).unwrap_err().to_string();
        assert!(err.contains("`norm` LayerNorm (DBRX)"), "{err}");
        for name in ["llama4-scout", "llama4-maverick"] {
            let err = lm_config(&preset(name).unwrap()).unwrap_err().to_string();
            assert!(err.contains("`model_type` llama4"), "{err}");
        }
    }
}
