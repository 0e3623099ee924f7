//! Expert and data parallelism over `piper-comm`: the differentiable expert all-to-all, expert-group
//! context of an MoE block, and the parallel training step.

pub mod exchange;
pub mod pipeline;
pub mod train;

/// Held while seeding and drawing a model's initial weights: the backend's seed may be global, so ranks
/// (or tests) that are threads of one process draw one at a time and get the same weights for a seed.
pub fn init_lock() -> std::sync::MutexGuard<'static, ()> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    INIT.lock().unwrap_or_else(|e| e.into_inner())
}
