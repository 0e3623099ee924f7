//! Model architecture: specs, Hugging Face loaders, presets, parameter and FLOP counts.

pub mod counts;
pub mod hf;
pub mod presets;
pub mod spec;
mod validate;

pub use counts::{
    FlopsBreakdown, LayerParams, ParamBreakdown, active_params, param_breakdown, training_flops_per_token,
};
pub use presets::{preset, preset_names, resolve_model};
pub use spec::{Attention, LayerKind, Mlp, ModelSpec, Moe, Norm, QkNorm, ScoreFunction};
