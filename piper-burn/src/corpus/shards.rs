//! A folder `piper data prepare` wrote: token shards read in place (memory-mapped); batches are random
//! windows of the train stream, the held-out split is its own file.

use std::path::Path;

use piper_planner::text::shards::TokenShards;

use super::bytes::shown;
use super::{Corpus, DataError, Rng, check_position, content_digest, position_of};

/// Prepared token shards.
pub struct ShardedTokens {
    shards: TokenShards,
    rng: Rng,
    name: String,
    held_out: Vec<i64>,
    /// Train tokens read from the shards so far (what this rank's batches needed).
    pub tokens_read: u64,
    /// The first id read that is outside the vocabulary (a shard changed since it was prepared).
    fault: Option<String>,
}

impl ShardedTokens {
    /// Opens the prepared folder `dir` (sizes checked, nothing loaded).
    pub fn open(dir: &Path, seed: u64) -> Result<Self, DataError> {
        let shards =
            TokenShards::open(dir, false).map_err(|e| DataError::Flag { flag: "--data", why: e.to_string() })?;
        if shards.len() < 2 {
            return Err(DataError::Flag {
                flag: "--data",
                why: format!(
                    "{}: the prepared folder holds {} training tokens; prepare more text",
                    shown(dir),
                    shards.len()
                ),
            });
        }
        Ok(ShardedTokens {
            shards,
            rng: Rng::new(seed),
            name: shown(dir),
            held_out: Vec::new(),
            tokens_read: 0,
            fault: None,
        })
    }

    /// The tokenizer the shards were made with: its file name and digest.
    pub fn tokenizer(&self) -> &str {
        &self.shards.index.tokenizer
    }
}

impl ShardedTokens {
    fn details(&self) -> String {
        let i = &self.shards.index;
        format!(
            "{} tokens in {} shards, {} held out, tokenizer {}, vocabulary {}",
            self.shards.len(),
            i.train.len(),
            i.held_out.tokens,
            i.tokenizer,
            i.vocab_size
        )
    }

    /// The shards' digests (recorded when they were prepared) in place of the folder's path.
    fn identity(&self) -> String {
        let i = &self.shards.index;
        let digests: String = i.train.iter().chain([&i.held_out]).map(|e| e.sha256.as_str()).collect();
        format!("{} ({})", content_digest(digests.as_bytes()), self.details())
    }
}

impl Corpus for ShardedTokens {
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64> {
        self.batch_rows(batch, seq_len, &|_| true)
    }
    fn batch_rows(&mut self, batch: usize, seq_len: usize, keep: &dyn Fn(usize) -> bool) -> Vec<i64> {
        let n = self.shards.len();
        let mut out = vec![0; batch * seq_len];
        for (row, ids) in out.chunks_mut(seq_len).enumerate() {
            // Every row draws its start, kept or not, so every rank's stream stays at the same position.
            let start = if n > seq_len as u64 { Some(self.rng.next_u64() % (n - seq_len as u64)) } else { None };
            if !keep(row) {
                continue;
            }
            self.tokens_read += seq_len as u64;
            match start {
                Some(start) => {
                    let window = self.shards.window(start, seq_len);
                    match self.shards.check_window(&window, start) {
                        Ok(()) => ids.copy_from_slice(&window),
                        // The ids stay 0 (inside every vocabulary); the step reports the fault.
                        Err(e) => self.fault = self.fault.take().or(Some(e.to_string())),
                    }
                }
                // A stream shorter than a sequence repeats, as a short text does.
                None => {
                    let all = self.shards.window(0, n as usize);
                    ids.iter_mut().zip(all.iter().cycle()).for_each(|(d, s)| *d = *s);
                }
            }
        }
        out
    }
    fn vocab_size(&self) -> usize {
        self.shards.index.vocab_size as usize
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
        let want = sequences.saturating_mul(len);
        let have = self.shards.index.held_out.tokens;
        let held_out = self.shards.held_out(want).ok_or_else(|| DataError::Flag {
            flag: "--eval-tokens",
            why: format!(
                "needs {sequences} sequences of {len} tokens ({want}), but {} holds out {have}: lower --eval-tokens, \
                 or prepare again with --held-out-tokens {want} or more",
                self.name
            ),
        })?;
        let vocab = self.shards.index.vocab_size as i64;
        if let Some(t) = held_out.iter().find(|&&t| t < 0 || t >= vocab) {
            return Err(DataError::Flag {
                flag: "--data",
                why: format!(
                    "{}: the held-out file holds token {t}, outside the vocabulary of {vocab}: the folder changed after it was prepared; prepare it again",
                    self.name
                ),
            });
        }
        self.held_out = held_out;
        Ok(())
    }
    fn fault(&self) -> Option<String> {
        self.fault.clone()
    }
    fn held_out(&self) -> &[i64] {
        &self.held_out
    }
}
