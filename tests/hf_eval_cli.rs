//! `hf_eval` run as a user would, on a Hugging Face folder of the transformers fixtures: `--json` to a FIFO
//! that a reader drains gets the whole result and to a device node is written in place, each still what
//! it was afterwards; a folder with one NaN weight is refused, naming the tensor, with exit code 2;
//! `--text` tokenizes with the folder's tokenizer.json and gives what transformers gives for the text.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{binary, run};
use piper_test_support::hf_folder::{V5, hf_folder};

fn hf_eval() -> Command {
    Command::new(binary("examples", "hf_eval"))
}

#[cfg(unix)]
#[test]
fn json_to_a_fifo_or_a_device_leaves_them_what_they_were() {
    use std::os::unix::fs::FileTypeExt;
    let model = hf_folder(V5, "mixtral", false, "eval-special", 1.0);
    let dir = model.join("outputs");
    std::fs::create_dir_all(&dir).unwrap();
    let ids = dir.join("ids.json");
    std::fs::write(&ids, "[[1, 5, 9, 2, 7, 3, 8, 4]]").unwrap();
    let (fifo, reader, device) = common::special_outputs(&dir);
    let mut cmd = hf_eval();
    cmd.args(["--model", model.to_str().unwrap(), "--input-ids", ids.to_str().unwrap()]);
    cmd.args(["--json", fifo.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    let doc: serde_json::Value = serde_json::from_str(&reader.join().unwrap()).unwrap();
    assert!(doc["cross_entropy"].as_f64().is_some_and(|x| x.is_finite() && x > 0.0), "{doc}");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let mut cmd = hf_eval();
    cmd.args(["--model", model.to_str().unwrap(), "--input-ids", ids.to_str().unwrap()]);
    cmd.args(["--json", device.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(ok, "{out}");
    assert!(std::fs::metadata(&device).unwrap().file_type().is_char_device());
    std::fs::remove_dir_all(&model).unwrap();
}

#[test]
fn a_folder_with_a_nan_weight_is_refused_naming_the_tensor() {
    let model = hf_folder(V5, "mixtral", false, "eval-nan", 1.0);
    let path = model.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    // The first tensor of the file (offset 0 of the data), whatever its name.
    let (name, _) = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, v)| *k != "__metadata__" && v["data_offsets"][0] == 0)
        .expect("a tensor at offset 0");
    let name = name.clone();
    let at = 8 + header_len;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let ids = model.join("ids.json");
    std::fs::write(&ids, "[[1, 5, 9, 2]]").unwrap();
    let mut cmd = hf_eval();
    cmd.args(["--model", model.to_str().unwrap(), "--input-ids", ids.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(120));
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("tensor `{name}` holds NaN at element 0")) && out.contains("damaged"), "{out}");
    std::fs::remove_dir_all(&model).unwrap();
}

/// `hf_eval --text`: the fixture tokenizer as the folder's tokenizer.json, the prompt of the generation
/// fixtures as the text; cross-entropy (1e-5) and every position's argmax equal transformers'
/// `model(ids, labels=ids)` (tests/fixtures/make_generate_fixtures.py).
#[test]
fn text_is_tokenized_with_the_folders_tokenizer_as_transformers_does() {
    let fixtures = piper_test_support::fixtures();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("transformers5/generate.json")).unwrap()).unwrap();
    for name in ["mixtral", "deepseek_v3"] {
        let want = &expected[name];
        let model = hf_folder(V5, name, false, "eval-text", 1.0);
        let text = model.join("prompt.txt");
        std::fs::write(&text, want["prompt"].as_str().unwrap()).unwrap();
        let out = model.join("out.json");
        let mut cmd = hf_eval();
        cmd.args([
            "--model",
            model.to_str().unwrap(),
            "--text",
            text.to_str().unwrap(),
            "--json",
            out.to_str().unwrap(),
        ]);
        let (ok, log) = run(cmd, Duration::from_secs(60));
        assert!(!ok && log.contains("no tokenizer.json"), "{name}: {log}");
        std::fs::copy(fixtures.join("tokenizer/metaspace64.json"), model.join("tokenizer.json")).unwrap();
        let mut cmd = hf_eval();
        cmd.args([
            "--model",
            model.to_str().unwrap(),
            "--text",
            text.to_str().unwrap(),
            "--json",
            out.to_str().unwrap(),
        ]);
        let (ok, log) = run(cmd, Duration::from_secs(60));
        assert!(ok, "{name}: {log}");
        let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let n = want["prompt_ids"].as_array().unwrap().len() as u64;
        assert_eq!(got["logits_shape"], serde_json::json!([1, n, 64]), "{name}");
        assert_eq!(got["argmax"][0], want["argmax"], "{name}: argmax per position");
        let (ce, ce_want) = (got["cross_entropy"].as_f64().unwrap(), want["cross_entropy"].as_f64().unwrap());
        piper_test_support::assert_close(&format!("{name} cross-entropy"), &[ce], &[ce_want], 1e-5);
        std::fs::remove_dir_all(&model).unwrap();
    }
}
