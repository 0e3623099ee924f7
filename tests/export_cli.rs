//! A fine-tuned Hugging Face model exports as the model it came from: `mixtral_train --init-hf` on the
//! Qwen3-MoE and DeepSeek-V3 fixture folders (saved by transformers' `save_pretrained`, with the fixture
//! tokenizer as their tokenizer.json), then `piper checkpoint export`: the export's config.json is the
//! folder's own, its weights carry exactly the folder's tensor names and shapes, its tokenizer.json is
//! the folder's byte for byte — what transformers loads — and `hf_eval` gives the same loss on the export
//! in one file and in shards (`--max-shard-size`, with an index naming every tensor), and within 1% of
//! it from a bf16 export (`--dtype bf16`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{binary, example, run};
use piper_test_support::hf_folder::{V5, hf_folder};

/// Tensor name → shape of a folder's weights (one file, or the shards its index names).
fn weight_shapes(dir: &Path) -> BTreeMap<String, Vec<usize>> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<String> = if index.exists() {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
        let mut f: Vec<String> =
            v["weight_map"].as_object().unwrap().values().map(|x| x.as_str().unwrap().to_string()).collect();
        f.sort();
        f.dedup();
        f
    } else {
        vec!["model.safetensors".into()]
    };
    let mut shapes = BTreeMap::new();
    for f in files {
        let bytes = std::fs::read(dir.join(&f)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            assert!(shapes.insert(name.clone(), view.shape().to_vec()).is_none(), "{name} in two shards");
        }
    }
    shapes
}

fn cross_entropy(model: &Path, text: &Path) -> f64 {
    let out = model.join("eval.json");
    let mut cmd = Command::new(binary("examples", "hf_eval"));
    cmd.args(["--model", model.to_str().unwrap(), "--text", text.to_str().unwrap(), "--json", out.to_str().unwrap()]);
    let (ok, log) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{log}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    std::fs::remove_file(&out).unwrap();
    v["cross_entropy"].as_f64().unwrap()
}

#[test]
fn fine_tuned_folders_export_as_their_own_family_with_their_tokenizer() {
    let fixtures = piper_test_support::fixtures();
    for name in ["qwen3_moe", "deepseek_v3"] {
        let src = hf_folder(V5, name, false, "export", 1.0);
        std::fs::copy(fixtures.join("tokenizer/metaspace64.json"), src.join("tokenizer.json")).unwrap();
        let work = common::scratch(&format!("export-{name}"));
        let text = work.join("text.txt");
        std::fs::write(&text, "the router scores each expert and the expert group dispatches tokens. ".repeat(40))
            .unwrap();
        let ckpt = work.join("ckpt");
        let mut train = Command::new(example());
        train.args(["--init-hf", src.to_str().unwrap(), "--data", text.to_str().unwrap(), "--steps", "2"]);
        train.args(["--batch-size", "2", "--seq-len", "15", "--no-progress", "--mtp-loss-weight", "0"]);
        train.args(["--checkpoint-dir", ckpt.to_str().unwrap()]);
        let (ok, log) = run(train, Duration::from_secs(120));
        assert!(ok, "{name}: {log}");
        let mut losses = Vec::new();
        for (out, shard, dtype) in
            [("hf", None, "fp32"), ("hf-sharded", Some("60000"), "fp32"), ("hf-bf16", None, "bf16")]
        {
            let hf = work.join(out);
            let mut export = Command::new(binary("", "piper"));
            export.args(["checkpoint", "export", ckpt.to_str().unwrap(), "--hf", hf.to_str().unwrap()]);
            if let Some(bytes) = shard {
                export.args(["--max-shard-size", bytes]);
            }
            export.args(["--dtype", dtype]);
            let (ok, log) = run(export, Duration::from_secs(60));
            assert!(ok && log.contains(&format!("the model's own, {name}")), "{name}: {log}");
            let read =
                |p: &Path| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
            let mut want = read(&src.join("config.json"));
            let key = if want.get("dtype").is_some() { "dtype" } else { "torch_dtype" };
            want[key] = if dtype == "bf16" { "bfloat16" } else { "float32" }.into();
            assert_eq!(read(&hf.join("config.json")), want, "{name}: config.json");
            assert_eq!(weight_shapes(&hf), weight_shapes(&src), "{name}: tensor names and shapes");
            assert_eq!(
                std::fs::read(hf.join("tokenizer.json")).unwrap(),
                std::fs::read(src.join("tokenizer.json")).unwrap()
            );
            assert_eq!(hf.join("model.safetensors.index.json").exists(), shard.is_some(), "{name}: {log}");
            losses.push(cross_entropy(&hf, &text));
        }
        assert_eq!(losses[0], losses[1], "{name}: one file and shards hold the same weights");
        let rel = (losses[2] - losses[0]).abs() / losses[0];
        assert!(rel < 1e-2 && losses[2] != losses[0], "{name}: bf16 export {} against fp32 {}", losses[2], losses[0]);
        assert_ne!(losses[0], cross_entropy(&src, &text), "{name}: the export holds the fine-tuned weights");
        std::fs::remove_dir_all(&work).unwrap();
        std::fs::remove_dir_all(&src).unwrap();
    }
}
