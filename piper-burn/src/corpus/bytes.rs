//! Any UTF-8 text as bytes: the vocabulary is the 256 byte values.

use std::path::Path;

use super::{
    Corpus, DataError, Rng, check_position, content_digest, held_note, position_of, random_windows, read_text,
    split_tail,
};

/// The vocabulary of byte-level text.
pub const BYTE_VOCAB: usize = 256;

/// Any UTF-8 text as bytes (vocabulary 256); batches are random windows.
#[derive(Clone, Debug)]
pub struct TextBytes {
    bytes: Vec<u8>,
    rng: Rng,
    name: String,
    /// The text's digest: what identifies it on resume, wherever it lies.
    content: String,
    held_out: Vec<i64>,
}

impl TextBytes {
    pub fn from_file(path: &Path, seed: u64) -> Result<Self, DataError> {
        let text = read_text(path)?;
        if text.len() < 2 {
            return Err(DataError::Flag {
                flag: "--data",
                why: format!("{}: needs at least 2 bytes of text", shown(path)),
            });
        }
        let content = content_digest(text.as_bytes());
        Ok(TextBytes {
            bytes: text.into_bytes(),
            rng: Rng::new(seed),
            name: shown(path),
            content,
            held_out: Vec::new(),
        })
    }
}

/// A path as printed: escaped (it may hold terminal controls).
pub(super) fn shown(path: &Path) -> String {
    path.display().to_string().escape_debug().to_string()
}

impl TextBytes {
    fn details(&self) -> String {
        let held = held_note(self.held_out.len());
        format!("{} bytes, byte-level tokens{held}", self.bytes.len())
    }

    fn identity(&self) -> String {
        format!("{} ({})", self.content, self.details())
    }
}

impl Corpus for TextBytes {
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64> {
        random_windows(&self.bytes, &mut self.rng, batch, seq_len)
    }
    fn vocab_size(&self) -> usize {
        BYTE_VOCAB
    }
    fn best_loss(&self) -> Option<f64> {
        None
    }
    fn describe(&self) -> String {
        format!("{} ({})", self.name, self.details())
    }
    fn position(&self) -> serde_json::Value {
        position_of(&self.describe(), &self.identity(), self.rng.0)
    }
    fn restore_position(&mut self, position: &serde_json::Value) -> Result<(), DataError> {
        self.rng.0 = check_position(position, &self.describe(), &self.identity())?.1;
        Ok(())
    }
    fn hold_out(&mut self, sequences: usize, len: usize) -> Result<(), DataError> {
        self.held_out = split_tail(&mut self.bytes, sequences, len, "bytes")?;
        Ok(())
    }
    fn held_out(&self) -> &[i64] {
        &self.held_out
    }
}
