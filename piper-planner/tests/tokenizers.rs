//! Piper's tokenizer reader against Hugging Face transformers: the fixtures' tokenizers (trained by the
//! Python `tokenizers`, `tests/fixtures/make_tokenizer_fixtures.py`) encode and decode the sample text
//! to exactly the ids and text `PreTrainedTokenizerFast` gave.

use std::path::PathBuf;

use piper_planner::text::TextTokenizer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer")
}

#[test]
fn ids_and_text_are_the_ones_transformers_gives() {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap();
    let cases = expected.as_object().unwrap();
    assert_eq!(cases.len(), 2, "both fixture tokenizers are checked");
    for (name, case) in cases {
        let tok = TextTokenizer::from_file(&fixtures().join(format!("{name}.json")), "--tokenizer").unwrap();
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
        let got = tok.encode(case["text"].as_str().unwrap()).unwrap();
        assert_eq!(got, want, "{name}: ids");
        assert_eq!(tok.decode(&got).unwrap(), case["decoded"].as_str().unwrap(), "{name}: decoded text");
        assert!(want.iter().all(|i| (*i as usize) < tok.vocab_size()), "{name}: vocab_size covers every id");
    }
}

#[test]
fn vocabulary_sizes_count_the_added_tokens() {
    let small = TextTokenizer::from_file(&fixtures().join("metaspace64.json"), "--tokenizer").unwrap();
    let bytes = TextTokenizer::from_file(&fixtures().join("bytelevel300.json"), "--tokenizer").unwrap();
    assert_eq!((small.vocab_size(), bytes.vocab_size()), (64, 300));
    assert_ne!(small.digest(), bytes.digest());
    small.check_fits(64, "--tokenizer").unwrap();
    let e = bytes.check_fits(64, "--tokenizer").unwrap_err().to_string();
    assert!(e.contains("holds 300 tokens but the model's vocabulary has 64"), "{e}");
}
