//! Checkpoints on in-process ranks: a resumed run continues the loss curve of the uninterrupted run bit
//! for bit under the same layout (one process, and PP=2×EP=2 after forced expert migrations), and within
//! 1e-5 relative under any other layout (resharding: PP=2×EP=2 → one process and → EP=2; one process →
//! PP=2×EP=2); `--keep` keeps the newest; bad checkpoints (corrupted, truncated, missing shard, another
//! model, a future format, no `latest`) are refused naming the file, before any step.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use piper_burn::CausalLmConfig;
use piper_burn::corpus::Grammar;
use piper_burn::hf::StateDictAdapter;
use piper_burn::hf::weights::read_f32;
use piper_burn::runtime::checkpoint::{CheckpointSettings, Resume, open_resume};
use piper_burn::runtime::{self, Job, LayoutFlags, RunConfig, StepMetrics};
use piper_comm::{Communicator, LocalComm, LocalWorld, Topology};
use piper_planner::comm::A2aAlgo;
use piper_planner::layout::{Layout, Schedule};
use piper_planner::model::preset;
use piper_planner::model::{ModelSpec, resolve_model};
use piper_planner::run_plan::RunPlan;
use piper_test_support::{assert_close, assert_close_scaled};

fn config(steps: usize) -> RunConfig {
    RunConfig::new()
        .with_steps(steps)
        .with_global_batch(8)
        .with_seq_len(15)
        .with_lr(1e-2)
        .with_warmup_steps(2)
        .with_seed(5)
}

fn plan(model: &str, pp: u64, ep: u64, dp: u64, m: usize, run: &RunConfig) -> RunPlan {
    let spec = preset(model).unwrap();
    let platform = piper_planner::platform::preset("local").unwrap();
    let flags = LayoutFlags {
        layout: Layout { pp, ep, dp },
        micro_batches: m,
        schedule: Schedule::OneFOneB,
        split: None,
        all_to_all: A2aAlgo::Flat,
        ..LayoutFlags::single()
    };
    runtime::plan_from_flags(&spec, &platform, run, &flags, (pp * ep * dp) as usize).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("piper-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `plan` of `model` on this rank, saving into `save` (every `every` steps) and resuming `resume`.
fn run_rank(
    world: &dyn Communicator,
    model: &str,
    plan: &RunPlan,
    run: &RunConfig,
    save: Option<(&Path, usize)>,
    resume: Option<&Resume>,
) -> Result<Vec<StepMetrics>, String> {
    let checkpoint = CheckpointSettings {
        dir: save.map(|(d, _)| d.to_path_buf()),
        save_every: save.map_or(0, |(_, n)| n),
        keep: 5,
        ..CheckpointSettings::default()
    };
    let job = Job {
        spec: preset(model).unwrap(),
        run: run.clone(),
        plan: plan.clone(),
        world,
        topo: Topology::uniform(world.size(), 2).unwrap(),
        platform: piper_planner::platform::preset("local").unwrap(),
        device: Device::flex(),
        flops_per_token: 1.0,
        peak_flops: 1.0,
        checkpoint,
        resume: resume.cloned(),
        init_hf: None,
        schedule: None,
    };
    runtime::execute(&job, &mut Grammar::new(32, 3, 9), |_| {}).map(|t| t.metrics).map_err(|e| e.to_string())
}

/// The losses of a run on `ranks` in-process ranks (every rank must report the same).
fn losses(
    ranks: usize,
    model: &str,
    plan: &RunPlan,
    run: &RunConfig,
    save: Option<(&Path, usize)>,
    resume: Option<&Resume>,
) -> Vec<f64> {
    let out = LocalWorld::run(ranks, |c| run_rank(&c, model, plan, run, save, resume).unwrap());
    let all: Vec<Vec<f64>> = out.iter().map(|m| m.iter().map(|s| s.loss).collect()).collect();
    assert!(all.iter().all(|l| l == &all[0]), "ranks disagree");
    let steps: Vec<usize> = out[0].iter().map(|m| m.step).collect();
    let first = resume.map_or(0, |r| r.manifest.step as usize);
    assert_eq!(steps, (first + 1..=run.steps).collect::<Vec<_>>(), "a resumed run continues the step numbers");
    for m in out[0].iter() {
        if let Some(c) = &m.checkpoint {
            assert_eq!(
                c.folder.file_name().unwrap().to_str().unwrap(),
                format!("step-{:08}", m.step),
                "step {}",
                m.step
            );
        }
    }
    assert_eq!(out[0].iter().filter(|m| m.checkpoint.is_some()).count() > 0, save.is_some(), "saves happened");
    all[0].clone()
}

fn folder(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

#[test]
fn one_process_resumes_bit_exact_and_keeps_the_newest() {
    for model in ["tiny", "tiny-deepseek"] {
        let dir = scratch(&format!("one-{model}"));
        let run = config(12);
        let p = plan(model, 1, 1, 1, 1, &run);
        let whole = losses(1, model, &p, &run, Some((&dir, 4)), None);
        assert_eq!(whole.len(), 12);
        let resume = open_resume(&folder(&dir, 4)).unwrap();
        let resumed = losses(1, model, &p, &run, None, Some(&resume));
        assert_eq!(resumed, whole[4..], "{model}: resumed at step 4, bit for bit");
        // The latest under the dir is step 12; saves at 4, 8, 12 with keep 5 all remain.
        assert_eq!(open_resume(&dir).unwrap().manifest.step, 12);
        let kept: Vec<u64> = piper_planner::checkpoint::complete_folders(&dir).iter().map(|(s, _)| *s).collect();
        assert_eq!(kept, vec![4, 8, 12]);
        piper_planner::checkpoint::prune(&dir, 2).unwrap();
        let kept: Vec<u64> = piper_planner::checkpoint::complete_folders(&dir).iter().map(|(s, _)| *s).collect();
        assert_eq!(kept, vec![8, 12]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn pipelined_expert_parallel_resumes_bit_exact_after_migrations_and_reshards() {
    let dir = scratch("pp2ep2");
    // Forced migrations (threshold 1, a check every 3 steps): the placement differs from the plan's.
    let run = config(12)
        .with_migration_threshold(Some(1.0))
        .with_migration_every(Some(3))
        .with_migration_decision(runtime::MigrationDecision::Threshold);
    let p4 = plan("tiny", 2, 2, 1, 2, &run);
    let whole = losses(4, "tiny", &p4, &run, Some((&dir, 6)), None);
    let resume = open_resume(&folder(&dir, 6)).unwrap();
    let moved = resume.manifest.placements.iter().any(|p| p.rank_of != vec![0, 0, 0, 0, 1, 1, 1, 1]);
    assert!(moved, "migrations changed the placement before the save");
    let same = losses(4, "tiny", &p4, &run, None, Some(&resume));
    assert_eq!(same, whole[6..], "PP=2×EP=2 resumed bit for bit");
    // Resharded: one process (same micro-batch count) and EP=2 on two ranks, each reading what it needs.
    let one = losses(1, "tiny", &plan("tiny", 1, 1, 1, 2, &run), &run, None, Some(&resume));
    let worst = assert_close("PP2×EP2 → one process", &one, &whole[6..], 1e-5);
    eprintln!("PP=2×EP=2 → one process: worst relative loss difference {worst:e}");
    let ep2 =
        losses(2, "tiny", &plan("tiny", 1, 2, 1, 1, &run.clone().with_global_batch(8)), &run, None, Some(&resume));
    assert_eq!(ep2.len(), 6);
    // EP=2 with M=1 differs from M=2 only through the load-balancing loss's micro-batches: compare it
    // with one process at M=1 resumed from the same checkpoint.
    let one_m1 = losses(1, "tiny", &plan("tiny", 1, 1, 1, 1, &run), &run, None, Some(&resume));
    let worst = assert_close("PP2×EP2 → EP2", &ep2, &one_m1, 1e-5);
    eprintln!("PP=2×EP=2 → EP=2 (vs one process, M=1): worst relative loss difference {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_process_checkpoint_resumes_on_four_ranks() {
    let dir = scratch("one-to-four");
    let run = config(10);
    let p1 = plan("tiny", 1, 1, 1, 2, &run);
    let whole = losses(1, "tiny", &p1, &run, Some((&dir, 5)), None);
    let resume = open_resume(&folder(&dir, 5)).unwrap();
    let four = losses(4, "tiny", &plan("tiny", 2, 2, 1, 2, &run), &run, None, Some(&resume));
    let worst = assert_close("one process → PP2×EP2", &four, &whole[5..], 1e-5);
    eprintln!("one process → PP=2×EP=2: worst relative loss difference {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Named tensors in Hugging Face layout: (name, shape, values).
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// The whole model of a run on `ranks` in-process ranks, by way of its final checkpoint exported as one
/// Hugging Face folder and loaded back: (tensors of the export, the exported config's spec).
fn exported(ranks: usize, p: &RunPlan, run: &RunConfig, dir: &Path) -> (Tensors, ModelSpec) {
    let save = dir.join("ckpt");
    losses(ranks, "tiny", p, run, Some((&save, 0)), None);
    let out = dir.join("hf");
    let e = piper_planner::checkpoint::export::export_hf(&save, &out, false).unwrap();
    assert_eq!(e.config, piper_planner::checkpoint::export::ExportedConfig::Mixtral, "tiny is Mixtral-shaped");
    let spec = resolve_model(out.join("config.json").to_str().unwrap()).unwrap();
    let tensors = read_f32(&std::fs::read(out.join("model.safetensors")).unwrap(), "").unwrap();
    // Loads into a fresh model through the HF loader, and reads back the same tensors.
    let fresh = CausalLmConfig::from_spec(&spec).unwrap().init(&Device::flex());
    let adapter = StateDictAdapter::new(&spec);
    let model = adapter.from_hf(fresh, &tensors).unwrap();
    let mut back = adapter.to_hf(&model);
    back.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(back.len(), tensors.len());
    for (name, shape, values) in &back {
        assert_eq!((shape, values), (&tensors[name].0, &tensors[name].1), "{name} round trip");
    }
    (back, spec)
}

#[test]
fn any_layout_exports_one_hugging_face_model() {
    let dir = scratch("export");
    let run = config(6)
        .with_migration_threshold(Some(1.0))
        .with_migration_every(Some(2))
        .with_migration_decision(runtime::MigrationDecision::Threshold);
    let (one, spec) = exported(1, &plan("tiny", 1, 1, 1, 2, &run), &run, &dir.join("one"));
    let (four, _) = exported(4, &plan("tiny", 2, 2, 1, 2, &run), &run, &dir.join("four"));
    // The exported config builds the same Burn model as the preset.
    let json = |s: &ModelSpec| serde_json::to_string(&CausalLmConfig::from_spec(s).unwrap()).unwrap();
    assert_eq!(json(&spec), json(&preset("tiny").unwrap()));
    // The same training on four ranks (after migrations) and on one: every tensor, by name, to round-off.
    assert_eq!(one.iter().map(|t| &t.0).collect::<Vec<_>>(), four.iter().map(|t| &t.0).collect::<Vec<_>>());
    let flat =
        |v: &[(String, Vec<usize>, Vec<f32>)]| v.iter().flat_map(|t| t.2.iter().map(|x| *x as f64)).collect::<Vec<_>>();
    // 5e-4: the layouts round differently (per-rank batches, all-reduced gradients) and routing is discrete.
    // Measured 2.3e-4 since the fused cross-entropy (5.8e-5 with Burn's): all in one expert matrix
    // (layer 1, expert 2, w1), every other tensor ≤ 8e-5 — most likely a token whose top-k tie broke the
    // other way (not traced token by token), not a drift spread over the model. The fused loss itself matches Burn's to 1.3e-6 (kernels parity).
    let worst = assert_close_scaled("PP2×EP2 vs one process, exported weights", &flat(&four), &flat(&one), 5e-4);
    eprintln!("exported weights, PP=2×EP=2 vs one process: worst scaled difference {worst:e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Resuming `path` must fail before any step, with an error containing every `want`.
fn refused(path: &Path, model: &str, want: &[&str]) {
    let err = match open_resume(path) {
        Err(e) => e.to_string(),
        Ok(r) => {
            let run = config(12);
            run_rank(&LocalComm::single(), model, &plan(model, 1, 1, 1, 1, &run), &run, None, Some(&r)).unwrap_err()
        }
    };
    for w in want {
        assert!(err.contains(w), "`{w}` not in: {err}");
    }
    assert!(!err.contains('\n'), "one line: {err}");
}

#[test]
fn bad_checkpoints_are_refused_naming_the_file() {
    let dir = scratch("bad");
    let run = config(4);
    losses(1, "tiny", &plan("tiny", 1, 1, 1, 1, &run), &run, Some((&dir, 2)), None);
    let good = folder(&dir, 4);
    let shard = good.join("shard-00000.safetensors");
    let copy = |name: &str| {
        let to = dir.join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&good).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
        }
        to
    };
    // One flipped byte in the last tensor's data.
    let corrupt = copy("corrupt");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x40;
    std::fs::write(corrupt.join("shard-00000.safetensors"), &bytes).unwrap();
    refused(&corrupt, "tiny", &["corrupt/shard-00000.safetensors", "SHA-256"]);
    // Truncated.
    let truncated = copy("truncated");
    std::fs::write(truncated.join("shard-00000.safetensors"), &bytes[..n / 2]).unwrap();
    refused(&truncated, "tiny", &["truncated/shard-00000.safetensors", "truncated"]);
    // Missing shard.
    let missing = copy("missing");
    std::fs::remove_file(missing.join("shard-00000.safetensors")).unwrap();
    refused(&missing, "tiny", &["missing/shard-00000.safetensors", "missing shard"]);
    // Another model.
    refused(&good, "tiny-qwen3", &["is a checkpoint of model `tiny`", "tiny-qwen3"]);
    // A future format version.
    let future = copy("future");
    let text = std::fs::read_to_string(future.join("manifest.json")).unwrap();
    std::fs::write(future.join("manifest.json"), text.replacen("\"version\": 1", "\"version\": 99", 1)).unwrap();
    refused(&future, "tiny", &["future/manifest.json", "format version 99", "newer piper"]);
    // `latest` names a folder that is gone: an error that lists what is there, never a silent fall-back.
    std::fs::remove_dir_all(&good).unwrap();
    refused(&dir, "tiny", &["holds no manifest.json", "step-00000002"]);
    // Another seed (it draws the data).
    let r = open_resume(&folder(&dir, 2)).unwrap();
    let other = config(12).with_seed(6);
    let err =
        run_rank(&LocalComm::single(), "tiny", &plan("tiny", 1, 1, 1, 1, &other), &other, None, Some(&r)).unwrap_err();
    assert!(err.contains("trained with `seed` 5, this run has `seed` 6"), "{err}");
    // Nothing to train.
    let r = open_resume(&folder(&dir, 2)).unwrap();
    let short = config(2);
    let err =
        run_rank(&LocalComm::single(), "tiny", &plan("tiny", 1, 1, 1, 1, &short), &short, None, Some(&r)).unwrap_err();
    assert!(err.contains("nothing to train"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
