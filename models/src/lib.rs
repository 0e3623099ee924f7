//! # piper-models
//!
//! Whole models, ready to run: a Hugging Face model folder (`config.json` and its safetensors weights)
//! loaded into piper-burn's causal LM ([`load_hf_folder`]), and its evaluation on token ids
//! ([`eval::evaluate`]: what transformers' `model(input_ids, labels=input_ids)` gives), and generation
//! with a key/value cache ([`generate::generate`]). Models come from
//! the planner's [`ModelSpec`](piper_planner::model::ModelSpec) — a preset, a native spec or a
//! `config.json` — so the model the planner sizes is the model that runs.

pub mod eval;
pub mod generate;
pub mod grammar_check;
pub mod load;

pub use load::{ModelError, checkpoint_trained_length, folder_spec, load_checkpoint, load_hf_folder, load_weights};
pub use piper_burn::{CausalLm, CausalLmConfig};
pub use piper_planner::model::{preset, resolve_model};
