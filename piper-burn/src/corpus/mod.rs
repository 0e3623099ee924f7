//! Training data: a seeded stochastic grammar whose entropy rate is known (so the best achievable loss
//! is known), token shards `piper data prepare` wrote, UTF-8 text through a Hugging Face tokenizer, or
//! UTF-8 text as bytes.

mod bytes;
mod grammar;
mod shards;
mod tokens;

use std::path::Path;

use piper_planner::text::TextTokenizer;
use piper_planner::text::shards::INDEX_FILE;

pub use bytes::{BYTE_VOCAB, TextBytes};
pub use grammar::Grammar;
pub use shards::ShardedTokens;
pub use tokens::TokenizedText;

/// A deterministic random generator (SplitMix64), so a seed gives the same data everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Data that cannot be read, or a saved position that belongs to other data.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DataError {
    /// A data flag that cannot work: the flag, then why and what would.
    #[error("{flag} {why}")]
    Flag { flag: &'static str, why: String },
    #[error("the data position is not an object")]
    NotAnObject,
    #[error("the checkpoint was trained on `{saved}`, this run reads `{reads}`: pass the same data flags")]
    OtherData { saved: String, reads: String },
    #[error(
        "`{reads}` is not what the checkpoint was trained on: its contents changed since; pass the data it was trained on"
    )]
    OtherContents { reads: String },
    #[error("the data position has no generator state")]
    NoGeneratorState,
    #[error("the data position's grammar state does not fit this grammar")]
    GrammarState,
}

/// Where training batches come from.
pub trait Corpus {
    /// Token ids of `batch` sequences of `seq_len` tokens, row-major.
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64>;
    /// [`Corpus::batch`] for a rank that needs only the rows `keep` accepts: the stream advances as for
    /// the whole batch (every rank stays at the same position) and the kept rows are the same, while the
    /// other rows may be left 0 — a source that reads from storage reads only this rank's share.
    fn batch_rows(&mut self, batch: usize, seq_len: usize, keep: &dyn Fn(usize) -> bool) -> Vec<i64> {
        let _ = keep;
        self.batch(batch, seq_len)
    }
    /// What went wrong reading the data, if anything did (a corrupted shard): the batch drawn since
    /// holds zeros where it could not be read, and the run stops with this error.
    fn fault(&self) -> Option<String> {
        None
    }
    /// Size of the token space the data uses (ids are below it).
    fn vocab_size(&self) -> usize;
    /// The lowest achievable cross-entropy (nats per token), if known.
    fn best_loss(&self) -> Option<f64>;
    fn describe(&self) -> String;
    /// Where the stream stands (its generator state and what it draws from), for a checkpoint.
    fn position(&self) -> serde_json::Value;
    /// Continues the stream from a [`Corpus::position`] of the same data; the error says what differs.
    fn restore_position(&mut self, position: &serde_json::Value) -> Result<(), DataError>;
    /// Sets `sequences` rows of `len` ids aside for evaluation, before any batch is drawn: a text gives
    /// its end (training windows no longer reach it; [`Corpus::describe`] says so), the grammar an
    /// independent stream of the same process. The same data and seed give the same rows.
    fn hold_out(&mut self, sequences: usize, len: usize) -> Result<(), DataError>;
    /// The rows set aside, row-major (empty before [`Corpus::hold_out`]).
    fn held_out(&self) -> &[i64];
}

/// A saved position of `describe`d data identified by `identity` (for data read from files: their
/// contents' digest in place of the path, so the same data resumes under another path or name).
fn position_of(describe: &str, identity: &str, rng: u64) -> serde_json::Value {
    serde_json::json!({"describe": describe, "identity": identity, "rng": rng})
}

/// `, the next N held out` for a text's held-out tail of `n` tokens (nothing for none).
fn held_note(n: usize) -> String {
    if n == 0 { String::new() } else { format!(", the next {n} held out") }
}

/// The SHA-256 of `bytes`, as a data identity's first word.
fn content_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Reads `{"describe": …, "identity": …, "rng": …, extra…}` back: the data must be the one identified
/// (a position saved without an identity: the one described).
fn check_position<'a>(
    position: &'a serde_json::Value,
    describe: &str,
    identity: &str,
) -> Result<(&'a serde_json::Map<String, serde_json::Value>, u64), DataError> {
    let obj = position.as_object().ok_or(DataError::NotAnObject)?;
    let saved = obj.get("describe").and_then(|d| d.as_str()).unwrap_or("?");
    let same = match obj.get("identity").and_then(|d| d.as_str()) {
        Some(saved_identity) => saved_identity == identity,
        None => saved == describe,
    };
    if !same && saved == describe {
        return Err(DataError::OtherContents { reads: describe.into() });
    }
    if !same {
        return Err(DataError::OtherData { saved: saved.into(), reads: describe.into() });
    }
    let rng = obj.get("rng").and_then(|r| r.as_u64()).ok_or(DataError::NoGeneratorState)?;
    Ok((obj, rng))
}

/// Where a run's data comes from: its flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct DataFlags<'a> {
    /// `--data`: a UTF-8 text file.
    pub data: Option<&'a Path>,
    /// `--tokenizer`: a Hugging Face tokenizer.json for `data`.
    pub tokenizer: Option<&'a Path>,
    /// `--init-hf`: the model's folder; its tokenizer.json encodes `data` unless `tokenizer` is given.
    pub model_folder: Option<&'a Path>,
    /// `--grammar-alphabet` and `--grammar-branching` of the synthetic grammar.
    pub alphabet: usize,
    pub branching: usize,
    pub seed: u64,
}

/// The training data of a run, checked against the model's vocabulary (`vocab_size` rows) before
/// anything is drawn; the errors name the flags and the fix:
/// - `--data` with a tokenizer (`--tokenizer`, else the `--init-hf` folder's tokenizer.json): its ids;
/// - `--data` alone: bytes, for a model trained from scratch (never for a pretrained folder's model,
///   whose vocabulary is not bytes);
/// - no `--data`: the seeded grammar.
pub fn open(flags: &DataFlags, vocab_size: usize) -> Result<Box<dyn Corpus>, DataError> {
    let tokenizer = match (flags.tokenizer, flags.model_folder) {
        (Some(file), _) => Some(TextTokenizer::from_file(file, "--tokenizer").map_err(tokenizer_error)?),
        (None, Some(dir)) if flags.data.is_some() => {
            TextTokenizer::from_model_folder(dir, "--init-hf").map_err(tokenizer_error)?
        }
        _ => None,
    };
    if let Some(dir) = flags.data.filter(|d| d.join(INDEX_FILE).is_file()) {
        return prepared(dir, tokenizer.as_ref(), flags.seed, vocab_size);
    }
    let Some(path) = flags.data else {
        if flags.tokenizer.is_some() {
            return Err(DataError::Flag {
                flag: "--tokenizer",
                why: "encodes --data; pass --data FILE too (the synthetic grammar has its own symbols)".into(),
            });
        }
        return grammar(flags, vocab_size);
    };
    match (tokenizer, flags.model_folder) {
        (Some(t), _) => {
            t.check_fits(vocab_size, "--tokenizer").map_err(tokenizer_error)?;
            Ok(Box::new(TokenizedText::from_file(path, &t, flags.seed)?))
        }
        (None, Some(dir)) => Err(DataError::Flag {
            flag: "--data",
            why: format!(
                "would be read as bytes, but the model of {} has its own vocabulary of {vocab_size} tokens and the \
                 folder has no tokenizer.json: pass --tokenizer FILE (the model's tokenizer.json)",
                bytes::shown(dir)
            ),
        }),
        (None, None) if vocab_size < BYTE_VOCAB => Err(DataError::Flag {
            flag: "--data",
            why: format!(
                "is read as bytes (vocabulary {BYTE_VOCAB}) but the model's vocabulary has {vocab_size}: pass \
                 --tokenizer FILE (e.g. from `piper tokenizer train --vocab {vocab_size}`), or use a model whose \
                 vocab_size is at least {BYTE_VOCAB}"
            ),
        }),
        (None, None) => Ok(Box::new(TextBytes::from_file(path, flags.seed)?)),
    }
}

/// A prepared folder: its vocabulary must fit the model's, and the tokenizer of the run (if any) must be
/// the one it was made with.
fn prepared(
    dir: &Path,
    tokenizer: Option<&TextTokenizer>,
    seed: u64,
    vocab_size: usize,
) -> Result<Box<dyn Corpus>, DataError> {
    let shards = ShardedTokens::open(dir, seed)?;
    if shards.vocab_size() > vocab_size {
        return Err(DataError::Flag {
            flag: "--data",
            why: format!(
                "{} holds ids of a vocabulary of {} but the model's has {vocab_size}: prepare it with the model's tokenizer",
                bytes::shown(dir),
                shards.vocab_size()
            ),
        });
    }
    if let Some(t) = tokenizer
        && !shards.tokenizer().ends_with(t.digest())
    {
        return Err(DataError::Flag {
            flag: "--data",
            why: format!(
                "{} was prepared with tokenizer {}, this run's is {} ({}): prepare it again with this run's tokenizer",
                bytes::shown(dir),
                shards.tokenizer(),
                bytes::shown(t.path()),
                t.digest()
            ),
        });
    }
    Ok(Box::new(shards))
}

fn tokenizer_error(e: piper_planner::Error) -> DataError {
    DataError::Flag { flag: "--tokenizer", why: e.to_string() }
}

/// The seeded grammar, its sizes checked against the vocabulary.
fn grammar(flags: &DataFlags, vocab_size: usize) -> Result<Box<dyn Corpus>, DataError> {
    let (alphabet, branching) = (flags.alphabet, flags.branching);
    if !(2..=vocab_size).contains(&alphabet) {
        return Err(DataError::Flag {
            flag: "--grammar-alphabet",
            why: format!("is {alphabet}; it must be in 2..={vocab_size} (the model's vocabulary)"),
        });
    }
    if !(1..=alphabet).contains(&branching) {
        return Err(DataError::Flag {
            flag: "--grammar-branching",
            why: format!("is {branching}; it must be in 1..={alphabet} (the alphabet)"),
        });
    }
    Ok(Box::new(Grammar::new(alphabet, branching, flags.seed)))
}

/// A `--data` file's text; one that cannot be read or is not UTF-8 is refused by name.
fn read_text(path: &Path) -> Result<String, DataError> {
    let refuse = |why: String| DataError::Flag { flag: "--data", why: format!("{}: {why}", bytes::shown(path)) };
    let raw = std::fs::read(path).map_err(|e| refuse(e.to_string()))?;
    String::from_utf8(raw).map_err(|e| {
        refuse(format!("not UTF-8 text (invalid byte at offset {}); convert it to UTF-8", e.utf8_error().valid_up_to()))
    })
}

/// Splits the last `sequences · len` tokens off `tokens` as consecutive rows; what stays must still hold
/// a training window (`len` tokens).
fn split_tail<T: Copy + Into<i64>>(
    tokens: &mut Vec<T>,
    sequences: usize,
    len: usize,
    unit: &str,
) -> Result<Vec<i64>, DataError> {
    let held = sequences.saturating_mul(len);
    if held.saturating_add(len) > tokens.len() {
        return Err(DataError::Flag {
            flag: "--eval-tokens",
            why: format!(
                "holds out {sequences} sequences of {len} {unit} ({held}), but the text has {} and training needs \
                 {len} more: lower --eval-tokens, or give a longer text",
                tokens.len()
            ),
        });
    }
    let rows = tokens.split_off(tokens.len() - held);
    Ok(rows.into_iter().map(Into::into).collect())
}

/// `batch` windows of `seq_len` tokens at random starts (wrapping past the end of a short text).
fn random_windows<T: Copy + Into<i64>>(tokens: &[T], rng: &mut Rng, batch: usize, seq_len: usize) -> Vec<i64> {
    let n = tokens.len();
    let mut out = Vec::with_capacity(batch * seq_len);
    for _ in 0..batch {
        let start = if n > seq_len { rng.below(n - seq_len) } else { 0 };
        out.extend((0..seq_len).map(|i| tokens[(start + i) % n].into()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer").join(name)
    }

    /// A scratch text file (and folder) removed on drop.
    struct Scratch(std::path::PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("piper-corpus-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("text.txt"), "The router dispatches tokens to experts. ".repeat(30)).unwrap();
            Scratch(dir)
        }
        fn text(&self) -> std::path::PathBuf {
            self.0.join("text.txt")
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn refusal(flags: &DataFlags, vocab: usize) -> String {
        match open(flags, vocab) {
            Ok(c) => panic!("opened {}", c.describe()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn text_goes_through_the_tokenizer_it_is_given() {
        let s = Scratch::new("tok");
        let (text, tok) = (s.text(), fixture("metaspace64.json"));
        let flags = DataFlags { data: Some(&text), tokenizer: Some(&tok), ..Default::default() };
        let mut c = open(&flags, 64).unwrap();
        assert_eq!(c.vocab_size(), 64);
        assert!(c.describe().contains("tokenizer metaspace64.json"), "{}", c.describe());
        let want =
            TextTokenizer::from_file(&tok, "t").unwrap().encode(&std::fs::read_to_string(&text).unwrap()).unwrap();
        // Every window is a run of the text's ids.
        let batch = c.batch(3, 16);
        for w in batch.chunks(16) {
            let w: Vec<u32> = w.iter().map(|i| *i as u32).collect();
            assert!(want.windows(16).any(|x| x == w.as_slice()), "window {w:?} is not in the text");
        }
    }

    #[test]
    fn the_model_folders_tokenizer_is_used_and_its_absence_refused() {
        let s = Scratch::new("folder");
        let text = s.text();
        let flags = DataFlags { data: Some(&text), model_folder: Some(&s.0), ..Default::default() };
        let e = refusal(&flags, 64);
        assert!(e.starts_with("--data ") && e.contains("no tokenizer.json") && e.contains("--tokenizer FILE"), "{e}");
        std::fs::copy(fixture("metaspace64.json"), s.0.join("tokenizer.json")).unwrap();
        assert!(open(&flags, 64).unwrap().describe().contains("tokenizer tokenizer.json"));
    }

    #[test]
    fn mismatched_vocabularies_are_refused_naming_both_sizes() {
        let s = Scratch::new("sizes");
        let (text, big) = (s.text(), fixture("bytelevel300.json"));
        let e = refusal(&DataFlags { data: Some(&text), tokenizer: Some(&big), ..Default::default() }, 64);
        assert!(e.starts_with("--tokenizer ") && e.contains("300 tokens") && e.contains("has 64"), "{e}");
        let e = refusal(&DataFlags { data: Some(&text), ..Default::default() }, 64);
        assert!(e.contains("bytes (vocabulary 256)") && e.contains("has 64"), "{e}");
        let e = refusal(&DataFlags { tokenizer: Some(&big), alphabet: 8, branching: 2, ..Default::default() }, 300);
        assert!(e.contains("pass --data FILE"), "{e}");
        assert_eq!(open(&DataFlags { data: Some(&text), ..Default::default() }, 256).unwrap().vocab_size(), 256);
    }

    #[test]
    fn the_held_out_split_is_the_texts_end_and_training_never_reaches_it() {
        let s = Scratch::new("held-out");
        let text = s.text();
        let flags = DataFlags { data: Some(&text), ..Default::default() };
        let all: Vec<i64> = std::fs::read(&text).unwrap().into_iter().map(i64::from).collect();
        let mut c = open(&flags, 256).unwrap();
        c.hold_out(3, 17).unwrap();
        assert_eq!(c.held_out(), &all[all.len() - 51..], "the last 3 × 17 bytes, in order");
        assert!(c.describe().contains("the next 51 held out"), "{}", c.describe());
        let train = &all[..all.len() - 51];
        for w in c.batch(200, 17).chunks(17) {
            assert!(train.windows(17).any(|x| x == w), "a training window reached the held-out tail: {w:?}");
        }
        let mut c = open(&flags, 256).unwrap();
        let e = c.hold_out(100, 17).unwrap_err().to_string();
        assert!(e.starts_with("--eval-tokens ") && e.contains(&format!("the text has {}", all.len())), "{e}");
        // The grammar's split is another stream of the same process: the same for the same seed, and
        // the training stream is the one without a split.
        let (mut a, mut b) = (Grammar::new(8, 3, 4), Grammar::new(8, 3, 4));
        a.hold_out(4, 9).unwrap();
        b.hold_out(4, 9).unwrap();
        assert_eq!(a.held_out(), b.held_out());
        assert_eq!(a.batch(2, 9), Grammar::new(8, 3, 4).batch(2, 9));
        assert_ne!(a.held_out(), &Grammar::new(8, 3, 4).batch(4, 9)[..]);
    }

    /// A prepared folder trains on windows of its stream and evaluates on its held-out file; it resumes
    /// where it stood; its vocabulary must fit the model and its tokenizer be the run's.
    #[test]
    fn prepared_shards_train_evaluate_and_resume() {
        use piper_planner::text::shards::{PrepareOptions, TokenShards, prepare};
        let s = Scratch::new("prepared");
        let (text, small, big) = (s.text(), fixture("metaspace64.json"), fixture("bytelevel300.json"));
        let tok = TextTokenizer::from_file(&small, "t").unwrap();
        let dir = s.0.join("prepared");
        let o = PrepareOptions { shard_tokens: 50, held_out_tokens: 40, separator: None, overwrite: false };
        prepare(&tok, &[&text], &dir, &o).unwrap();
        let stream = TokenShards::open(&dir, true).unwrap();
        let all = stream.window(0, stream.len() as usize);
        let flags = DataFlags { data: Some(&dir), ..Default::default() };
        let mut c = open(&flags, 64).unwrap();
        assert!(c.describe().contains("40 held out") && c.describe().contains("metaspace64.json"), "{}", c.describe());
        for w in c.batch(20, 12).chunks(12) {
            assert!(all.windows(12).any(|x| x == w), "{w:?} is not a window of the stream");
        }
        c.hold_out(3, 12).unwrap();
        assert_eq!(c.held_out(), &stream.held_out(36).unwrap()[..]);
        assert!(c.hold_out(4, 12).unwrap_err().to_string().contains("--held-out-tokens 48"));
        let saved = c.position();
        let next = c.batch(2, 12);
        let mut again = open(&flags, 64).unwrap();
        again.restore_position(&saved).unwrap();
        assert_eq!(again.batch(2, 12), next);
        // A rank reading its share: the kept rows as in the whole batch, the stream at the same place,
        // only the kept rows' tokens read.
        let (mut whole, mut share) = (ShardedTokens::open(&dir, 7).unwrap(), ShardedTokens::open(&dir, 7).unwrap());
        let (all_rows, odd_rows) = (whole.batch(6, 12), share.batch_rows(6, 12, &|r| r % 2 == 1));
        for (r, (a, b)) in all_rows.chunks(12).zip(odd_rows.chunks(12)).enumerate() {
            assert_eq!(b, if r % 2 == 1 { a } else { &[0; 12][..] }, "row {r}");
        }
        assert_eq!((whole.tokens_read, share.tokens_read), (72, 36));
        assert_eq!(whole.batch(2, 12), share.batch(2, 12), "both streams at the same place");
        assert!(refusal(&flags, 32).contains("vocabulary of 64 but the model's has 32"));
        // A shard changed after preparation: the first window that reads the bad id reports it, naming
        // the file; the batch holds no id outside the vocabulary.
        let shard = dir.join("train-00000.bin");
        let mut bytes = std::fs::read(&shard).unwrap();
        bytes[20..22].copy_from_slice(&999u16.to_le_bytes());
        std::fs::write(&shard, bytes).unwrap();
        let mut bad = ShardedTokens::open(&dir, 7).unwrap();
        let drawn: Vec<i64> = (0..50).flat_map(|_| bad.batch(4, 12)).collect();
        let fault = bad.fault().expect("a window crossed the changed token");
        assert!(fault.contains("train-00000.bin") && fault.contains("token 999 at position 10"), "{fault}");
        assert!(drawn.iter().all(|t| (0..64).contains(t)));
        let other = DataFlags { data: Some(&dir), tokenizer: Some(&big), ..Default::default() };
        assert!(refusal(&other, 300).contains("was prepared with tokenizer metaspace64.json"));
        let same = DataFlags { data: Some(&dir), tokenizer: Some(&small), ..Default::default() };
        open(&same, 64).unwrap();
    }

    /// Data is identified by its contents: the same text under another path (relative, copied,
    /// renamed) resumes where it stood, with bytes or a tokenizer, and so do prepared shards in a moved
    /// folder; the same path with other contents is refused, saying so; a position saved before
    /// identities is matched by its description.
    #[test]
    fn data_is_identified_by_its_contents_not_its_path() {
        let s = Scratch::new("identity");
        let text = s.text();
        let copy = s.0.join("renamed.txt");
        std::fs::copy(&text, &copy).unwrap();
        let small = fixture("metaspace64.json");
        for tokenizer in [None, Some(small.as_path())] {
            let flags = |data| DataFlags { data: Some(data), tokenizer, ..Default::default() };
            let mut a = open(&flags(&text), 256).unwrap();
            let _ = a.batch(3, 8);
            let saved = a.position();
            let next = a.batch(2, 8);
            let mut b = open(&flags(&copy), 256).unwrap();
            b.restore_position(&saved).unwrap();
            assert_eq!(b.batch(2, 8), next);
            std::fs::write(&copy, "The router dispatches experts to tokens. ".repeat(30)).unwrap();
            let mut changed = open(&flags(&copy), 256).unwrap();
            let err = changed.restore_position(&saved).unwrap_err().to_string();
            assert!(err.contains("trained on") && err.contains("renamed.txt"), "{err}");
            std::fs::copy(&text, &copy).unwrap();
            let moved_saved = open(&flags(&copy), 256).unwrap().position();
            std::fs::write(&copy, "The router dispatches experts to tokens. ".repeat(30)).unwrap();
            let err = open(&flags(&copy), 256).unwrap().restore_position(&moved_saved).unwrap_err().to_string();
            assert!(err.contains("its contents changed since"), "{err}");
            std::fs::copy(&text, &copy).unwrap();
            let mut old = saved.clone();
            old.as_object_mut().unwrap().remove("identity");
            open(&flags(&text), 256).unwrap().restore_position(&old).unwrap();
            assert!(open(&flags(&copy), 256).unwrap().restore_position(&old).is_err(), "old positions: by description");
        }
        use piper_planner::text::shards::{PrepareOptions, prepare};
        let tok = TextTokenizer::from_file(&small, "t").unwrap();
        let o = PrepareOptions { shard_tokens: 50, held_out_tokens: 40, separator: None, overwrite: false };
        let (dir, moved) = (s.0.join("prepared"), s.0.join("moved"));
        prepare(&tok, &[&text], &dir, &o).unwrap();
        let saved = open(&DataFlags { data: Some(&dir), ..Default::default() }, 64).unwrap().position();
        std::fs::rename(&dir, &moved).unwrap();
        open(&DataFlags { data: Some(&moved), ..Default::default() }, 64).unwrap().restore_position(&saved).unwrap();
    }

    #[test]
    fn a_resumed_run_must_tokenize_alike() {
        let s = Scratch::new("resume");
        let text = s.text();
        let (small, big) = (fixture("metaspace64.json"), fixture("bytelevel300.json"));
        let a = open(&DataFlags { data: Some(&text), tokenizer: Some(&small), ..Default::default() }, 300).unwrap();
        let mut b = open(&DataFlags { data: Some(&text), tokenizer: Some(&big), ..Default::default() }, 300).unwrap();
        assert!(b.restore_position(&a.position()).unwrap_err().to_string().contains("trained on"));
    }
}
