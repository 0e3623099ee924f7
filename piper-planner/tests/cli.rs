//! The `piper` CLI's machine interface (the JSON other tools rely on) and its one-line errors.

use std::process::{Command, Output};

use serde_json::Value;

fn piper(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_piper")).args(args).output().expect("piper runs")
}

fn json(args: &[&str]) -> Value {
    let out = piper(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

/// Runs a command that must fail; returns its stderr, which must be a single line.
fn error_line(args: &[&str]) -> String {
    let out = piper(args);
    assert_eq!(out.status.code(), Some(2), "{args:?} should fail with exit code 2");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: error is not one line: {err}");
    assert!(out.stdout.is_empty());
    err
}

#[test]
fn model_json_has_the_agreed_fields() {
    let v = json(&["model", "--preset", "mixtral-8x7b", "--json"]);
    for key in ["total_params", "active_params", "flops_per_token"] {
        assert!(v[key].is_number(), "{key}");
    }
    for key in
        ["embedding", "lm_head", "attention", "dense_mlp", "routed_experts", "shared_experts", "router", "norms", "mtp"]
    {
        assert!(v["params"][key].is_u64(), "params.{key}");
    }
    let total = v["total_params"].as_u64().unwrap();
    let sum: u64 = v["params"].as_object().unwrap().values().map(|x| x.as_u64().unwrap()).sum();
    assert_eq!(sum, total);
    assert!(v["flops_convention"].as_str().unwrap().contains("Megatron"));
}

#[test]
fn hf_config_file_gives_the_same_numbers_as_the_preset() {
    let dir = std::env::temp_dir().join(format!("piper-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, include_str!("../presets/models/deepseek-v3.json")).unwrap();
    let from_file = json(&["model", "--hf-config", path.to_str().unwrap(), "--seq-len", "2048", "--json"]);
    let from_preset = json(&["model", "--preset", "deepseek-v3", "--seq-len", "2048", "--json"]);
    assert_eq!(from_file["total_params"], from_preset["total_params"]);
    assert_eq!(from_file["flops_per_token"], from_preset["flops_per_token"]);
    std::fs::write(&path, "{\"model_type\": \"mixtral\", \"hidden_size\": 64").unwrap();
    let err = error_line(&["model", "--hf-config", path.to_str().unwrap()]);
    assert!(err.contains("not valid JSON"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn memory_json_lists_every_stage() {
    let v = json(&[
        "memory",
        "--model",
        "mixtral-8x7b",
        "--platform",
        "frontier",
        "--pp",
        "4",
        "--ep",
        "8",
        "--dp",
        "1",
        "--micro-batch-size",
        "1",
        "--num-micro-batches",
        "8",
        "--seq-len",
        "4096",
        "--schedule",
        "1f1b",
        "--recompute",
        "none",
        "--json",
    ]);
    let stages = v["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4);
    for s in stages {
        let parts: f64 = ["params_bytes", "grads_bytes", "optimizer_bytes", "activation_bytes", "overhead_bytes"]
            .iter()
            .map(|k| s[*k].as_f64().unwrap())
            .sum();
        assert!((parts - s["total_bytes"].as_f64().unwrap()).abs() < 1.0);
    }
    // 1F1B: stage 0 holds the most activations.
    assert!(stages[0]["activation_bytes"].as_f64() > stages[3]["activation_bytes"].as_f64());
}

#[test]
fn plan_json_ranks_plans_and_explains_rejections() {
    let v = json(&[
        "plan",
        "--model",
        "mixtral-8x7b",
        "--platform",
        "frontier",
        "--gpus",
        "64",
        "--seq-len",
        "4096",
        "--global-batch",
        "256",
        "--json",
    ]);
    let plans = v["plans"].as_array().unwrap();
    assert!(!plans.is_empty());
    for p in plans {
        for key in [
            "pp",
            "ep",
            "dp",
            "micro_batch_size",
            "num_micro_batches",
            "schedule",
            "recompute",
            "peak_memory_bytes",
            "step_time_s",
            "mfu",
        ] {
            assert!(!p[key].is_null(), "plans[].{key}");
        }
    }
    let mfu: Vec<f64> = plans.iter().map(|p| p["mfu"].as_f64().unwrap()).collect();
    assert!(mfu.windows(2).all(|w| w[0] >= w[1]));
    assert!(v["rejected"].as_array().unwrap().iter().all(|r| r["reason"].as_str().is_some_and(|s| !s.is_empty())));
}

#[test]
fn plan_out_writes_the_run_plan() {
    let path = std::env::temp_dir().join(format!("piper-plan-{}.json", std::process::id()));
    let out = piper(&[
        "plan",
        "--model",
        "tiny",
        "--platform",
        "local",
        "--gpus",
        "4",
        "--seq-len",
        "64",
        "--global-batch",
        "16",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: piper_planner::run_plan::RunPlan = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(run.pp * run.ep * run.dp, 4);
    assert_eq!(run.stages.iter().map(|s| s.num_layers).sum::<u64>(), 2);
    // `local`'s runtime trains in fp32 and keeps its activations: the default plan is one it runs.
    assert_eq!(run.dtype, "fp32");
    assert_eq!(piper_planner::run_plan::runtime_refusal(&run.dtype), None);
    std::fs::remove_file(&path).unwrap();
}

/// A plan the runtime cannot run is priced and shown, never written: with `--out`, that is an error
/// (exit 2) and the file a user had stays; so is a request nothing fits.
#[test]
fn plan_out_writes_only_what_the_runtime_runs() {
    let path = std::env::temp_dir().join(format!("piper-plan-bf16-{}.json", std::process::id()));
    std::fs::write(&path, "the previous plan").unwrap();
    let args = ["plan", "--model", "mixtral-8x7b", "--platform", "frontier", "--gpus", "64", "--seq-len", "4096"];
    let line = error_line(&[&args[..], &["--global-batch", "256", "--out", path.to_str().unwrap()]].concat());
    assert!(line.contains("no plan written") && line.contains("re-plan with --dtype fp32"), "{line}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "the previous plan");
    let huge = ["plan", "--model", "deepseek-v3", "--platform", "frontier", "--gpus", "1", "--seq-len", "4096"];
    let line = error_line(&[&huge[..], &["--global-batch", "8", "--out", path.to_str().unwrap()]].concat());
    assert!(line.contains("no plan written: nothing is feasible") && line.contains("run without --out"), "{line}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "the previous plan");
    std::fs::remove_file(&path).unwrap();
    let out =
        piper(&[&args[..], &["--global-batch", "256", "--dtype", "fp32", "--out", path.to_str().unwrap()]].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    let run: piper_planner::run_plan::RunPlan = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(piper_planner::run_plan::runtime_refusal(&run.dtype), None, "{text}");
    assert!(text.contains("plan written to") && !text.contains("priced only"), "{text}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn migrate_json_interfaces() {
    let v = json(&[
        "migrate",
        "--worst-case",
        "--model",
        "mixtral-8x7b",
        "--group-size",
        "8",
        "--link-gbps",
        "50",
        "--json",
    ]);
    assert_eq!(v["bytes_per_gpu"].as_f64().unwrap(), 48.0 * 8.0 * 4096.0 * 14336.0 / 8.0);
    assert!((v["time_s"].as_f64().unwrap() - v["bytes_per_gpu"].as_f64().unwrap() / 50e9).abs() < 1e-12);
    let path = std::env::temp_dir().join(format!("piper-loads-{}.json", std::process::id()));
    std::fs::write(&path, r#"{"loads": [100, 90, 10, 0], "placement": [0, 0, 1, 1], "model": "tiny"}"#).unwrap();
    let v = json(&["migrate", "--loads", path.to_str().unwrap(), "--json"]);
    for key in ["swaps", "imbalance_before", "imbalance_after", "bytes_moved", "time_s"] {
        assert!(!v[key].is_null(), "{key}");
    }
    assert!(v["imbalance_after"].as_f64() < v["imbalance_before"].as_f64());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bad_input_is_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["memory", "--model", "mixtral-8x7b", "--ep", "3"], "`--ep` EP = 3 must divide the 8 routed experts"),
        (&["memory", "--model", "mixtral-8x7b", "--pp", "40"], "`--pp` 40 stages > 32 layers"),
        (
            &["plan", "--model", "mixtral-8x7b", "--gpus", "0", "--global-batch", "8"],
            "`--gpus` is 0; it must be in 1..=",
        ),
        (&["model", "--preset", "gpt-5"], "`gpt-5` is not known"),
        (
            &["plan", "--model", "tiny", "--platform", "mars", "--gpus", "2", "--global-batch", "2"],
            "platform (neither a file nor a preset) `mars`",
        ),
        (
            &[
                "plan",
                "--model",
                "tiny",
                "--platform",
                "frontier",
                "--gpus",
                "2",
                "--global-batch",
                "2",
                "--dtype",
                "fp8",
            ],
            "peak_tflops.fp8",
        ),
        (&["memory", "--model", "tiny", "--pp", "2", "--split", "1,2"], "`--split`"),
    ];
    for (args, expect) in cases {
        let err = error_line(args);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

/// `piper predict` gives the numbers `piper plan` ranks by for the same layout, and its breakdown adds up
/// to the step time.
#[test]
fn predict_agrees_with_plan_and_its_parts_add_up() {
    let plan = json(&[
        "plan",
        "--model",
        "mixtral-8x7b",
        "--platform",
        "frontier",
        "--gpus",
        "64",
        "--global-batch",
        "64",
        "--seq-len",
        "4096",
        "--recompute",
        "none",
        "--schedules",
        "1f1b",
        "--all-to-all",
        "halo",
        "--json",
    ]);
    let best = &plan["plans"][0];
    let arg = |k: &str| best[k].as_u64().unwrap().to_string();
    let split: Vec<String> =
        best["split"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap().to_string()).collect();
    let (pp, ep, dp, mbs, m) = (arg("pp"), arg("ep"), arg("dp"), arg("micro_batch_size"), arg("num_micro_batches"));
    let split = split.join(",");
    let p = json(&[
        "predict",
        "--model",
        "mixtral-8x7b",
        "--platform",
        "frontier",
        "--pp",
        &pp,
        "--ep",
        &ep,
        "--dp",
        &dp,
        "--micro-batch-size",
        &mbs,
        "--num-micro-batches",
        &m,
        "--seq-len",
        "4096",
        "--recompute",
        "none",
        "--schedule",
        "1f1b",
        "--all-to-all",
        best["all_to_all"].as_str().unwrap(),
        "--split",
        &split,
        "--json",
    ]);
    for (mine, theirs) in [("step_time_s", "step_time_s"), ("mfu", "mfu"), ("peak_memory_bytes", "peak_memory_bytes")] {
        assert_eq!(p[mine].as_f64(), best[theirs].as_f64(), "{mine}");
    }
    let b = &p["breakdown"];
    let parts: f64 =
        ["compute_s", "all_to_all_s", "p2p_s", "bubble_s", "grad_allreduce_s", "optimizer_s", "overhead_s"]
            .iter()
            .map(|k| {
                let v = b[*k].as_f64().unwrap();
                assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
                v
            })
            .sum();
    let step = p["step_time_s"].as_f64().unwrap();
    assert!((parts - step).abs() <= 1e-9 * step, "parts {parts} vs step {step}");
    assert!(b["compute_s"].as_f64().unwrap() > 0.5 * step, "compute dominates a dense-enough model");
    let mem = p["stage_memory_bytes"].as_array().unwrap();
    assert_eq!(mem.len().to_string(), pp);
}

/// `piper paper --json`: one row per compared figure, each with the paper's value, the prediction and
/// (for numbers) their ratio; the 1.7T run gets a plan with default flags.
#[test]
fn paper_comparison_rows() {
    let v = json(&["paper", "--json"]);
    let rows = v.as_array().unwrap();
    assert!(rows.len() >= 30, "{} rows", rows.len());
    for r in rows {
        for key in ["section", "item", "paper", "predicted", "unit", "note"] {
            assert!(r[key].is_string(), "{key} in {r}");
        }
    }
    let largest = rows.iter().find(|r| r["section"] == "largest run").unwrap();
    let ratio = largest["ratio"].as_f64().unwrap();
    assert!((0.8..1.25).contains(&ratio), "{largest}");
    assert!(largest["note"].as_str().unwrap().contains("PP="));
}

/// The published accuracy figures (`benchmarks/results/accuracy.jsonl`) are this model's: `piper
/// predict` on the committed calibration gives every row's predicted step time and memory again. A
/// change to the model or the calibration format that moves a prediction fails here until
/// `benchmarks/accuracy.sh` is rerun.
#[test]
fn published_accuracy_rows_are_this_models_predictions() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let platform = format!("{root}/benchmarks/results/platforms/local.toml");
    let read = |name: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(format!("{root}/benchmarks/results/{name}")).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let (tuned_on, fresh) = (read("accuracy.jsonl"), read("accuracy-heldout3.jsonl"));
    assert_eq!((tuned_on.len(), fresh.len()), (48, 24), "4 and 2 models × 12 layouts");
    let rows: Vec<Value> = tuned_on.into_iter().chain(fresh).collect();
    let (batch, seq) = (16, "127");
    for r in &rows {
        let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        let model = format!("{root}/benchmarks/configs/{}.json", r["model"].as_str().unwrap());
        let mbs = (batch / (n("micro_batches") * n("ep") * n("dp"))).to_string();
        let s = |k: &str| n(k).to_string();
        let (pp, ep, dp, m) = (s("pp"), s("ep"), s("dp"), s("micro_batches"));
        let v = json(&[
            "predict",
            "--model",
            &model,
            "--platform",
            &platform,
            "--pp",
            &pp,
            "--ep",
            &ep,
            "--dp",
            &dp,
            "--micro-batch-size",
            &mbs,
            "--num-micro-batches",
            &m,
            "--seq-len",
            seq,
            "--schedule",
            r["schedule"].as_str().unwrap(),
            "--recompute",
            "none",
            "--dtype",
            "fp32",
            "--no-flash-attention",
            "--json",
        ]);
        for (key, published) in [("step_time_s", &r["step_time_s"]), ("peak_memory_bytes", &r["peak_memory_bytes"])] {
            let (now, then) = (v[key].as_f64().unwrap(), published["predicted"].as_f64().unwrap());
            assert!((now / then - 1.0).abs() < 1e-9, "{key} of {r}: predicted now {now}, published {then}");
        }
    }
}

/// A calibration that cannot start (its workers are not built) says which and how to build them, and
/// leaves the platform file a user already has as it was.
#[test]
fn calibrate_without_workers_names_the_build_and_keeps_the_old_platform() {
    let dir = std::env::temp_dir().join(format!("piper-cli-calibrate-{}", std::process::id()));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let out = dir.join("local.toml");
    std::fs::write(&out, "the previous calibration").unwrap();
    let args = ["calibrate", "--out", out.to_str().unwrap(), "--bin-dir", bin.to_str().unwrap()];
    let line = error_line(&args);
    assert!(
        line.contains("mixtral_train not found") && line.contains("cargo build --release --features mpi"),
        "{line}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the previous calibration");
    let args = ["validate", "--model", "tiny", "--gpus", "2", "--global-batch", "8", "--seq-len", "31"];
    let line = error_line(&[args.as_slice(), &["--bin-dir", bin.to_str().unwrap()]].concat());
    assert!(line.contains("mixtral_train not found"), "{line}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Attention is priced as the platform's runtime runs it: with flash attention on `local` (Piper's
/// fused attention keeps each row's log-sum-exp) and Frontier, where `--no-flash-attention` holds the
/// s² scores; a platform whose runtime has none (`flash_attention = false`) is priced without it by
/// default.
#[test]
fn attention_defaults_to_what_the_platform_runtime_runs() {
    let peak = |platform: &str, extra: &[&str]| {
        let base = [
            "predict",
            "--model",
            "tiny",
            "--platform",
            platform,
            "--pp",
            "1",
            "--ep",
            "1",
            "--dp",
            "1",
            "--micro-batch-size",
            "4",
            "--num-micro-batches",
            "1",
            "--seq-len",
            "512",
            "--json",
        ];
        json(&[&base[..], extra].concat())["peak_memory_bytes"].as_f64().unwrap()
    };
    let local = "presets/platforms/local.toml";
    assert!(peak(local, &["--no-flash-attention"]) > peak(local, &[]));
    assert!(peak("frontier", &["--no-flash-attention"]) > peak("frontier", &[]));
    let dir = std::env::temp_dir().join(format!("piper-cli-no-flash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let no_flash = dir.join("no-flash.toml");
    let text = std::fs::read_to_string(local).unwrap().replace("flash_attention = true", "flash_attention = false");
    assert!(text.contains("flash_attention = false"), "local.toml states its attention");
    std::fs::write(&no_flash, text).unwrap();
    let no_flash = no_flash.to_str().unwrap();
    assert_eq!(peak(no_flash, &[]), peak(no_flash, &["--no-flash-attention"]));
    assert_eq!(peak(no_flash, &[]), peak(local, &["--no-flash-attention"]));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `piper calibrate --refine` refits a calibrated platform from a history whose runs were 25% slower
/// and 10% smaller than it predicted: the refined platform predicts them, the report shows the held-out
/// half, and runs of another platform are named, not counted. A missing history is one clear line, and
/// the platform is left as it was.
#[test]
fn refine_fits_the_history_and_the_refined_platform_predicts_it() {
    use piper_planner::history::{HISTORY_VERSION, HistoryRecord, append};
    use piper_planner::layout::{Layout, StageSplit, TrainConfig};
    use piper_planner::planner::price;
    use piper_planner::run_plan::RunPlan;

    let dir = std::env::temp_dir().join(format!("piper-cli-refine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("local.toml");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../benchmarks/results/platforms/local.toml"), &out).unwrap();
    let platform = piper_planner::platform::load(&out).unwrap();
    let priced = |model: &str, layout: Layout, mbs: u64| {
        let spec = piper_planner::model::resolve_model(model).unwrap();
        let cfg =
            TrainConfig { micro_batch_size: mbs, dtype: "fp32".into(), flash_attention: false, ..TrainConfig::new(63) };
        let split = StageSplit::even(spec.num_layers, layout.pp);
        let c = price(&spec, &platform, &layout, &cfg, piper_planner::comm::A2aAlgo::Flat, &split).unwrap();
        (spec, cfg, c)
    };
    let history = dir.join("history.jsonl");
    let one = Layout { pp: 1, ep: 1, dp: 1 };
    let runs = [
        ("tiny", one, 4),
        ("tiny-qwen3", Layout { pp: 1, ep: 2, dp: 1 }, 2),
        ("tiny", Layout { pp: 2, ep: 1, dp: 1 }, 2),
        ("tiny-deepseek", one, 8),
    ];
    for (i, (model, layout, mbs)) in runs.into_iter().enumerate() {
        let (spec, cfg, c) = priced(model, layout, mbs);
        let mut record = HistoryRecord {
            version: HISTORY_VERSION,
            unix_time_s: i as u64,
            plan: RunPlan::from_candidate(&spec, &platform.name, 63, "fp32", &c),
            model: spec,
            config: cfg,
            cores: platform.cores_per_node.unwrap(),
            node_ranks: layout.gpus(),
            steps: 50,
            step_time_median_s: 1.25 * c.step_time_s,
            peak_rss_bytes: 0.9 * c.peak_memory_bytes,
            steal_share: Some(0.01),
        };
        append(&history, &record).unwrap();
        if i == 0 {
            record.plan.platform = "frontier".into();
            append(&history, &record).unwrap();
        }
    }
    let run = |h: &std::path::Path| {
        piper(&["calibrate", "--refine", "--out", out.to_str().unwrap(), "--history", h.to_str().unwrap()])
    };
    let line = error_line(&[
        "calibrate",
        "--refine",
        "--out",
        out.to_str().unwrap(),
        "--history",
        dir.join("none.jsonl").to_str().unwrap(),
    ]);
    assert!(line.contains("none.jsonl: cannot read"), "{line}");
    assert_eq!(piper_planner::platform::load(&out).unwrap(), platform);
    let o = run(&history);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("refined from 4 run(s)") && text.contains("time ×1.250, memory ×0.900"), "{text}");
    assert!(text.contains("held out (refitted on the older 2 run(s), tried on the newer 2)"), "{text}");
    assert!(text.contains("not counted: 1 of platform `frontier`"), "{text}");
    let refined = piper_planner::platform::load(&out).unwrap();
    let spec = piper_planner::model::resolve_model("tiny").unwrap();
    let (_, cfg, before) = priced("tiny", one, 4);
    let after =
        price(&spec, &refined, &one, &cfg, piper_planner::comm::A2aAlgo::Flat, &StageSplit::even(2, 1)).unwrap();
    assert!((after.step_time_s / before.step_time_s - 1.25).abs() < 1e-9);
    assert!((after.peak_memory_bytes / before.peak_memory_bytes - 0.9).abs() < 1e-9);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--out` and `--json` targets that are not regular files are never replaced: a FIFO nobody reads is
/// refused at once (no hang), a character device made in a temporary folder (root; else `/dev/null`) is
/// written in place, a directory is refused; each is still what it was.
#[cfg(unix)]
#[test]
fn outputs_that_are_not_regular_files_stay_what_they_were() {
    use std::os::unix::fs::FileTypeExt;
    let dir = std::env::temp_dir().join(format!("piper-cli-special-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let c = |p: &std::path::Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let fifo = dir.join("plan.fifo");
    // SAFETY: NUL-terminated paths; the calls only create nodes.
    assert_eq!(unsafe { libc::mkfifo(c(&fifo).as_ptr(), 0o600) }, 0);
    let node = dir.join("null");
    let made = unsafe { libc::mknod(c(&node).as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
    let device = if made { node } else { std::path::PathBuf::from("/dev/null") };
    let plan =
        ["plan", "--model", "tiny", "--platform", "local", "--gpus", "2", "--seq-len", "64", "--global-batch", "8"];
    let start = std::time::Instant::now();
    let line = error_line(&[&plan[..], &["--out", fifo.to_str().unwrap()]].concat());
    assert!(line.contains("FIFO that no process reads") && start.elapsed().as_secs() < 30, "{line}");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let out = piper(&[&plan[..], &["--out", device.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::metadata(&device).unwrap().file_type().is_char_device());
    let line = error_line(&[&plan[..], &["--out", dir.to_str().unwrap()]].concat());
    assert!(line.contains("is a directory, not a file"), "{line}");
    assert!(dir.is_dir());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `piper tokenizer train` writes a tokenizer.json that reads back with the vocabulary asked for and
/// round-trips text it never saw; an existing --out is kept unless --overwrite.
#[test]
fn tokenizer_train_writes_a_tokenizer_that_round_trips() {
    let dir = std::env::temp_dir().join(format!("piper-cli-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data.txt");
    let text = "Each stage holds a share of the layers; the expert group dispatches and combines tokens.\n";
    std::fs::write(&data, text.repeat(50)).unwrap();
    let out = dir.join("tokenizer.json");
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let run = piper(&["tokenizer", "train", "--vocab", "320", "--data", d, "--out", o]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).contains("byte-level BPE, 320 tokens"));
    let tok = piper_planner::text::TextTokenizer::from_file(&out, "--tokenizer").unwrap();
    let unseen = "Pipelines, experts — and ünïcode.";
    assert_eq!(tok.decode(&tok.encode(unseen).unwrap()).unwrap(), unseen);
    let before = std::fs::read(&out).unwrap();
    let e = error_line(&["tokenizer", "train", "--vocab", "300", "--data", d, "--out", o]);
    assert!(e.contains("exists; pass --overwrite"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), before, "the refused run left --out as it was");
    let again = piper(&["tokenizer", "train", "--vocab", "300", "--data", d, "--out", o, "--overwrite"]);
    assert!(again.status.success());
    assert_eq!(piper_planner::text::TextTokenizer::from_file(&out, "t").unwrap().vocab_size(), 300);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `piper trace merge` reads trace files only: a file that is not one is named, with the reason; the
/// predicted timeline merges with itself as two side-by-side copies.
#[test]
fn trace_merge_names_a_file_that_is_not_a_trace() {
    let dir = std::env::temp_dir().join(format!("piper-trace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (bad, predicted, out) = (dir.join("bad\u{1b}.json"), dir.join("p.json"), dir.join("out.json"));
    std::fs::write(&bad, "{\"steps\": 3}").unwrap();
    let e = error_line(&["trace", "merge", bad.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(e.contains("bad\\u{1b}.json") && e.contains("traceEvents"), "{e}");
    let p = piper(&[
        "predict",
        "--model",
        "mixtral-8x7b",
        "--pp",
        "2",
        "--num-micro-batches",
        "4",
        "--trace",
        predicted.to_str().unwrap(),
    ]);
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    let both = piper(&[
        "trace",
        "merge",
        predicted.to_str().unwrap(),
        predicted.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(both.status.success(), "{}", String::from_utf8_lossy(&both.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let pids: std::collections::BTreeSet<u64> =
        v["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3]);
    // Drawn as a picture; a window that is not FROM:TO, or holds no span, is refused.
    let pictures = dir.join("pictures");
    let plot = piper(&["trace", "plot", out.to_str().unwrap(), "--out", pictures.to_str().unwrap()]);
    assert!(plot.status.success(), "{}", String::from_utf8_lossy(&plot.stderr));
    assert!(std::fs::metadata(pictures.join("timeline.png")).unwrap().len() > 1000);
    let e = error_line(&["trace", "plot", out.to_str().unwrap(), "--out", "x", "--window", "5:1"]);
    assert!(e.contains("--window") && e.contains("not an increasing window"), "{e}");
    let far = piper(&["trace", "plot", out.to_str().unwrap(), "--out", "x", "--window", "1e12:2e12"]);
    assert!(!far.status.success() && String::from_utf8_lossy(&far.stderr).contains("no span falls in it"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `piper plan --plot DIR` draws the ranked plans: a PNG of the picture's size whose first-ranked bar
/// (green) sits above every other (blue), and an SVG with the plans' labels.
#[test]
fn plan_plot_draws_the_first_choice_on_top() {
    let dir = std::env::temp_dir().join(format!("piper-plan-plot-{}", std::process::id()));
    let out = piper(&[
        "plan",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "--plot",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let decoder = png::Decoder::new(std::fs::File::open(dir.join("plan.png")).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut rgb = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut rgb).unwrap();
    assert_eq!((info.width, info.height), piper_planner::plots::SIZE);
    let rows_of = |want: fn(&[u8]) -> bool| -> Vec<u32> {
        (0..info.height)
            .filter(|y| (0..info.width).any(|x| want(&rgb[((y * info.width + x) * 3) as usize..][..3])))
            .collect()
    };
    let green = rows_of(|p| p[1] > 200 && p[0] < 60 && p[2] < 60);
    let blue = rows_of(|p| p[2] > 200 && p[0] > 60 && p[0] < 140 && p[1] < 140);
    assert!(!green.is_empty() && !blue.is_empty());
    assert!(green.last() < blue.first(), "the first choice's bar is the top one");
    let svg = std::fs::read_to_string(dir.join("plan.svg")).unwrap();
    assert!(svg.contains("1f1b") && svg.contains("peak memory per GPU"));
    std::fs::remove_dir_all(&dir).unwrap();
}
