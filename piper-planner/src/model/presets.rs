//! Named model presets, and resolution of a `--model` argument (preset name or file).
//!
//! Public models are stored as their Hugging Face `config.json` (with a `_source` link) and go through the
//! same loader as a user's file. Models that exist only in papers are built here, with the paper cited.

use std::path::Path;

use super::spec::{Attention, LayerKind, Mlp, ModelSpec, Moe, Norm, QkNorm, ScoreFunction};
use crate::error::{Error, Result};
use crate::hf::from_hf_config_str;

/// Presets stored as Hugging Face `config.json` files.
const HF_PRESETS: &[(&str, &str)] = &[
    ("mixtral-8x7b", include_str!("../../presets/models/mixtral-8x7b.json")),
    ("mixtral-8x22b", include_str!("../../presets/models/mixtral-8x22b.json")),
    ("deepseek-v2", include_str!("../../presets/models/deepseek-v2.json")),
    ("deepseek-v3", include_str!("../../presets/models/deepseek-v3.json")),
    ("qwen3-30b-a3b", include_str!("../../presets/models/qwen3-30b-a3b.json")),
    ("qwen3-235b-a22b", include_str!("../../presets/models/qwen3-235b-a22b.json")),
    ("qwen1.5-moe-a2.7b", include_str!("../../presets/models/qwen1.5-moe-a2.7b.json")),
    ("olmoe-1b-7b", include_str!("../../presets/models/olmoe-1b-7b.json")),
    ("gpt-oss-120b", include_str!("../../presets/models/gpt-oss-120b.json")),
    ("gpt-oss-20b", include_str!("../../presets/models/gpt-oss-20b.json")),
    ("dbrx", include_str!("../../presets/models/dbrx.json")),
    ("llama4-scout", include_str!("../../presets/models/llama4-scout.json")),
    ("llama4-maverick", include_str!("../../presets/models/llama4-maverick.json")),
];

/// Presets built in code (paper-only models and the CPU test model).
const NATIVE_PRESETS: &[&str] = &[
    "switch-base-128",
    "piper-110b",
    "piper-862b",
    "piper-1.7t",
    "xmoe-small",
    "xmoe-medium",
    "xmoe-large",
    "xmoe-super",
    "grok-1",
    "glam-1.2t",
    "tiny",
    "tiny-qwen3",
    "tiny-deepseek",
];

/// All preset names.
pub fn preset_names() -> Vec<&'static str> {
    HF_PRESETS.iter().map(|(n, _)| *n).chain(NATIVE_PRESETS.iter().copied()).collect()
}

/// A preset by name.
pub fn preset(name: &str) -> Result<ModelSpec> {
    if let Some((_, text)) = HF_PRESETS.iter().find(|(n, _)| *n == name) {
        return from_hf_config_str(text, &format!("preset {name}"));
    }
    let spec = match name {
        // Switch-Base-128 (google/switch-base-128): a T5 encoder-decoder, approximated as 24 decoder-only
        // layers (12 + 12) with every other layer MoE; ReLU experts (2 matrices), d_ff 3072, top-1. The
        // decoder's cross-attention is not modelled.
        "switch-base-128" => plain(
            name,
            768,
            24,
            12,
            12,
            32128,
            true,
            Some(3072),
            3072,
            128,
            1,
            ModelSpec::layer_pattern(24, 0, 2, 1, &[]),
        ),
        // Piper's weak-scaling family (Piper §VII): d 5120, d_ffn 20480, 32 layers, top-2, E grows with the
        // GPU count. The paper's sizes (110B / 862B / 1.7T) count 2 expert matrices and no embeddings.
        "piper-110b" => piper_family(name, 16),
        "piper-862b" => piper_family(name, 128),
        "piper-1.7t" => piper_family(name, 256),
        // X-MoE's models (Yuan et al., SC'25, arXiv 2508.13337), reconstructed from its launch scripts;
        // GPT-2 vocabulary, 2-matrix experts. Sizes in the paper are L·(4h² + 2·E·h·f) / 2³⁰.
        "xmoe-small" => plain(name, 2048, 28, 16, 16, 50257, false, None, 1408, 64, 6, all_moe(28)),
        "xmoe-medium" => plain(name, 5120, 28, 128, 128, 50257, false, None, 1536, 128, 6, all_moe(28)),
        "xmoe-large" => plain(name, 7168, 28, 128, 128, 50257, false, None, 2048, 256, 8, all_moe(28)),
        "xmoe-super" => plain(name, 7168, 61, 128, 128, 50257, false, None, 2560, 256, 8, all_moe(61)),
        // Grok-1 (xai-org/grok-1): 64 layers, d 6144, 48/8 heads, 8 experts top-2, d_ff 32768.
        "grok-1" => gated(name, 6144, 64, 48, 8, 131072, false, 32768, 8, 2),
        // GLaM 1.2T (Du et al., 2022): 64 layers, every other one MoE with 64 experts top-2, d 8192,
        // d_ff 32768, 128 heads, 256k vocabulary; 2-matrix GELU experts assumed.
        "glam-1.2t" => plain(
            name,
            8192,
            64,
            128,
            128,
            256_000,
            true,
            Some(32768),
            32768,
            64,
            2,
            ModelSpec::layer_pattern(64, 0, 2, 1, &[]),
        ),
        // Tiny Mixtral-style model for CPU tests and `mixtral_train --preset tiny`.
        "tiny" => gated(name, 64, 2, 4, 2, 256, false, 128, 8, 2),
        // Tiny Qwen3-MoE-style model: per-head q/k norms, 16 experts top-4, renormalised top-k.
        "tiny-qwen3" => {
            let mut spec = gated(name, 64, 2, 4, 2, 256, false, 64, 16, 4);
            if let Attention::Gqa { qk_norm, .. } = &mut spec.attention {
                *qk_norm = QkNorm::PerHead;
            }
            spec
        }
        // Tiny DeepSeek-style model (GQA attention instead of MLA): a dense first layer, 32 fine-grained
        // experts top-6 in 4 groups (2 per token), 1 shared expert, sigmoid scores with a selection bias.
        "tiny-deepseek" => {
            let mut spec = gated(name, 64, 3, 4, 2, 256, false, 32, 32, 6);
            spec.layers[0] = LayerKind::Dense;
            spec.dense_mlp = Some(Mlp { intermediate_size: 192, gated: true, bias: false });
            let moe = spec.moe.as_mut().expect("gated() builds an MoE block");
            moe.num_shared_experts = 1;
            moe.score_function = ScoreFunction::Sigmoid;
            moe.router_bias = true;
            moe.n_group = Some(4);
            moe.topk_group = Some(2);
            moe.routed_scaling_factor = Some(2.5);
            spec
        }
        _ => return Err(Error::unknown("model preset", name, &preset_names())),
    };
    spec.validate()?;
    Ok(spec)
}

/// A `--model` argument: a preset name, a Hugging Face `config.json`, or a native spec (`"model_type":
/// "piper"`, the JSON `piper model --spec-json` prints).
pub fn resolve_model(arg: &str) -> Result<ModelSpec> {
    let path = Path::new(arg);
    if path.exists() && preset_names().contains(&arg) {
        return Err(Error::invalid(
            "--model",
            arg,
            format!("names both a preset and a file here; write `./{arg}` for the file or rename it to use the preset"),
        ));
    }
    if !path.exists() {
        return preset(arg).map_err(|e| match e {
            Error::Unknown { known, .. } => {
                Error::Unknown { what: "model (neither a file nor a preset)".into(), name: arg.into(), known }
            }
            other => other,
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(arg, format!("cannot read: {e}")))?;
    load_model_str(&text, arg)
}

/// Parses a model file's text (HF config.json or native spec).
pub fn load_model_str(text: &str, source: &str) -> Result<ModelSpec> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::file(source, format!("not valid JSON: {e}")))?;
    if value.get("model_type").and_then(|v| v.as_str()) == Some("piper") {
        let spec: ModelSpec =
            serde_json::from_value(value).map_err(|e| Error::file(source, format!("not a piper model spec: {e}")))?;
        spec.validate()?;
        return Ok(spec);
    }
    crate::hf::from_hf_config(&value, source)
}

fn all_moe(layers: u64) -> Vec<LayerKind> {
    vec![LayerKind::Moe; layers as usize]
}

fn piper_family(name: &str, experts: u64) -> ModelSpec {
    plain(name, 5120, 32, 40, 40, 50257, false, None, 20480, experts, 2, all_moe(32))
}

fn mha(num_heads: u64, num_kv_heads: u64, d: u64) -> Attention {
    Attention::Gqa {
        num_heads,
        num_kv_heads,
        head_dim: d / num_heads,
        qkv_bias: false,
        o_bias: false,
        qk_norm: QkNorm::None,
        sinks: false,
    }
}

/// A native MoE model with non-gated (2-matrix) experts.
#[allow(clippy::too_many_arguments)]
fn plain(
    name: &str,
    d: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    tie: bool,
    dense_f: Option<u64>,
    expert_f: u64,
    experts: u64,
    top_k: u64,
    pattern: Vec<LayerKind>,
) -> ModelSpec {
    let mlp = |f| Mlp { intermediate_size: f, gated: false, bias: false };
    ModelSpec {
        name: name.into(),
        model_type: "piper".into(),
        hidden_size: d,
        num_layers: layers,
        vocab_size: vocab,
        tie_embeddings: tie,
        attention: mha(heads, kv_heads, d),
        norm: Norm::LayerNorm { bias: true },
        dense_mlp: dense_f.map(mlp),
        moe: Some(Moe::softmax(experts, top_k, mlp(expert_f), true)),
        layers: pattern,
        mtp_depth: 0,
        rope_theta: None,
        norm_eps: None,
        rope_interleave: None,
        clip_qkv: None,
    }
}

/// A native Mixtral-style model: SwiGLU experts, RMSNorm, every layer MoE.
#[allow(clippy::too_many_arguments)]
fn gated(
    name: &str,
    d: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    tie: bool,
    expert_f: u64,
    experts: u64,
    top_k: u64,
) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        model_type: "piper".into(),
        hidden_size: d,
        num_layers: layers,
        vocab_size: vocab,
        tie_embeddings: tie,
        attention: mha(heads, kv_heads, d),
        norm: Norm::RmsNorm,
        dense_mlp: None,
        moe: Some(Moe::softmax(experts, top_k, Mlp { intermediate_size: expert_f, gated: true, bias: false }, true)),
        layers: all_moe(layers),
        mtp_depth: 0,
        rope_theta: None,
        norm_eps: None,
        rope_interleave: None,
        clip_qkv: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_loads_and_validates() {
        for name in preset_names() {
            let spec = preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(spec.layers.len() as u64, spec.num_layers, "{name}");
        }
    }

    #[test]
    fn unknown_preset_lists_known_ones() {
        let err = resolve_model("mixtral-8x9b").unwrap_err().to_string();
        assert!(err.contains("`mixtral-8x9b` is not known"), "{err}");
        assert!(err.contains("mixtral-8x7b"), "{err}");
    }

    #[test]
    fn native_spec_round_trips_through_json() {
        let spec = preset("deepseek-v3").unwrap();
        let mut value = serde_json::to_value(&spec).unwrap();
        value["model_type"] = "piper".into();
        let back = load_model_str(&value.to_string(), "x.json").unwrap();
        assert_eq!(back.layers, spec.layers);
        assert_eq!(back.attention, spec.attention);
    }
}
