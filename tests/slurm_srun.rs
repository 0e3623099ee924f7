//! `mixtral_train` launched by Slurm as a cluster launches it (`srun --mpi=pmix`, each rank learning the
//! world from PMIx and the ranks on its node from Slurm): EP=2 on 2 tasks, PP=2 × EP=2 (1F1B, 4
//! micro-batches) and EP=2 × DP=2 on 4, each equal step by step to the same layout under `mpirun`;
//! `scancel --signal=USR1` (what `sbatch --signal=USR1@…` sends ahead of a time limit) makes every rank
//! finish its step and the run save and exit 0, and `srun … --resume` continues bit for bit; the batch
//! script `docs/slurm/frontier.sbatch` (its node and GPU options overridden for one node without GPUs)
//! trains a `piper plan` plan, is signalled through its batch shell, saves, and submitted again continues
//! bit for bit.
//! Needs a Slurm cluster: `scripts/slurm-local.sh start` makes one on this machine (CI does; see
//! `.ci/run`). Built without `--features mpi` these tests show as ignored; with it, a missing `srun` or
//! cluster fails them.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{COMMON, example, losses, run};
use piper_test_support::assert_close;

/// `srun --mpi=pmix -n np mixtral_train COMMON args` (more tasks than cores allowed, as on a laptop).
fn srun(np: usize, name: &str, args: &[&str]) -> Command {
    require_slurm();
    let mut cmd = Command::new("srun");
    cmd.args(["--mpi=pmix", "--overcommit", "--job-name", name, "-n", &np.to_string()]);
    cmd.env("OMPI_MCA_mpi_yield_when_idle", "1");
    cmd.arg(example()).args(COMMON).args(args);
    cmd
}

/// Fails the test when no Slurm cluster answers (a test that needs one never passes without running).
fn require_slurm() {
    // The partition's availability: `up` whether its node is idle or running another test's job.
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%a"])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == "up"));
    assert!(
        up,
        "no Slurm cluster answers `sinfo`: `scripts/slurm-local.sh start` makes one here and prints its SLURM_CONF"
    );
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI and Slurm: scripts/slurm-local.sh start, then cargo test --features mpi --test slurm_srun"
)]
fn srun_launches_equal_mpirun() {
    let dir = common::scratch("srun");
    for (name, np, args) in [
        ("ep2", 2, vec!["--ep", "2"]),
        ("pp2ep2-1f1b", 4, vec!["--pp", "2", "--ep", "2", "--micro-batches", "4"]),
        ("ep2dp2", 4, vec!["--ep", "2", "--dp", "2"]),
    ] {
        let file = |launcher: &str| dir.join(format!("{name}-{launcher}.jsonl"));
        let (srun_file, mpirun_file) = (file("srun"), file("mpirun"));
        let srun_args = [args.as_slice(), &["--metrics", srun_file.to_str().unwrap()]].concat();
        let (ok, out) = run(srun(np, &format!("piper-{name}"), &srun_args), Duration::from_secs(300));
        assert!(ok, "{name} under srun failed:\n{out}");
        assert!(!out.contains("launch with mpirun"), "a rank saw a world of one:\n{out}");
        let mut cmd = common::mpirun(np, &[], &example());
        cmd.args(COMMON).args(&args).args(["--metrics", mpirun_file.to_str().unwrap()]);
        let (ok, out) = run(cmd, Duration::from_secs(300));
        assert!(ok, "{name} under mpirun failed:\n{out}");
        let (got, want) = (losses(&file("srun")), losses(&file("mpirun")));
        assert_eq!(got.len(), 20, "{name}");
        let worst = assert_close(name, &got, &want, 1e-9);
        eprintln!("{name}: srun against mpirun, worst relative loss difference {worst:e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI and Slurm: scripts/slurm-local.sh start, then cargo test --features mpi --test slurm_srun"
)]
fn scancel_signal_saves_and_srun_resumes_bit_exact() {
    let dir = common::scratch("srun-scancel");
    let job = format!("piper-scancel-{}", std::process::id());
    let ep2 = |extra: &[&str]| srun(2, &job, &[["--ep", "2", "--steps", "40"].as_slice(), extra].concat());
    common::signal_saves_and_resume_continues(&dir, ep2, "USR1", |_| {
        let sent = Command::new("scancel").args(["--signal=USR1", "--name", &job]).status().expect("scancel");
        assert!(sent.success(), "scancel --signal=USR1 --name {job} failed");
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI and Slurm: scripts/slurm-local.sh start, then cargo test --features mpi --test slurm_srun"
)]
fn the_frontier_batch_script_saves_when_signalled_and_continues_when_resubmitted() {
    let dir = common::scratch("sbatch");
    let path = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let mut plan = Command::new(common::binary("", "piper"));
    plan.args(["plan", "--model", "tiny", "--platform", "local", "--gpus", "2", "--global-batch", "8"]);
    plan.args(["--seq-len", "31", "--ep", "2", "--out", &path("plan.json")]);
    let (ok, out) = run(plan, Duration::from_secs(60));
    assert!(ok, "piper plan failed:\n{out}");
    let train = ["--steps", "40", "--lr", "5e-3", "--warmup", "4", "--seed", "3", "--no-progress", "--log-every", "0"];
    let mut whole = Command::new("srun");
    whole.args(["--mpi=pmix", "--overcommit", "-n", "2"]).arg(example());
    whole.args(["--plan", &path("plan.json"), "--metrics", &path("whole.jsonl")]).args(train);
    let (ok, out) = run(whole, Duration::from_secs(300));
    assert!(ok, "{out}");
    let job = format!("piper-sbatch-{}", std::process::id());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/slurm/frontier.sbatch");
    let sbatch = || {
        require_slurm();
        let mut cmd = Command::new("sbatch");
        cmd.args(["--wait", "--job-name", &job, "--chdir", &path(""), "--output", &path("job-%j.out")]);
        cmd.args(["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-task=0", "--gpu-bind=none"]);
        cmd.args(["--time=10", script]).env("PIPER_BIN", example()).env("OMPI_MCA_mpi_yield_when_idle", "1");
        cmd.args(["--metrics", &path("run.jsonl")]).args(train);
        cmd
    };
    let (ok, out) = common::run_signalled(sbatch(), &dir.join("run.jsonl"), 3, Duration::from_secs(300), |_| {
        let sent =
            Command::new("scancel").args(["--batch", "--signal=USR1", "--name", &job]).status().expect("scancel");
        assert!(sent.success(), "scancel --batch --signal=USR1 --name {job} failed");
    });
    let job_output = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("job-"))
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let log = job_output();
    assert!(ok && log.contains("stopped by SIGUSR1: saved"), "{out}\n{log}");
    let want = losses(&dir.join("whole.jsonl"));
    let cut = losses(&dir.join("run.jsonl"));
    assert!(cut.len() < 40 && cut == want[..cut.len()], "{cut:?}");
    let (ok, out) = run(sbatch(), Duration::from_secs(300));
    assert!(ok && job_output().contains("resuming from"), "{out}\n{}", job_output());
    assert_eq!(losses(&dir.join("run.jsonl")), want, "the resubmitted job's metrics continue the first's");
    std::fs::remove_dir_all(&dir).unwrap();
}
