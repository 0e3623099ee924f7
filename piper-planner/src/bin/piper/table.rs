//! Human-readable formatting: tables and units, and `outln!` to build a command's output.

/// `writeln!` into a `String` (cannot fail).
#[macro_export]
macro_rules! outln {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        writeln!($out, $($arg)*).expect("writing to a String cannot fail")
    }};
}

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

/// A table with a header row, right-aligned numbers.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(header.to_vec());
    for i in 1..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t
}

/// 46.70 B, 1.23 T, 512.0 M …
pub fn count(n: f64) -> String {
    match n {
        n if n >= 1e12 => format!("{:.2} T", n / 1e12),
        n if n >= 1e9 => format!("{:.2} B", n / 1e9),
        n if n >= 1e6 => format!("{:.2} M", n / 1e6),
        n if n >= 1e3 => format!("{:.2} K", n / 1e3),
        n => format!("{n:.0}"),
    }
}

/// Bytes in GiB with one decimal.
pub fn gib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1024.0 * 1024.0 * 1024.0))
}

/// Seconds with a sensible unit.
pub fn secs(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.2} s"),
        s if s >= 1e-3 => format!("{:.1} ms", s * 1e3),
        s => format!("{:.1} µs", s * 1e6),
    }
}

pub fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}
