//! # piper-planner
//!
//! The resource model and planner of Piper (Dash & Wang, arXiv 2605.05049): per-rank memory, compute and
//! communication of MoE training for any architecture and PP×EP×DP layout, and a planner that enumerates
//! layouts, rejects infeasible ones with the reason, and ranks the rest by predicted MFU.
//!
//! No Burn dependency: everything here is arithmetic over specs, so its tests run in seconds.

pub mod atomic;
pub mod calibrate;
pub mod checkpoint;
pub mod class_work;
pub mod comm;
pub mod core_sharing;
pub mod error;
pub mod hf;
pub mod history;
pub mod layout;
pub mod limits;
pub mod memory;
pub mod migration;
pub mod migration_payoff;
pub mod model;
pub mod paper;
pub mod planner;
pub mod platform;
pub mod plots;
pub mod run_plan;
pub mod runtime_work;
pub mod schedule;
pub mod split;
pub mod stats;
pub mod text;
pub mod time;
pub mod trace;

pub use error::{Error, Result};
