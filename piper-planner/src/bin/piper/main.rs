//! `piper`: size any MoE model on any platform, and pick its PP×EP×DP layout.

#[macro_use]
mod table;
mod commands;

use clap::{Parser, Subcommand};

/// Resource model and planner for Mixture-of-Experts training (Piper, arXiv 2605.05049).
///
/// Start with `piper model --preset deepseek-v3` (parameters and FLOPs), then `piper memory` (what one
/// layout needs per GPU, term by term), then `piper plan` (every layout searched, ranked by predicted
/// MFU, the rejected ones with their reasons). Models: a preset name (see `piper model --list`), a
/// Hugging Face config.json, or a native spec. Platforms: frontier, nvlink-8, local, or a TOML file
/// (`piper calibrate` writes one for the machine it runs on). Add --json for machine-readable output.
#[derive(Parser)]
#[command(name = "piper", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parameters (total, active, by component) and training FLOPs per token of a model.
    Model(commands::model::Args),
    /// Per-GPU memory of every pipeline stage for one layout: parameters, gradients, optimizer, activations.
    Memory(commands::memory::Args),
    /// The resource model's answer for one layout: step time, tokens/s, MFU, memory per stage, and where
    /// the step goes (compute, all-to-all, p2p, bubble, gradient all-reduce, optimizer).
    Predict(commands::predict::Args),
    /// Search PP × EP × DP layouts, micro-batching, schedules and recomputation; rank by predicted MFU.
    Plan(commands::plan::Args),
    /// Rebalance experts inside an expert group (hill-climbing swaps), or price Piper's worst case.
    Migrate(commands::migrate::Args),
    /// Measure this machine through the runtime's own binaries and write the platform the planner prices
    /// with (the `local` preset's file by default).
    Calibrate(commands::calibrate::Args),
    /// Run the planner's best plans for a model on this machine and set each against its prediction
    /// (regret of the first choice, rank correlation).
    Validate(commands::validate::Args),
    /// Checkpoints written by the runtime: export one as a Hugging Face model folder.
    Checkpoint(commands::checkpoint::Args),
    /// Tokenizers for training on text: train a byte-level BPE and write its tokenizer.json.
    Tokenizer(commands::tokenizer::Args),
    /// Training data at scale: tokenize text once into memory-mapped token shards.
    Data(commands::data::Args),
    /// Timelines: merge traces (a run's and a prediction's) into one Chrome/Perfetto trace, or draw one.
    Trace(commands::trace::Args),
    /// Pictures of a run from its metrics file: loss, throughput, expert load, rank imbalance.
    Plot(commands::plot::Args),
    /// The planner against the paper's reported figures: paper value, prediction and ratio for each row
    /// (the 1.7T run, weak scaling, X-MoE comparison, single-layer table, recomputation, HALO, Table IV).
    Paper(commands::paper::Args),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind::{DisplayHelp, DisplayHelpOnMissingArgumentOrSubcommand, DisplayVersion};
            if matches!(e.kind(), DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand) {
                e.exit();
            }
            // One line, like every other error: clap's first line names the flag and the value.
            let text = e.render().to_string();
            eprintln!("{}", text.lines().next().unwrap_or("error: bad arguments"));
            std::process::exit(2);
        }
    };
    let result: Result<String, Box<dyn std::error::Error>> = match cli.command {
        Command::Model(a) => commands::model::run(a).map_err(Into::into),
        Command::Memory(a) => commands::memory::run(a).map_err(Into::into),
        Command::Plan(a) => commands::plan::run(a).map_err(Into::into),
        Command::Predict(a) => commands::predict::run(a).map_err(Into::into),
        Command::Migrate(a) => commands::migrate::run(a).map_err(Into::into),
        Command::Calibrate(a) => commands::calibrate::run(a).map_err(Into::into),
        Command::Validate(a) => commands::validate::run(a).map_err(Into::into),
        Command::Checkpoint(a) => commands::checkpoint::run(a).map_err(Into::into),
        Command::Tokenizer(a) => commands::tokenizer::run(a).map_err(Into::into),
        Command::Data(a) => commands::data::run(a).map_err(Into::into),
        Command::Trace(a) => commands::trace::run(a).map_err(Into::into),
        Command::Plot(a) => commands::plot::run(a).map_err(Into::into),
        Command::Paper(a) => commands::paper::run(a).map_err(Into::into),
    };
    match result {
        Ok(text) => {
            // A closed pipe (`piper plan ... | head`) is not an error worth a panic.
            use std::io::Write as _;
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
