//! `piper tokenizer train`.

use std::path::PathBuf;

use piper_planner::text::{TextTokenizer, train_byte_level_bpe};
use piper_planner::{Error, Result};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Train a byte-level BPE (every byte is a token, so any text encodes; `<|endoftext|>` is id 0) on
    /// UTF-8 text files and write it as a Hugging Face tokenizer.json, for `mixtral_train --tokenizer`.
    Train {
        /// Tokens in the vocabulary, the 256 bytes and `<|endoftext|>` included (fewer if the text
        /// has fewer pairs worth merging).
        #[arg(long, value_name = "N")]
        vocab: usize,
        /// The text files to learn the merges from.
        #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
        data: Vec<PathBuf>,
        /// Where to write tokenizer.json.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Replace --out if it exists.
        #[arg(long)]
        overwrite: bool,
    },
}

pub fn run(a: Args) -> Result<String> {
    match a.command {
        Command::Train { vocab, data, out, overwrite } => {
            let shown = out.display().to_string().escape_debug().to_string();
            if out.exists() && !overwrite {
                return Err(Error::file(&shown, "--out: exists; pass --overwrite to replace it"));
            }
            let files: Vec<&std::path::Path> = data.iter().map(PathBuf::as_path).collect();
            let json = train_byte_level_bpe(&files, vocab)?;
            piper_planner::atomic::write_atomic(&out, json.as_bytes())
                .map_err(|e| Error::file(&shown, format!("--out: {e}")))?;
            let trained = TextTokenizer::from_file(&out, "--out")?;
            Ok(format!("wrote {shown}: byte-level BPE, {} tokens\n", trained.vocab_size()))
        }
    }
}
