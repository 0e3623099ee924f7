//! Helpers shared by the tests that run the workspace's binaries (`mixtral_train`, `piper`) as a user
//! would: locate them, run them with a time limit, launch them under `mpirun`, read their metrics.
#![allow(dead_code)] // each test file uses a subset

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One child process at a time: the tests share 2 cores, and concurrent `mpirun`s oversubscribe them.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `mixtral_train` flags of the runs the command-line and multi-rank tests compare: 20 steps of the tiny
/// model on a short batch, quietly.
pub const COMMON: &[&str] = &[
    "--steps",
    "20",
    "--batch-size",
    "8",
    "--seq-len",
    "31",
    "--lr",
    "5e-3",
    "--warmup",
    "4",
    "--seed",
    "3",
    "--no-progress",
    "--log-every",
    "0",
];

/// A binary of the workspace, under target/<profile>/ (`sub` = "examples" for an example, "" for a bin).
pub fn binary(sub: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let bin = dir.join(sub).join(name);
    assert!(bin.exists(), "{} is missing: `cargo test` builds it (with the features of this test run)", bin.display());
    bin
}

/// `target/<profile>/examples/mixtral_train`, built by `cargo test` with this test's features.
pub fn example() -> PathBuf {
    binary("examples", "mixtral_train")
}

/// Runs a command to completion, or kills it and fails the test after `limit`; returns (success,
/// stdout + stderr). A test's runs stay out of the user's history of training runs (`PIPER_HISTORY=off`)
/// unless the command names one.
pub fn run(cmd: Command, limit: Duration) -> (bool, String) {
    let (status, text) = run_polling(cmd, limit, |_| {});
    (status.success(), text)
}

/// [`run`], returning the exit status itself (a refusal's exit code, a signal).
pub fn run_status(cmd: Command, limit: Duration) -> (ExitStatus, String) {
    run_polling(cmd, limit, |_| {})
}

/// [`run_status`], calling `poll` with the child's pid every 20 ms while it runs.
fn run_polling(mut cmd: Command, limit: Duration, mut poll: impl FnMut(u32)) -> (ExitStatus, String) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !cmd.get_envs().any(|(k, _)| k == "PIPER_HISTORY") {
        cmd.env("PIPER_HISTORY", "off");
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            return (status, text);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "hung for {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        poll(child.id());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a training command and, once its metrics file holds `after` lines, calls `send` with its pid (to
/// signal it: [`kill`], `scancel`); returns (success, stdout + stderr). Fails the test if nothing was sent
/// in `limit`.
pub fn run_signalled(
    cmd: Command,
    metrics: &Path,
    after: usize,
    limit: Duration,
    mut send: impl FnMut(u32),
) -> (bool, String) {
    let mut sent = false;
    let (status, text) = run_polling(cmd, limit, |pid| {
        let lines = std::fs::read_to_string(metrics).map_or(0, |t| t.lines().count());
        if !sent && lines >= after {
            send(pid);
            sent = true;
        }
    });
    assert!(sent, "the run ended before it was signalled:\n{text}");
    (status.success(), text)
}

/// Preemption end to end: `launch(flags)` (a run of 40 steps with `flags` added) trains uninterrupted; a
/// second run is sent `signal` by `send` (given its pid) once it has 3 steps, and must finish its step,
/// save into a checkpoint folder, say `stopped by SIG<signal>: saved` and exit 0 with the uninterrupted
/// losses so far; resumed from that folder, it must train the remaining steps with the uninterrupted
/// run's losses, bit for bit. `dir` holds the files.
pub fn signal_saves_and_resume_continues(
    dir: &Path,
    launch: impl Fn(&[&str]) -> Command,
    signal: &str,
    send: impl FnMut(u32),
) {
    let path = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let (ok, out) = run(launch(&["--metrics", &path("whole.jsonl")]), Duration::from_secs(300));
    assert!(ok, "{out}");
    let whole = losses(&dir.join("whole.jsonl"));
    assert_eq!(whole.len(), 40, "the uninterrupted run");
    let cmd = launch(&["--metrics", &path("cut.jsonl"), "--checkpoint-dir", &path("ck")]);
    let (ok, out) = run_signalled(cmd, &dir.join("cut.jsonl"), 3, Duration::from_secs(300), send);
    assert!(ok && out.contains(&format!("stopped by SIG{signal}: saved")), "{out}");
    let cut = losses(&dir.join("cut.jsonl"));
    assert!(cut.len() < 40, "stopped early: {} steps", cut.len());
    assert_eq!(cut, whole[..cut.len()]);
    let (ok, out) = run(launch(&["--metrics", &path("rest.jsonl"), "--resume", &path("ck")]), Duration::from_secs(300));
    assert!(ok, "{out}");
    assert_eq!(losses(&dir.join("rest.jsonl")), whole[cut.len()..], "resumed after step {}", cut.len());
}

/// Sends `signal` to `pid` with the shell's own `kill` (a fresh machine may not have /bin/kill).
pub fn kill(signal: &str, pid: u32) {
    let sent = Command::new("sh").args(["-c", &format!("kill -s {signal} {pid}")]).status().expect("sh");
    assert!(sent.success(), "kill -s {signal} {pid} failed");
}

/// Fails the test when `mpirun` is missing: a test that needs it never passes without running.
pub fn require_mpirun() {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mpirun is not installed: scripts/test-mpi.sh installs OpenMPI and runs the multi-rank tests");
}

/// `mpirun -np np BIN` (oversubscribed, yielding when idle, allowed as root) with `env` exported to the
/// ranks; the caller adds BIN's arguments.
pub fn mpirun(np: usize, env: &[(&str, &str)], bin: &Path) -> Command {
    require_mpirun();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", &np.to_string()]);
    for (k, v) in env {
        cmd.env(k, v);
        cmd.args(["-x", k]);
    }
    cmd.arg(bin).env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

/// The `loss` of every line of a metrics JSONL file, in order.
pub fn losses(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("metrics file {}: {e}", path.display()))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            v["loss"].as_f64().expect("loss")
        })
        .collect()
}

/// A fresh scratch directory under the system temp dir, unique to this process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("piper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Output targets that are not regular files, made in `dir`: a FIFO with a reader already waiting on it
/// (join it for everything written), and a character device (the null device made with `mknod` as root,
/// else `/dev/null`).
#[cfg(unix)]
pub fn special_outputs(dir: &Path) -> (PathBuf, std::thread::JoinHandle<String>, PathBuf) {
    let fifo = dir.join("output.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs").success());
    let node = dir.join("null");
    let made = Command::new("mknod").arg(&node).args(["c", "1", "3"]).status().is_ok_and(|s| s.success());
    let device = if made { node } else { PathBuf::from("/dev/null") };
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).expect("the FIFO reads"))
    };
    (fifo, reader, device)
}

/// A `--trace` file: every process's name and its instruction spans (name and micro-batch, in the order
/// they began), as the schedule names them; the file must be a trace-event JSON object.
pub fn traced_instructions(path: &Path) -> std::collections::BTreeMap<u64, (String, Vec<serde_json::Value>)> {
    use piper_planner::schedule::Instr;
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    let names: Vec<String> = [
        Instr::LoadMicroBatch(0),
        Instr::Forward(0),
        Instr::Backward(0),
        Instr::RecvActivation(0),
        Instr::SendActivation(0),
        Instr::RecvGrad(0),
        Instr::SendGrad(0),
        Instr::ReduceGrads,
        Instr::OptimizerStep,
    ]
    .iter()
    .map(|i| serde_json::to_value(i).unwrap()["instr"].as_str().unwrap().to_string())
    .collect();
    let mut out = std::collections::BTreeMap::new();
    for e in events {
        let pid = e["pid"].as_u64().expect("every event has a pid");
        let entry = out.entry(pid).or_insert_with(|| (String::new(), Vec::new()));
        if e["ph"] == "M" && e["name"] == "process_name" {
            entry.0 = e["args"]["name"].as_str().unwrap().to_string();
        }
        let name = e["name"].as_str().unwrap_or("");
        if (e["ph"] == "B" || e["ph"] == "X") && names.iter().any(|n| n == name) {
            // tracing-chrome records fields as text.
            let mb = &e["args"]["micro_batch"];
            let mb = mb.as_u64().or_else(|| mb.as_str().and_then(|s| s.parse().ok()));
            let mut v = serde_json::json!({"instr": name});
            if let Some(mb) = mb {
                v["micro_batch"] = mb.into();
            }
            entry.1.push(v);
        }
    }
    out
}

/// The instruction stream of `stage` for `steps` steps, as [`traced_instructions`] reads it.
pub fn expected_instructions(
    schedule: piper_planner::layout::Schedule,
    stage: u64,
    pp: u64,
    m: u64,
    steps: usize,
) -> Vec<serde_json::Value> {
    let one = piper_planner::schedule::instructions(schedule, stage, pp, m);
    (0..steps).flat_map(|_| one.iter().map(|i| serde_json::to_value(i).unwrap())).collect()
}
