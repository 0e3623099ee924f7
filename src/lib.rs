//! Piper: efficient large-scale Mixture-of-Experts training via resource modeling and pipelined hybrid
//! parallelism (Dash & Wang, arXiv 2605.05049), in Rust.
//!
//! This root crate re-exports the workspace crates so that examples and integration tests can use one
//! path: the resource model and planner ([`planner`]) and the communication layer ([`comm`]; its MPI
//! backend behind the `mpi` feature). The kernels, Burn modules and models join as their crates land.

pub use piper_comm as comm;
pub use piper_planner as planner;
