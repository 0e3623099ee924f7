//! The dense layers of a decoder: attention (grouped-query, or DeepSeek's multi-head latent attention)
//! with rotary embedding, the gated MLP, Burn's `Linear` and `RmsNorm` run through the fused operations,
//! Hugging Face's weight initialisation, the key/value cache of generation, and selective activation
//! recompute.

pub mod attention;
pub mod fused;
pub mod init;
pub mod kv_cache;
pub mod mla;
pub mod mlp;
pub mod recompute;
pub mod rope;
