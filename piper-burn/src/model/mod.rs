//! The model: pre-norm decoder layers (dense or MoE) inside a causal language model, and its
//! construction from a planner [`ModelSpec`](piper_planner::model::ModelSpec), and what the runtime needs
//! from any model ([`stage_model`]).

pub mod causal_lm;
pub mod decoder;
pub mod from_spec;
pub mod stage_model;

pub use causal_lm::{CausalLm, CausalLmConfig, LmLoss, LmOutput};
pub use from_spec::Unsupported;
pub use stage_model::{StageModel, StageModelConfig, StagePart};
