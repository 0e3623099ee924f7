//! Weights in Hugging Face's safetensors layout: tensor names and `[out, in]` linear weights as
//! `transformers` stores them for Mixtral, Qwen2/3-MoE and DeepSeek-style models, so their checkpoints
//! load and what Piper saves loads back into `transformers`.

use std::collections::HashMap;
use std::path::Path;

use burn::prelude::*;
use piper_burn::CausalLm;
use piper_burn::state_dict;
use piper_planner::hf_files::decode;
use piper_planner::model::ModelSpec;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

/// Tensors by name: shape and f32 values.
pub type NamedTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Every tensor of `model` under its Hugging Face name, as `(name, shape, f32 values)` in HF layout
/// (the state dict of the whole model: [`piper_burn::state_dict`]).
pub fn hf_tensors(model: &CausalLm, spec: &ModelSpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let all_experts = |i: usize| (0..model.layers[i].moe.as_ref().map_or(0, |m| m.experts.num_experts())).collect();
    let host = state_dict::host_values(model);
    state_dict::entries(model, spec, 0, &all_experts)
        .iter()
        .map(|e| {
            let (dims, values) = &host[&e.target];
            let (shape, v) = state_dict::to_hf(e, dims, values);
            (e.name.clone(), shape, v)
        })
        .collect()
}

/// Writes the model as a Hugging Face safetensors file (f32).
pub fn save_hf(model: &CausalLm, spec: &ModelSpec, path: &Path) -> Result<(), String> {
    let tensors = hf_tensors(model, spec);
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).expect("shape matches data")))
        .collect();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| format!("{}: cannot write safetensors: {e}", path.display()))
}

/// Reads f32 tensors by name from safetensors bytes (an optional prefix is stripped from names; F32,
/// BF16 and F16 are converted, other dtypes skipped).
pub fn read_f32(bytes: &[u8], prefix: &str) -> Result<NamedTensors, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let Some(name) = name.strip_prefix(prefix) else { continue };
        let Some(data) = decode(&view.dtype().to_string(), view.data()) else { continue };
        out.insert(name.to_string(), (view.shape().to_vec(), data));
    }
    Ok(out)
}

/// Replaces every weight of `model` by the tensor of the same Hugging Face name in `tensors`. Every
/// expected name must be present with the expected shape; the error names the first that is not.
pub fn load_hf(
    model: CausalLm,
    spec: &ModelSpec,
    tensors: &HashMap<String, (Vec<usize>, Vec<f32>)>,
    _device: &Device,
) -> Result<CausalLm, String> {
    let all_experts = |i: usize| (0..model.layers[i].moe.as_ref().map_or(0, |m| m.experts.num_experts())).collect();
    let entries = state_dict::entries(&model, spec, 0, &all_experts);
    let dims = state_dict::host_values(&model).into_iter().map(|(t, (d, _))| (t, d)).collect();
    let values = state_dict::assemble(&entries, &dims, tensors, &|e| e.name.clone())
        .map_err(|e| e.replace("no tensor", "checkpoint has no tensor"))?;
    Ok(state_dict::replace(model, &values))
}
