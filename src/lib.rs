//! Piper: efficient large-scale Mixture-of-Experts training via resource modeling and pipelined hybrid
//! parallelism (Dash & Wang, arXiv 2605.05049), in Rust.
//!
//! This root crate re-exports the workspace crates so that examples and integration tests can use one
//! path. Today it holds the resource model and planner ([`planner`]); the communication layer, kernels,
//! Burn modules and models join as their crates land.

pub use piper_planner as planner;
