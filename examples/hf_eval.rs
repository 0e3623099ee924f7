//! Evaluate a Hugging Face model folder on token ids, as transformers' `model(input_ids,
//! labels=input_ids).loss` would:
//! `cargo run --release --example hf_eval -- --model DIR --input-ids IDS.json --json OUT.json`, where
//! IDS.json is `[[token ids of sequence 1], …]` and OUT.json gets `{"cross_entropy", "logits_shape",
//! "argmax"}`. Policy lives in `piper_models::eval`.

use std::path::PathBuf;

use clap::Parser;

/// Evaluate a Hugging Face model folder (config.json + safetensors) on token ids.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The model folder: config.json and model.safetensors (or a sharded model.safetensors.index.json).
    #[arg(long)]
    model: PathBuf,
    /// JSON: `[[ids of sequence 1], [ids of sequence 2], …]`, equal lengths.
    #[arg(long)]
    input_ids: PathBuf,
    /// Write `{"cross_entropy", "logits_shape", "argmax"}` here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let text =
        std::fs::read_to_string(&a.input_ids).map_err(|e| format!("--input-ids {}: {e}", a.input_ids.display()))?;
    let ids: Vec<Vec<i64>> = serde_json::from_str(&text)
        .map_err(|e| format!("--input-ids {}: not a list of token-id lists ({e})", a.input_ids.display()))?;
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

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
