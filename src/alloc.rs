//! The allocator of Piper's binaries. Declare it in yours and call [`keep_freed_pages`] first thing:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: piper::alloc::Allocator = piper::alloc::Allocator;
//! fn main() {
//!     piper::alloc::keep_freed_pages();
//! }
//! ```
//!
//! mimalloc keeps freed pages for reuse, where glibc's malloc handed the large activation buffers back
//! to the kernel and faulted them in again every step (~15% of an MoE layer's time); and with its purge
//! off it never decommits them either (its default `purge_delay` still cost ~4% of a training step in
//! zeroed re-faulted pages, and inflated calibration measurements). It counts the bytes it holds for the
//! program ([`piper_burn::runtime::heap`]): the run's summary gives their peak beside the peak RSS.

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;
use piper_burn::runtime::heap;

/// mimalloc, counting the bytes it holds for the program.
pub struct Allocator;

// SAFETY: every call goes to mimalloc with the caller's arguments; the counting only reads sizes.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { MiMalloc.alloc(layout) };
        if !p.is_null() {
            heap::allocated(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            heap::allocated(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        heap::freed(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            heap::freed(layout.size());
            heap::allocated(new_size);
        }
        p
    }
}

/// Tells mimalloc never to purge (decommit) freed memory, and the runtime that the heap is counted.
pub fn keep_freed_pages() {
    // mi_option_purge_delay: index 15 of `mi_option_t` in both the v2 and v3 headers libmimalloc-sys
    // builds (`MIMALLOC_VERBOSE=1` prints the option as -1 once set).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets a process-wide allocator option, which mimalloc allows at any time.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) }
    heap::start_counting();
}
