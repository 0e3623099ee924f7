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
/// A unit of bytes: its name and size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ByteUnit(pub &'static str, pub f64);

impl ByteUnit {
    /// The unit byte counts up to `largest` read best in: GiB from 10 GiB, else MiB (a laptop's small
    /// models would read 0.0 GiB everywhere).
    pub fn for_largest(largest: f64) -> ByteUnit {
        const MIB: f64 = 1024.0 * 1024.0;
        if largest >= 10.0 * 1024.0 * MIB { ByteUnit("GiB", 1024.0 * MIB) } else { ByteUnit("MiB", MIB) }
    }

    /// `bytes` in this unit, one decimal, without the unit's name.
    pub fn of(self, bytes: f64) -> String {
        format!("{:.1}", bytes / self.1)
    }
}

/// Bytes with their unit (see [`ByteUnit::for_largest`]), e.g. `187.5 MiB`, `61.2 GiB`.
pub fn bytes(bytes: f64) -> String {
    let unit = ByteUnit::for_largest(bytes);
    format!("{} {}", unit.of(bytes), unit.0)
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
