//! Piper: efficient large-scale Mixture-of-Experts training via resource modeling and pipelined hybrid
//! parallelism (Dash & Wang, arXiv 2605.05049), in Rust.
//!
//! This root crate re-exports the workspace crates so that examples and integration tests can use one
//! path: the resource model and planner ([`planner`]), the communication layer ([`comm`]; its MPI backend
//! behind the `mpi` feature), the kernels ([`kernels`]), the Burn modules ([`modules`]) and the model
//! definitions ([`models`]), and [`burn`] itself at the version they are built with (so a model author's
//! crate uses `piper::burn` instead of matching Burn's exact version by hand).

pub use burn;
pub use kernels_cubecl as kernels;
pub use piper_burn as modules;
/// The runtime: [`runtime::Job`], [`runtime::RunConfig`], [`runtime::execute`] (also `modules::runtime`).
pub use piper_burn::runtime;
pub use piper_comm as comm;
pub use piper_models as models;
pub use piper_planner as planner;
pub mod alloc;

/// Piper as a library: the guide of `docs/library.md`, whose examples run as doctests.
#[doc = include_str!("../docs/library.md")]
pub mod library {}
