//! `--plots DIR`: the run's pictures at the end (rank 0), drawn by [`piper_planner::plots::run`] from the
//! metrics file when the run keeps one (so a resumed run draws every step since the first), else from
//! the steps this process trained.

use std::path::{Path, PathBuf};

use piper_planner::plots::run::{RunSeries, plot_run};

use super::metrics::StepMetrics;
use crate::runtime::error::{Result, RuntimeError};

/// Draws loss, throughput, expert load and imbalance into `dir`; returns the files written.
pub fn write_run_plots(
    dir: &Path,
    metrics_file: Option<&Path>,
    metrics: &[StepMetrics],
    best_loss: Option<f64>,
) -> Result<Vec<PathBuf>> {
    let refuse = |e: piper_planner::Error| RuntimeError::invalid("--plots", e.to_string());
    let series = match metrics_file {
        Some(file) => RunSeries::read(file, best_loss).map_err(refuse)?,
        None => {
            let lines = metrics
                .iter()
                .map(serde_json::to_value)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(RuntimeError::json("plots"))?;
            RunSeries::from_metrics(&lines, best_loss, "the run's steps").map_err(refuse)?
        }
    };
    plot_run(&series, dir).map_err(refuse)
}
