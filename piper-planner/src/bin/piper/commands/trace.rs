//! `piper trace merge` and `piper trace plot`.

use std::path::PathBuf;

use piper_planner::Result;
use piper_planner::trace::{merge, read_events, write};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Merges the ranks' trace parts (`--trace FILE` of a run whose ranks could not merge them, e.g.
    /// without a shared file system: FILE.rank-R.json) into one Chrome/Perfetto trace, one process per
    /// rank on one clock.
    Merge {
        /// The parts, one per rank.
        #[arg(num_args = 1.., required = true, value_name = "PART")]
        parts: Vec<PathBuf>,
        /// The merged trace to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Draws a trace's spans (one row per process, coloured by kind) into DIR/timeline.png and .svg.
    Plot {
        /// The trace (a run's --trace, piper predict --trace, or piper trace merge's output).
        #[arg(value_name = "TRACE")]
        trace: PathBuf,
        /// The folder to write into.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Only the spans between these times, milliseconds from the trace's start: FROM:TO.
        #[arg(long, value_name = "FROM:TO", value_parser = parse_window)]
        window: Option<(f64, f64)>,
    },
}

/// `FROM:TO` in milliseconds, finite and increasing.
fn parse_window(text: &str) -> std::result::Result<(f64, f64), String> {
    let (a, b) = text.split_once(':').ok_or("give FROM:TO in milliseconds, e.g. 0:250")?;
    let (a, b): (f64, f64) =
        (a.trim().parse().map_err(|e| format!("FROM: {e}"))?, b.trim().parse().map_err(|e| format!("TO: {e}"))?);
    if a.is_finite() && b.is_finite() && a < b {
        Ok((a, b))
    } else {
        Err(format!("{a}:{b} is not an increasing window"))
    }
}

pub fn run(a: Args) -> Result<String> {
    match a.command {
        Command::Plot { trace, out, window } => {
            let events = read_events(&trace)?;
            let title = format!("timeline of {}", trace.display().to_string().escape_debug());
            let files = piper_planner::plots::timeline::plot_timeline(&events, window, &title, &out)?;
            Ok(files.iter().map(|f| format!("wrote {}\n", f.display().to_string().escape_debug())).collect())
        }
        Command::Merge { parts, out } => {
            let events = parts.iter().map(|p| read_events(p)).collect::<Result<Vec<_>>>()?;
            let n: usize = events.iter().map(Vec::len).sum();
            write(&out, &merge(events)?)?;
            Ok(format!("merged {} parts ({n} events) into {}\n", parts.len(), out.display().to_string().escape_debug()))
        }
    }
}
