//! Model architecture: specs, presets, parameter and FLOP counts (Hugging Face configs: [`crate::hf`]).

pub mod builder;
pub mod counts;
pub mod presets;
pub mod spec;
mod validate;

pub use builder::{Family, ModelBuilder};
pub use counts::{
    FlopsBreakdown, LayerParams, ParamBreakdown, active_params, param_breakdown, training_flops_per_token,
};
pub use presets::{preset, preset_names, resolve_model};
pub use spec::{Attention, LayerKind, Mlp, ModelSpec, Moe, Norm, QkNorm, ScoreFunction};
