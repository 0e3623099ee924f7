//! A Hugging Face model folder into a ready model: the spec from its `config.json`, the Burn model of
//! that spec, its weights (`model.safetensors` or a sharded index; F32, BF16 or F16, converted to f32)
//! through the state-dict adapter.

use std::path::Path;

use burn::prelude::*;
use piper_burn::hf::StateDictAdapter;
use piper_burn::hf::state_dict::StateDictError;
use piper_burn::{CausalLm, CausalLmConfig, Unsupported};
use piper_planner::hf::read_hf_tensors;
use piper_planner::model::{ModelSpec, resolve_model};

/// Why a model could not be loaded or evaluated; every message names the file, tensor or input.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Planner(#[from] piper_planner::Error),
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    #[error("{dir}: the model has no tensor `{name}`")]
    Missing { dir: String, name: String },
    #[error("{dir}: {source}")]
    Weights { dir: String, source: StateDictError },
    /// Token ids that the model cannot evaluate.
    #[error("input ids: {0}")]
    InputIds(String),
    /// The backend could not hand a tensor back to the host.
    #[error("reading a result back from the device: {0}")]
    Device(String),
    /// A setting that cannot work: the flag, then why and what would.
    #[error("{flag} {why}")]
    Flag { flag: String, why: String },
    /// NaN or infinite logits: the weights are broken.
    #[error("the model's logits for generated token {0} are not finite (NaN or ±inf); check the weights")]
    NotFinite(usize),
}

/// Loads the model folder `dir` on `device`: its spec (without a multi-token-prediction module, as
/// transformers runs it) and the model with the folder's weights.
pub fn load_hf_folder(dir: &Path, device: &Device) -> Result<(ModelSpec, CausalLm), ModelError> {
    let spec = folder_spec(dir)?;
    let model = load_weights(dir, &spec, device)?;
    Ok((spec, model))
}

/// The spec of the model folder `dir` (its `config.json`), without a multi-token-prediction module.
pub fn folder_spec(dir: &Path) -> Result<ModelSpec, ModelError> {
    Ok(resolve_model(&dir.join("config.json").display().to_string())?.without_mtp())
}

/// The model of `spec` with the weights of the folder `dir`.
pub fn load_weights(dir: &Path, spec: &ModelSpec, device: &Device) -> Result<CausalLm, ModelError> {
    let model = CausalLmConfig::from_spec(spec)?.init(device);
    let adapter = StateDictAdapter::new(spec);
    let names: Vec<String> = adapter.whole_model_entries(&model).into_iter().map(|e| e.name).collect();
    let (tensors, missing) = read_hf_tensors(dir, &names)?;
    let show = || dir.display().to_string();
    if let Some(name) = missing.into_iter().next() {
        return Err(ModelError::Missing { dir: show(), name });
    }
    adapter.from_hf(model, &tensors).map_err(|source| ModelError::Weights { dir: show(), source })
}

/// Loads a checkpoint the runtime saved (a checkpoint folder, or a `--checkpoint-dir` whose `latest`
/// names one), whatever layout saved it, as one whole model: exported to a temporary Hugging Face folder
/// (`piper checkpoint export`'s format), read back, and the folder removed.
pub fn load_checkpoint(path: &Path, device: &Device) -> Result<(ModelSpec, CausalLm), ModelError> {
    let tmp = std::env::temp_dir().join(format!("piper-checkpoint-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let loaded = piper_planner::checkpoint::export::export_hf(path, &tmp, false)
        .map_err(ModelError::from)
        .and_then(|_| load_hf_folder(&tmp, device));
    let _ = std::fs::remove_dir_all(&tmp);
    loaded
}

/// The tokens per sequence checkpoint `path` trained on: positions past it were never seen in training,
/// and a model's output there degrades.
pub fn checkpoint_trained_length(path: &Path) -> Result<u64, ModelError> {
    let folder = piper_planner::checkpoint::resolve(path)?;
    Ok(piper_planner::checkpoint::Manifest::load(&folder)?.plan.seq_len)
}
