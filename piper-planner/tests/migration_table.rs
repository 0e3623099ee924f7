//! Piper's Table IV: worst-case full reassignment of one layer's experts, 8 GPUs per group, 50 GB/s.
//!
//! Piper's rows are 48·E·d·f / 8 bytes (3 matrices × 16 B per parameter). The table mixes units: most
//! sizes are in GiB, Switch-Base's and GLaM's in decimal GB, and each latency is that size figure / 50.
//! GLaM's real experts have 2 matrices (that is what makes it 1.2T); Table IV prices them as Piper's 3
//! (`--expert-matrices 3`): 103.08 GB, 0.19% above the printed 102.88. Switch-Base has non-gated experts
//! with d_ff 3072 (2 matrices), which gives the same bytes as Piper's 3 × 2048.

use piper_planner::migration::{expert_bytes_as, worst_case_bytes_per_gpu, worst_case_bytes_per_gpu_with};
use piper_planner::model::preset;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

#[test]
fn reproduces_table_iv() {
    // (preset, size in the table, unit of that row, latency ms in the table)
    let rows = [
        ("switch-base-128", 1.21, 1e9, 24.2),
        ("mixtral-8x7b", 2.63, GIB, 52.6),
        ("mixtral-8x22b", 4.50, GIB, 90.0),
        ("grok-1", 9.00, GIB, 180.0),
        ("deepseek-v2", 7.04, GIB, 140.8),
        ("deepseek-v3", 21.00, GIB, 420.0),
    ];
    for (name, size, unit, latency_ms) in rows {
        let bytes = worst_case_bytes_per_gpu(&preset(name).unwrap(), 8, 16.0).unwrap();
        let in_unit = bytes / unit;
        // Half a unit of the last digit, except DeepSeek-V2: the formula gives 7.031 GiB, the table 7.04.
        let tol = if name == "deepseek-v2" { 0.01 } else { 0.005 };
        assert!((in_unit - size).abs() <= tol + 1e-9, "{name}: {in_unit:.4} vs {size}");
        // The table's latency is its size figure over 50 (units per second).
        assert!(
            (in_unit / 50.0 * 1e3 - latency_ms).abs() <= 0.2 + 1e-9,
            "{name}: {} ms vs {latency_ms}",
            in_unit / 50.0 * 1e3
        );
    }
}

#[test]
fn glam_row_with_pipers_three_matrix_experts() {
    let spec = preset("glam-1.2t").unwrap();
    let own = worst_case_bytes_per_gpu(&spec, 8, 16.0).unwrap();
    assert_eq!(own, 64.0 * GIB, "GLaM's own 2-matrix experts");
    let piper = worst_case_bytes_per_gpu_with(64, expert_bytes_as(&spec, Some(3), 16.0).unwrap(), 8).unwrap();
    assert_eq!(piper, 48.0 * 64.0 * 8192.0 * 32768.0 / 8.0);
    let gb = piper / 1e9;
    assert!((gb / 102.88 - 1.0).abs() < 0.0025, "{gb} GB vs the printed 102.88");
    assert!((gb / 50.0 * 1e3 / 2057.6 - 1.0).abs() < 0.0025);
}
