//! `mixtral_train`'s command line on one process, run as a user would: `--plan auto` picks a layout and
//! reports its prediction error; every class of bad run configuration (checkpoint flags included) gets
//! one `error:` line naming the flag, exit code 2, and no work; layouts that need more ranks than the job
//! has are refused; a save killed midway leaves the previous checkpoint; a DeepSeek-V3 folder with an MTP
//! module trains only with `--mtp-loss-weight 0`; `--summary` to a FIFO or a device leaves it what it was.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{COMMON, binary, example, run};
use piper_test_support::hf_folder::{V5, hf_folder};

#[test]
fn plan_auto_picks_a_layout_and_reports_its_prediction_error() {
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--plan", "auto"]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    assert!(out.contains("plan (local platform): PP=1 × EP=1 × DP=1"), "{out}");
    assert!(out.contains("plan vs measured (local platform): step"), "{out}");
}

/// A plan `piper plan --out` writes with selective recompute (DeepSeek-style: a dense layer and shared
/// experts, whose SwiGLU activation it recomputes) trains as written, and its losses are those of the
/// same layout without recompute, bit for bit.
#[test]
fn a_selective_recompute_plan_from_piper_plan_trains() {
    let dir = common::scratch("selective-plan");
    let plan = dir.join("plan.json");
    let mut cmd = Command::new(binary("", "piper"));
    cmd.args(["plan", "--model", "tiny-deepseek", "--platform", "local", "--gpus", "1", "--global-batch", "8"]);
    cmd.args(["--seq-len", "31", "--recompute", "selective", "--out", plan.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(ok, "piper plan failed:\n{out}");
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(written["recompute"], "selective", "{written}");
    let m = written["num_micro_batches"].as_u64().unwrap().to_string();
    let train = |how: &[&str], metrics: &std::path::Path| {
        let mut cmd = Command::new(example());
        cmd.args(["--steps", "6", "--lr", "5e-3", "--warmup", "2", "--seed", "3", "--no-progress", "--log-every", "0"]);
        cmd.args(how).args(["--metrics", metrics.to_str().unwrap()]);
        let (ok, out) = run(cmd, Duration::from_secs(120));
        assert!(ok, "{how:?}:\n{out}");
        out
    };
    let (planned, kept) = (dir.join("planned.jsonl"), dir.join("kept.jsonl"));
    let out = train(&["--plan", plan.to_str().unwrap()], &planned);
    assert!(out.contains("recompute selective"), "{out}");
    let flags = ["--preset", "tiny-deepseek", "--batch-size", "8", "--seq-len", "31", "--micro-batches", &m];
    train(&[&flags[..], &["--recompute", "none"]].concat(), &kept);
    let (a, b) = (common::losses(&planned), common::losses(&kept));
    assert!(
        a.len() == 6 && b.len() == 6 && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "{a:?} vs {b:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run appends its line to the history (`--history FILE`), and the line holds what re-prices the run:
/// the planner, given the line's model, plan and settings, predicts what the run predicted.
#[test]
fn a_run_appends_the_line_that_re_prices_it_to_the_history() {
    use piper::planner::planner::price;
    let dir = std::env::temp_dir().join(format!("piper-run-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let history = dir.join("runs").join("history.jsonl");
    for _ in 0..2 {
        let mut cmd = Command::new(example());
        cmd.args(COMMON).args(["--platform", "frontier", "--history", history.to_str().unwrap()]);
        let (ok, out) = run(cmd, Duration::from_secs(120));
        assert!(ok, "{out}");
    }
    let lines = piper::planner::history::read(&history).unwrap();
    assert_eq!(lines.len(), 2);
    let r = &lines[1];
    assert_eq!((r.steps, r.plan.platform.as_str(), r.model.name.as_str()), (20, "frontier", "tiny"));
    assert!(r.step_time_median_s > 0.0 && r.peak_rss_bytes > 0.0, "{r:?}");
    let platform = piper::planner::platform::preset("frontier").unwrap();
    let again = price(&r.model, &platform, &r.plan.layout(), &r.config, r.plan.all_to_all, &r.plan.split()).unwrap();
    assert_eq!(again.step_time_s, r.plan.predicted.step_time_s);
    assert_eq!(again.peak_memory_bytes, r.plan.predicted.peak_memory_bytes());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--profile` prints where the steady steps went: the phases of the step, the fused operations inside
/// them with their GFLOP/s, and shares that add up to the step (each phase's operations and "other" to
/// the phase, the phases and "outside" to 100%).
#[test]
fn profile_prints_phases_and_operations_that_add_up_to_the_step() {
    let mut cmd = Command::new(example());
    cmd.args(COMMON).arg("--profile");
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let table: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("profile: 17 steady steps")).collect();
    assert!(table.len() > 3, "no profile table:\n{out}");
    let number = |l: &str, from_end: usize| -> f64 {
        let cols: Vec<&str> = l.split_whitespace().collect();
        cols[cols.len() - from_end].parse().unwrap_or_else(|e| panic!("{l}: {e}"))
    };
    // Rows: "<phase> (all) ms %", "<op> calls ms % gflops", "other ms %", "outside ms %".
    // Each printed figure is rounded to 0.05 at most.
    let mut phases = 0.0;
    let (mut phase_ms, mut parts_ms, mut rows) = (0.0, 0.0, 0.0);
    let adds_up = |parts: f64, total: f64, rows: f64| (parts - total).abs() <= 0.05 * (rows + 1.0) + 1e-9;
    let mut seen = Vec::new();
    for l in &table[2..] {
        let first = l.split_whitespace().next().unwrap_or("");
        if l.contains("(all)") {
            assert!(
                adds_up(parts_ms, phase_ms, rows),
                "the previous phase's rows add up to {parts_ms}, not {phase_ms}"
            );
            phase_ms = number(l, 2);
            (parts_ms, rows) = (0.0, 0.0);
            phases += number(l, 1);
            seen.push(first.to_string());
        } else if first == "outside" {
            assert!(adds_up(parts_ms, phase_ms, rows), "the last phase's rows add up to {parts_ms}, not {phase_ms}");
            phases += number(l, 1);
            break;
        } else if first == "other" {
            parts_ms += number(l, 2);
            rows += 1.0;
        } else if !l.trim().is_empty() {
            parts_ms += number(l, 3);
            rows += 1.0;
            seen.push(first.to_string());
            let gflops = l.split_whitespace().last().unwrap();
            assert!(gflops == "-" || gflops.parse::<f64>().is_ok_and(|g| g > 0.0 && g.is_finite()), "{l}");
        }
    }
    assert!(adds_up(phases, 100.0, seen.len() as f64), "phases and outside add up to {phases}%:\n{}", table.join("\n"));
    for want in ["forward", "backward", "optimizer", "linear", "routed", "attention", "rms", "adamw"] {
        assert!(seen.iter().any(|s| s == want), "no {want} row:\n{}", table.join("\n"));
    }
}

/// Bad run configurations: one line naming the flag, exit code 2, before any work (no "step" line), for
/// every class — zero and absurd sizes, non-finite and negative numbers, layouts and micro-batches that do
/// not divide, a missing or foreign plan file.
#[test]
fn bad_run_configurations_get_one_line_and_exit_2() {
    let dir = common::scratch("bad");
    let foreign = dir.join("foreign.json");
    std::fs::write(&foreign, r#"{"version": 1, "pipeline": "x"}"#).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--batch-size", "0", "--micro-batches", "2"], "--batch-size is 0"),
        (vec!["--steps", "0", "--pp", "2"], "--steps is 0"),
        (vec!["--seq-len", "0"], "--seq-len is 0"),
        (vec!["--seq-len", "1"], "--seq-len is 1"),
        (vec!["--lr", "NaN"], "--lr is NaN"),
        (vec!["--lr", "-1"], "--lr is -1"),
        (vec!["--grad-clip", "-1"], "--grad-clip is -1"),
        (vec!["--grad-clip", "inf"], "--grad-clip is inf"),
        (vec!["--aux-loss-coef", "NaN"], "--aux-loss-coef is NaN"),
        (vec!["--steps", "1000000000"], "--steps is 1000000000"),
        // 12 688 GiB predicted: more than any machine holds, so the refusal does not depend on the one it runs on.
        (vec!["--seq-len", "1048576", "--batch-size", "1024"], "more than this machine's"),
        (vec!["--micro-batches", "3"], "must be divisible by EP·DP·micro-batches"),
        (vec!["--micro-batches", "100000"], "--micro-batches is 100000"),
        (vec!["--ep", "2"], "--pp 1 × --ep 2 × --dp 1 = 2 ranks, but the job has 1"),
        (vec!["--pp", "2"], "--pp 2 × --ep 1 × --dp 1 = 2 ranks, but the job has 1"),
        (vec!["--plan", "/nonexistent/plan.json"], "--plan /nonexistent/plan.json"),
        (vec!["--plan", foreign.to_str().unwrap()], "not a Piper plan file"),
        (vec!["--grammar-alphabet", "1"], "--grammar-alphabet is 1"),
        (vec!["--tokenizer", "tests/fixtures/tokenizer/metaspace64.json"], "--tokenizer encodes --data"),
        (vec!["--eval-every", "5", "--eval-tokens", "0"], "--eval-tokens is 0"),
        (vec!["--config", "/nonexistent/run.toml"], "--config /nonexistent/run.toml"),
        (vec!["--data", "README.md", "--eval-every", "5", "--eval-tokens", "100000000"], "--eval-tokens holds out"),
        (vec!["--keep", "0", "--checkpoint-dir", "/tmp"], "--keep is 0"),
        (vec!["--peak-tflops", "1e-300"], "`--peak-tflops` is 1e-300"),
        (vec!["--save-every", "5"], "--save-every needs --checkpoint-dir"),
        (vec!["--resume", "/nonexistent/ckpt"], "--resume /nonexistent/ckpt: no such checkpoint folder"),
    ];
    for (args, want) in cases {
        let mut cmd = Command::new(example());
        // Not COMMON: its --steps/--seq-len would come first; the flags under test are enough.
        cmd.args(["--no-progress", "--log-every", "1"]).args(&args);
        let (status, text) = common::run_status(cmd, Duration::from_secs(60));
        let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(status.code(), Some(2), "{args:?}: exit {:?}\n{text}", status.code());
        assert!(errors.len() == 1 && errors[0].contains(want), "{args:?}: want one error line with `{want}`:\n{text}");
        assert!(!text.contains("step "), "{args:?}: work started before the refusal:\n{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_layouts_are_refused_with_the_reason() {
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--ep", "2"]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(!ok && out.contains("error: --pp 1 × --ep 2 × --dp 1 = 2 ranks, but the job has 1"), "{out}");
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--pp", "2"]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(!ok && out.contains("--pp 2 × --ep 1 × --dp 1 = 2 ranks, but the job has 1"), "{out}");
}

/// A save killed midway (SIGKILL after the shards are written, before the commit) leaves the previous
/// checkpoint as `latest`; resuming from the checkpoint dir continues the run bit for bit, and the metrics
/// file continues with the same step numbers. A corrupted checkpoint is refused with one line naming the
/// file, exit 2, and the metrics file and the checkpoints are left as they were.
#[test]
fn a_save_killed_midway_leaves_the_previous_checkpoint() {
    use std::os::unix::process::ExitStatusExt;
    let dir = common::scratch("kill-save");
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let (whole, ck, killed) = (path("whole.jsonl"), path("ck"), path("killed.jsonl"));
    let base = ["--batch-size", "8", "--seq-len", "31", "--seed", "3", "--no-progress", "--log-every", "0", "--steps"];
    let mut cmd = Command::new(example());
    cmd.args(base).args(["8", "--metrics", &whole]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let mut cmd = Command::new(example());
    cmd.args(base).args(["8", "--checkpoint-dir", &ck, "--save-every", "2", "--metrics", &killed]);
    cmd.env("PIPER_FAULT", "kill-in-save").env("PIPER_FAULT_STEP", "6");
    let (status, _) = common::run_status(cmd, Duration::from_secs(120));
    assert_eq!(status.signal(), Some(9), "the saving process must die of SIGKILL: {status:?}");
    assert_eq!(std::fs::read_to_string(dir.join("ck/latest")).unwrap().trim(), "step-00000004");
    let leftovers: Vec<String> = std::fs::read_dir(dir.join("ck"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".step-00000006.tmp-"))
        .collect();
    assert_eq!(leftovers.len(), 1, "the killed save's scratch folder stays aside");
    let mut cmd = Command::new(example());
    cmd.args(base).args(["8", "--resume", &ck, "--checkpoint-dir", &ck, "--save-every", "2", "--metrics", &killed]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok && out.contains("resuming from"), "{out}");
    assert_eq!(common::losses(&dir.join("killed.jsonl")), common::losses(&dir.join("whole.jsonl")), "bit for bit");
    // A corrupted shard: refused, and nothing the user saved changes.
    let shard = dir.join("ck/step-00000008/shard-00000.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let before = (std::fs::read(dir.join("killed.jsonl")).unwrap(), std::fs::read_dir(dir.join("ck")).unwrap().count());
    let mut cmd = Command::new(example());
    cmd.args(base).args(["10", "--resume", &ck, "--checkpoint-dir", &ck, "--metrics", &killed]);
    let (status, text) = common::run_status(cmd, Duration::from_secs(60));
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(
        errors.len() == 1
            && errors[0].contains("step-00000008/shard-00000.safetensors")
            && errors[0].contains("SHA-256"),
        "{text}"
    );
    let after = (std::fs::read(dir.join("killed.jsonl")).unwrap(), std::fs::read_dir(dir.join("ck")).unwrap().count());
    assert_eq!(before, after, "a refused resume changes nothing");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A batch job's output (stdout and stderr to a pipe, progress bar asked for): every line the bar would
/// carry is printed plainly — the run's description, checkpoints and the step lines at --log-every.
#[test]
fn without_a_terminal_the_bars_lines_are_printed_plainly() {
    let dir = common::scratch("batch-output");
    let mut cmd = Command::new(example());
    // COMMON without its --no-progress and --log-every: the bar is asked for.
    let at = COMMON.iter().position(|a| *a == "--no-progress").unwrap();
    cmd.args(&COMMON[..at]).args(&COMMON[at + 3..]);
    cmd.args(["--log-every", "5", "--checkpoint-dir", dir.to_str().unwrap(), "--save-every", "10"]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    assert!(out.contains("plan (local platform)") && out.contains("data: synthetic"), "{out}");
    for step in [1, 5, 10, 15, 20] {
        assert!(out.contains(&format!("step {step:>5}  loss ")), "no line for step {step}:\n{out}");
    }
    assert_eq!(out.matches("  checkpoint: ").count(), 2, "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--eval-every`: the held-out loss after steps 10 and 20 in the output, in the metrics lines
/// (`eval_loss`) and, the last one, in the summary.
#[test]
fn evaluations_reach_the_output_the_metrics_and_the_summary() {
    let dir = common::scratch("eval");
    let (metrics, summary) = (dir.join("m.jsonl"), dir.join("s.json"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--eval-every", "10", "--eval-tokens", "300"]);
    cmd.args(["--metrics", metrics.to_str().unwrap(), "--summary", summary.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let evals: Vec<(u64, f64)> = lines
        .iter()
        .filter_map(|l| l.get("eval_loss").map(|e| (l["step"].as_u64().unwrap(), e.as_f64().unwrap())))
        .collect();
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![10, 20], "{out}");
    assert!(evals.iter().all(|e| e.1.is_finite() && e.1 > 0.0) && evals[1].1 < evals[0].1, "{evals:?}");
    assert!(out.contains(&format!("step    20  held-out loss {:.4}", evals[1].1)), "{out}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(s["eval_loss"].as_f64(), Some(evals[1].1));
    // The summary reads back as the library's type.
    let typed: piper::modules::runtime::report::RunSummary =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!((typed.steps, typed.eval_loss), (20, Some(evals[1].1)));
    // The trainer's allocator counts its heap: at the peak it held at least the weights and AdamW's two
    // moments (12 bytes per parameter of the `tiny` model), and never more than the process's peak RSS.
    let spec = piper::planner::model::resolve_model("tiny").unwrap();
    let params = piper::planner::model::counts::param_breakdown(&spec).total() as f64;
    let (heap, rss) = (typed.peak_heap_bytes[0] as f64, typed.peak_rss_bytes[0] as f64);
    assert!(heap >= 12.0 * params && heap <= rss, "heap {heap}, RSS {rss}, {params} parameters");
    assert!(out.contains("; heap peak "), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The optimizer step frees each old weight as it writes the update: on a model of many parameters and
/// few activations the heap peaks near the 16 bytes per parameter of weights, gradients and AdamW's
/// moments, below the 20 a second copy of the weights would add (16.9 at 2 × 15 tokens, Intel Xeon
/// family 6 model 167).
#[test]
fn the_optimizer_step_holds_one_copy_of_the_weights() {
    let dir = common::scratch("one-copy");
    let summary = dir.join("s.json");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/piper-planner/presets/calibration/train-qwen3-m.json");
    let mut cmd = Command::new(example());
    cmd.args(["--preset", config, "--steps", "4", "--batch-size", "2", "--seq-len", "15", "--warmup", "1"]);
    cmd.args(["--no-progress", "--log-every", "0", "--summary", summary.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(300));
    assert!(ok, "{out}");
    let typed: piper::modules::runtime::report::RunSummary =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let spec = piper::planner::model::resolve_model(config).unwrap();
    let params = piper::planner::model::counts::param_breakdown(&spec).total() as f64;
    let per_param = typed.peak_heap_bytes[0] as f64 / params;
    assert!((16.0..18.0).contains(&per_param), "heap peak {per_param:.2} bytes per parameter");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run with --metrics writes its resolved flags beside them (`m.toml`); `--config` that file (with
/// another --metrics, the command line overriding the file) trains the same run again: the same losses.
#[test]
fn the_resolved_run_file_runs_the_same_run_again() {
    let dir = common::scratch("run-file");
    let (first, second) = (dir.join("m.jsonl"), dir.join("again.jsonl"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--aux-loss-scope", "micro-batch", "--metrics", first.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let file = dir.join("m.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("aux_loss_scope = \"micro-batch\"") && text.contains("steps = 20"), "{text}");
    let mut again = Command::new(example());
    again.args(["--config", file.to_str().unwrap(), "--metrics", second.to_str().unwrap()]);
    let (ok, out) = run(again, Duration::from_secs(120));
    assert!(ok, "{out}");
    assert_eq!(common::losses(&first), common::losses(&second));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--trace`: one Chrome/Perfetto trace whose process is the rank, with every instruction of the
/// one-process stream of 2 micro-batches, every step, in schedule order; `piper predict --trace` writes
/// the predicted step in the same format and `piper trace merge` lays the two side by side.
#[test]
fn trace_holds_the_schedule_in_order_beside_the_prediction() {
    let dir = common::scratch("trace");
    let trace = dir.join("run.json");
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--steps", "3", "--micro-batches", "2", "--trace", trace.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok && out.contains("timeline written to"), "{out}");
    let traced = common::traced_instructions(&trace);
    assert_eq!(traced.len(), 1, "one process: {:?}", traced.keys());
    let (name, instrs) = &traced[&0];
    assert!(name.starts_with("rank 0: stage 0"), "{name}");
    let want = common::expected_instructions(piper_planner::layout::Schedule::OneFOneB, 0, 1, 2, 3);
    assert_eq!(instrs, &want);
    let predicted = dir.join("predicted.json");
    let mut cmd = Command::new(binary("", "piper"));
    cmd.args(["predict", "--model", "mixtral-8x7b", "--pp", "4", "--num-micro-batches", "8"]);
    cmd.args(["--trace", predicted.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{out}");
    let stages = common::traced_instructions(&predicted);
    assert_eq!(stages.len(), 4);
    let both = dir.join("both.json");
    let mut cmd = Command::new(binary("", "piper"));
    cmd.args(["trace", "merge", trace.to_str().unwrap(), predicted.to_str().unwrap(), "--out", both.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{out}");
    let merged = common::traced_instructions(&both);
    assert_eq!(merged.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert_eq!(merged[&1].0, "stage 0 (predicted)");
    // The predicted step starts where the run's first step does, not at the run's set-up.
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&both).unwrap()).unwrap();
    let starts = |keep: &dyn Fn(&serde_json::Value) -> bool| {
        let ts = doc["traceEvents"].as_array().unwrap().iter().filter(|e| keep(e)).filter_map(|e| e["ts"].as_f64());
        ts.fold(f64::INFINITY, f64::min)
    };
    let first_step = starts(&|e| e["pid"] == 0 && e["name"] == "step" && (e["ph"] == "B" || e["ph"] == "X"));
    let predicted_start = starts(&|e| e["pid"].as_u64().is_some_and(|p| p >= 1) && e["ph"] == "X");
    // The trace's clock starts with the tracer, before the run's set-up.
    assert!(first_step.is_finite() && first_step > 0.0, "no step span after the set-up: {first_step}");
    assert!((predicted_start - first_step).abs() < 1e-3, "{predicted_start} vs {first_step}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--plots DIR` draws the run's four pictures as PNG and SVG at the end, from the metrics file (so a
/// resumed run's pictures hold every step): `piper plot` draws the same files from that file.
#[test]
fn plots_are_drawn_from_the_metrics_at_the_end() {
    let dir = common::scratch("plots");
    let (metrics, plots) = (dir.join("m.jsonl"), dir.join("plots"));
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--steps", "6", "--eval-every", "3", "--eval-tokens", "256"]);
    cmd.args(["--metrics", metrics.to_str().unwrap(), "--plots", plots.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok && out.contains("pictures written to"), "{out}");
    for stem in ["loss", "throughput", "expert_load", "imbalance"] {
        for ext in ["png", "svg"] {
            let f = plots.join(format!("{stem}.{ext}"));
            assert!(std::fs::metadata(&f).map(|m| m.len() > 1000).unwrap_or(false), "{} is missing", f.display());
        }
    }
    // The metrics file reads back as the library's type (a model author's own tools).
    let steps: Vec<piper::modules::runtime::report::StepMetrics> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps.iter().map(|m| m.step).collect::<Vec<_>>(), (1..=6).collect::<Vec<_>>());
    assert_eq!(steps.iter().filter(|m| m.eval_loss.is_some()).count(), 2, "evaluations after steps 3 and 6");
    let loss_svg = std::fs::read_to_string(plots.join("loss.svg")).unwrap();
    assert!(loss_svg.contains("held out") && loss_svg.contains("best possible"));
    let again = dir.join("again");
    let mut cmd = Command::new(binary("", "piper"));
    cmd.args(["plot", "--metrics", metrics.to_str().unwrap(), "--out", again.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{out}");
    let png = |d: &std::path::Path| std::fs::read(d.join("expert_load.png")).unwrap();
    assert_eq!(png(&plots), png(&again), "the same metrics draw the same heat map");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Threads per rank: a rank the launcher bound (OpenMPI's `OMPI_MCA_orte_bound_at_launch`, Slurm's
/// `SLURM_CPU_BIND_TYPE`) keeps the cores of its affinity mask (`taskset`); an unbound one shares the
/// host's cores with the other ranks on it; the choice is printed.
#[test]
fn a_bound_rank_keeps_its_cores_and_says_so() {
    let line = |env: &[(&str, &str)]| {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0,1"]).arg(example()).args(COMMON).args(["--steps", "1"]);
        cmd.env("OMPI_COMM_WORLD_LOCAL_SIZE", "2").env_remove("RAYON_NUM_THREADS");
        cmd.env_remove("OMPI_MCA_orte_bound_at_launch").env_remove("SLURM_CPU_BIND_TYPE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (ok, out) = run(cmd, Duration::from_secs(120));
        assert!(ok, "{out}");
        out.lines().find(|l| l.starts_with("threads:")).unwrap_or_else(|| panic!("no threads line: {out}")).to_string()
    };
    let cores = std::thread::available_parallelism().unwrap().get().min(2);
    let shared = line(&[]);
    assert_eq!(
        shared,
        format!("threads: {} per rank ({cores} cores shared by 2 ranks on the host)", (cores / 2).max(1))
    );
    for bound in [("OMPI_MCA_orte_bound_at_launch", "1"), ("SLURM_CPU_BIND_TYPE", "mask_cpu:")] {
        assert_eq!(
            line(&[bound]),
            format!("threads: {cores} per rank (the {cores} cores the launcher bound this rank to)")
        );
    }
    let none = line(&[("SLURM_CPU_BIND_TYPE", "none")]);
    assert_eq!(none, shared, "srun --cpu-bind=none does not bind");
}

/// SIGTERM (a time limit, `scancel`): the run finishes its step, saves a checkpoint, says so and exits 0;
/// resumed from it, the run trains the remaining steps with the uninterrupted run's losses, bit for bit.
#[test]
fn sigterm_saves_and_the_resumed_run_is_bit_exact() {
    let dir = common::scratch("sigterm");
    let train = |extra: &[&str]| {
        let mut cmd = Command::new(example());
        cmd.args(COMMON).args(["--steps", "40"]).args(extra);
        cmd
    };
    common::signal_saves_and_resume_continues(&dir, train, "TERM", |pid| common::kill("TERM", pid));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `piper data prepare` then training on the prepared folder: it evaluates on the folder's held-out
/// split, and a run saved at step 4 and resumed trains the steps after it with the uninterrupted run's
/// losses, bit for bit (the data position is in the checkpoint).
#[test]
fn prepared_token_shards_train_evaluate_and_resume_bit_exact() {
    let dir = common::scratch("prepared");
    let text = dir.join("corpus.txt");
    std::fs::write(&text, "The router scores each expert and the expert group dispatches tokens.\n".repeat(300))
        .unwrap();
    let prepared = dir.join("prepared");
    let tokenizer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/metaspace64.json");
    let mut prep = Command::new(binary("", "piper"));
    prep.args(["data", "prepare", "--tokenizer", tokenizer.to_str().unwrap(), "--data", text.to_str().unwrap()]);
    prep.args(["--out", prepared.to_str().unwrap(), "--shard-tokens", "1000", "--held-out-tokens", "2000"]);
    let (ok, out) = run(prep, Duration::from_secs(60));
    assert!(ok && out.contains("held out"), "{out}");
    let train = |extra: &[&str], metrics: &std::path::Path| {
        let mut cmd = Command::new(example());
        cmd.args(["--data", prepared.to_str().unwrap(), "--steps", "8", "--batch-size", "4", "--seq-len", "15"]);
        cmd.args(["--no-progress", "--log-every", "0", "--eval-every", "4", "--eval-tokens", "100"]);
        cmd.args(["--metrics", metrics.to_str().unwrap()]).args(extra);
        let (ok, out) = run(cmd, Duration::from_secs(120));
        assert!(ok, "{out}");
        out
    };
    let (whole, ckpt) = (dir.join("whole.jsonl"), dir.join("ckpt"));
    let out = train(&["--checkpoint-dir", ckpt.to_str().unwrap(), "--save-every", "4"], &whole);
    assert!(out.contains("held-out loss") && out.contains("tokenizer metaspace64.json"), "{out}");
    let resumed = dir.join("resumed.jsonl");
    train(&["--resume", ckpt.join("step-00000004").to_str().unwrap()], &resumed);
    assert_eq!(common::losses(&resumed), common::losses(&whole)[4..], "steps 4..8 after the resume");
    // A shard changed after preparation (same size, an id outside the vocabulary everywhere): refused
    // at the first step that reads it, naming the file, exit 2.
    for entry in std::fs::read_dir(&prepared).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "bin") && path.file_name().unwrap() != "held-out.bin" {
            let n = std::fs::metadata(&path).unwrap().len() as usize;
            std::fs::write(&path, 9999u16.to_le_bytes().repeat(n / 2)).unwrap();
        }
    }
    let mut cmd = Command::new(example());
    cmd.args(["--data", prepared.to_str().unwrap(), "--steps", "2", "--batch-size", "4", "--seq-len", "15"]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(!ok && out.contains("outside the vocabulary of 64") && out.contains(".bin"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Fine-tuning on text reads it through the model folder's tokenizer.json (never as bytes into a
/// vocabulary of other tokens): without one the run is refused and told to pass `--tokenizer`; a
/// tokenizer whose ids do not fit the model is refused naming both sizes; with the folder's own it trains.
#[test]
fn fine_tuning_reads_text_through_the_model_folders_tokenizer() {
    let dir = hf_folder(V5, "mixtral", false, "tokenizer", 1.0);
    let text = dir.join("text.txt");
    std::fs::write(&text, "The router dispatches tokens to experts, and the combine phase returns them.\n".repeat(40))
        .unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let train = |extra: &[&str]| {
        let mut cmd = Command::new(example());
        cmd.args(["--init-hf", dir.to_str().unwrap(), "--data", text.to_str().unwrap()])
            .args(["--steps", "3", "--batch-size", "2", "--seq-len", "16", "--no-progress", "--log-every", "1"])
            .args(extra);
        run(cmd, Duration::from_secs(120))
    };
    let (ok, out) = train(&[]);
    assert!(!ok && out.contains("no tokenizer.json") && out.contains("--tokenizer FILE"), "{out}");
    assert!(!out.contains("step "), "work started before the refusal:\n{out}");
    let big = fixtures.join("bytelevel300.json");
    let (ok, out) = train(&["--tokenizer", big.to_str().unwrap()]);
    assert!(!ok && out.contains("holds 300 tokens but the model's vocabulary has 64"), "{out}");
    std::fs::copy(fixtures.join("metaspace64.json"), dir.join("tokenizer.json")).unwrap();
    let (ok, out) = train(&[]);
    assert!(ok, "{out}");
    assert!(out.contains("tokenizer tokenizer.json") && out.contains("vocabulary 64"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--log FILTER` (else `RUST_LOG`) prints the tracing events and spans that pass it: the report's lines
/// alone with `piper::report=info`, every instruction's span as it closes with `info`; without either
/// nothing of it; a filter tracing cannot read stops the run before the first step, naming its source.
#[test]
fn log_filters_choose_what_the_run_prints() {
    let train = |log: Option<&str>, env: Option<&str>| {
        let mut cmd = Command::new(example());
        cmd.args(["--steps", "2", "--batch-size", "4", "--seq-len", "15", "--no-progress", "--log-every", "1"]);
        cmd.env_remove("RUST_LOG");
        if let Some(f) = log {
            cmd.args(["--log", f]);
        }
        if let Some(e) = env {
            cmd.env("RUST_LOG", e);
        }
        run(cmd, Duration::from_secs(120))
    };
    let report = |out: &str| out.lines().filter(|l| l.contains("INFO piper::report: step ")).count();
    let spans = |out: &str| out.lines().filter(|l| l.contains("forward{micro_batch=0}") && l.contains("close")).count();
    let (ok, out) = train(Some("piper::report=info"), Some("off"));
    assert!(ok && report(&out) == 2 && spans(&out) == 0, "{out}");
    let (ok, out) = train(None, Some("info"));
    assert!(ok && report(&out) == 2 && spans(&out) == 2, "{out}");
    let (ok, out) = train(None, None);
    assert!(ok && report(&out) == 0 && spans(&out) == 0, "{out}");
    for (log, env, source) in [(Some("piper=[["), None, "--log"), (None, Some("x=[["), "RUST_LOG")] {
        let (ok, out) = train(log, env);
        assert!(!ok && out.contains(&format!("{source} `")) && out.contains("not a tracing filter"), "{out}");
        assert!(!out.lines().any(|l| l.starts_with("step ")), "training started before the refusal:\n{out}");
    }
}

/// A damaged `--init-hf` folder — a NaN in a norm weight (one f32 file), +inf in a projection (BF16
/// shards) — is refused before the first step, naming the tensor, the element and the file, not trained
/// until the loss or the gradient turns NaN.
#[test]
fn a_damaged_model_folder_is_refused_before_training() {
    for (bf16, part, value, shown) in [(false, "norm", f32::NAN, "NaN"), (true, "proj", f32::INFINITY, "inf")] {
        let dir = hf_folder(V5, "mixtral", bf16, "damaged", 1.0);
        let (tensor, file) = damage(&dir, part, value);
        let mut cmd = Command::new(example());
        cmd.args(["--init-hf", dir.to_str().unwrap(), "--steps", "2", "--batch-size", "2", "--seq-len", "11"]);
        cmd.args(["--no-progress", "--log-every", "1"]);
        let (ok, out) = run(cmd, Duration::from_secs(120));
        assert!(!ok, "{out}");
        assert!(out.contains(&format!("tensor `{tensor}` holds {shown} at element 1 of")), "{out}");
        assert!(out.contains(&file) && out.contains("damaged"), "{out}");
        assert!(!out.lines().any(|l| l.starts_with("step ")), "training started before the refusal:\n{out}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Writes `value` into element 1 of the first tensor (by name) whose name holds `part`, in whichever
/// safetensors file of `dir` has it (f32 or BF16); returns the tensor's and the file's names.
fn damage(dir: &std::path::Path, part: &str, value: f32) -> (String, String) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    for path in files {
        let mut bytes = std::fs::read(&path).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
        let mut names: Vec<&String> = header.as_object().unwrap().keys().filter(|k| k.contains(part)).collect();
        names.sort();
        let Some(name) = names.first().map(|n| n.to_string()) else { continue };
        let entry = &header[&name];
        let start = 8 + header_len + entry["data_offsets"][0].as_u64().unwrap() as usize;
        let encoded = match entry["dtype"].as_str().unwrap() {
            "F32" => value.to_le_bytes().to_vec(),
            "BF16" => ((value.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
            other => panic!("{other}: the fixtures are f32 or bf16"),
        };
        let at = start + encoded.len();
        bytes[at..at + encoded.len()].copy_from_slice(&encoded);
        std::fs::write(&path, bytes).unwrap();
        return (name, path.file_name().unwrap().to_string_lossy().into_owned());
    }
    panic!("no tensor named like `{part}` in {}", dir.display());
}

/// transformers 5 writes `num_nextn_predict_layers: 1` into every DeepSeek-V3 config. `mixtral_train
/// --init-hf` refuses it naming the field and the flag, and trains without the MTP module with
/// `--mtp-loss-weight 0`; a weight for a model without MTP is refused too.
#[test]
fn deepseek_v3_with_mtp_trains_only_with_an_explicit_zero_weight() {
    let dir = hf_folder(V5, "deepseek_v3", false, "mtp", 1.0);
    let d = dir.to_str().unwrap();
    let train = |extra: &[&str]| {
        let mut cmd = Command::new(example());
        cmd.args(["--init-hf", d, "--steps", "2", "--batch-size", "2", "--seq-len", "11", "--no-progress"]).args(extra);
        run(cmd, Duration::from_secs(120))
    };
    let (ok, out) = train(&[]);
    assert!(!ok && out.contains("`num_nextn_predict_layers`") && out.contains("--mtp-loss-weight 0"), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("error")).count(), 1, "{out}");
    let (ok, out) = train(&["--mtp-loss-weight", "0.3"]);
    assert!(!ok && out.contains("`num_nextn_predict_layers`"), "{out}");
    let (ok, out) = train(&["--mtp-loss-weight", "0"]);
    assert!(ok, "{out}");
    let mixtral = hf_folder(V5, "mixtral", false, "mtp", 1.0);
    let mut cmd = Command::new(example());
    cmd.args(["--init-hf", mixtral.to_str().unwrap(), "--steps", "1", "--mtp-loss-weight", "0.1", "--no-progress"]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(!ok && out.contains("--mtp-loss-weight") && out.contains("no multi-token-prediction module"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&mixtral).unwrap();
}

/// `--summary` to targets that are not regular files: a FIFO a reader drains gets the whole summary, a
/// character device made in a temporary folder (as root; else `/dev/null`) is written in place; each is
/// still what it was afterwards.
#[cfg(unix)]
#[test]
fn summaries_to_a_fifo_or_a_device_leave_them_what_they_were() {
    use std::os::unix::fs::FileTypeExt;
    let dir = std::env::temp_dir().join(format!("piper-run-special-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (fifo, reader, device) = common::special_outputs(&dir);
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--summary", fifo.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let text = reader.join().unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(doc["step_time_median_s"].as_f64().is_some_and(|t| t > 0.0), "{text}");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let mut cmd = Command::new(example());
    cmd.args(COMMON).args(["--summary", device.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    assert!(std::fs::metadata(&device).unwrap().file_type().is_char_device());
    std::fs::remove_dir_all(&dir).unwrap();
}
