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
//! zeroed re-faulted pages, and inflated calibration measurements).

/// mimalloc.
pub use mimalloc::MiMalloc as Allocator;

/// Tells mimalloc never to purge (decommit) freed memory.
pub fn keep_freed_pages() {
    // mi_option_purge_delay: index 15 of `mi_option_t` in both the v2 and v3 headers libmimalloc-sys
    // builds (`MIMALLOC_VERBOSE=1` prints the option as -1 once set).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets a process-wide allocator option, which mimalloc allows at any time.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) }
}
