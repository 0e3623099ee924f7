//! Hugging Face model folders, without Burn: `config.json` ↔ [`ModelSpec`](crate::model::ModelSpec)
//! ([`config`]) and the weight files — `model.safetensors` or the shards of an index, F32/BF16/F16 —
//! read by tensor name ([`files`]). Putting those tensors into a Burn model, and taking them out, is
//! piper-burn's `hf` module (its state-dict adapter).

pub mod config;
pub mod files;

pub use config::{SUPPORTED_MODEL_TYPES, from_hf_config, from_hf_config_str, mixtral_config};
pub use files::{decode, read_hf_tensors, weight_map};
