//! `piper plot`.

use std::path::PathBuf;

use piper_planner::Result;
use piper_planner::plots::run::{RunSeries, plot_run};

/// Draws a run's pictures from its metrics file (what `mixtral_train --plots DIR` draws at the end).
#[derive(clap::Args)]
pub struct Args {
    /// The run's `--metrics` JSON-lines file.
    #[arg(long, value_name = "FILE.jsonl")]
    metrics: PathBuf,
    /// The folder to write loss, throughput, expert_load and imbalance (.png and .svg) into.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The lowest achievable loss, drawn as a dashed line (the run prints it for the grammar).
    #[arg(long)]
    best_loss: Option<f64>,
}

pub fn run(a: Args) -> Result<String> {
    if let Some(b) = a.best_loss.filter(|b| !b.is_finite()) {
        return Err(piper_planner::Error::invalid(
            "piper plot",
            "--best-loss",
            format!("is {b}; give a finite number"),
        ));
    }
    let series = RunSeries::read(&a.metrics, a.best_loss)?;
    let files = plot_run(&series, &a.out)?;
    Ok(files.iter().map(|f| format!("wrote {}\n", f.display().to_string().escape_debug())).collect())
}
