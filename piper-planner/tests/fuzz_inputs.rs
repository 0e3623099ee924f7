//! Fuzzing the input parsers (bounded, so it runs in CI): model configs (Hugging Face families and native
//! specs), platform TOML, loads files, plan files, checkpoint manifests and safetensors headers, with
//! random and adversarial values — 0, negative, NaN-like, huge, fractional, powers of two up to 2⁷⁰,
//! wrong types, truncated files. Each input is either refused with an error or accepted, and whatever is
//! accepted is priced (or read): no panic, no hang, no allocation past the file, and every count and
//! prediction finite and non-negative (step time positive).
//!
//! Cases per property: `PROPTEST_CASES` (default 256 here); set it higher for a longer local run.

use std::path::PathBuf;

use piper_planner::checkpoint::export::export_hf;
use piper_planner::checkpoint::shard::{Source, write_shard};
use piper_planner::checkpoint::{FORMAT, FORMAT_VERSION, Manifest, OptimizerState};
use piper_planner::comm::A2aAlgo;
use piper_planner::hf::read_hf_tensors;
use piper_planner::layout::{Layout, StageSplit, TrainConfig};
use piper_planner::memory::Footprint;
use piper_planner::migration::rebalance;
use piper_planner::model::presets::load_model_str;
use piper_planner::model::{ModelSpec, active_params, param_breakdown, training_flops_per_token};
use piper_planner::planner::{PlanRequest, plan, price};
use piper_planner::platform::{self, Platform};
use piper_planner::run_plan::RunPlan;
use proptest::prelude::*;
use serde_json::{Value, json};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// An adversarial JSON value for a numeric field.
fn nasty() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..70)
            .prop_map(|k| json!(1u128.checked_shl(k as u32).map_or(u64::MAX, |v| v.min(u64::MAX as u128) as u64))),
        (0u64..9).prop_map(|v| json!(v)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(-1e18)),
        Just(json!(0.5)),
        Just(json!(1e300)),
        Just(json!(1e18)),
        Just(json!(f64::MIN_POSITIVE)),
        Just(json!("12")),
        Just(json!(true)),
        Just(Value::Null),
        Just(json!([1, 2])),
    ]
}

/// Numeric leaves of a JSON document, as JSON pointers.
fn numeric_leaves(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Number(_) => out.push(at),
        Value::Object(m) => m.iter().for_each(|(k, v)| numeric_leaves(v, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| numeric_leaves(v, format!("{at}/{i}"), out)),
        _ => {}
    }
}

/// `base` with up to four numeric leaves replaced.
fn mutated(base: &Value, picks: &[(prop::sample::Index, Value)]) -> Value {
    let mut leaves = Vec::new();
    numeric_leaves(base, String::new(), &mut leaves);
    let mut doc = base.clone();
    for (i, v) in picks {
        let at = &leaves[i.index(leaves.len())];
        *doc.pointer_mut(at).expect("leaf") = v.clone();
    }
    doc
}

fn finite_non_negative(what: &str, v: f64) -> Result<(), TestCaseError> {
    prop_assert!(v.is_finite() && v >= 0.0, "{} = {}", what, v);
    Ok(())
}

/// Prices an accepted model on a platform with the smallest layout: counts, FLOPs, memory and step time
/// must be finite and non-negative.
fn price_model(spec: &ModelSpec, platform: &Platform, seq_len: u64) -> Result<(), TestCaseError> {
    let params = param_breakdown(spec);
    prop_assert!(params.total() > 0 && active_params(spec) <= params.total());
    finite_non_negative("flops per token", training_flops_per_token(spec, seq_len).total())?;
    let dtype = if platform.peak_tflops.contains_key("bf16") { "bf16" } else { "fp32" };
    let cfg = TrainConfig { dtype: dtype.into(), ..TrainConfig::new(seq_len) };
    let layout = Layout { pp: 1, ep: 1, dp: 1 };
    let split = StageSplit::even(spec.num_layers, 1);
    let stages = match Footprint::new(spec, platform, &layout, &cfg) {
        Ok(f) => f.stages(&split),
        Err(_) => return Ok(()), // refused with a reason (e.g. a dtype the platform lacks)
    };
    for s in &stages {
        finite_non_negative("stage bytes", s.total_bytes)?;
    }
    if let Ok(c) = price(spec, platform, &layout, &cfg, A2aAlgo::Flat, &split) {
        prop_assert!(c.step_time_s.is_finite() && c.step_time_s > 0.0, "step time {}", c.step_time_s);
        for (what, v) in [("mfu", c.mfu), ("tokens/s", c.tokens_per_s), ("bubble", c.bubble_fraction)] {
            finite_non_negative(what, v)?;
        }
    }
    Ok(())
}

const MIXTRAL: &str = r#"{"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "num_local_experts": 4, "num_experts_per_tok": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}"#;
const QWEN3: &str = r#"{"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 256, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
    "mlp_only_layers": [0]}"#;
const DEEPSEEK: &str = include_str!("../presets/models/deepseek-v3.json");

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn model_configs_are_refused_or_priced(
        family in 0usize..3,
        picks in prop::collection::vec((any::<prop::sample::Index>(), nasty()), 1..5),
        seq_len in prop_oneof![1u64..4096, Just(1u64 << 24)],
    ) {
        let base: Value = serde_json::from_str([MIXTRAL, QWEN3, DEEPSEEK][family]).unwrap();
        let text = mutated(&base, &picks).to_string();
        let frontier = platform::preset("frontier").unwrap();
        if let Ok(spec) = load_model_str(&text, "fuzz.json") {
            price_model(&spec, &frontier, seq_len)?;
            // The native spec it prints reads back to the same model.
            let mut native = serde_json::to_value(&spec).unwrap();
            native["model_type"] = "piper".into();
            let again = load_model_str(&native.to_string(), "native.json").unwrap();
            prop_assert_eq!(again.num_layers, spec.num_layers);
        }
    }

    #[test]
    fn native_specs_are_refused_or_priced(picks in prop::collection::vec((any::<prop::sample::Index>(), nasty()), 1..5)) {
        let spec = piper_planner::model::preset("tiny").unwrap();
        let mut base = serde_json::to_value(&spec).unwrap();
        base["model_type"] = "piper".into();
        if let Ok(spec) = load_model_str(&mutated(&base, &picks).to_string(), "spec.json") {
            price_model(&spec, &platform::preset("local").unwrap(), 64)?;
        }
    }

    #[test]
    fn platform_files_are_refused_or_priced(
        which in 0usize..3,
        picks in prop::collection::vec((any::<prop::sample::Index>(), nasty()), 1..5),
    ) {
        let name = ["local", "frontier", "nvlink-8"][which];
        let base = serde_json::to_value(platform::preset(name).unwrap()).unwrap();
        let doc = mutated(&base, &picks);
        // Through TOML, as a user's file arrives (values TOML cannot hold are refused by the encoder).
        let Ok(p) = serde_json::from_value::<Platform>(doc) else { return Ok(()) };
        let Ok(text) = toml::to_string(&p) else { return Ok(()) };
        if let Ok(p) = platform::parse(&text, "fuzz.toml") {
            let spec = piper_planner::model::preset("tiny").unwrap();
            price_model(&spec, &p, 64)?;
            let gpus = p.gpus_per_node.min(8);
            let mut req = PlanRequest::new(gpus, 8 * gpus, 64);
            req.base.dtype = if p.peak_tflops.contains_key("bf16") { "bf16".into() } else { "fp32".into() };
            if let Ok(report) = plan(&spec, &p, &req) {
                for c in &report.plans {
                    prop_assert!(c.step_time_s.is_finite() && c.step_time_s > 0.0);
                    finite_non_negative("peak memory", c.peak_memory_bytes)?;
                }
            }
        }
    }

    #[test]
    fn loads_are_refused_or_rebalanced(
        loads in prop::collection::vec(prop_oneof![0.0f64..1e6, Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(1e300)], 0..24),
        placement in prop::collection::vec(prop_oneof![0u64..6, Just(u64::MAX)], 0..24),
        ranks in prop_oneof![0u64..8, Just(1u64 << 40)],
        iterations in prop_oneof![0u64..64, Just(u64::MAX)],
        bytes in prop_oneof![0.0f64..1e9, Just(f64::NAN), Just(-1e9), Just(f64::INFINITY)],
        link in prop_oneof![1.0f64..100.0, Just(0.0), Just(f64::INFINITY), Just(f64::NAN)],
    ) {
        if let Ok(m) = rebalance(&loads, &placement, ranks, iterations, bytes, link) {
            for (what, v) in [("before", m.imbalance_before), ("after", m.imbalance_after), ("bytes", m.bytes_moved), ("time", m.time_s)] {
                finite_non_negative(what, v)?;
            }
            prop_assert!(m.imbalance_after <= m.imbalance_before + 1e-12);
        }
    }

    #[test]
    fn plan_files_are_refused_or_consistent(picks in prop::collection::vec((any::<prop::sample::Index>(), nasty()), 1..4)) {
        let spec = piper_planner::model::preset("tiny").unwrap();
        let p = platform::preset("local").unwrap();
        let mut req = PlanRequest::new(4, 8, 32);
        req.base.dtype = "fp32".into();
        let best = plan(&spec, &p, &req).unwrap().plans.remove(0);
        let good = RunPlan::from_candidate(&spec, "local", 32, "fp32", &best);
        let doc = mutated(&serde_json::to_value(&good).unwrap(), &picks);
        if let Ok(run) = RunPlan::parse(&doc.to_string(), "plan.json") {
            prop_assert_eq!(run.pp * run.ep * run.dp, run.gpus);
            prop_assert_eq!(run.split().0.iter().sum::<u64>(), run.stages.iter().map(|s| s.num_layers).sum::<u64>());
            finite_non_negative("predicted step", run.predicted.step_time_s)?;
            finite_non_negative("predicted peak", run.predicted.peak_memory_bytes())?;
        }
    }

    #[test]
    fn safetensors_headers_are_refused_or_read(
        picks in prop::collection::vec((any::<prop::sample::Index>(), nasty()), 0..4),
        dtype in prop_oneof![Just("F32"), Just("BF16"), Just("F16"), Just("I64"), Just(""), Just("F32\u{1b}[2J")],
        header_len in prop_oneof![Just(None), Just(Some(0u64)), Just(Some(u64::MAX)), (0u64..400).prop_map(Some)],
        data_len in 0usize..64,
    ) {
        let base = json!({
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
            "__metadata__": {"format": "pt"},
        });
        let mut doc = mutated(&base, &picks);
        doc["b"]["dtype"] = dtype.into();
        let text = doc.to_string();
        let mut bytes = header_len.unwrap_or(text.len() as u64).to_le_bytes().to_vec();
        bytes.extend(text.as_bytes());
        bytes.extend((0..data_len).map(|i| (i * 7) as u8 & 0x3f));
        let dir = scratch("safetensors");
        std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
        if let Ok((tensors, _missing)) = read_hf_tensors(&dir, &["a".into(), "b".into()]) {
            for (name, (shape, values)) in &tensors {
                prop_assert_eq!(values.len(), shape.iter().product::<usize>(), "{}", name);
                prop_assert!(values.iter().all(|v| v.is_finite()), "{}", name);
                prop_assert!(values.len() * 2 <= data_len, "{} read past the data", name);
            }
        }
    }

    #[test]
    fn checkpoint_manifests_are_refused_or_exported(
        picks in prop::collection::vec((any::<prop::sample::Index>(), nasty()), 1..4),
    ) {
        let (folder, good) = tiny_checkpoint();
        let doc = mutated(&good, &picks);
        let case = scratch("manifest-case");
        let ckpt = case.join("step-1");
        std::fs::create_dir_all(&ckpt).unwrap();
        std::fs::copy(folder.join("rank-0.safetensors"), ckpt.join("rank-0.safetensors")).unwrap();
        std::fs::write(ckpt.join("manifest.json"), doc.to_string()).unwrap();
        if let Ok(e) = export_hf(&ckpt, &case.join("hf"), false) {
            // Accepted: the export is a model the planner reads, with every tensor the shards hold.
            let spec = piper_planner::model::resolve_model(case.join("hf/config.json").to_str().unwrap());
            prop_assert!(spec.is_ok(), "{:?}", spec.err());
            let (tensors, missing) = read_hf_tensors(&case.join("hf"), &tiny_names()).unwrap();
            prop_assert!(missing.is_empty() && tensors.len() == e.tensors, "{:?}", missing);
        }
        std::fs::remove_dir_all(&case).unwrap();
    }

    /// A manifest that lists a shard file or a tensor a second time (anywhere: the same shard, another
    /// entry of it) is refused, naming the file or the tensor, before anything is written.
    #[test]
    fn manifests_with_duplicate_entries_are_refused(
        tensor in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        whole_file: bool,
    ) {
        let (folder, good) = tiny_checkpoint();
        let mut doc = good.clone();
        let files = doc["files"].as_array_mut().unwrap();
        let named = if whole_file {
            files.push(files[0].clone());
            files[0]["name"].as_str().unwrap().to_string()
        } else {
            let list = files[0]["tensors"].as_array_mut().unwrap();
            let copy = list[tensor.index(list.len())].clone();
            list.insert(at.index(list.len() + 1), copy.clone());
            copy["name"].as_str().unwrap().to_string()
        };
        let case = scratch("manifest-duplicate");
        let ckpt = case.join("step-1");
        std::fs::create_dir_all(&ckpt).unwrap();
        std::fs::copy(folder.join("rank-0.safetensors"), ckpt.join("rank-0.safetensors")).unwrap();
        std::fs::write(ckpt.join("manifest.json"), doc.to_string()).unwrap();
        let err = export_hf(&ckpt, &case.join("hf"), false).unwrap_err().to_string();
        prop_assert!(err.contains("twice") && err.contains(&format!("`{named}`")), "{}", err);
        prop_assert!(!case.join("hf").exists(), "nothing is written");
        std::fs::remove_dir_all(&case).unwrap();
    }
}

/// A folder of this test process for `name`, emptied.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("piper-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The weights of the `tiny` preset that an export checks for (Mixtral names), with their shapes.
fn tiny_tensors() -> Vec<(String, Vec<usize>)> {
    let spec = piper_planner::model::preset("tiny").unwrap();
    let (d, f) = (spec.hidden_size as usize, spec.moe.as_ref().unwrap().expert.intermediate_size as usize);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![spec.vocab_size as usize, d])];
    out.push(("model.norm.weight".into(), vec![d]));
    for i in 0..spec.num_layers {
        out.push((format!("model.layers.{i}.input_layernorm.weight"), vec![d]));
        for x in 0..spec.num_experts() {
            for (w, shape) in [("w1", vec![f, d]), ("w2", vec![d, f]), ("w3", vec![f, d])] {
                out.push((format!("model.layers.{i}.block_sparse_moe.experts.{x}.{w}.weight"), shape));
            }
        }
    }
    out
}

fn tiny_names() -> Vec<String> {
    tiny_tensors().into_iter().map(|t| t.0).collect()
}

/// A checkpoint of `tiny` (one shard of small values) in a folder of this process, made once, and its
/// manifest as JSON.
fn tiny_checkpoint() -> (PathBuf, Value) {
    static MADE: std::sync::OnceLock<(PathBuf, Value)> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        let dir = scratch("manifest");
        let spec = piper_planner::model::preset("tiny").unwrap();
        let tensors = tiny_tensors();
        let values: Vec<Vec<f32>> =
            tensors.iter().map(|(_, s)| (0..s.iter().product()).map(|i| (i % 13) as f32 * 0.01).collect()).collect();
        let sources: Vec<Source> =
            tensors.iter().zip(&values).map(|((n, s), v)| Source::values(n.clone(), s.clone(), v)).collect();
        let shard = write_shard(&dir, "rank-0.safetensors", 0, &sources).unwrap();
        let p = platform::preset("local").unwrap();
        let mut req = PlanRequest::new(1, 8, 32);
        req.base.dtype = "fp32".into();
        let best = plan(&spec, &p, &req).unwrap().plans.remove(0);
        let manifest = Manifest {
            format: FORMAT.into(),
            version: FORMAT_VERSION,
            step: 1,
            model_config: String::new(),
            seed: 0,
            layout: Layout { pp: 1, ep: 1, dp: 1 },
            split: vec![spec.num_layers],
            plan: RunPlan::from_candidate(&spec, "local", 32, "fp32", &best),
            optimizer: OptimizerState { steps: 1, beta_1: 0.9, beta_2: 0.95, epsilon: 1e-8, weight_decay: 0.1 },
            data: Value::Null,
            placements: vec![],
            migration_window: None,
            files: vec![shard],
            model: spec,
            companions: Default::default(),
        };
        // The unmutated manifest exports.
        let good = serde_json::to_value(&manifest).unwrap();
        std::fs::write(dir.join("manifest.json"), good.to_string()).unwrap();
        assert!(export_hf(&dir, &dir.join("hf-check"), false).is_ok(), "the base checkpoint exports");
        (dir, good)
    })
    .clone()
}
