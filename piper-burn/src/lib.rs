//! # piper-burn
//!
//! MoE transformer building blocks on Burn 0.22: rotary embedding, grouped-query causal attention, the
//! top-k router (softmax or sigmoid + selection bias, group-limited, routed scaling) with its losses,
//! dropless padding-free dispatch, grouped SwiGLU experts, shared experts, the MoE block, decoder layer
//! and causal LM. The heavy element-wise and gather/scatter work goes through `kernels-cubecl`.

pub mod attention;
pub mod corpus;
pub mod decoder;
pub mod dispatch;
pub mod experts;
pub mod init;
pub mod lm;
pub mod losses;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod parallel;
pub mod rope;
pub mod router;
pub mod train;

pub use lm::{CausalLm, CausalLmConfig, LmLoss, LmOutput};
pub use moe::{MoeBlock, MoeBlockConfig, MoeStats};
