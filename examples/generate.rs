//! Generate text with a model: a Hugging Face folder (`--model DIR`, its tokenizer.json) or a checkpoint
//! the trainer saved (`--checkpoint PATH`, with `--tokenizer FILE` for text):
//! `cargo run --release --example generate -- --model DIR --prompt "Once upon" --max-new-tokens 40`.
//! Greedy by default (`--temperature 0`), else sampled (`--temperature`, `--top-k`, `--seed`); `--json
//! OUT` gets `{"prompt_ids", "generated_ids", "text"}`. A checkpoint trained on the synthetic grammar
//! also reports the share of generated transitions the grammar allows. Policy lives in
//! `piper_models::generate` and `piper_models::grammar_check`.

use std::path::PathBuf;

use burn::prelude::*;
use clap::Parser;
use piper::models::generate::{Sampling, generate};
use piper::models::grammar_check::checkpoint_grammar;
use piper::planner::text::TextTokenizer;

/// Generate tokens after a prompt, with a key/value cache.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A Hugging Face model folder (config.json, safetensors weights, tokenizer.json).
    #[arg(long, conflicts_with = "checkpoint", required_unless_present = "checkpoint")]
    model: Option<PathBuf>,
    /// A checkpoint folder, or a --checkpoint-dir whose `latest` names one (any layout).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// The tokenizer.json of the prompt and the output (default: the --model folder's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The prompt, as text (through the tokenizer).
    #[arg(long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated (no tokenizer needed).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// 0: greedy (the most likely token); else the softmax temperature.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample among the K most likely tokens only.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop after this token id (an end-of-text token).
    #[arg(long, value_name = "ID")]
    stop_id: Option<u32>,
    /// Write `{"prompt_ids", "generated_ids", "text"}` here (and `grammar_transitions` for a checkpoint
    /// trained on the synthetic grammar).
    #[arg(long)]
    json: Option<PathBuf>,
    /// The --grammar-branching of the run that saved --checkpoint, when it trained on the grammar.
    #[arg(long, default_value_t = 3)]
    grammar_branching: usize,
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let tokenizer = match (&a.tokenizer, &a.model) {
        (Some(file), _) => Some(TextTokenizer::from_file(file, "--tokenizer")?),
        (None, Some(dir)) => TextTokenizer::from_model_folder(dir, "--model")?,
        (None, None) => None,
    };
    let prompt_ids = match (&a.prompt, &a.prompt_ids, &tokenizer) {
        (Some(text), _, Some(t)) => t.encode(text)?,
        (Some(_), _, None) => return Err("--prompt needs a tokenizer: pass --tokenizer FILE, or --prompt-ids".into()),
        (None, Some(ids), _) => ids.clone(),
        (None, None, _) => unreachable!("clap requires one"),
    };
    let device = Device::flex();
    let (_, model) = match (&a.model, &a.checkpoint) {
        (Some(dir), _) => piper::models::load_hf_folder(dir, &device)?,
        (None, Some(path)) => piper::models::load_checkpoint(path, &device)?,
        (None, None) => unreachable!("clap requires one"),
    };
    if let Some(t) = &tokenizer {
        t.check_fits(model.embed.weight.dims()[0], "--tokenizer")?;
    }
    let sampling = Sampling {
        max_new_tokens: a.max_new_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        seed: a.seed,
        stop: a.stop_id,
    };
    if let Some(path) = &a.checkpoint {
        let trained = piper::models::checkpoint_trained_length(path)?;
        let positions = prompt_ids.len() + a.max_new_tokens;
        if positions as u64 > trained {
            eprintln!(
                "warning: the prompt and --max-new-tokens reach position {positions}, past the {trained} tokens per \
                 sequence the checkpoint trained on: expect worse tokens there"
            );
        }
    }
    let grammar = match &a.checkpoint {
        Some(path) => checkpoint_grammar(path, a.grammar_branching)?,
        None => None,
    };
    let generated_ids = generate(&model, &prompt_ids, &sampling)?;
    let grammar_transitions = grammar.map(|g| {
        let ids: Vec<i64> = prompt_ids.iter().chain(&generated_ids).map(|&x| x as i64).collect();
        let (allowed, total) = g.allowed_transitions(&ids, prompt_ids.len());
        let share = if total > 0 { 100.0 * allowed as f64 / total as f64 } else { f64::NAN };
        eprintln!("grammar: {allowed} of {total} generated transitions allowed ({share:.1}%)");
        serde_json::json!({"allowed": allowed, "total": total})
    });
    let text = match &tokenizer {
        Some(t) => Some(t.decode(&[prompt_ids.clone(), generated_ids.clone()].concat())?),
        None => None,
    };
    match &text {
        Some(t) => println!("{t}"),
        None => println!("{generated_ids:?}"),
    }
    if let Some(path) = &a.json {
        let mut doc = serde_json::json!({"prompt_ids": prompt_ids, "generated_ids": generated_ids, "text": text});
        if let Some(g) = grammar_transitions {
            doc["grammar_transitions"] = g;
        }
        piper::planner::atomic::write_atomic(path, serde_json::to_string_pretty(&doc)?.as_bytes())
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
