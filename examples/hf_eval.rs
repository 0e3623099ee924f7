//! Evaluate a Hugging Face model folder on token ids or text, as transformers' `model(input_ids,
//! labels=input_ids).loss` would:
//! `cargo run --release --example hf_eval -- --model DIR --input-ids IDS.json --json OUT.json`, where
//! IDS.json is `[[token ids of sequence 1], …]`, or `--text FILE` (one sequence, through the folder's
//! tokenizer.json or `--tokenizer`); OUT.json gets `{"cross_entropy", "logits_shape", "argmax"}`.
//! Policy lives in `piper_models::eval`.

use std::path::{Path, PathBuf};

use clap::Parser;
use piper::planner::text::TextTokenizer;

/// Evaluate a Hugging Face model folder (config.json + safetensors) on token ids.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The model folder: config.json and model.safetensors (or a sharded model.safetensors.index.json).
    #[arg(long)]
    model: PathBuf,
    /// JSON: `[[ids of sequence 1], [ids of sequence 2], …]`, equal lengths.
    #[arg(long, conflicts_with = "text", required_unless_present = "text")]
    input_ids: Option<PathBuf>,
    /// A UTF-8 text file, evaluated as one sequence of its tokens.
    #[arg(long)]
    text: Option<PathBuf>,
    /// The tokenizer.json for --text (default: the --model folder's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Write `{"cross_entropy", "logits_shape", "argmax"}` here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let ids = match (&a.input_ids, &a.text) {
        (Some(file), _) => read_ids(file)?,
        (None, Some(file)) => vec![tokenized(&a, file)?],
        (None, None) => unreachable!("clap requires one"),
    };
    let e = piper::models::eval::evaluate(&a.model, &ids)?;
    println!(
        "cross-entropy {:.6} nats over {} × {} tokens (logits {:?})",
        e.cross_entropy,
        e.logits_shape[0],
        e.logits_shape[1] - 1,
        e.logits_shape
    );
    if let Some(path) = &a.json {
        let doc = serde_json::to_string_pretty(&e).expect("json");
        piper::planner::atomic::write_atomic(path, doc.as_bytes())
            .map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    Ok(())
}

/// `[[ids], …]` from a JSON file.
fn read_ids(file: &Path) -> Result<Vec<Vec<i64>>, Box<dyn std::error::Error>> {
    let shown = file.display().to_string().escape_debug().to_string();
    let text = std::fs::read_to_string(file).map_err(|e| format!("--input-ids {shown}: {e}"))?;
    Ok(serde_json::from_str(&text).map_err(|e| format!("--input-ids {shown}: not a list of token-id lists ({e})"))?)
}

/// The ids of the text file `file`, through --tokenizer or the model folder's tokenizer.json.
fn tokenized(a: &Args, file: &Path) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    let tokenizer = match &a.tokenizer {
        Some(t) => TextTokenizer::from_file(t, "--tokenizer")?,
        None => TextTokenizer::from_model_folder(&a.model, "--model")?
            .ok_or("--text needs a tokenizer: the --model folder has no tokenizer.json; pass --tokenizer FILE")?,
    };
    let shown = file.display().to_string().escape_debug().to_string();
    let text = std::fs::read_to_string(file).map_err(|e| format!("--text {shown}: {e} (UTF-8 text is expected)"))?;
    Ok(tokenizer.encode(&text)?.into_iter().map(i64::from).collect())
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
