//! What the host machine says about this process: its peak resident memory and the machine's memory
//! (Linux `/proc`; `None` or 0 where it cannot be read).

/// Peak resident memory of this process (`VmHWM`), bytes; 0 where it cannot be read.
pub fn peak_rss_bytes() -> u64 {
    proc_field("/proc/self/status", "VmHWM").map_or(0, |kib| kib * 1024)
}

/// The machine's memory (`MemTotal`), bytes.
pub fn total_memory_bytes() -> Option<u64> {
    proc_field("/proc/meminfo", "MemTotal:").map(|kib| kib * 1024)
}

/// The number (kiB) on the line of `file` that starts with `key`.
fn proc_field(file: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}
