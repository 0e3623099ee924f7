//! Hugging Face weights: the state-dict adapter — one name map between the Burn model and
//! transformers' tensor names, per family where the names differ — used both ways by import
//! (`--init-hf`, [`weights::load_hf`]), export ([`weights::save_hf`]) and checkpoints (which keep HF
//! names). Reading model folders and safetensors files without Burn is the planner's
//! (`piper_planner::hf`); this module puts those tensors into a model and takes them out.

pub mod state_dict;
pub mod weights;

pub use state_dict::StateDictAdapter;
