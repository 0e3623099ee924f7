//! Token shards for large corpora (`piper data prepare`): text files tokenized once into little-endian
//! `u16` (vocabularies up to 65 536) or `u32` token files of at most `shard_tokens` tokens each, with an
//! `index.json` naming each file, its token count and SHA-256, the tokenizer (file name and digest) and
//! a held-out split — the first `held_out_tokens` tokens of the stream, in their own file. Training
//! memory-maps the files ([`TokenShards`]): nothing is loaded, a window reads its own pages only.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::tokenizer::TextTokenizer;
use crate::checkpoint::shard::sha256_hex;
use crate::error::{Error, Result};

/// The index of a prepared folder.
pub const INDEX_FILE: &str = "index.json";
/// `index.json`'s format tag.
pub const FORMAT: &str = "piper-tokens";
pub const FORMAT_VERSION: u32 = 1;

/// `index.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardIndex {
    pub format: String,
    pub version: u32,
    /// Bytes per token: 2 (`u16`) or 4 (`u32`).
    pub token_bytes: u32,
    /// One more than the largest id the tokenizer emits.
    pub vocab_size: u64,
    /// The tokenizer's file name and digest (as [`TextTokenizer::digest`]).
    pub tokenizer: String,
    /// The id put between documents (files), if any.
    pub separator: Option<u32>,
    pub train: Vec<ShardEntry>,
    pub held_out: ShardEntry,
}

/// One token file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    pub name: String,
    pub tokens: u64,
    pub sha256: String,
}

/// How to prepare.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareOptions {
    pub shard_tokens: u64,
    pub held_out_tokens: u64,
    /// The id between documents (e.g. `<|endoftext|>`'s).
    pub separator: Option<u32>,
    pub overwrite: bool,
}

/// Tokenizes `files` (UTF-8 text, in order, each a document) with `tokenizer` into `out`. Every input is
/// checked before anything is written; every file is written under a temporary name and renamed.
pub fn prepare(tokenizer: &TextTokenizer, files: &[&Path], out: &Path, o: &PrepareOptions) -> Result<ShardIndex> {
    const SRC: &str = "piper data prepare";
    if files.is_empty() {
        return Err(Error::invalid(SRC, "--data", "needs at least one text file"));
    }
    if o.shard_tokens == 0 {
        return Err(Error::invalid(SRC, "--shard-tokens", "is 0; give at least 1"));
    }
    for f in files {
        if !f.is_file() {
            return Err(Error::file(shown(f), "--data: no such file"));
        }
    }
    check_output(out, o.overwrite)?;
    let written = write_all(tokenizer, files, out, o);
    if written.is_err() && !out.join(INDEX_FILE).exists() {
        // A failed first preparation leaves no token files behind.
        for e in std::fs::read_dir(out).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "held-out.bin" || (name.starts_with("train-") && name.ends_with(".bin")) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    written
}

fn write_all(tokenizer: &TextTokenizer, files: &[&Path], out: &Path, o: &PrepareOptions) -> Result<ShardIndex> {
    const SRC: &str = "piper data prepare";
    let token_bytes = if tokenizer.vocab_size() <= 1 << 16 { 2 } else { 4 };
    let mut writer = Writer::new(out, token_bytes, o);
    for (i, f) in files.iter().enumerate() {
        if i > 0
            && let Some(sep) = o.separator
        {
            writer.push(&[sep])?;
        }
        push_file(tokenizer, f, &mut writer)?;
    }
    let file = tokenizer.path().file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let (train, held_out) = writer.finish()?;
    if held_out.tokens < o.held_out_tokens || train.iter().map(|s| s.tokens).sum::<u64>() < 2 {
        return Err(Error::invalid(
            SRC,
            "--held-out-tokens",
            format!("the text has {} tokens: hold out fewer than that (training needs some)", held_out.tokens),
        ));
    }
    let index = ShardIndex {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        token_bytes,
        vocab_size: tokenizer.vocab_size() as u64,
        tokenizer: format!("{} {}", file.escape_debug(), tokenizer.digest()),
        separator: o.separator,
        train,
        held_out,
    };
    let text = serde_json::to_string_pretty(&index).expect("an index serialises");
    crate::atomic::write_atomic(&out.join(INDEX_FILE), text.as_bytes())
        .map_err(|e| Error::file(shown(&out.join(INDEX_FILE)), e.to_string()))?;
    Ok(index)
}

fn shown(p: &Path) -> String {
    p.display().to_string().escape_debug().to_string()
}

/// A new, empty or (with `overwrite`) prepared folder.
fn check_output(out: &Path, overwrite: bool) -> Result<()> {
    let occupied = std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(false);
    if occupied && !(overwrite && out.join(INDEX_FILE).is_file()) {
        let why = if overwrite {
            "holds files but no index.json: not a prepared folder"
        } else {
            "is not empty; pass --overwrite to replace a prepared folder"
        };
        return Err(Error::invalid("piper data prepare", "--out", format!("{}: {why}", shown(out))));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::file(shown(out), format!("--out: {e}")))
}

/// Tokenizes a file in pieces of about 1 MiB cut after a newline (tokenizers see whole lines), streamed:
/// a corpus file larger than memory is never read whole.
fn push_file(tokenizer: &TextTokenizer, path: &Path, writer: &mut Writer) -> Result<()> {
    use std::io::Read;
    let io_error = |e: std::io::Error| Error::file(shown(path), format!("--data: {e}"));
    let mut file = std::fs::File::open(path).map_err(io_error)?;
    let (mut pending, mut offset, mut eof) = (Vec::<u8>::new(), 0u64, false);
    while !eof || !pending.is_empty() {
        if !eof && pending.len() < PIECE_BYTES {
            let mut more = Vec::with_capacity(PIECE_BYTES);
            let n = (&mut file).take(PIECE_BYTES as u64).read_to_end(&mut more).map_err(io_error)?;
            eof = n == 0;
            pending.extend_from_slice(&more);
            continue;
        }
        let cut = if eof { pending.len() } else { piece_end(&pending) };
        let piece = std::str::from_utf8(&pending[..cut]).map_err(|e| {
            let at = offset + e.valid_up_to() as u64;
            Error::file(shown(path), format!("--data: not UTF-8 (invalid byte at offset {at})"))
        })?;
        writer.push(&tokenizer.encode(piece)?)?;
        offset += cut as u64;
        pending.drain(..cut);
    }
    Ok(())
}

const PIECE_BYTES: usize = 1 << 20;

/// The end of the first piece of a buffer holding at least one piece: after the last newline, else at
/// the last character boundary.
fn piece_end(bytes: &[u8]) -> usize {
    let head = &bytes[..PIECE_BYTES];
    if let Some(n) = head.iter().rposition(|&b| b == b'\n') {
        return n + 1;
    }
    (1..=PIECE_BYTES).rev().find(|&c| c == bytes.len() || (bytes[c] as i8) >= -0x40).unwrap_or(PIECE_BYTES)
}

/// Fills the held-out file first, then train files of `shard_tokens` tokens.
struct Writer<'a> {
    out: &'a Path,
    token_bytes: u32,
    o: &'a PrepareOptions,
    buffer: Vec<u8>,
    held_out: Option<ShardEntry>,
    train: Vec<ShardEntry>,
}

impl<'a> Writer<'a> {
    fn new(out: &'a Path, token_bytes: u32, o: &'a PrepareOptions) -> Self {
        Writer { out, token_bytes, o, buffer: Vec::new(), held_out: None, train: Vec::new() }
    }

    fn capacity(&self) -> u64 {
        if self.held_out.is_none() { self.o.held_out_tokens } else { self.o.shard_tokens }
    }

    fn push(&mut self, ids: &[u32]) -> Result<()> {
        for id in ids {
            while self.buffered() >= self.capacity() {
                self.flush()?;
            }
            match self.token_bytes {
                2 => self.buffer.extend_from_slice(&(*id as u16).to_le_bytes()),
                _ => self.buffer.extend_from_slice(&id.to_le_bytes()),
            }
        }
        Ok(())
    }

    fn buffered(&self) -> u64 {
        self.buffer.len() as u64 / self.token_bytes as u64
    }

    fn flush(&mut self) -> Result<()> {
        let name = if self.held_out.is_none() {
            "held-out.bin".to_string()
        } else {
            format!("train-{:05}.bin", self.train.len())
        };
        let path = self.out.join(&name);
        crate::atomic::write_atomic(&path, &self.buffer).map_err(|e| Error::file(shown(&path), e.to_string()))?;
        let entry = ShardEntry { name, tokens: self.buffered(), sha256: sha256_hex(&self.buffer) };
        self.buffer.clear();
        match self.held_out {
            None => self.held_out = Some(entry),
            Some(_) => self.train.push(entry),
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(Vec<ShardEntry>, ShardEntry)> {
        if self.buffered() > 0 || self.held_out.is_none() {
            self.flush()?;
        }
        let held_out = self.held_out.take().expect("flushed");
        Ok((self.train, held_out))
    }
}

/// A prepared folder, memory-mapped.
pub struct TokenShards {
    pub index: ShardIndex,
    pub folder: PathBuf,
    train: Vec<memmap2::Mmap>,
    held_out: memmap2::Mmap,
    /// Token offset of each train file in the stream, and the stream's length.
    starts: Vec<u64>,
    len: u64,
}

impl TokenShards {
    /// Opens `folder` (its `index.json` and every file, checked against their sizes; `verify` checks the
    /// SHA-256 too, which reads every byte). Errors name the file and the fix.
    pub fn open(folder: &Path, verify: bool) -> Result<TokenShards> {
        let index_path = folder.join(INDEX_FILE);
        let text = std::fs::read_to_string(&index_path).map_err(|e| Error::file(shown(&index_path), e.to_string()))?;
        let index: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| Error::file(shown(&index_path), format!("not a token-shard index ({e})")))?;
        if index.format != FORMAT || index.version != FORMAT_VERSION || !matches!(index.token_bytes, 2 | 4) {
            return Err(Error::file(shown(&index_path), format!("not a {FORMAT} v{FORMAT_VERSION} index")));
        }
        let map = |e: &ShardEntry| -> Result<memmap2::Mmap> {
            if e.name.contains(['/', '\\']) || e.name.starts_with('.') {
                return Err(Error::file(
                    shown(&index_path),
                    format!("`{}` is not a plain file name", e.name.escape_debug()),
                ));
            }
            let path = folder.join(&e.name);
            let file = std::fs::File::open(&path).map_err(|err| Error::file(shown(&path), err.to_string()))?;
            // Safety: the file is only read; a file truncated by another process while mapped could fault,
            // which the size check below makes a stale-folder error in the common case.
            let mmap =
                unsafe { memmap2::Mmap::map(&file) }.map_err(|err| Error::file(shown(&path), err.to_string()))?;
            let want = e.tokens.checked_mul(index.token_bytes as u64);
            if want != Some(mmap.len() as u64) || (verify && sha256_hex(&mmap) != e.sha256) {
                return Err(Error::file(
                    shown(&path),
                    "fails its size or SHA-256 check: truncated or corrupted; prepare again",
                ));
            }
            Ok(mmap)
        };
        let train = index.train.iter().map(map).collect::<Result<Vec<_>>>()?;
        let held_out = map(&index.held_out)?;
        let mut starts = Vec::with_capacity(train.len());
        let mut len = 0u64;
        for e in &index.train {
            starts.push(len);
            len += e.tokens;
        }
        Ok(TokenShards { index, folder: folder.to_path_buf(), train, held_out, starts, len })
    }

    /// Train tokens in the stream.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn token(&self, bytes: &[u8], i: usize) -> i64 {
        let w = self.index.token_bytes as usize;
        let b = &bytes[i * w..(i + 1) * w];
        if w == 2 {
            u16::from_le_bytes([b[0], b[1]]) as i64
        } else {
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64
        }
    }

    /// Tokens `start..start + len` of the train stream (across files), `start + len ≤ len()`.
    pub fn window(&self, start: u64, len: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(len);
        let mut file = self.starts.partition_point(|s| *s <= start).saturating_sub(1);
        let mut at = (start - self.starts[file]) as usize;
        while out.len() < len {
            if at as u64 >= self.index.train[file].tokens {
                file += 1;
                at = 0;
                continue;
            }
            out.push(self.token(&self.train[file], at));
            at += 1;
        }
        out
    }

    /// The first id of `ids` (the train stream's tokens from `start`) outside the index's vocabulary, as
    /// an error naming its file and position: a shard changed after it was prepared.
    pub fn check_window(&self, ids: &[i64], start: u64) -> Result<()> {
        let vocab = self.index.vocab_size as i64;
        let Some(i) = ids.iter().position(|&t| t < 0 || t >= vocab) else { return Ok(()) };
        let at = start + i as u64;
        let file = self.starts.partition_point(|s| *s <= at).saturating_sub(1);
        let path = self.folder.join(&self.index.train[file].name);
        Err(Error::file(
            shown(&path),
            format!(
                "token {} at position {} is outside the vocabulary of {vocab}: the shard changed after it was prepared; prepare it again",
                ids[i],
                at - self.starts[file]
            ),
        ))
    }

    /// The first `n` held-out tokens.
    pub fn held_out(&self, n: usize) -> Option<Vec<i64>> {
        (n as u64 <= self.index.held_out.tokens).then(|| (0..n).map(|i| self.token(&self.held_out, i)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_tokenizer(name: &str) -> TextTokenizer {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer").join(name);
        TextTokenizer::from_file(&p, "--tokenizer").unwrap()
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("piper-shards-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const A: &str = "The router scores each expert.\nThe expert group dispatches the tokens.\n";
    const B: &str = "Pipelines split the layers into stages; micro-batches keep them busy.\n";

    /// The held-out file and the train files, in order, are the documents' ids with the separator between
    /// them; files hold at most `shard_tokens`; windows across file boundaries read the stream.
    #[test]
    fn shards_hold_the_token_stream_in_order() {
        let dir = scratch("order");
        let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
        std::fs::write(&a, A.repeat(3)).unwrap();
        std::fs::write(&b, B.repeat(2)).unwrap();
        let tok = fixture_tokenizer("bytelevel300.json");
        let o = PrepareOptions { shard_tokens: 7, held_out_tokens: 10, separator: Some(0), overwrite: false };
        let out = dir.join("prepared");
        let index = prepare(&tok, &[&a, &b], &out, &o).unwrap();
        assert_eq!(index.token_bytes, 2);
        let mut want: Vec<i64> = tok.encode(&A.repeat(3)).unwrap().into_iter().map(i64::from).collect();
        want.push(0);
        want.extend(tok.encode(&B.repeat(2)).unwrap().into_iter().map(i64::from));
        let shards = TokenShards::open(&out, true).unwrap();
        assert_eq!(shards.held_out(10).unwrap(), want[..10]);
        assert!(shards.held_out(11).is_none());
        assert_eq!(shards.len() as usize, want.len() - 10);
        assert!(index.train.iter().all(|s| s.tokens <= 7) && index.train.len() > 3);
        assert_eq!(shards.window(0, shards.len() as usize), want[10..]);
        assert_eq!(shards.window(5, 9), want[15..24], "a window across three files");
        // A prepared folder is replaced only with --overwrite; a truncated file is refused by name.
        let e = prepare(&tok, &[&a], &out, &o).unwrap_err().to_string();
        assert!(e.contains("--overwrite"), "{e}");
        std::fs::write(out.join("train-00001.bin"), [1u8, 2, 3]).unwrap();
        let e = TokenShards::open(&out, false).err().unwrap().to_string();
        assert!(e.contains("train-00001.bin") && e.contains("truncated"), "{e}");
        prepare(&tok, &[&a], &out, &PrepareOptions { overwrite: true, ..o.clone() }).unwrap();
        TokenShards::open(&out, true).unwrap();
        let e = prepare(&tok, &[&a], &dir.join("p2"), &PrepareOptions { held_out_tokens: 100_000, ..o }).unwrap_err();
        assert!(e.to_string().contains("--held-out-tokens"), "{e}");
        assert_eq!(std::fs::read_dir(dir.join("p2")).unwrap().count(), 0, "a failed preparation leaves nothing");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file over one piece is streamed in pieces that end after a newline, or between characters when a
    /// piece has none: the ids equal the pieces' encodings, and no character is split.
    #[test]
    fn large_files_stream_in_pieces_at_lines_and_characters() {
        let mut bytes = vec![b'a'; PIECE_BYTES - 1];
        bytes.extend("é".as_bytes());
        assert_eq!(piece_end(&bytes), PIECE_BYTES - 1, "the two-byte character is not split");
        bytes[10] = b'\n';
        assert_eq!(piece_end(&bytes), 11);
        let dir = scratch("stream");
        let line = "Expert groups stay inside a node; héllo wörld.\n";
        let text = line.repeat(PIECE_BYTES / line.len() * 2 + 7);
        let f = dir.join("big.txt");
        std::fs::write(&f, &text).unwrap();
        let tok = fixture_tokenizer("bytelevel300.json");
        let o = PrepareOptions { shard_tokens: 1 << 30, held_out_tokens: 5, separator: None, overwrite: false };
        prepare(&tok, &[&f], &dir.join("out"), &o).unwrap();
        let shards = TokenShards::open(&dir.join("out"), true).unwrap();
        let first = piece_end(text.as_bytes());
        let second = first + piece_end(&text.as_bytes()[first..]);
        let mut want: Vec<i64> = Vec::new();
        for piece in [&text[..first], &text[first..second], &text[second..]] {
            want.extend(tok.encode(piece).unwrap().into_iter().map(i64::from));
        }
        let mut got = shards.held_out(5).unwrap();
        got.extend(shards.window(0, shards.len() as usize));
        assert_eq!(got, want);
        std::fs::write(&f, [b"ok\n".as_slice(), &[0xff]].concat()).unwrap();
        let e = prepare(&tok, &[&f], &dir.join("bad"), &o).unwrap_err().to_string();
        assert!(e.contains("offset 3") && e.contains("big.txt"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
