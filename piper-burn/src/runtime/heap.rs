//! The bytes a process's heap holds for it, counted by its global allocator: Piper's binaries declare
//! `piper::alloc::Allocator`, which reports each allocation and free here. Beside the peak resident
//! memory (what the allocator keeps from the system, freed pages included), the peak of these bytes is
//! what the program's own tensors and buffers needed at once — what the resource model counts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static HELD: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static COUNTED: AtomicBool = AtomicBool::new(false);

/// Records an allocation of `bytes` (the allocator's `alloc`, after it succeeded).
#[inline]
pub fn allocated(bytes: usize) {
    let held = HELD.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    if held > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(held, Ordering::Relaxed);
    }
}

/// Records a free of `bytes` (the allocator's `dealloc`).
#[inline]
pub fn freed(bytes: usize) {
    HELD.fetch_sub(bytes as u64, Ordering::Relaxed);
}

/// Marks this process's heap as counted: its global allocator reports every allocation and free to
/// [`allocated`] and [`freed`].
pub fn start_counting() {
    COUNTED.store(true, Ordering::Relaxed);
}

/// The most bytes the heap held at once so far; `None` where the process's allocator does not count.
pub fn peak_heap_bytes() -> Option<u64> {
    COUNTED.load(Ordering::Relaxed).then(|| PEAK.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters are process-wide: this test is the only one that touches them.
    #[test]
    fn the_peak_is_the_most_held_at_once() {
        let base = PEAK.load(Ordering::Relaxed);
        allocated(100);
        allocated(50);
        freed(100);
        allocated(20);
        let held = HELD.load(Ordering::Relaxed);
        assert_eq!(held, 70);
        assert_eq!(PEAK.load(Ordering::Relaxed), base.max(150));
        assert_eq!(peak_heap_bytes(), None, "not counted until the allocator says so");
        start_counting();
        assert_eq!(peak_heap_bytes(), Some(base.max(150)));
        freed(70);
    }
}
