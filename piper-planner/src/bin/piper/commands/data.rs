//! `piper data prepare`.

use std::path::PathBuf;

use piper_planner::Result;
use piper_planner::text::TextTokenizer;
use piper_planner::text::shards::{PrepareOptions, prepare};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Tokenize text files once into memory-mapped token shards with an index and a held-out split
    /// (the first --held-out-tokens tokens), for `mixtral_train --data DIR`.
    Prepare {
        /// The Hugging Face tokenizer.json (e.g. from `piper tokenizer train`).
        #[arg(long, value_name = "FILE")]
        tokenizer: PathBuf,
        /// UTF-8 text files, each a document, in order.
        #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
        data: Vec<PathBuf>,
        /// The folder to write: new or empty, or a prepared one with --overwrite.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Tokens per shard file.
        #[arg(long, default_value_t = 100_000_000)]
        shard_tokens: u64,
        /// Tokens of the held-out split (evaluation).
        #[arg(long, default_value_t = 65_536)]
        held_out_tokens: u64,
        /// The token between documents (default: `<|endoftext|>` when the tokenizer has it).
        #[arg(long, value_name = "TOKEN")]
        separator: Option<String>,
        #[arg(long)]
        overwrite: bool,
    },
}

pub fn run(a: Args) -> Result<String> {
    match a.command {
        Command::Prepare { tokenizer, data, out, shard_tokens, held_out_tokens, separator, overwrite } => {
            let tok = TextTokenizer::from_file(&tokenizer, "--tokenizer")?;
            let separator = match separator {
                Some(t) => Some(tok.token_id(&t).ok_or_else(|| {
                    piper_planner::Error::invalid(
                        "piper data prepare",
                        "--separator",
                        format!("`{}` is not a token of the tokenizer", t.escape_debug()),
                    )
                })?),
                None => tok.token_id("<|endoftext|>"),
            };
            let files: Vec<&std::path::Path> = data.iter().map(PathBuf::as_path).collect();
            let o = PrepareOptions { shard_tokens, held_out_tokens, separator, overwrite };
            let index = prepare(&tok, &files, &out, &o)?;
            let train: u64 = index.train.iter().map(|s| s.tokens).sum();
            Ok(format!(
                "prepared {}: {train} training tokens in {} and {} held out, {} bytes per token\n",
                out.display().to_string().escape_debug(),
                match index.train.len() {
                    1 => "1 file".to_string(),
                    n => format!("{n} files"),
                },
                index.held_out.tokens,
                index.token_bytes
            ))
        }
    }
}
