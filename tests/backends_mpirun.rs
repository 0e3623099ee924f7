//! The expert exchange on every backend the kernels support: `mixtral_train --backend ndarray` and
//! `--backend wgpu` (lavapipe in CI) under `mpirun -np 2 --ep 2` equal the same backend on one process
//! (host-staged exchange; device-aware transports are future work). Built with `--release --features
//! mpi,ndarray,wgpu` (see `.ci/run`: the example must be built with the same features and profile); a
//! missing mpirun fails.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{example, losses};
use piper_test_support::assert_close;

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

fn run(cmd: Command, what: &str) {
    let (ok, text) = common::run(cmd, Duration::from_secs(1200));
    assert!(ok, "{what} failed:\n{text}");
}

fn equal_to_one_process(backend: &str) {
    let dir = common::scratch(&format!("backend-{backend}"));
    let (single, multi) = (dir.join("single.jsonl"), dir.join("ep2.jsonl"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--backend", backend, "--metrics", single.to_str().unwrap()]);
    run(cmd, &format!("{backend}, one process"));
    let mut cmd = common::mpirun(2, &[], &example());
    cmd.args(COMMON).args(["--backend", backend, "--ep", "2", "--metrics", multi.to_str().unwrap()]);
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
