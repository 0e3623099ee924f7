//! UTF-8 text through a Hugging Face tokenizer: the ids the model's own vocabulary gives the text.

use std::path::Path;

use piper_planner::text::TextTokenizer;

use super::bytes::shown;
use super::{
    Corpus, DataError, Rng, check_position, content_digest, held_note, position_of, random_windows, read_text,
    split_tail,
};

/// A text file encoded once by a tokenizer; batches are random windows of its ids.
#[derive(Clone, Debug)]
pub struct TokenizedText {
    ids: Vec<u32>,
    rng: Rng,
    name: String,
    /// The text's digest: what identifies it on resume, wherever it lies.
    content: String,
    /// The tokenizer's file name and digest: a resumed run must tokenize alike.
    tokenizer: String,
    vocab_size: usize,
    held_out: Vec<i64>,
}

impl TokenizedText {
    pub fn from_file(path: &Path, tokenizer: &TextTokenizer, seed: u64) -> Result<Self, DataError> {
        let text = read_text(path)?;
        let ids = tokenizer.encode(&text).map_err(|e| DataError::Flag { flag: "--data", why: e.to_string() })?;
        if ids.len() < 2 {
            return Err(DataError::Flag {
                flag: "--data",
                why: format!("{}: encodes to {} token(s); at least 2 are needed", shown(path), ids.len()),
            });
        }
        let file = tokenizer.path().file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        Ok(TokenizedText {
            ids,
            rng: Rng::new(seed),
            name: shown(path),
            content: content_digest(text.as_bytes()),
            tokenizer: format!("{} {}", file.escape_debug(), tokenizer.digest()),
            vocab_size: tokenizer.vocab_size(),
            held_out: Vec::new(),
        })
    }

    /// The text's ids, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

impl TokenizedText {
    fn details(&self) -> String {
        let held = held_note(self.held_out.len());
        format!("{} tokens{held}, tokenizer {}, vocabulary {}", self.ids.len(), self.tokenizer, self.vocab_size)
    }
}

impl Corpus for TokenizedText {
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64> {
        random_windows(&self.ids, &mut self.rng, batch, seq_len)
    }
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
    fn best_loss(&self) -> Option<f64> {
        None
    }
    fn describe(&self) -> String {
        format!("{} ({})", self.name, self.details())
    }
    fn position(&self) -> serde_json::Value {
        position_of(&self.describe(), &format!("{} ({})", self.content, self.details()), self.rng.0)
    }
    fn restore_position(&mut self, position: &serde_json::Value) -> Result<(), DataError> {
        let identity = format!("{} ({})", self.content, self.details());
        self.rng.0 = check_position(position, &self.describe(), &identity)?.1;
        Ok(())
    }
    fn hold_out(&mut self, sequences: usize, len: usize) -> Result<(), DataError> {
        self.held_out = split_tail(&mut self.ids, sequences, len, "tokens")?;
        Ok(())
    }
    fn held_out(&self) -> &[i64] {
        &self.held_out
    }
}
