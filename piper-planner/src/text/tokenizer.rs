//! A Hugging Face `tokenizer.json` (BPE, WordPiece, Unigram…) read through the `tokenizers` crate:
//! text to token ids and back, with the checks a training run needs before it draws a batch.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The file a Hugging Face model folder keeps its fast tokenizer in.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// A loaded tokenizer and where it came from.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The first 16 hex digits of the file's SHA-256: which tokenizer, whatever its path.
    digest: String,
    vocab_size: usize,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("path", &self.path).field("vocab_size", &self.vocab_size).finish()
    }
}

impl TextTokenizer {
    /// Reads `path` (a `tokenizer.json`); `flag` names where it came from in the errors.
    pub fn from_file(path: &Path, flag: &str) -> Result<Self> {
        let shown = path.display().to_string().escape_debug().to_string();
        let bytes = std::fs::read(path).map_err(|e| Error::file(&shown, format!("{flag}: {e}")))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            Error::file(&shown, format!("{flag}: not a Hugging Face tokenizer.json ({})", one_line(&e.to_string())))
        })?;
        // The ids the tokenizer can emit: the model's, the added tokens', whichever reaches higher.
        let top = inner.get_vocab(true).values().copied().max();
        let vocab_size = top.map_or(0, |t| t as usize + 1);
        if vocab_size == 0 {
            return Err(Error::file(&shown, format!("{flag}: the tokenizer has an empty vocabulary")));
        }
        let digest = Sha256::digest(&bytes).iter().take(8).map(|b| format!("{b:02x}")).collect();
        Ok(TextTokenizer { inner, path: path.to_path_buf(), digest, vocab_size })
    }

    /// The tokenizer of a Hugging Face model folder, if it has a `tokenizer.json`.
    pub fn from_model_folder(dir: &Path, flag: &str) -> Result<Option<Self>> {
        let path = dir.join(TOKENIZER_FILE);
        if !path.exists() {
            return Ok(None);
        }
        Self::from_file(&path, flag).map(Some)
    }

    /// One more than the largest id it can emit (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's SHA-256 (16 hex digits): two runs with the same digest tokenize alike.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Refuses a tokenizer whose ids do not fit a model's `model_vocab` embedding rows (a larger
    /// model vocabulary is fine: checkpoints often pad it).
    pub fn check_fits(&self, model_vocab: usize, flag: &str) -> Result<()> {
        if self.vocab_size > model_vocab {
            return Err(Error::invalid(
                flag,
                "vocabulary",
                format!(
                    "{} holds {} tokens but the model's vocabulary has {model_vocab}: use the model's own \
                     tokenizer, or a model whose vocab_size is at least {}",
                    self.path.display().to_string().escape_debug(),
                    self.vocab_size,
                    self.vocab_size
                ),
            ));
        }
        Ok(())
    }

    /// The id of `token` (a special token such as `<|endoftext|>`), if the tokenizer has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids of `text`, without special tokens (training windows are cut from one long stream).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::invalid(self.shown(), "encode", one_line(&e.to_string())))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::invalid(self.shown(), "decode", one_line(&e.to_string())))
    }

    fn shown(&self) -> String {
        self.path.display().to_string().escape_debug().to_string()
    }
}

/// An error of the `tokenizers` crate as one printable line (it may quote file content).
fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").escape_debug().to_string();
    if line.chars().count() > 200 { line.chars().take(200).collect::<String>() + "…" } else { line }
}
