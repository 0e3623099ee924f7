//! Training a byte-level BPE tokenizer (GPT-2 style: every byte is a token, so any text encodes) on
//! text files, written as a Hugging Face `tokenizer.json` that `transformers` loads.

use std::path::Path;

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};

use crate::error::{Error, Result};

/// The one special token: separates documents, id 0.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// The smallest vocabulary: the 256 bytes and [`END_OF_TEXT`].
pub const MIN_VOCAB: usize = 257;

/// The largest vocabulary accepted (ids stay far inside u32; embedding rows stay plausible).
pub const MAX_VOCAB: usize = 1 << 21;

/// Trains a byte-level BPE of `vocab` tokens on the UTF-8 text of `files` and returns its
/// `tokenizer.json`. Every input is checked before training starts; errors name the flag and the fix.
pub fn train_byte_level_bpe(files: &[&Path], vocab: usize) -> Result<String> {
    const SRC: &str = "piper tokenizer train";
    if !(MIN_VOCAB..=MAX_VOCAB).contains(&vocab) {
        return Err(Error::invalid(
            SRC,
            "--vocab",
            format!("is {vocab}; it must be in {MIN_VOCAB}..={MAX_VOCAB} (the 256 bytes and {END_OF_TEXT} come first)"),
        ));
    }
    if files.is_empty() {
        return Err(Error::invalid(SRC, "--data", "needs at least one text file"));
    }
    let texts = files.iter().map(|f| read_text(f)).collect::<Result<Vec<String>>>()?;
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab)
        .min_frequency(2)
        .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<NormalizerWrapper>)
        .with_pre_tokenizer(Some(byte_level))
        .with_post_processor(Some(byte_level))
        .with_decoder(Some(byte_level))
        .build()
        .map_err(|e| Error::invalid(SRC, "tokenizer", e.to_string()))?;
    let lines = texts.iter().flat_map(|t| t.split_inclusive('\n'));
    tokenizer.train(&mut trainer, lines).map_err(|e| Error::invalid(SRC, "training", e.to_string()))?;
    tokenizer.to_string(true).map_err(|e| Error::invalid(SRC, "tokenizer.json", e.to_string()))
}

/// A training file's text; one that is not UTF-8 or is empty is refused by name.
fn read_text(path: &Path) -> Result<String> {
    let shown = path.display().to_string().escape_debug().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::file(&shown, format!("--data: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::file(&shown, format!("--data: not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
    })?;
    if text.trim().is_empty() {
        return Err(Error::file(&shown, "--data: holds no text"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::TextTokenizer;

    const TEXT: &str = "The expert group dispatches tokens; the combine phase returns them.\n\
        Pipelines split the model into stages, and each stage holds a share of the layers.\n\
        Ünïcödé, emoji 🚀 and tabs\tsurvive the byte-level round trip.\n";

    fn trained(vocab: usize) -> (tempdir::Dir, TextTokenizer) {
        let dir = tempdir::Dir::new("bpe");
        let data = dir.path().join("data.txt");
        std::fs::write(&data, TEXT.repeat(20)).unwrap();
        let json = train_byte_level_bpe(&[&data], vocab).unwrap();
        let out = dir.path().join("tokenizer.json");
        std::fs::write(&out, json).unwrap();
        let tok = TextTokenizer::from_file(&out, "--tokenizer").unwrap();
        (dir, tok)
    }

    #[test]
    fn any_text_survives_the_round_trip_and_merges_shorten_it() {
        let (_dir, tok) = trained(400);
        assert!(tok.vocab_size() > MIN_VOCAB && tok.vocab_size() <= 400, "vocab {}", tok.vocab_size());
        let ids = tok.encode(TEXT).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), TEXT);
        // Text it never saw still encodes, byte by byte where no merge applies.
        let unseen = "Zyzzyva ∮ 漢字 \u{1}";
        assert_eq!(tok.decode(&tok.encode(unseen).unwrap()).unwrap(), unseen);
        // The merges learned from the text shorten it well below one token per byte.
        assert!(ids.len() * 2 < TEXT.len(), "{} tokens for {} bytes", ids.len(), TEXT.len());
        assert!(ids.iter().all(|i| (*i as usize) < tok.vocab_size()));
    }

    #[test]
    fn the_model_vocabulary_must_hold_every_id() {
        let (_dir, tok) = trained(300);
        let n = tok.vocab_size();
        tok.check_fits(n, "--tokenizer").unwrap();
        tok.check_fits(n + 64, "--tokenizer").unwrap();
        let e = tok.check_fits(n - 1, "--tokenizer").unwrap_err().to_string();
        assert!(e.contains(&format!("holds {n} tokens")) && e.contains(&format!("has {}", n - 1)), "{e}");
    }

    #[test]
    fn bad_input_is_refused_before_training() {
        let dir = tempdir::Dir::new("bpe-bad");
        let data = dir.path().join("data.txt");
        std::fs::write(&data, TEXT).unwrap();
        assert!(train_byte_level_bpe(&[&data], 100).unwrap_err().to_string().contains("--vocab"));
        assert!(train_byte_level_bpe(&[], 500).unwrap_err().to_string().contains("--data"));
        let latin1 = dir.path().join("latin1.txt");
        std::fs::write(&latin1, b"caf\xe9").unwrap();
        let e = train_byte_level_bpe(&[&latin1], 500).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("offset 3"), "{e}");
        let json = dir.path().join("not-a-tokenizer.json");
        std::fs::write(&json, "{\"model\": 3}").unwrap();
        let e = TextTokenizer::from_file(&json, "--tokenizer").unwrap_err().to_string();
        assert!(e.contains("--tokenizer: not a Hugging Face tokenizer.json"), "{e}");
    }

    /// A scratch folder removed on drop.
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new(tag: &str) -> Self {
                let p = std::env::temp_dir().join(format!(
                    "piper-{tag}-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
