//! `mixtral_train` under mpirun equals the one-process run with default flags (global load-balancing
//! loss, global-norm clipping): 4 ranks as EP=4, EP=2×DP=2 (HALO), DP=4, PP=2×EP=2 (1F1B, 4
//! micro-batches) and PP=2×DP=2 (GPipe, 2 micro-batches) give the same loss curve over 20 steps as one
//! process with the same micro-batch count, within 1e-4 relative per step. A plan written by `piper plan
//! --out` drives a 4-rank run and its summary reports the plan's layout. A rank that hangs is named by
//! the others within the timeout, and the job ends; a rank that exits ends the job. Prepared token
//! shards, each rank reading its share of a batch, give the one-process losses under PP×EP and EP×DP.
//! Shared experts computed while the dispatch's rows travel (`--overlap on`; EP=2 and PP=2×EP=2 of
//! tiny-deepseek) equal one process, and `--overlap off` bit for bit.
//! Built without `--features mpi` (the README's `cargo test --workspace`), these tests show as ignored
//! and name `scripts/test-mpi.sh`, which installs OpenMPI and runs them; with the feature, a missing
//! `mpirun` fails them.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{COMMON, binary, example, losses, run};
use piper_test_support::assert_close;

/// `mpirun -np np mixtral_train COMMON args` with `env` exported to the ranks.
fn mpirun(np: usize, env: &[(&str, &str)], args: &[&str]) -> Command {
    mpirun_with(np, env, COMMON, args)
}

fn mpirun_with(np: usize, env: &[(&str, &str)], common: &[&str], args: &[&str]) -> Command {
    let mut cmd = common::mpirun(np, env, &example());
    cmd.args(common).args(args);
    cmd
}

/// One process with `m` micro-batches (what a layout with `m` micro-batches equals).
fn one_process(dir: &std::path::Path, m: usize, extra: &[&str]) -> Vec<f64> {
    let path = dir.join(format!("single-m{m}.jsonl"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(extra).args(["--micro-batches", &m.to_string(), "--metrics", path.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(300));
    assert!(ok, "single-process run failed:\n{out}");
    losses(&path)
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn four_ranks_equal_one_process() {
    let dir = common::scratch("parallel");
    let reference = one_process(&dir, 1, &[]);
    assert_eq!(reference.len(), 20);
    assert!(reference[19] < reference[0], "the run must learn: {reference:?}");
    for (name, m, args) in [
        ("ep4", 1, vec!["--ep", "4"]),
        ("ep2dp2-halo", 1, vec!["--ep", "2", "--dp", "2", "--all-to-all", "halo"]),
        ("dp4", 1, vec!["--dp", "4"]),
        ("pp2ep2-1f1b", 4, vec!["--pp", "2", "--ep", "2", "--micro-batches", "4"]),
        ("pp2dp2-gpipe", 2, vec!["--pp", "2", "--dp", "2", "--micro-batches", "2", "--schedule", "gpipe"]),
    ] {
        let want = if m == 1 { reference.clone() } else { one_process(&dir, m, &[]) };
        let path = dir.join(format!("{name}.jsonl"));
        let mut args = args.clone();
        args.extend(["--metrics", path.to_str().unwrap()]);
        let (ok, out) = run(mpirun(4, &[("PIPER_RANKS_PER_NODE", "2")], &args), Duration::from_secs(300));
        assert!(ok, "{name} failed:\n{out}");
        let worst = assert_close(name, &losses(&path), &want, 1e-4);
        eprintln!("{name}: worst relative loss difference over 20 steps {worst:e} (one process, M={m})");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn a_plan_file_from_piper_plan_drives_a_four_rank_run() {
    let dir = common::scratch("planfile");
    let plan = dir.join("plan.json");
    let (ok, out) = run(
        {
            let mut c = Command::new(binary("", "piper"));
            c.args(["plan", "--model", "tiny", "--platform", "local", "--gpus", "4", "--global-batch", "8"]);
            // Default dtype and recomputation: on `local` the planner writes a plan the runtime runs.
            c.args(["--seq-len", "31", "--pp", "2", "--ep", "2"]);
            c.args(["--out", plan.to_str().unwrap()]);
            c
        },
        Duration::from_secs(60),
    );
    assert!(ok, "piper plan failed:\n{out}");
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let m = written["num_micro_batches"].as_u64().unwrap() as usize;
    let (summary, metrics) = (dir.join("summary.json"), dir.join("run.jsonl"));
    // Not COMMON: batch and sequence length come from the plan file.
    let args = [
        ["--plan", plan.to_str().unwrap(), "--steps", "20", "--lr", "5e-3", "--warmup", "4", "--seed", "3"].as_slice(),
        &["--no-progress", "--log-every", "0", "--summary", summary.to_str().unwrap()],
        &["--metrics", metrics.to_str().unwrap()],
    ]
    .concat();
    let (ok, out) = run(mpirun_with(4, &[], &[], &args), Duration::from_secs(300));
    assert!(ok, "the planned run failed:\n{out}");
    assert!(out.contains("plan (local platform): PP=2 × EP=2 × DP=1"), "{out}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(s["layout"], serde_json::json!({"pp": 2, "ep": 2, "dp": 1}));
    assert_eq!(s["micro_batches"].as_u64(), Some(m as u64));
    assert_eq!(s["steps"].as_u64(), Some(20));
    assert_eq!(s["peak_rss_bytes"].as_array().map(Vec::len), Some(4));
    // Every rank's heap peak, each under its own peak RSS.
    let heap: Vec<u64> = serde_json::from_value(s["peak_heap_bytes"].clone()).unwrap();
    let rss: Vec<u64> = serde_json::from_value(s["peak_rss_bytes"].clone()).unwrap();
    assert!(heap.len() == 4 && heap.iter().zip(&rss).all(|(h, r)| *h > 0 && h <= r), "{heap:?} {rss:?}");
    assert_eq!(s["predicted"], written["predicted"]);
    for field in ["step_time_median_s", "tokens_per_s", "mfu", "bubble_measured", "final_loss"] {
        assert!(s[field].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "{field}: {}", s[field]);
    }
    // The same run as one process with the plan's micro-batch count.
    let want = one_process(&dir, m, &[]);
    let worst = assert_close("plan file (pp2ep2)", &losses(&metrics), &want, 1e-4);
    eprintln!("plan file pp2ep2 M={m}: worst relative loss difference {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Forced expert migrations under mpirun (threshold 1, a check every 3 steps, the threshold rule): the
/// loss curve equals the run without migration, for EP=2, EP=4 and PP=2×EP=2; a skewed workload
/// (`--hot-experts 2:4`, both hot experts on rank 0) is rebalanced by the plan's policy (payoff
/// decision) with a shorter check interval.
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn expert_migration_under_mpirun_preserves_the_loss_curve() {
    let dir = common::scratch("migration");
    let events = |path: &std::path::Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .flat_map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["migration"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    };
    for (name, np, layout) in
        [("ep2", 2, vec!["--ep", "2"]), ("pp2ep2", 4, vec!["--pp", "2", "--ep", "2", "--micro-batches", "2"])]
    {
        let (on, off) = (dir.join(format!("{name}-on.jsonl")), dir.join(format!("{name}-off.jsonl")));
        let mut args = layout.clone();
        args.extend(["--migration-threshold", "1", "--migration-every", "3", "--migration-decision", "threshold"]);
        args.extend(["--metrics", on.to_str().unwrap()]);
        let (ok, out) = run(mpirun(np, &[], &args), Duration::from_secs(300));
        assert!(ok, "{name} with migration failed:\n{out}");
        let mut args = layout.clone();
        args.extend(["--migration", "off", "--metrics", off.to_str().unwrap()]);
        let (ok, out) = run(mpirun(np, &[], &args), Duration::from_secs(300));
        assert!(ok, "{name} without migration failed:\n{out}");
        let moved = events(&on);
        assert!(!moved.is_empty(), "{name}: no migration happened");
        assert!(events(&off).is_empty());
        let worst = assert_close(&format!("{name} migration"), &losses(&on), &losses(&off), 1e-5);
        eprintln!("{name}: {} migrations, worst relative loss difference {worst:e}", moved.len());
    }
    let hot = dir.join("hot.jsonl");
    let args = ["--ep", "2", "--hot-experts", "2:4", "--migration-every", "5", "--metrics", hot.to_str().unwrap()];
    let (ok, out) = run(mpirun(2, &[], &args), Duration::from_secs(300));
    assert!(ok, "hot experts failed:\n{out}");
    let first = events(&hot).into_iter().next().expect("the skewed workload is rebalanced");
    let (before, after) = (first["imbalance_before"].as_f64().unwrap(), first["imbalance_after"].as_f64().unwrap());
    assert!(before > 1.1 && after < before, "imbalance {before} → {after} (the plan's threshold is 1.1)");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn overlapped_communication_equals_one_process() {
    // tiny-deepseek has shared experts: with `--overlap on` they compute while the posted dispatch's
    // rows travel (point-to-point messages), with `off` before a blocking MPI_Alltoallv; alone and in a
    // pipeline.
    let dir = common::scratch("overlap");
    let model = ["--preset", "tiny-deepseek"];
    for (name, np, m, layout) in
        [("ep2", 2, 1, vec!["--ep", "2"]), ("pp2ep2", 4, 4, vec!["--pp", "2", "--ep", "2", "--micro-batches", "4"])]
    {
        let single = one_process(&dir, m, &model);
        let mut curves = Vec::new();
        for overlap in ["on", "off"] {
            let path = dir.join(format!("{name}-{overlap}.jsonl"));
            let flags = ["--overlap", overlap, "--metrics", path.to_str().unwrap()];
            let args = [&model[..], &layout, &flags].concat();
            let (ok, out) = run(mpirun(np, &[], &args), Duration::from_secs(300));
            assert!(ok, "{name} --overlap {overlap}:\n{out}");
            let worst = assert_close(&format!("{name} --overlap {overlap}"), &losses(&path), &single, 1e-4);
            eprintln!("tiny-deepseek {name} --overlap {overlap}: worst relative loss difference {worst:e}");
            curves.push(losses(&path));
        }
        assert_eq!(curves[0], curves[1], "{name}: overlapping changes no bit");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn expert_group_members_with_zero_tokens_equal_one_process() {
    // A zero router sends every token to experts 0 and 1 at first: with EP=4 over 8 experts, ranks
    // 1-3 hold experts that get no tokens, and their rows of the all-to-all are empty.
    let dir = common::scratch("zero");
    let (single, multi) = (dir.join("single.jsonl"), dir.join("ep4.jsonl"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--zero-router", "--metrics", single.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(300));
    assert!(ok, "{out}");
    let args = ["--zero-router", "--ep", "4", "--metrics", multi.to_str().unwrap()];
    let (ok, out) = run(mpirun(4, &[], &args), Duration::from_secs(300));
    assert!(ok, "{out}");
    // With every token tied, round-off (a different summation order of the expert gradients) decides
    // later top-k ties differently in the two runs and the curves drift apart after a few updates;
    // the first steps are the ones with empty expert ranks, and they must agree.
    let (a, b) = (losses(&multi), losses(&single));
    assert_eq!((a.len(), b.len()), (20, 20));
    let worst = assert_close("zero-router ep4, first 4 steps", &a[..4], &b[..4], 1e-4);
    eprintln!("zero-router ep4: worst relative loss difference over the first 4 steps {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn a_hung_rank_is_named_and_a_dead_rank_ends_the_job() {
    let start = Instant::now();
    let env =
        [("PIPER_COMM_TIMEOUT_S", "3"), ("PIPER_FAULT_RANK", "2"), ("PIPER_FAULT_STEP", "1"), ("PIPER_FAULT", "hang")];
    let (ok, out) = run(mpirun(4, &env, &["--ep", "2", "--dp", "2"]), Duration::from_secs(120));
    assert!(!ok, "the job must fail:\n{out}");
    assert!(out.contains("still waiting for world ranks [2]"), "{out}");
    assert!(out.contains("timed out after 3s"), "{out}");
    assert!(start.elapsed() < Duration::from_secs(60), "took {:?}", start.elapsed());
    let env = [("PIPER_FAULT_RANK", "1"), ("PIPER_FAULT_STEP", "1"), ("PIPER_FAULT", "exit")];
    let (ok, out) = run(mpirun(4, &env, &["--ep", "4"]), Duration::from_secs(120));
    assert!(!ok && out.contains("fault injection: this rank exits"), "{out}");
    // A peer that stops answering while experts move is named by its partner.
    let env = [("PIPER_COMM_TIMEOUT_S", "3"), ("PIPER_FAULT_RANK", "1"), ("PIPER_FAULT", "hang-in-migration")];
    let args =
        ["--ep", "2", "--migration-threshold", "1", "--migration-every", "2", "--migration-decision", "threshold"];
    let (ok, out) = run(mpirun(2, &env, &args), Duration::from_secs(120));
    assert!(!ok, "the job must fail:\n{out}");
    assert!(
        out.contains("expert migration of MoE layer 0") && out.contains("still waiting for world ranks [1]"),
        "{out}"
    );
}

/// Checkpoints under mpirun: saved by PP=2×EP=2 on 4 ranks and resumed by the same layout (bit for bit),
/// by one process (the same micro-batch count) and by EP=2 on 2 ranks (against one process resumed from
/// the same checkpoint with its micro-batch count), all within 1e-5 relative; saved by one process and
/// resumed by 4 ranks.
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn checkpoints_resume_and_reshard_under_mpirun() {
    let dir = common::scratch("ckpt-mpirun");
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let pp2ep2 = ["--pp", "2", "--ep", "2", "--micro-batches", "2"];
    let (ck4, whole4) = (path("ck4"), path("whole4.jsonl"));
    let mut args = pp2ep2.to_vec();
    args.extend(["--checkpoint-dir", &ck4, "--save-every", "10", "--metrics", &whole4]);
    let (ok, out) = run(mpirun(4, &[], &args), Duration::from_secs(300));
    assert!(ok, "saving run failed:\n{out}");
    let whole = losses(&dir.join("whole4.jsonl"));
    assert_eq!(whole.len(), 20);
    let resumed = |np: usize, layout: &[&str], from: &str, name: &str| -> Vec<f64> {
        let metrics = path(name);
        let mut args = layout.to_vec();
        args.extend(["--resume", from, "--metrics", &metrics]);
        let cmd = if np == 1 {
            let mut c = Command::new(example());
            c.args(COMMON).args(&args);
            c
        } else {
            mpirun(np, &[], &args)
        };
        let (ok, out) = run(cmd, Duration::from_secs(300));
        assert!(ok, "{name} failed:\n{out}");
        let l = losses(&dir.join(name));
        assert_eq!(l.len(), 10, "{name}: steps 10..19");
        l
    };
    let from = path("ck4/step-00000010");
    assert_eq!(resumed(4, &pp2ep2, &from, "same.jsonl"), whole[10..], "PP=2×EP=2 resumed bit for bit");
    let one = resumed(1, &["--micro-batches", "2"], &from, "one.jsonl");
    let worst = assert_close("PP2×EP2 → one process", &one, &whole[10..], 1e-5);
    eprintln!("checkpoint PP=2×EP=2 → one process: worst relative loss difference {worst:e}");
    let ep2 = resumed(2, &["--ep", "2"], &from, "ep2.jsonl");
    let one_m1 = resumed(1, &[], &from, "one-m1.jsonl");
    let worst = assert_close("PP2×EP2 → EP2", &ep2, &one_m1, 1e-5);
    eprintln!("checkpoint PP=2×EP=2 → EP=2: worst relative loss difference {worst:e}");
    // Saved by one process, resumed by four ranks.
    let (ck1, whole1) = (path("ck1"), path("whole1.jsonl"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args([
        "--micro-batches",
        "2",
        "--checkpoint-dir",
        &ck1,
        "--save-every",
        "10",
        "--metrics",
        &whole1,
    ]);
    let (ok, out) = run(cmd, Duration::from_secs(300));
    assert!(ok, "{out}");
    let whole1 = losses(&dir.join("whole1.jsonl"));
    let four = resumed(4, &pp2ep2, &path("ck1/step-00000010"), "four.jsonl");
    let worst = assert_close("one process → PP2×EP2", &four, &whole1[10..], 1e-5);
    eprintln!("checkpoint one process → PP=2×EP=2: worst relative loss difference {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn prepared_token_shards_under_mpirun_equal_one_process() {
    let dir = common::scratch("shards-mpirun");
    let text = dir.join("corpus.txt");
    let line = "The router scores each expert; the expert group dispatches tokens and combines them.\n";
    std::fs::write(&text, line.repeat(400)).unwrap();
    let prepared = dir.join("prepared");
    let tokenizer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/metaspace64.json");
    let mut prep = Command::new(binary("", "piper"));
    prep.args(["data", "prepare", "--tokenizer", tokenizer.to_str().unwrap(), "--data", text.to_str().unwrap()]);
    prep.args(["--out", prepared.to_str().unwrap(), "--shard-tokens", "3000", "--held-out-tokens", "1000"]);
    let (ok, out) = run(prep, Duration::from_secs(60));
    assert!(ok, "{out}");
    let data = ["--data", prepared.to_str().unwrap()];
    for (name, m, layout) in [
        ("pp2ep2", 2, vec!["--pp", "2", "--ep", "2"]),
        ("ep2dp2", 1, vec!["--ep", "2", "--dp", "2", "--all-to-all", "halo"]),
    ] {
        let want = one_process(&dir, m, &data);
        let path = dir.join(format!("{name}.jsonl"));
        let mut args = layout.clone();
        args.extend(data);
        let m_text = m.to_string();
        args.extend(["--micro-batches", &m_text, "--metrics", path.to_str().unwrap()]);
        let (ok, out) = run(mpirun(4, &[("PIPER_RANKS_PER_NODE", "2")], &args), Duration::from_secs(300));
        assert!(ok, "{name} failed:\n{out}");
        let worst = assert_close(name, &losses(&path), &want, 1e-4);
        eprintln!("prepared shards {name}: worst relative loss difference {worst:e} (one process, M={m})");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--trace` under PP=2×EP=2 (1F1B, 4 micro-batches): one merged trace, one process per rank named by
/// its place in the grid, each rank's instruction spans its stage's stream in schedule order every step,
/// and the expert ranks' exchanges inside them.
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn trace_has_one_process_per_rank_with_its_stages_schedule() {
    use piper_planner::layout::Schedule;
    let dir = common::scratch("trace-mpirun");
    let trace = dir.join("pp2ep2.json");
    let args = ["--pp", "2", "--ep", "2", "--micro-batches", "4", "--steps", "3", "--log-every", "1"];
    let args = [&args[..], &["--trace", trace.to_str().unwrap()]].concat();
    let (ok, out) = run(mpirun(4, &[], &args), Duration::from_secs(300));
    assert!(ok && out.contains("timeline written to"), "{out}");
    let traced = common::traced_instructions(&trace);
    assert_eq!(traced.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    for (rank, (name, instrs)) in &traced {
        let stage = rank / 2;
        assert!(name.starts_with(&format!("rank {rank}: stage {stage}, expert rank {}", rank % 2)), "{name}");
        assert_eq!(instrs, &common::expected_instructions(Schedule::OneFOneB, stage, 2, 4, 3), "rank {rank}");
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("expert_exchange"), "the expert exchanges are spans");
    assert!(text.contains("\"ph\":\"i\""), "the reporter's lines are instants");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGUSR1 to `mpirun` (Slurm's `--signal=USR1@…` ahead of a time limit; mpirun forwards it): every rank
/// finishes the step, the run saves and exits 0; resumed under mpirun, the rest equals the uninterrupted
/// run bit for bit.
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn sigusr1_under_mpirun_saves_every_rank_and_resumes_bit_exact() {
    let dir = common::scratch("sigusr1-mpirun");
    let ep2 = |extra: &[&str]| mpirun(2, &[], &[["--ep", "2", "--steps", "40"].as_slice(), extra].concat());
    common::signal_saves_and_resume_continues(&dir, ep2, "USR1", |pid| common::kill("USR1", pid));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A rank's threads follow the ranks on its host as MPI counts them (`MPI_Comm_split_type`), not the
/// launcher's variables: with every such variable removed from the ranks' environment, two unbound
/// ranks still share the host's cores (they each took every core before).
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn ranks_share_the_cores_as_mpi_counts_them() {
    common::require_mpirun();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--bind-to", "none", "-np", "2", "env"]);
    for var in ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"] {
        cmd.args(["-u", var]);
    }
    cmd.args(["-u", "RAYON_NUM_THREADS", "-u", "OMPI_MCA_orte_bound_at_launch"]);
    cmd.arg(example()).args(COMMON).args(["--ep", "2", "--steps", "1"]);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with("threads:")).unwrap_or_else(|| panic!("no threads line: {out}"));
    let cores = std::thread::available_parallelism().unwrap().get();
    let want = format!("threads: {} per rank ({cores} cores shared by 2 ranks on the host)", (cores / 2).max(1));
    assert_eq!(line, want, "{out}");
}

/// An author's own crate outside the workspace (`tests/author-crate`, which builds
/// `examples/custom_model.rs`: Burn's attention, LayerNorm, its own head, loss and held-out accuracy — a
/// model the library does not define — against the `piper` crate alone) on the runtime: as PP=2 × EP=2
/// under mpirun it gives the one-process losses and held-out metrics (same micro-batch count) within 1e-6
/// relative; resumed on one process from its checkpoint of step 3 it continues bit for bit; the same
/// checkpoint resumed as PP=2 × EP=2 continues within 1e-6; it reads its summary back.
#[test]
#[cfg_attr(
    not(feature = "mpi"),
    ignore = "needs MPI: run scripts/test-mpi.sh (installs OpenMPI, builds with --features mpi)"
)]
fn an_authors_own_crate_trains_as_pp2_ep2_like_one_process_and_resumes() {
    let dir = common::scratch("author-crate");
    let bin = binary("", "author_model");
    let checkpoints = dir.join("checkpoints");
    let step3 = checkpoints.join(piper::planner::checkpoint::folder_name(3));
    let base = ["--steps", "6", "--micro-batches", "2", "--eval-every", "3"];
    let train = |mut cmd: Command, name: &str, extra: &[&str]| {
        let path = dir.join(format!("{name}.jsonl"));
        let summary = dir.join(format!("{name}.summary.json"));
        cmd.args(base).args(extra).args(["--metrics", path.to_str().unwrap(), "--summary", summary.to_str().unwrap()]);
        let (ok, out) = run(cmd, Duration::from_secs(300));
        assert!(ok, "{name} failed:\n{out}");
        let metrics = read_metrics(&path);
        let last_eval = metrics.iter().rev().find(|m| m.eval_loss.is_some()).expect("an evaluation");
        let tail = &metrics[metrics.len().saturating_sub(10)..];
        let final_loss = tail.iter().map(|m| m.loss).sum::<f64>() / tail.len() as f64;
        let read_back = format!(
            "summary read back: {} steps, final loss {final_loss:.5}, held-out {:?}",
            metrics.len(),
            last_eval.eval_metrics
        );
        assert!(out.contains(&read_back), "{name}: no `{read_back}` in\n{out}");
        let held_out: Vec<f64> =
            metrics.iter().filter_map(|m| m.eval_loss.map(|l| [l, m.eval_metrics["accuracy"]])).flatten().collect();
        (metrics.iter().map(|m| m.loss).collect::<Vec<_>>(), held_out)
    };
    let ck = ["--checkpoint-dir", checkpoints.to_str().unwrap(), "--save-every", "3"];
    let (whole, whole_eval) = train(Command::new(&bin), "one-process", &ck);
    assert_eq!(whole_eval.len(), 4, "held-out loss and accuracy after steps 3 and 6");
    let pp2ep2 = ["--pp", "2", "--ep", "2"];
    let (four, four_eval) = train(common::mpirun(4, &[], &bin), "pp2ep2", &pp2ep2);
    let worst = assert_close("author's model, PP2×EP2 vs one process", &four, &whole, 1e-6);
    assert_close("author's held-out loss and accuracy, PP2×EP2", &four_eval, &whole_eval, 1e-6);
    println!("author's model PP2×EP2: worst relative difference {worst:.2e}");

    let resume = ["--resume", step3.to_str().unwrap()];
    let (resumed, _) = train(Command::new(&bin), "resumed", &resume);
    assert_eq!(resumed, whole[3..], "a resumed run continues bit for bit");
    let (resharded, _) = train(common::mpirun(4, &[], &bin), "resumed-pp2ep2", &[&pp2ep2[..], &resume[..]].concat());
    let worst = assert_close("author's model resumed as PP2×EP2", &resharded, &whole[3..], 1e-6);
    println!("author's model resumed as PP2×EP2: worst relative difference {worst:.2e}");
}

/// Every line of a metrics file (`--metrics`).
fn read_metrics(path: &std::path::Path) -> Vec<piper::runtime::StepMetrics> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("metrics file {}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).expect("a metrics line")).collect()
}
