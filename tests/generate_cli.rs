//! `generate` run as a user would, against transformers: on the Hugging Face folders of the fixtures
//! (six families: GQA, q/k norms, q/k/v biases and clamping, latent attention) with the fixture
//! tokenizer as their tokenizer.json, the prompt's ids and the 16 greedy tokens equal those of
//! transformers' `generate(do_sample=False)` (tests/fixtures/make_generate_fixtures.py); a checkpoint
//! the trainer saved generates too, and the ids of a prompt outside the vocabulary are refused.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{binary, example, run};
use piper_test_support::hf_folder::{V5, hf_folder};

fn generate() -> Command {
    Command::new(binary("examples", "generate"))
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().unwrap_or_else(|| panic!("not a list: {v}")).iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn greedy_generation_is_what_transformers_generates() {
    let fixtures = piper_test_support::fixtures();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("transformers5/generate.json")).unwrap()).unwrap();
    let families: Vec<&String> = expected.as_object().unwrap().keys().filter(|k| !k.starts_with('_')).collect();
    assert_eq!(families.len(), 6);
    for name in families {
        let want = &expected[name.as_str()];
        let dir = hf_folder(V5, name, false, "generate", 1.0);
        std::fs::copy(fixtures.join("tokenizer/metaspace64.json"), dir.join("tokenizer.json")).unwrap();
        let out = dir.join("out.json");
        let mut cmd = generate();
        cmd.args(["--model", dir.to_str().unwrap(), "--prompt", want["prompt"].as_str().unwrap()]);
        cmd.args(["--max-new-tokens", "16", "--json", out.to_str().unwrap()]);
        let (ok, text) = run(cmd, Duration::from_secs(60));
        assert!(ok, "{name}: {text}");
        let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(ids(&got["prompt_ids"]), ids(&want["prompt_ids"]), "{name}: prompt ids");
        assert_eq!(ids(&got["generated_ids"]), ids(&want["generated_ids"]), "{name}: generated ids");
        assert!(got["text"].as_str().unwrap().starts_with("the router scores"), "{name}: {got}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_trained_checkpoint_generates_and_bad_prompts_are_refused() {
    let dir = common::scratch("generate-checkpoint");
    let mut train = Command::new(example());
    train.args(["--steps", "3", "--batch-size", "4", "--seq-len", "15", "--no-progress", "--log-every", "0"]);
    train.args(["--checkpoint-dir", dir.to_str().unwrap()]);
    let (ok, out) = run(train, Duration::from_secs(120));
    assert!(ok, "{out}");
    let json = dir.join("g.json");
    let mut cmd = generate();
    cmd.args(["--checkpoint", dir.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-new-tokens", "5"]);
    cmd.args(["--temperature", "0.8", "--top-k", "10", "--seed", "3", "--json", json.to_str().unwrap()]);
    let (ok, out) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{out}");
    let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let generated = ids(&got["generated_ids"]);
    assert!(generated.len() == 5 && generated.iter().all(|t| *t < 256), "{got}");
    // Trained on the grammar: the share of generated transitions it allows is reported.
    assert_eq!(got["grammar_transitions"]["total"], 5, "{got}");
    assert!(out.contains("generated transitions allowed") && !out.contains("warning"), "{out}");
    let mut long = generate();
    long.args(["--checkpoint", dir.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-new-tokens", "16"]);
    let (ok, out) = run(long, Duration::from_secs(60));
    assert!(
        ok && out.contains("reach position 19, past the 15 tokens per sequence the checkpoint trained on"),
        "{out}"
    );
    let mut wrong = generate();
    wrong.args(["--checkpoint", dir.to_str().unwrap(), "--prompt-ids", "1,2", "--grammar-branching", "4"]);
    let (ok, out) = run(wrong, Duration::from_secs(60));
    assert!(!ok && out.contains("--grammar-branching 4 does not rebuild the checkpoint's grammar"), "{out}");
    let mut bad = generate();
    bad.args(["--checkpoint", dir.to_str().unwrap(), "--prompt-ids", "1,999"]);
    let (ok, out) = run(bad, Duration::from_secs(60));
    assert!(!ok && out.contains("--prompt holds token 999, outside the model's vocabulary of 256"), "{out}");
    let mut bad = generate();
    bad.args(["--checkpoint", dir.to_str().unwrap(), "--prompt", "hello"]);
    let (ok, out) = run(bad, Duration::from_secs(60));
    assert!(!ok && out.contains("--prompt needs a tokenizer"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
