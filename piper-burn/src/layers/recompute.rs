//! Selective activation recompute (`--recompute selective`): while a [`SelectiveRecompute`] scope is
//! open on a thread, the dense SwiGLU MLPs (dense layers and shared experts) that thread builds hold
//! their gate and up projections but not `silu(gate) ⊙ up`, which their backward recomputes
//! ([`kernels_cubecl::swiglu_down`]). Routed experts always recompute it, and the fused causal
//! attention never holds its scores, so this is all that `selective` adds to what the runtime keeps —
//! what the planner's memory model counts for `selective` (`piper_planner::memory`). Values and
//! gradients are those without recompute, bit for bit.
//!
//! A scope, not a model setting: what the forward keeps is how a step runs, like the schedule; the same
//! model trains with or without it.

use std::cell::Cell;

thread_local! {
    static SELECTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Selective recompute for the forwards run on this thread until it is dropped (see the module).
#[must_use = "the scope ends when this is dropped"]
pub struct SelectiveRecompute {
    previous: bool,
}

impl SelectiveRecompute {
    /// Opens the scope when `on` (else keeps what is in force).
    pub fn enter(on: bool) -> Self {
        let previous = SELECTIVE.with(|s| s.replace(s.get() || on));
        SelectiveRecompute { previous }
    }
}

impl Drop for SelectiveRecompute {
    fn drop(&mut self) {
        SELECTIVE.with(|s| s.set(self.previous));
    }
}

/// Whether a [`SelectiveRecompute`] scope is open on this thread.
pub fn selective() -> bool {
    SELECTIVE.with(Cell::get)
}
