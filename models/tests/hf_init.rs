//! Starting from Hugging Face model folders: `hf_eval`'s evaluation of the transformers fixtures (config.json
//! and model.safetensors, as `save_pretrained` writes them, from transformers 4.57.1 and 5.24.0)
//! reproduces transformers' cross-entropy and logits' argmax; BF16 weights in a sharded folder
//! (`model.safetensors.index.json`) read as the rounded values; a run with `--init-hf` starts from
//! exactly those weights (its first loss is the folder's cross-entropy on the first batch), on one process
//! and as PP=2×EP=2 in-process ranks.

use std::path::{Path, PathBuf};

use piper_burn::corpus::{Corpus, Grammar};
use piper_burn::hf::weights::read_f32;
use piper_burn::runtime::{self, Job, LayoutFlags, RunConfig};
use piper_comm::{LocalWorld, Topology};
use piper_models::eval::evaluate;
use piper_planner::comm::A2aAlgo;
use piper_planner::hf::read_hf_tensors;
use piper_planner::layout::{Layout, Schedule};
use piper_planner::model::resolve_model;
use piper_test_support::hf_folder::{V4, V5, bf16_bits, hf_folder as folder};
use safetensors::SafeTensors;

/// Fixture folder of a transformers version.
fn fixtures(version: &str) -> PathBuf {
    piper_test_support::fixtures().join(version)
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
    let run = RunConfig::new().with_steps(1).with_global_batch(4).with_seq_len(15).with_seed(1);
    let platform = piper_planner::platform::preset("local").unwrap();
    let ranks = flags.layout.gpus() as usize;
    let losses = LocalWorld::run(ranks, |c| {
        let job = Job::builder(spec.clone(), &c)
            .run(run.clone())
            .layout(flags.clone())
            .platform(platform.clone())
            .topology(Topology::uniform(ranks, 2).unwrap())
            .peak_flops(1.0)
            .init_hf(dir)
            .build()
            .unwrap();
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
        ..LayoutFlags::single()
    };
    for (what, flags) in [("one process", single), ("PP=2×EP=2", pp2ep2)] {
        let got = first_loss(&dir, flags);
        let rel = (got - want).abs() / want;
        assert!(rel < 1e-5, "{what}: first loss {got} vs the folder's cross-entropy {want} ({rel:e})");
        eprintln!("--init-hf, {what}: first loss {got} vs {want}: {rel:e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
