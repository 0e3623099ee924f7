//! Expert and data parallelism over `piper-comm`: the differentiable expert all-to-all, expert-group
//! context of an MoE block, and the parallel training step.

pub mod exchange;
pub mod pipeline;
pub mod train;
