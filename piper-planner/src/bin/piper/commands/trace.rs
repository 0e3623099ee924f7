//! `piper trace merge`.

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
}

pub fn run(a: Args) -> Result<String> {
    match a.command {
        Command::Merge { parts, out } => {
            let events = parts.iter().map(|p| read_events(p)).collect::<Result<Vec<_>>>()?;
            let n: usize = events.iter().map(Vec::len).sum();
            write(&out, &merge(events)?)?;
            Ok(format!("merged {} parts ({n} events) into {}\n", parts.len(), out.display().to_string().escape_debug()))
        }
    }
}
