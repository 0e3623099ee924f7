//! The expert exchange on every backend the kernels support: `mixtral_train --backend ndarray` and
//! `--backend wgpu` (lavapipe in CI) under `mpirun -np 2 --ep 2` equal the same backend on one process
//! (host-staged exchange; device-aware transports are future work). Built with `--release --features
//! mpi,ndarray,wgpu` (see `.ci/run`: the example must be built with the same features and profile); a
//! missing mpirun fails.

use std::path::PathBuf;
use std::process::Command;

use piper::testing::assert_close;

fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let bin = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").join("examples").join("mixtral_train");
    assert!(bin.exists(), "{} is missing: build it with `--release --features mpi,ndarray,wgpu`", bin.display());
    bin
}

const COMMON: &[&str] = &[
    // The peak is given: timing 1024³ GEMMs in a debug build takes minutes on lavapipe.
    "--peak-tflops",
    "1",
    "--steps",
    "6",
    "--batch-size",
    "4",
    "--seq-len",
    "15",
    "--lr",
    "5e-3",
    "--warmup",
    "2",
    "--seed",
    "3",
    "--no-progress",
    "--log-every",
    "0",
];

fn losses(path: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .expect("metrics file")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON line")["loss"].as_f64().expect("loss"))
        .collect()
}

fn run(mut cmd: Command, what: &str) {
    let out = cmd.output().expect("spawn");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{text}");
}

fn equal_to_one_process(backend: &str) {
    let dir = std::env::temp_dir().join(format!("piper-backend-{backend}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (single, multi) = (dir.join("single.jsonl"), dir.join("ep2.jsonl"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--backend", backend, "--metrics", single.to_str().unwrap()]);
    run(cmd, &format!("{backend}, one process"));
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "2"])
        .arg(example())
        .args(COMMON)
        .args(["--backend", backend, "--ep", "2", "--metrics", multi.to_str().unwrap()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    run(cmd, &format!("{backend}, mpirun -np 2 --ep 2"));
    let worst = assert_close(backend, &losses(&multi), &losses(&single), 1e-4);
    eprintln!("{backend}: EP=2 under mpirun vs one process, worst relative loss difference {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn expert_parallel_on_ndarray_equals_one_process() {
    equal_to_one_process("ndarray");
}

#[test]
fn expert_parallel_on_wgpu_equals_one_process() {
    equal_to_one_process("wgpu");
}
