//! Where a step's time goes, per operation: the host kernels ([`crate::flex`]) book the wall time of
//! each call (on the calling thread, so a multi-threaded kernel counts once) and its FLOPs under the
//! phase the caller set ([`set_phase`]: forward, backward, optimizer…). Off by default; one relaxed
//! atomic load per call when off. `mixtral_train --profile` turns it on and prints the table.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);

struct Registry {
    phase: &'static str,
    totals: BTreeMap<(&'static str, &'static str), OpTotal>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { phase: "", totals: BTreeMap::new() });

/// What one operation took in one phase, summed over its calls.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpTotal {
    pub calls: u64,
    /// Wall seconds of the calls.
    pub seconds: f64,
    /// Floating-point operations (multiply and add counted apart), 0 for passes that are not counted.
    pub flops: f64,
}

/// One row of [`snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpRecord {
    pub phase: &'static str,
    pub op: &'static str,
    pub total: OpTotal,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic while the lock was held left plain numbers behind: still usable.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Turns the booking on or off (it keeps what it has).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether calls are being booked.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The phase later calls are booked under.
pub fn set_phase(phase: &'static str) {
    if enabled() {
        registry().phase = phase;
    }
}

/// Forgets every booked call.
pub fn reset() {
    registry().totals.clear();
}

/// Every (phase, operation) booked so far, in phase then operation order.
pub fn snapshot() -> Vec<OpRecord> {
    registry().totals.iter().map(|(&(phase, op), &total)| OpRecord { phase, op, total }).collect()
}

/// Books the call's time when dropped (see [`op`]).
#[must_use = "the call is booked when the guard is dropped"]
pub struct OpGuard {
    started: Option<(Instant, &'static str, f64)>,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        if let Some((started, op, flops)) = self.started.take() {
            let seconds = started.elapsed().as_secs_f64();
            let mut r = registry();
            let phase = r.phase;
            let t = r.totals.entry((phase, op)).or_default();
            t.calls += 1;
            t.seconds += seconds;
            t.flops += flops;
        }
    }
}

/// Starts booking one call of `op` doing `flops` floating-point operations; it ends when the guard
/// is dropped. Nothing is measured while booking is off.
pub fn op(op: &'static str, flops: f64) -> OpGuard {
    OpGuard { started: enabled().then(|| (Instant::now(), op, flops)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn books_calls_time_and_flops_per_phase_only_while_on() {
        // The registry is global: this is the only test that touches it.
        reset();
        drop(op("not booked", 1.0));
        enable(true);
        set_phase("forward");
        for _ in 0..3 {
            let _g = op("gemm", 10.0);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        set_phase("backward");
        drop(op("gemm", 5.0));
        enable(false);
        drop(op("gemm", 7.0));
        let rows = snapshot();
        assert_eq!(rows.len(), 2, "{rows:?}");
        let (bwd, fwd) = (&rows[0], &rows[1]);
        assert_eq!((fwd.phase, fwd.op, fwd.total.calls, fwd.total.flops), ("forward", "gemm", 3, 30.0));
        assert!(fwd.total.seconds >= 0.006, "three sleeps of 2 ms: {}", fwd.total.seconds);
        assert_eq!((bwd.phase, bwd.total.calls, bwd.total.flops), ("backward", 1, 5.0));
        reset();
        assert!(snapshot().is_empty());
    }
}
