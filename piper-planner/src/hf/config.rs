//! Hugging Face `config.json` files: read into a [`ModelSpec`], and written for an exported model
//! ([`mixtral_config`]).
//!
//! Supported `model_type`s: mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, olmoe, gpt_oss, dbrx,
//! llama4 (its `text_config`) and llama4_text. Field names follow the `transformers` configuration classes
//! of each family; a field a family needs and the file lacks is an error naming it.

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::model::spec::{Attention, LayerKind, Mlp, ModelSpec, Moe, Norm, QkNorm, ScoreFunction};

/// The `model_type` values [`from_hf_config`] understands.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "olmoe",
    "gpt_oss",
    "dbrx",
    "llama4",
    "llama4_text",
];

/// Typed access to one JSON object, with errors that name the file and the field.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    source: &'a str,
    model_type: &'a str,
}

impl Fields<'_> {
    fn missing(&self, key: &str) -> Error {
        Error::missing(self.source, key, Some(format!("required for model_type `{}`", self.model_type)))
    }

    fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_f64().filter(|x| x.fract() == 0.0 && *x >= 0.0).map(|x| x as u64))
                .map(Some)
                .ok_or_else(|| Error::invalid(self.source, key, format!("must be a non-negative integer, found {v}"))),
        }
    }

    fn u64(&self, key: &str) -> Result<u64> {
        self.u64_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// The routed-expert count under any of the names transformers 4.4x–5.x writes for it (5.x's
    /// `attribute_map`s store Qwen3-MoE's as `num_local_experts`, DeepSeek's as `n_routed_experts`, ...).
    fn num_experts(&self) -> Result<u64> {
        const NAMES: [&str; 3] = ["num_local_experts", "num_experts", "n_routed_experts"];
        for key in NAMES {
            if let Some(v) = self.u64_opt(key)? {
                return Ok(v);
            }
        }
        Err(Error::missing(
            self.source,
            NAMES.join("` / `"),
            Some(format!("the routed-expert count, required for model_type `{}`", self.model_type)),
        ))
    }

    /// `rope_theta` at the top level (transformers 4.x) or inside `rope_parameters` (5.x).
    fn rope_theta(&self) -> Result<Option<f64>> {
        if let Some(v) = self.f64_opt("rope_theta")? {
            return Ok(Some(v));
        }
        match self.obj.get("rope_parameters") {
            Some(Value::Object(obj)) => {
                Fields { obj, source: self.source, model_type: self.model_type }.f64_opt("rope_theta")
            }
            _ => Ok(None),
        }
    }

    /// `num_hidden_layers`, bounded before any per-layer list is built from it.
    fn num_layers(&self) -> Result<u64> {
        crate::limits::count(
            self.source,
            "num_hidden_layers",
            self.u64("num_hidden_layers")?,
            1,
            crate::limits::MAX_LAYERS,
        )
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Error::invalid(self.source, key, format!("must be true or false, found {v}"))),
        }
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::invalid(self.source, key, format!("must be a number, found {v}"))),
        }
    }

    fn str_opt(&self, key: &str) -> Option<&str> {
        self.obj.get(key).and_then(Value::as_str)
    }

    fn u64_list(&self, key: &str) -> Result<Vec<u64>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(vec![]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| Error::invalid(self.source, key, format!("must list layer indices, found {v}")))
                })
                .collect(),
            Some(v) => Err(Error::invalid(self.source, key, format!("must be a list of integers, found {v}"))),
        }
    }

    fn nested(&self, key: &str) -> Result<Fields<'_>> {
        match self.obj.get(key) {
            Some(Value::Object(obj)) => Ok(Fields { obj, source: self.source, model_type: self.model_type }),
            Some(_) => Err(Error::invalid(self.source, key, "must be an object")),
            None => Err(self.missing(key)),
        }
    }

    /// GQA attention from the Llama-style field names.
    fn gqa(&self, qkv_bias: bool, o_bias: bool, qk_norm: QkNorm, sinks: bool) -> Result<Attention> {
        let d = self.u64("hidden_size")?;
        let num_heads = self.u64("num_attention_heads")?;
        let num_kv_heads = self.u64_opt("num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim = match self.u64_opt("head_dim")? {
            Some(h) => h,
            None if num_heads > 0 && d % num_heads == 0 => d / num_heads,
            None => return Err(self.missing("head_dim")),
        };
        Ok(Attention::Gqa { num_heads, num_kv_heads, head_dim, qkv_bias, o_bias, qk_norm, sinks })
    }
}

/// Parses the text of a `config.json`; `source` names it in errors (usually the path).
pub fn from_hf_config_str(text: &str, source: &str) -> Result<ModelSpec> {
    let value: Value = serde_json::from_str(text).map_err(|e| Error::file(source, format!("not valid JSON: {e}")))?;
    from_hf_config(&value, source)
}

/// Reads a parsed `config.json`.
pub fn from_hf_config(value: &Value, source: &str) -> Result<ModelSpec> {
    let obj = value.as_object().ok_or_else(|| Error::file(source, "a config.json must hold a JSON object"))?;
    let model_type = match obj.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
        None | Some(Value::Null) => {
            return Err(Error::missing(
                source,
                "model_type",
                Some(format!("one of {}", SUPPORTED_MODEL_TYPES.join(", "))),
            ));
        }
        Some(other) => {
            return Err(Error::invalid(
                source,
                "model_type",
                format!("must be a string, one of {}; found {other}", SUPPORTED_MODEL_TYPES.join(", ")),
            ));
        }
    };
    let top = Fields { obj, source, model_type };
    let name =
        obj.get("_name_or_path").or_else(|| obj.get("_name")).and_then(Value::as_str).unwrap_or(source).to_string();
    let spec = match model_type {
        "mixtral" => mixtral(&top)?,
        "qwen2_moe" | "qwen3_moe" => qwen_moe(&top)?,
        "deepseek_v2" | "deepseek_v3" => deepseek(&top)?,
        "olmoe" => olmoe(&top)?,
        "gpt_oss" => gpt_oss(&top)?,
        "dbrx" => dbrx(&top)?,
        "llama4" => llama4(&top.nested("text_config")?)?,
        "llama4_text" => llama4(&top)?,
        other => return Err(Error::unknown("model_type", other, SUPPORTED_MODEL_TYPES)),
    };
    let fields = if model_type == "llama4" { top.nested("text_config")? } else { Fields { obj, source, model_type } };
    let spec = ModelSpec {
        name,
        model_type: model_type.to_string(),
        rope_theta: fields.rope_theta()?,
        norm_eps: fields.f64_opt("rms_norm_eps")?.or(fields.f64_opt("layer_norm_epsilon")?),
        rope_interleave: match fields.obj.get("rope_interleave") {
            Some(serde_json::Value::Bool(b)) => Some(*b),
            _ if model_type == "deepseek_v3" => Some(true),
            _ => None,
        },
        clip_qkv: fields.f64_opt("clip_qkv")?.or(spec.clip_qkv),
        ..spec
    };
    let mut spec = spec;
    if let Some(moe) = spec.moe.as_mut() {
        moe.router_aux_loss_coef = fields.f64_opt("router_aux_loss_coef")?;
    }
    spec.validate()?;
    Ok(spec)
}

/// A spec with the fields common to all families; the caller fills the rest.
fn base(f: &Fields, attention: Attention, layers: Vec<LayerKind>) -> Result<ModelSpec> {
    Ok(ModelSpec {
        name: String::new(),
        model_type: String::new(),
        hidden_size: f.u64("hidden_size")?,
        num_layers: f.num_layers()?,
        vocab_size: f.u64("vocab_size")?,
        tie_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention,
        norm: Norm::RmsNorm,
        dense_mlp: None,
        moe: None,
        layers,
        mtp_depth: 0,
        rope_theta: None,
        norm_eps: None,
        rope_interleave: None,
        clip_qkv: None,
    })
}

fn swiglu(f: u64) -> Mlp {
    Mlp { intermediate_size: f, gated: true, bias: false }
}

fn all_moe(f: &Fields) -> Result<Vec<LayerKind>> {
    Ok(vec![LayerKind::Moe; f.num_layers()? as usize])
}

fn mixtral(f: &Fields) -> Result<ModelSpec> {
    let moe = Moe::softmax(f.num_experts()?, f.u64("num_experts_per_tok")?, swiglu(f.u64("intermediate_size")?), true);
    Ok(ModelSpec { moe: Some(moe), ..base(f, f.gqa(false, false, QkNorm::None, false)?, all_moe(f)?)? })
}

fn qwen_moe(f: &Fields) -> Result<ModelSpec> {
    let qwen2 = f.model_type == "qwen2_moe";
    let layers_n = f.num_layers()?;
    let every = f.u64_opt("decoder_sparse_step")?.unwrap_or(1);
    if every == 0 {
        // transformers takes `(i + 1) % decoder_sparse_step`: 0 is a division by zero there.
        return Err(Error::invalid(f.source, "decoder_sparse_step", "is 0; 1 makes every layer sparse, k every k-th"));
    }
    let dense = f.u64_list("mlp_only_layers")?;
    // transformers: layer i is sparse when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    let layers = (0..layers_n)
        .map(|i| if !dense.contains(&i) && (i + 1) % every == 0 { LayerKind::Moe } else { LayerKind::Dense })
        .collect();
    let mut moe = Moe::softmax(
        f.num_experts()?,
        f.u64("num_experts_per_tok")?,
        swiglu(f.u64("moe_intermediate_size")?),
        f.bool_or("norm_topk_prob", !qwen2)?,
    );
    if qwen2 && let Some(shared) = f.u64_opt("shared_expert_intermediate_size")?.filter(|s| *s > 0) {
        moe.num_shared_experts = 1;
        moe.shared_expert_intermediate_size = Some(shared);
        moe.shared_expert_gate = true;
    }
    let attention = if qwen2 {
        // transformers 5 writes `qkv_bias` (true by default); 4.x has no field and always has the biases.
        f.gqa(f.bool_or("qkv_bias", true)?, false, QkNorm::None, false)?
    } else {
        f.gqa(f.bool_or("attention_bias", false)?, f.bool_or("attention_bias", false)?, QkNorm::PerHead, false)?
    };
    let dense_mlp = f.u64_opt("intermediate_size")?.map(swiglu);
    Ok(ModelSpec { moe: Some(moe), dense_mlp, ..base(f, attention, layers)? })
}

fn deepseek(f: &Fields) -> Result<ModelSpec> {
    let v3 = f.model_type == "deepseek_v3";
    let attention = Attention::Mla {
        num_heads: f.u64("num_attention_heads")?,
        q_lora_rank: f.u64_opt("q_lora_rank")?,
        kv_lora_rank: f.u64("kv_lora_rank")?,
        qk_nope_head_dim: f.u64("qk_nope_head_dim")?,
        qk_rope_head_dim: f.u64("qk_rope_head_dim")?,
        v_head_dim: f.u64("v_head_dim")?,
    };
    let first_k_dense = f.u64_opt("first_k_dense_replace")?.unwrap_or(0);
    let every = f.u64_opt("moe_layer_freq")?.unwrap_or(1);
    let layers = ModelSpec::layer_pattern(f.num_layers()?, first_k_dense, every, 0, &[]);
    let n_routed = f.num_experts()?;
    let scoring = match f.str_opt("scoring_func").unwrap_or(if v3 { "sigmoid" } else { "softmax" }) {
        "softmax" => ScoreFunction::Softmax,
        "sigmoid" => ScoreFunction::Sigmoid,
        other => return Err(Error::invalid(f.source, "scoring_func", format!("`{other}` is not softmax or sigmoid"))),
    };
    // transformers' DeepseekV3Config drops `topk_method`: V3 always routes noaux_tc (V2's default is greedy).
    let topk_method = f.str_opt("topk_method").unwrap_or(if v3 { "noaux_tc" } else { "greedy" });
    let group_limited = matches!(topk_method, "group_limited_greedy" | "noaux_tc");
    let moe = Moe {
        num_experts: n_routed,
        top_k: f.u64("num_experts_per_tok")?,
        expert: swiglu(f.u64("moe_intermediate_size")?),
        num_shared_experts: f.u64_opt("n_shared_experts")?.unwrap_or(0),
        shared_expert_intermediate_size: None,
        shared_expert_gate: false,
        router_bias: topk_method == "noaux_tc",
        score_function: scoring,
        norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
        n_group: if group_limited { f.u64_opt("n_group")? } else { None },
        topk_group: if group_limited { f.u64_opt("topk_group")? } else { None },
        routed_scaling_factor: f.f64_opt("routed_scaling_factor")?,
        router_aux_loss_coef: None,
    };
    let dense_mlp = if first_k_dense > 0 || every > 1 { Some(swiglu(f.u64("intermediate_size")?)) } else { None };
    Ok(ModelSpec {
        moe: Some(moe),
        dense_mlp,
        mtp_depth: f.u64_opt("num_nextn_predict_layers")?.unwrap_or(0),
        ..base(f, attention, layers)?
    })
}

fn olmoe(f: &Fields) -> Result<ModelSpec> {
    let moe = Moe::softmax(
        f.num_experts()?,
        f.u64("num_experts_per_tok")?,
        swiglu(f.u64("intermediate_size")?),
        f.bool_or("norm_topk_prob", false)?,
    );
    let attention =
        f.gqa(f.bool_or("attention_bias", false)?, f.bool_or("attention_bias", false)?, QkNorm::PerProjection, false)?;
    Ok(ModelSpec { moe: Some(moe), ..base(f, attention, all_moe(f)?)? })
}

fn gpt_oss(f: &Fields) -> Result<ModelSpec> {
    let experts = f.num_experts()?;
    let top_k = match f.u64_opt("num_experts_per_tok")? {
        Some(k) => k,
        None => f.u64("experts_per_token")?,
    };
    let mut moe = Moe::softmax(
        experts,
        top_k,
        Mlp { intermediate_size: f.u64("intermediate_size")?, gated: true, bias: true },
        true,
    );
    moe.router_bias = true;
    let attention =
        f.gqa(f.bool_or("attention_bias", true)?, f.bool_or("attention_bias", true)?, QkNorm::None, true)?;
    Ok(ModelSpec { moe: Some(moe), ..base(f, attention, all_moe(f)?)? })
}

fn dbrx(f: &Fields) -> Result<ModelSpec> {
    let attn = f.nested("attn_config")?;
    let ffn = f.nested("ffn_config")?;
    let d = f.u64("d_model")?;
    let num_heads = f.u64("n_heads")?;
    let layers_n = f.u64("n_layers")?;
    let attention = Attention::Gqa {
        num_heads,
        num_kv_heads: attn.u64_opt("kv_n_heads")?.unwrap_or(num_heads),
        head_dim: d / num_heads.max(1),
        qkv_bias: false,
        o_bias: false,
        qk_norm: QkNorm::None,
        sinks: false,
    };
    let moe =
        Moe::softmax(ffn.u64("moe_num_experts")?, ffn.u64("moe_top_k")?, swiglu(ffn.u64("ffn_hidden_size")?), true);
    Ok(ModelSpec {
        name: String::new(),
        model_type: String::new(),
        hidden_size: d,
        num_layers: layers_n,
        vocab_size: f.u64("vocab_size")?,
        tie_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention,
        norm: Norm::LayerNorm { bias: false },
        dense_mlp: None,
        moe: Some(moe),
        layers: vec![LayerKind::Moe; layers_n as usize],
        mtp_depth: 0,
        rope_theta: None,
        norm_eps: None,
        rope_interleave: None,
        clip_qkv: attn.f64_opt("clip_qkv")?,
    })
}

fn llama4(f: &Fields) -> Result<ModelSpec> {
    let layers_n = f.num_layers()?;
    let step = f.u64_opt("interleave_moe_layer_step")?.unwrap_or(1).max(1);
    let explicit = f.u64_list("moe_layers")?;
    // transformers default: moe_layers = range(step - 1, L, step).
    let layers = (0..layers_n)
        .map(|i| {
            let moe = if explicit.is_empty() { (i + 1) % step == 0 } else { explicit.contains(&i) };
            if moe { LayerKind::Moe } else { LayerKind::Dense }
        })
        .collect::<Vec<_>>();
    let expert_f = f.u64("intermediate_size")?;
    let mut moe = Moe::softmax(f.num_experts()?, f.u64("num_experts_per_tok")?, swiglu(expert_f), false);
    moe.score_function = ScoreFunction::Sigmoid;
    moe.num_shared_experts = 1;
    let dense_mlp =
        if layers.contains(&LayerKind::Dense) { Some(swiglu(f.u64("intermediate_size_mlp")?)) } else { None };
    Ok(ModelSpec { moe: Some(moe), dense_mlp, ..base(f, f.gqa(false, false, QkNorm::None, false)?, layers)? })
}

/// A transformers `MixtralConfig` for a Mixtral-shaped spec — GQA without biases or q/k norms, every
/// layer MoE with softmax top-k routing, no shared experts, RMSNorm — else `None`.
pub fn mixtral_config(spec: &ModelSpec) -> Option<Value> {
    let Attention::Gqa {
        num_heads,
        num_kv_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
        qk_norm: QkNorm::None,
        sinks: false,
    } = spec.attention
    else {
        return None;
    };
    let moe = spec.moe.as_ref()?;
    let shaped = matches!(spec.model_type.as_str(), "mixtral" | "piper")
        && spec.norm == Norm::RmsNorm
        && spec.layers.iter().all(|k| *k == LayerKind::Moe)
        && spec.mtp_depth == 0
        && moe.score_function == ScoreFunction::Softmax
        && moe.num_shared_experts == 0
        && !moe.shared_expert_gate
        && !moe.router_bias
        && moe.n_group.is_none()
        && moe.routed_scaling_factor.is_none()
        && moe.norm_topk_prob
        && moe.expert.gated
        && !moe.expert.bias;
    shaped.then(|| {
        let mut config = json!({
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "hidden_size": spec.hidden_size,
            "intermediate_size": moe.expert.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
            "vocab_size": spec.vocab_size,
            "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            // The defaults Piper's model builder uses when the spec gives none.
            "rope_theta": spec.rope_theta.unwrap_or(10000.0),
            "rms_norm_eps": spec.norm_eps.unwrap_or(1e-6),
            "tie_word_embeddings": spec.tie_embeddings,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "torch_dtype": "float32",
        });
        if let Some(coef) = moe.router_aux_loss_coef {
            config["router_aux_loss_coef"] = coef.into();
        }
        config
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_type_is_named() {
        let err = from_hf_config_str(r#"{"model_type": "bert"}"#, "cfg.json").unwrap_err().to_string();
        assert!(err.contains("model_type `bert` is not known"), "{err}");
        assert!(err.contains("mixtral"), "{err}");
    }

    #[test]
    fn missing_field_is_named() {
        let err =
            from_hf_config_str(r#"{"model_type": "mixtral", "hidden_size": 64}"#, "cfg.json").unwrap_err().to_string();
        assert!(err.starts_with("cfg.json: missing field `"), "{err}");
        assert!(err.contains("required for model_type `mixtral`"), "{err}");
    }

    #[test]
    fn malformed_json_is_one_line() {
        let err = from_hf_config_str("{not json", "cfg.json").unwrap_err().to_string();
        assert!(err.starts_with("cfg.json: not valid JSON"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn wrong_type_is_named() {
        let text = r#"{"model_type":"mixtral","hidden_size":"big","intermediate_size":8,"num_hidden_layers":1,
            "num_attention_heads":2,"vocab_size":8,"num_local_experts":2,"num_experts_per_tok":1}"#;
        let err = from_hf_config_str(text, "c.json").unwrap_err().to_string();
        assert!(err.contains("`hidden_size` must be a non-negative integer"), "{err}");
    }

    #[test]
    fn top_k_above_experts_is_refused() {
        let text = r#"{"model_type":"mixtral","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,
            "num_attention_heads":2,"vocab_size":8,"num_local_experts":2,"num_experts_per_tok":3}"#;
        let err = from_hf_config_str(text, "c.json").unwrap_err().to_string();
        assert!(err.contains("`num_experts_per_tok` top-k = 3 must be in 1..=2"), "{err}");
    }

    /// transformers 5 writes Qwen3-MoE's expert count as `num_local_experts` and `rope_theta` inside
    /// `rope_parameters`; 4.x wrote `num_experts` and a top-level `rope_theta`. Both read the same.
    #[test]
    fn config_names_of_transformers_4_and_5_read_the_same() {
        let common = r#""model_type":"qwen3_moe","hidden_size":8,"intermediate_size":16,"num_hidden_layers":2,
            "num_attention_heads":2,"vocab_size":8,"num_experts_per_tok":2,"moe_intermediate_size":4"#;
        let v4 = format!(r#"{{{common},"num_experts":4,"rope_theta":1000000.0}}"#);
        let v5 = format!(
            r#"{{{common},"num_local_experts":4,"rope_parameters":{{"rope_theta":1000000.0,"rope_type":"default"}}}}"#
        );
        let (a, b) = (from_hf_config_str(&v4, "v4.json").unwrap(), from_hf_config_str(&v5, "v5.json").unwrap());
        assert_eq!(a.moe, b.moe);
        assert_eq!((a.rope_theta, b.rope_theta), (Some(1e6), Some(1e6)));
        let none = format!(r#"{{{common}}}"#);
        let err = from_hf_config_str(&none, "c.json").unwrap_err().to_string();
        assert!(err.contains("`num_local_experts` / `num_experts` / `n_routed_experts`"), "{err}");
    }

    #[test]
    fn qwen_sparse_step_follows_transformers() {
        let text = r#"{"model_type":"qwen2_moe","hidden_size":8,"intermediate_size":16,"num_hidden_layers":4,
            "num_attention_heads":2,"vocab_size":8,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":4,
            "decoder_sparse_step":2,"mlp_only_layers":[3],"shared_expert_intermediate_size":8}"#;
        let spec = from_hf_config_str(text, "c.json").unwrap();
        use LayerKind::*;
        assert_eq!(spec.layers, vec![Dense, Moe, Dense, Dense]);
        // transformers divides by it; 0 is no model (it was read as one without MoE layers).
        let zero = text.replace(r#""decoder_sparse_step":2"#, r#""decoder_sparse_step":0"#);
        let err = from_hf_config_str(&zero, "c.json").unwrap_err().to_string();
        assert!(err.contains("c.json: `decoder_sparse_step` is 0; 1 makes every layer sparse"), "{err}");
    }
}
