//! `piper calibrate` end to end, as a user runs it: it launches the runtime's workers (links under
//! mpirun, the cost tables per thread count, profiled training runs, expert-parallel and time-sharing
//! runs) and writes a platform the planner reads, with compute costs and step costs for every thread
//! count a rank can get on this node, the fitted memory and the time-sharing exponent; `piper predict`
//! then prices a model the calibration never ran with it, and `piper validate` runs the planner's two
//! best plans for 2 ranks on it and reports each plan's prediction beside its measurement. Run in release (`.ci/run` does, after building
//! the workers; a debug calibration takes ~15 minutes). Built without `--features mpi`, the test shows
//! as ignored and names `scripts/test-mpi.sh`, which installs OpenMPI.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{binary, run};
use piper::planner::platform::{self, thread_counts};

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn calibrate_writes_a_platform_the_planner_prices_with() {
    common::require_mpirun();
    let dir = common::scratch("calibrate");
    let out = dir.join("local.toml");
    let piper = binary("", "piper");
    let bin_dir = piper.parent().expect("target/<profile>").to_path_buf();
    let mut cmd = Command::new(&piper);
    cmd.args(["calibrate", "--out", out.to_str().unwrap(), "--bin-dir", bin_dir.to_str().unwrap()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let (ok, text) = run(cmd, Duration::from_secs(1800));
    assert!(ok, "piper calibrate failed:\n{text}");
    assert!(text.contains("4/4") && text.contains(out.to_str().unwrap()), "{text}");

    let p = platform::load(&out).unwrap_or_else(|e| panic!("the calibrated platform does not load: {e}"));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(p.cores_per_node, Some(cores));
    let measured: Vec<u64> = p.threads.iter().map(|t| t.threads).collect();
    assert_eq!(measured, thread_counts(cores), "one set of costs per thread count a rank can get");
    for t in &p.threads {
        let line = format!("  {} thread(s) per rank: op", t.threads);
        assert!(text.contains(&line), "the summary names each thread count's costs (`{line}`):\n{text}");
        if t.threads < cores {
            assert!(t.framework_overhead_gib.is_some(), "no memory fit of its own at {} thread(s)", t.threads);
        }
        let step = t.step.as_ref().unwrap_or_else(|| panic!("no step costs at {} thread(s)", t.threads));
        // The routed experts are priced on their table, their FLOPs at the peak rate, or both.
        let experts = step.experts + step.experts_peak;
        assert!(step.linear > 0.0 && experts > 0.0 && step.optimizer_ns > 0.0, "{step:?}");
        assert!(step.replica_sync > 0.0, "the data-parallel runs' gradient reduction: {step:?}");
        if cores / t.threads >= 2 {
            let exchange = step.exchange_experts + step.exchange_ns;
            assert!(exchange > 0.0, "no expert-parallel path cost at {} thread(s): {step:?}", t.threads);
        }
    }
    let gamma = p.time_share_exponent.expect("time sharing measured");
    assert!((0.5..=4.0).contains(&gamma), "γ {gamma}");
    let rc = p.runtime.expect("memory fitted");
    assert!(rc.bytes_per_param > 0.0 && rc.activation_factor > 0.0 && p.framework_overhead_gib > 0.0, "{rc:?}");

    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/benchmarks/configs/heldout-qwen3.json");
    let mut predict = Command::new(&piper);
    predict.args(["predict", "--model", model, "--platform", out.to_str().unwrap(), "--pp", "1", "--ep", "2"]);
    predict.args(["--dp", "1", "--micro-batch-size", "4", "--num-micro-batches", "1", "--seq-len", "63"]);
    predict.args(["--schedule", "1f1b", "--recompute", "none", "--dtype", "fp32", "--json"]);
    let (ok, text) = run(predict, Duration::from_secs(60));
    assert!(ok, "piper predict on the calibrated platform failed:\n{text}");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("predict --json");
    let step = doc["step_time_s"].as_f64().expect("step_time_s");
    assert!(step.is_finite() && step > 0.0, "{text}");

    // `piper validate` on the calibrated platform: the planner's two best plans for 2 ranks, run.
    let json = dir.join("validate.json");
    let mut validate = Command::new(&piper);
    validate.args(["validate", "--model", "tiny", "--platform", out.to_str().unwrap(), "--gpus", "2"]);
    validate.args(["--global-batch", "8", "--seq-len", "31", "--top", "2", "--rounds", "1", "--steps", "6"]);
    validate.args(["--bin-dir", bin_dir.to_str().unwrap(), "--json", json.to_str().unwrap()]);
    validate.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let (ok, text) = run(validate, Duration::from_secs(600));
    assert!(ok && text.contains("regret"), "piper validate failed:\n{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let plans = v["plans"].as_array().expect("plans");
    assert_eq!(plans.len(), 2, "{v}");
    for p in plans {
        let ranks: u64 = ["pp", "ep", "dp"].iter().map(|k| p[*k].as_u64().unwrap()).product();
        assert_eq!(ranks, 2, "{p}");
        for k in ["predicted_step_s", "measured_step_s", "predicted_peak_bytes", "measured_peak_bytes"] {
            assert!(p[k].as_f64().is_some_and(|x| x.is_finite() && x > 0.0), "{k}: {p}");
        }
    }
    assert!(v["regret"].as_f64().is_some_and(|r| r >= 0.0), "{v}");
    // A profiled one-rank step, class by class, on every core and with the one thread of a rank of the
    // two-rank plans (where the cores are two or more): every class priced and booked, the GEMMs and
    // the update measured.
    let classes = v["classes"].as_array().expect("classes");
    let mut counts = vec![cores];
    if cores >= 2 {
        counts.push(cores / 2);
    }
    for t in counts {
        let names: Vec<&str> =
            classes.iter().filter(|c| c["threads"].as_u64() == Some(t)).filter_map(|c| c["class"].as_str()).collect();
        assert_eq!(names, ["linear", "experts", "attention", "layer", "cross_entropy", "optimizer"], "{t}: {v}");
    }
    for c in classes {
        for k in ["predicted_s", "measured_s"] {
            assert!(c[k].as_f64().is_some_and(|x| x.is_finite() && x >= 0.0), "{k}: {c}");
        }
    }
    assert!(classes.iter().all(|c| c["class"] != "linear" || c["measured_s"].as_f64() > Some(0.0)), "{v}");
    assert!(text.contains(&format!("one rank of {cores} thread(s): step by class")), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
