//! `scripts/simulate-alltoall.sh` end to end on a simulated 4-node Frontier (SimGrid's SMPI), checked
//! against what the platform file makes certain: at 4 MiB per peer every algorithm pushes each node's
//! 8 × 24 remote blocks through its 100 GB/s of NICs, so it cannot take less than 8.05 ms and, bandwidth
//! bound, should not take much more; flat (MPI_Alltoallv) and pairwise post the same messages. The
//! planner's model, on the same preset, is within 15% of every simulated time, and the algorithm it
//! picks is within 5% of the fastest simulated (issue 32's goals, held here on 4 nodes). Skips
//! (saying so) where smpirun is not installed, unless `PIPER_REQUIRE_SIMGRID=1` (set by `.ci/run`).

use std::path::Path;
use std::process::Command;

fn simgrid() -> bool {
    let found = Command::new("smpirun").arg("-version").output().is_ok();
    if !found && std::env::var("PIPER_REQUIRE_SIMGRID").as_deref() == Ok("1") {
        panic!("smpirun (SimGrid) is not installed: apt-get install libsimgrid-dev");
    }
    if !found {
        eprintln!("skipping: smpirun (SimGrid) is not installed");
    }
    found
}

fn row<'a>(rows: &'a [serde_json::Value], algo: &str, bytes: u64) -> &'a serde_json::Value {
    rows.iter().find(|r| r["algo"] == algo && r["bytes_per_peer"] == bytes).expect("a row per algorithm and size")
}

fn seconds(r: &serde_json::Value) -> f64 {
    let s = r["simulated_s"].as_f64().unwrap_or(f64::NAN);
    assert!(s.is_finite() && s > 0.0, "no simulated time: {r}");
    s
}

#[test]
fn the_simulated_all_to_all_obeys_the_platforms_bandwidth() {
    if !simgrid() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let work = std::env::temp_dir().join(format!("piper-simgrid-{}", std::process::id()));
    let json = work.join("rows.json");
    let status = Command::new(root.join("scripts/simulate-alltoall.sh"))
        .args(["--platform", "frontier", "--nodes", "4", "--bytes", "1024,4194304", "--timeout-s", "300"])
        .args(["--algos", "flat,pairwise,halo2", "--json"])
        .arg(&json)
        .arg("--work")
        .arg(&work)
        .env("PIPER_SCHEDULE_BIN", env!("CARGO_BIN_EXE_piper-schedule"))
        .status()
        .expect("runs the script");
    assert!(status.success(), "simulate-alltoall.sh failed");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(rows.len(), 6, "{rows:?}");
    let bound = 8.0 * 24.0 * 4194304.0 / 100e9;
    for algo in ["flat", "pairwise", "halo2"] {
        let s = seconds(row(&rows, algo, 4194304));
        assert!(s >= bound && s <= 1.5 * bound, "{algo}: {s} s at 4 MiB, the NICs allow {bound} s");
        assert!(seconds(row(&rows, algo, 1024)) < s / 100.0, "{algo}: 1 KiB is not 4096 times cheaper");
        for bytes in [1024, 4194304] {
            let r = row(&rows, algo, bytes);
            let ratio = r["model_s"].as_f64().unwrap_or(f64::NAN) / seconds(r);
            assert!((0.85..=1.15).contains(&ratio), "{algo} at {bytes} B: model / simulated = {ratio}");
        }
    }
    for bytes in [1024, 4194304] {
        let (flat, pairwise) = (seconds(row(&rows, "flat", bytes)), seconds(row(&rows, "pairwise", bytes)));
        assert!((flat - pairwise).abs() <= 0.02 * flat, "{bytes} B: flat {flat} s, pairwise {pairwise} s");
        let picked: Vec<&serde_json::Value> =
            rows.iter().filter(|r| r["bytes_per_peer"] == bytes && r["auto"] == true).collect();
        assert_eq!(picked.len(), 1, "{bytes} B: the planner picks one algorithm");
        let fastest =
            piper_planner::limits::min_or_zero(["flat", "pairwise", "halo2"].map(|a| seconds(row(&rows, a, bytes))));
        let chosen = seconds(picked[0]);
        assert!(chosen <= 1.05 * fastest, "{bytes} B: the pick takes {chosen} s, the fastest {fastest} s");
    }
    std::fs::remove_dir_all(&work).ok();
}
