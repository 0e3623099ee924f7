//! # piper-burn
//!
//! MoE transformers on Burn 0.22, and the runtime that trains them under a plan:
//! - [`layers`]: the dense building blocks — rotary embedding, grouped-query attention, DeepSeek's MLA,
//!   the gated MLP, Burn's `Linear`/`RmsNorm` through the fused operations, initialisation;
//! - [`moe`]: the MoE pieces — router and its losses, the local permute, grouped experts, the token
//!   dispatcher that reaches experts on other ranks, and the block that joins them;
//! - [`model`]: the decoder layer and the causal LM, built from a planner `ModelSpec`;
//! - [`hf`]: Hugging Face weights — the one state-dict adapter that import, export and checkpoints share;
//! - [`corpus`]: training data (a grammar with a known entropy rate, or text);
//! - [`runtime`]: the executor of the planner's instruction stream (PP × EP × DP), checkpoints,
//!   expert migration, reports.
//!
//! The heavy element-wise and gather/scatter work goes through `kernels-cubecl`.

pub mod calibrate;
pub mod corpus;
pub mod hf;
pub mod layers;
pub mod model;
pub mod moe;
pub mod runtime;

pub use model::{CausalLm, CausalLmConfig, LmLoss, LmOutput, StageModel, StageModelConfig, StagePart, Unsupported};
pub use moe::{MoeBlock, MoeBlockConfig, MoeStats};

/// Held while seeding and drawing a model's initial weights: the backend's seed may be global, so ranks
/// (or tests) that are threads of one process draw one at a time and get the same weights for a seed.
pub fn init_lock() -> std::sync::MutexGuard<'static, ()> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    INIT.lock().unwrap_or_else(|e| e.into_inner())
}
