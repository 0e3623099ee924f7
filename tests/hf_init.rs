//! Starting from Hugging Face model folders: `hf_eval`'s evaluation of the transformers fixtures (config.json
//! and model.safetensors, as `save_pretrained` writes them, from transformers 4.57.1 and 5.24.0)
//! reproduces transformers' cross-entropy and logits' argmax; BF16 weights in a sharded folder
//! (`model.safetensors.index.json`) read as the rounded values; a run with `--init-hf` starts from
//! exactly those weights (its first loss is the folder's cross-entropy on the first batch), on one process
//! and as PP=2×EP=2 in-process ranks; and a DeepSeek-V3 folder with an MTP module trains only with
//! `--mtp-loss-weight 0`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use piper::comm::{LocalWorld, Topology};
use piper::models::eval::evaluate;
use piper::models::hf_weights::read_f32;
use piper::models::lm_config;
use piper::modules::corpus::{Corpus, Grammar};
use piper::modules::runtime::checkpoint::CheckpointSettings;
use piper::modules::runtime::{self, Job, LayoutFlags, RunConfig};
use piper::planner::comm::A2aAlgo;
use piper::planner::hf_files::read_hf_tensors;
use piper::planner::layout::{Layout, Schedule};
use piper::planner::model::resolve_model;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

mod common;

/// Fixture folder of a transformers version: "" (4.57.1) or "transformers5" (5.24.0).
fn fixtures(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(version)
}

const V4: &str = "";
const V5: &str = "transformers5";

/// A model folder as transformers writes it from the fixture `name`: config.json and the weights (times
/// `scale`), f32 in one model.safetensors, or BF16 in two shards with an index.
fn folder(version: &str, name: &str, bf16: bool, test: &str, scale: f32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("piper-hf-{test}-{version}{name}-{bf16}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixtures(version).join(format!("hf_{name}_config.json")), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(fixtures(version).join(format!("hf_{name}.safetensors"))).unwrap();
    let mut weights: Vec<(String, Vec<usize>, Vec<f32>)> = read_f32(&bytes, "weight.")
        .unwrap()
        .into_iter()
        .map(|(n, (s, v))| (n, s, v.iter().map(|x| x * scale).collect()))
        .collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    let encode = |v: &[f32]| -> Vec<u8> {
        if bf16 {
            v.iter().flat_map(|x| (bf16_bits(*x)).to_le_bytes()).collect()
        } else {
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
    };
    let dtype = if bf16 { Dtype::BF16 } else { Dtype::F32 };
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> =
        weights.iter().map(|(n, s, v)| (n.clone(), s.clone(), encode(v))).collect();
    let write = |file: &str, part: &[(String, Vec<usize>, Vec<u8>)]| {
        let views: Vec<(String, TensorView)> =
            part.iter().map(|(n, s, b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &dir.join(file)).unwrap();
    };
    if bf16 {
        let half = encoded.len() / 2;
        let files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
        write(files[0], &encoded[..half]);
        write(files[1], &encoded[half..]);
        let map: HashMap<&String, &str> =
            encoded.iter().enumerate().map(|(i, (n, _, _))| (n, files[usize::from(i >= half)])).collect();
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    } else {
        write("model.safetensors", &encoded);
    }
    dir
}

/// f32 → bf16 bits, rounding to nearest even (as torch does).
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The fixture's input ids, transformers' cross-entropy and its logits' argmax per position.
fn reference(version: &str, name: &str) -> (Vec<Vec<i64>>, f64, Vec<Vec<usize>>) {
    let bytes = std::fs::read(fixtures(version).join(format!("hf_{name}.safetensors"))).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor("input_ids").unwrap();
    let s = view.shape()[1];
    let flat: Vec<i64> = view.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    let refs = read_f32(&bytes, "").unwrap();
    let (shape, logits) = &refs["logits"];
    let v = shape[2];
    let argmax = logits
        .chunks(v)
        .map(|row| row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0)
        .collect::<Vec<_>>()
        .chunks(shape[1])
        .map(|c| c.to_vec())
        .collect();
    (flat.chunks(s).map(|c| c.to_vec()).collect(), refs["cross_entropy"].1[0] as f64, argmax)
}

#[test]
fn hf_eval_reproduces_transformers_on_its_own_folders() {
    let v4 = ["mixtral", "qwen3_moe", "deepseek_v3"].map(|n| (V4, n));
    let v5 = ["mixtral", "qwen3_moe", "deepseek_v3", "deepseek_v2", "qwen2_moe", "olmoe"].map(|n| (V5, n));
    for (version, name) in v4.into_iter().chain(v5) {
        let dir = folder(version, name, false, "eval", 1.0);
        let (ids, ce, argmax) = reference(version, name);
        let e = evaluate(&dir, &ids).unwrap();
        let name = format!("{name} (transformers {})", if version.is_empty() { "4" } else { "5" });
        // transformers computes logits for every position; the fixture's logits come from the same ids.
        assert_eq!(e.logits_shape[..2], [ids.len(), ids[0].len()]);
        assert_eq!(e.argmax, argmax, "{name}: argmax of the logits");
        let rel = (e.cross_entropy - ce).abs() / ce.abs();
        assert!(rel < 1e-5, "{name}: cross-entropy {} vs transformers {ce} ({rel:e})", e.cross_entropy);
        eprintln!("{name}: cross-entropy {} vs transformers {ce}: {rel:e}", e.cross_entropy);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// transformers 5 writes `num_nextn_predict_layers: 1` into every DeepSeek-V3 config. `mixtral_train
/// --init-hf` refuses it naming the field and the flag, and trains without the MTP module with
/// `--mtp-loss-weight 0`; a weight for a model without MTP is refused too.
#[test]
fn deepseek_v3_with_mtp_trains_only_with_an_explicit_zero_weight() {
    let dir = folder(V5, "deepseek_v3", false, "mtp", 1.0);
    let d = dir.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut cmd = std::process::Command::new(common::example());
        cmd.args(["--init-hf", d, "--steps", "2", "--batch-size", "2", "--seq-len", "11", "--no-progress"]).args(extra);
        common::run(cmd, std::time::Duration::from_secs(120))
    };
    let (ok, out) = run(&[]);
    assert!(!ok && out.contains("`num_nextn_predict_layers`") && out.contains("--mtp-loss-weight 0"), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("error")).count(), 1, "{out}");
    let (ok, out) = run(&["--mtp-loss-weight", "0.3"]);
    assert!(!ok && out.contains("`num_nextn_predict_layers`"), "{out}");
    let (ok, out) = run(&["--mtp-loss-weight", "0"]);
    assert!(ok, "{out}");
    let mixtral = folder(V5, "mixtral", false, "mtp", 1.0);
    let mut cmd = std::process::Command::new(common::example());
    cmd.args(["--init-hf", mixtral.to_str().unwrap(), "--steps", "1", "--mtp-loss-weight", "0.1", "--no-progress"]);
    let (ok, out) = common::run(cmd, std::time::Duration::from_secs(60));
    assert!(!ok && out.contains("--mtp-loss-weight") && out.contains("no multi-token-prediction module"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&mixtral).unwrap();
}

#[test]
fn bf16_sharded_folders_read_as_their_rounded_values() {
    let (f32_dir, bf16_dir) = (folder(V4, "mixtral", false, "bf16", 1.0), folder(V4, "mixtral", true, "bf16", 1.0));
    let names = vec!["model.embed_tokens.weight".to_string(), "lm_head.weight".to_string(), "nope".to_string()];
    let (exact, _) = read_hf_tensors(&f32_dir, &names).unwrap();
    let (rounded, missing) = read_hf_tensors(&bf16_dir, &names).unwrap();
    assert_eq!(missing, vec!["nope".to_string()]);
    for n in &names[..2] {
        let want: Vec<f32> = exact[n].1.iter().map(|x| f32::from_bits((bf16_bits(*x) as u32) << 16)).collect();
        assert_eq!(rounded[n].1, want, "{n}");
        assert_ne!(rounded[n].1, exact[n].1, "{n}: the values were rounded");
    }
    let (ids, ce, _) = reference(V4, "mixtral");
    let e = evaluate(&bf16_dir, &ids).unwrap();
    assert!((e.cross_entropy - ce).abs() / ce < 1e-2, "bf16 weights: {} vs {ce}", e.cross_entropy);
    std::fs::remove_dir_all(&f32_dir).unwrap();
    std::fs::remove_dir_all(&bf16_dir).unwrap();
}

/// The first loss of a run started with `--init-hf dir` on `ranks` in-process ranks.
fn first_loss(dir: &Path, flags: LayoutFlags) -> f64 {
    let spec = resolve_model(dir.join("config.json").to_str().unwrap()).unwrap();
    let lm = lm_config(&spec).unwrap();
    let run = RunConfig::new().with_steps(1).with_global_batch(4).with_seq_len(15).with_seed(1);
    let platform = piper::planner::platform::preset("local").unwrap();
    let ranks = flags.layout.gpus() as usize;
    let plan = runtime::plan_from_flags(&spec, &platform, &run, &flags, ranks).unwrap();
    let losses = LocalWorld::run(ranks, |c| {
        let topo = Topology::uniform(ranks, 2).unwrap();
        let job = Job {
            spec: &spec,
            model: &lm,
            run: &run,
            plan: &plan,
            world: &c,
            topo: &topo,
            platform: &platform,
            device: &Device::flex(),
            flops_per_token: 1.0,
            peak_flops: 1.0,
            checkpoint: &CheckpointSettings::default(),
            resume: None,
            init_hf: Some(dir),
        };
        runtime::execute(&job, &mut Grammar::new(16, 3, 9), |_| {}).unwrap().metrics[0].loss
    });
    assert!(losses.iter().all(|l| *l == losses[0]));
    losses[0]
}

#[test]
fn init_hf_starts_from_the_folders_weights_on_any_layout() {
    // Weights × 4: far from a fresh random model, whose loss is ≈ ln(vocab) like the fixture's.
    let dir = folder(V5, "mixtral", false, "init", 4.0);
    // The first batch the run draws, evaluated on the folder's weights.
    let batch = Grammar::new(16, 3, 9).batch(4, 16);
    let ids: Vec<Vec<i64>> = batch.chunks(16).map(|c| c.to_vec()).collect();
    let want = evaluate(&dir, &ids).unwrap().cross_entropy;
    assert!((want - 64f64.ln()).abs() > 0.1, "the folder's loss {want} must be unlike a random model's");
    let single = LayoutFlags::single();
    let pp2ep2 = LayoutFlags {
        layout: Layout { pp: 2, ep: 2, dp: 1 },
        micro_batches: 1,
        schedule: Schedule::OneFOneB,
        split: None,
        all_to_all: A2aAlgo::Flat,
    };
    for (what, flags) in [("one process", single), ("PP=2×EP=2", pp2ep2)] {
        let got = first_loss(&dir, flags);
        let rel = (got - want).abs() / want;
        assert!(rel < 1e-5, "{what}: first loss {got} vs the folder's cross-entropy {want} ({rel:e})");
        eprintln!("--init-hf, {what}: first loss {got} vs {want}: {rel:e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
