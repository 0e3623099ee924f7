//! # piper-burn
//!
//! MoE transformer building blocks on Burn 0.22: rotary embedding, grouped-query causal attention, the
//! top-k router (softmax or sigmoid + selection bias, group-limited, routed scaling) with its losses,
//! dropless padding-free dispatch, grouped SwiGLU experts, shared experts, the MoE block, decoder layer
//! and causal LM. The heavy element-wise and gather/scatter work goes through `kernels-cubecl`.

pub mod attention;
pub mod calibrate;
pub mod corpus;
pub mod decoder;
pub mod dispatch;
pub mod dispatcher;
pub mod experts;
pub mod fused_layers;
pub mod init;
pub mod lm;
pub mod losses;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod rope;
pub mod router;
pub mod runtime;
pub mod state_dict;

pub use lm::{CausalLm, CausalLmConfig, LmLoss, LmOutput};
pub use moe::{MoeBlock, MoeBlockConfig, MoeStats};

/// Held while seeding and drawing a model's initial weights: the backend's seed may be global, so ranks
/// (or tests) that are threads of one process draw one at a time and get the same weights for a seed.
pub fn init_lock() -> std::sync::MutexGuard<'static, ()> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    INIT.lock().unwrap_or_else(|e| e.into_inner())
}
