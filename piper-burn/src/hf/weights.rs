//! Hugging Face safetensors files of a whole model: tensor names and `[out, in]` linear weights as
//! `transformers` stores them (through the [`StateDictAdapter`]), so its checkpoints load and what Piper
//! saves loads back into `transformers`.

use std::collections::HashMap;
use std::path::Path;

use piper_planner::hf::decode;
use piper_planner::model::ModelSpec;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

use super::state_dict::{NamedTensors, StateDictAdapter};
use crate::model::CausalLm;

/// Why a safetensors file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("not a safetensors file: {0}")]
    NotSafetensors(safetensors::SafeTensorError),
    #[error("{path}: cannot write safetensors: {source}")]
    Write { path: String, source: safetensors::SafeTensorError },
}

/// Writes the whole `model` as one Hugging Face safetensors file (f32).
pub fn save_hf(model: &CausalLm, spec: &ModelSpec, path: &Path) -> Result<(), WeightsError> {
    let tensors = StateDictAdapter::new(spec).to_hf(model);
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).expect("shape matches data")))
        .collect();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|source| WeightsError::Write { path: path.display().to_string(), source })
}

/// Reads f32 tensors by name from safetensors bytes (an optional prefix is stripped from names; F32,
/// BF16 and F16 are converted, other dtypes skipped).
pub fn read_f32(bytes: &[u8], prefix: &str) -> Result<NamedTensors, WeightsError> {
    let st = SafeTensors::deserialize(bytes).map_err(WeightsError::NotSafetensors)?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let Some(name) = name.strip_prefix(prefix) else { continue };
        let Some(data) = decode(&view.dtype().to_string(), view.data()) else { continue };
        out.insert(name.to_string(), (view.shape().to_vec(), data));
    }
    Ok(out)
}
