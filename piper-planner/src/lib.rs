//! # piper-planner
//!
//! The resource model and planner of Piper (Dash & Wang, arXiv 2605.05049): per-rank memory, compute and
//! communication of MoE training for any architecture and PP×EP×DP layout, and a planner that enumerates
//! layouts, rejects infeasible ones with the reason, and ranks the rest by predicted MFU.
//!
//! No Burn dependency: everything here is arithmetic over specs, so its tests run in seconds.

pub mod error;
pub mod model;
pub mod platform;

pub use error::{Error, Result};
pub mod comm;
pub mod layout;
pub mod memory;
pub mod migration;
pub mod planner;
pub mod schedule;
pub mod split;
pub mod time;
