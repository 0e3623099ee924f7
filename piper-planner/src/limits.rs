//! The one vocabulary for checking numbers that come from users: every input kind (model spec, platform,
//! training config, layout, loads, plan file) checks each field with these before any work starts, so a
//! value is finite, has the right sign and lies in a range some real job could have; the error names the
//! field and the range. The bounds are far beyond any published model or machine (DeepSeek-V3: 61 layers,
//! 256 experts, d = 7168; Frontier: 9,408 nodes), and they keep every product the resource model forms
//! inside `u64` and `f64`'s exact-integer range, so no count wraps and no prediction is infinite.

use crate::error::{Error, Result};

/// Decoder layers (and MTP modules) of a model.
pub const MAX_LAYERS: u64 = 1_000_000;
/// Hidden size, head dims, LoRA ranks.
pub const MAX_WIDTH: u64 = 1 << 20;
/// Inner width of one MLP / expert.
pub const MAX_FFN: u64 = 1 << 24;
/// Vocabulary entries.
pub const MAX_VOCAB: u64 = 1 << 27;
/// Attention heads.
pub const MAX_HEADS: u64 = 1 << 16;
/// Routed (or shared) experts of one layer.
pub const MAX_EXPERTS: u64 = 1 << 20;
/// Multi-token-prediction depth.
pub const MAX_MTP_DEPTH: u64 = 64;
/// Parameters of a whole model (the largest published are ~2·10¹²).
pub const MAX_PARAMS: f64 = 1e15;
/// GPUs (ranks) of one job, and of one layout dimension.
pub const MAX_GPUS: u64 = 1 << 40;
/// Tokens of one sequence.
pub const MAX_SEQ_LEN: u64 = 1 << 24;
/// Sequences of one micro-batch, and micro-batches of one step.
pub const MAX_BATCH: u64 = 1 << 24;
/// Stage × micro-batch pairs of one step's pipeline schedule: the runtime and the time model's
/// simulator list every micro-batch's ops on every stage, so this bounds what they allocate (tens of MiB
/// at the limit). 2²⁰ is 64 stages × 16,384 micro-batches, beyond any published run.
pub const MAX_PIPELINE_PAIRS: u64 = 1 << 20;
/// Tokens of one optimizer step across the job (2⁵³: still exact in `f64`).
pub const MAX_STEP_TOKENS: u64 = 1 << 53;
/// Bytes per parameter of one state (weights, gradients, optimizer).
pub const MAX_BYTES_PER_PARAM: f64 = 64.0;

/// A number as a user reads it in an error: `1e300`, not three hundred digits.
pub fn show(v: f64) -> String {
    if v.is_finite() && v != 0.0 && (v.abs() >= 1e7 || v.abs() < 1e-4) { format!("{v:e}") } else { format!("{v}") }
}

/// Whether `c` changes how a terminal shows the text after it: a control character (escape sequences,
/// carriage returns, backspaces) or one of Unicode's bidirectional marks, embeddings, overrides and
/// isolates (text that reads other than it is).
pub fn hides_text(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// A name read from a file (a model's, a platform's), which reports and messages print: refused when it
/// holds a character that [`hides_text`]; the error shows the name escaped.
pub fn printable(src: &str, field: &str, name: &str) -> Result<()> {
    match name.chars().find(|c| hides_text(*c)) {
        None => Ok(()),
        Some(c) => Err(Error::invalid(
            src,
            field,
            format!(
                "is \"{}\", which holds U+{:04X}, a character that changes how a terminal shows what follows; use printable text",
                name.escape_debug(),
                c as u32
            ),
        )),
    }
}

/// A count in `lo..=hi`; the error names the field and the range.
pub fn count(src: &str, field: &str, v: u64, lo: u64, hi: u64) -> Result<u64> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(Error::invalid(src, field, format!("is {v}; it must be in {lo}..={hi}")))
    }
}

/// A finite number in `lo..=hi`.
pub fn number(src: &str, field: &str, v: f64, lo: f64, hi: f64) -> Result<f64> {
    if v.is_finite() && v >= lo && v <= hi {
        Ok(v)
    } else {
        Err(Error::invalid(
            src,
            field,
            format!("is {}; it must be a finite number in [{}, {}]", show(v), show(lo), show(hi)),
        ))
    }
}

/// A finite number in `(0, hi]`.
pub fn positive(src: &str, field: &str, v: f64, hi: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 && v <= hi {
        Ok(v)
    } else {
        Err(Error::invalid(src, field, format!("is {}; it must be a finite number in (0, {}]", show(v), show(hi))))
    }
}

/// `a · b`, or an error naming what the product counts when it passes `hi` (or `u64`).
pub fn product(src: &str, what: &str, factors: &[(&str, u64)], hi: u64) -> Result<u64> {
    let p = factors.iter().try_fold(1u64, |acc, (_, v)| acc.checked_mul(*v)).filter(|p| *p <= hi);
    p.ok_or_else(|| {
        let names: Vec<String> = factors.iter().map(|(n, v)| format!("{n} {v}")).collect();
        Error::invalid(src, what, format!("= {} exceeds {hi}; no real job is this large", names.join(" × ")))
    })
}

/// The largest value, 0 for none, and NaN when any value is NaN (`fold(0.0, f64::max)` would drop it and
/// hide a broken input behind a plausible number).
pub fn max_or_zero(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(0.0, |acc: f64, v| if acc.is_nan() || v.is_nan() { f64::NAN } else { acc.max(v) })
}

/// Smallest value, NaN if any is NaN, 0 for none.
pub fn min_or_zero(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut it = values.into_iter();
    let Some(first) = it.next() else { return 0.0 };
    it.fold(first, |acc: f64, v| if acc.is_nan() || v.is_nan() { f64::NAN } else { acc.min(v) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_refuse_non_finite_negative_and_out_of_range() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 1e30] {
            assert!(number("x", "f", v, 0.0, 1e6).is_err(), "{v}");
            assert!(positive("x", "f", v, 1e6).is_err(), "{v}");
        }
        assert!(positive("x", "f", 0.0, 1.0).is_err());
        assert_eq!(number("x", "f", 0.0, 0.0, 1.0), Ok(0.0));
        assert!(count("x", "f", 0, 1, 8).unwrap_err().to_string().contains("`f` is 0; it must be in 1..=8"));
        let err = product("x", "tokens", &[("a", 1 << 40), ("b", 1 << 40)], u64::MAX).unwrap_err().to_string();
        assert!(err.contains("`tokens` = a 1099511627776 × b 1099511627776 exceeds"), "{err}");
        assert_eq!(product("x", "t", &[("a", 3), ("b", 5)], 15), Ok(15));
    }

    #[test]
    fn numbers_show_compactly() {
        assert_eq!(show(1e300), "1e300");
        assert_eq!(show(-16.0), "-16");
        assert_eq!(show(2.5e-9), "2.5e-9");
        assert_eq!(show(f64::NAN), "NaN");
        assert!(
            number("x", "f", 1e300, 0.0, 1e6)
                .unwrap_err()
                .to_string()
                .contains("is 1e300; it must be a finite number in [0, 1000000]")
        );
    }

    #[test]
    fn max_keeps_nan() {
        assert_eq!(max_or_zero([]), 0.0);
        assert_eq!(max_or_zero([1.0, 3.0, 2.0]), 3.0);
        assert!(max_or_zero([1.0, f64::NAN, 2.0]).is_nan());
        assert!(max_or_zero([f64::NAN]).is_nan());
    }
}
