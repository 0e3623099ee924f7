//! Multi-rank tests under `mpirun`: every algorithm against the host-side reference on 4 and 8 ranks
//! over 1–4 emulated nodes (even and uneven), and a rank that never arrives (the others must name it
//! and the job must end). Built without `--features mpi` they show as ignored, naming `scripts/test-mpi.sh`
//! (installs OpenMPI and runs them); with the feature, a missing `mpirun` fails them.

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One mpirun at a time: the tests share 2 cores.
static MPIRUN: Mutex<()> = Mutex::new(());

fn require_mpirun() {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mpirun is not installed: scripts/test-mpi.sh installs OpenMPI and runs the multi-rank tests");
}

/// The `piper-comm` binary: it exists only when built with `--features mpi` (its required feature).
fn binary() -> &'static str {
    match option_env!("CARGO_BIN_EXE_piper-comm") {
        Some(bin) => bin,
        None => panic!("the piper-comm binary is built with --features mpi: run scripts/test-mpi.sh"),
    }
}

/// Runs `mpirun -np N piper-comm ARGS`, killing it after `limit`; returns (success, stdout + stderr).
fn launch(np: usize, args: &[&str], limit: Duration) -> (bool, String) {
    require_mpirun();
    let bin = binary();
    let _one_at_a_time = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new("mpirun")
        .args([
            "--oversubscribe",
            "--mca",
            "mpi_yield_when_idle",
            "1",
            "--mca",
            "btl",
            "self,vader,tcp",
            "-np",
            &np.to_string(),
        ])
        .arg(bin)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait on mpirun") {
            let out = child.wait_with_output().expect("mpirun output");
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            return (status.success(), text);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("mpirun output");
            panic!(
                "mpirun -np {np} {args:?} hung for {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn algorithms_match_the_reference_under_mpirun() {
    // (ranks, ranks per node): 1, 2 and 4 emulated nodes, and uneven nodes (3 + 3 + 2).
    for (np, per_node) in [(4, 4), (4, 2), (8, 8), (8, 4), (8, 2), (8, 3)] {
        let (ok, out) = launch(
            np,
            &["--ranks-per-node", &per_node.to_string(), "selftest", "--seed", &(np * 10 + per_node).to_string()],
            Duration::from_secs(120),
        );
        let nodes = np.div_ceil(per_node);
        assert!(ok, "np {np}, {per_node} per node failed:\n{out}");
        assert!(out.contains(&format!("ALL CHECKS PASSED size={np} nodes={nodes}")), "np {np}:\n{out}");
        assert_eq!(out.matches("OK rank").count(), np, "np {np}:\n{out}");
    }
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn a_missing_rank_is_named_and_the_job_ends() {
    let start = Instant::now();
    let (ok, out) = launch(4, &["--timeout-s", "2", "selftest", "--absent-rank", "2"], Duration::from_secs(60));
    assert!(!ok, "the job must fail:\n{out}");
    assert!(out.contains("still waiting for world ranks [2]"), "{out}");
    assert!(out.contains("barrier (failure test)") && out.contains("group `world`"), "{out}");
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
}

/// Sizes the user gives are checked against this machine's memory before anything is allocated (one
/// process, no mpirun needed): an absurd `--sizes` or `--dispatch-tokens` is one error line, not an abort.
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn absurd_benchmark_sizes_are_refused_before_allocation() {
    let bin = binary();
    for (args, want) in [
        (&["bench", "--sizes", "100GiB"][..], "more than this machine's"),
        (&["bench", "--dispatch-top-k", "2", "--dispatch-tokens", "1000000000000"][..], "exceeds this machine's"),
        (&["bench", "--dispatch-top-k", "2", "--row-bytes", "0"][..], "`--row-bytes` must be ≥ 1"),
        (&["bench", "--sizes", "99999999999999999GiB"][..], "is not a size"),
        (&["bench", "--iters", "0"][..], "`--iters` is 0"),
    ] {
        let out = Command::new(bin).args(args).output().expect("piper-comm runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.status.code().is_some(), "{args:?}: {:?} {err}", out.status);
        assert!(err.lines().any(|l| l.starts_with("error:") && l.contains(want)), "{args:?}: {err}");
    }
}
