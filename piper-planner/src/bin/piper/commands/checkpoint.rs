//! `piper checkpoint export`.

use std::path::PathBuf;

use piper_planner::Result;
use piper_planner::checkpoint::export::export_hf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Write one Hugging Face-style folder (model.safetensors + config.json) from a checkpoint saved by
    /// any layout: a checkpoint folder, or the latest under a --checkpoint-dir.
    Export {
        /// The checkpoint folder, or the --checkpoint-dir whose `latest` names it.
        checkpoint: PathBuf,
        /// The folder to write: new or empty, unless --overwrite.
        #[arg(long, value_name = "OUT")]
        hf: PathBuf,
        /// Write into a folder that holds files: replace its model.safetensors and config.json and remove
        /// its other weight files (sharded or PyTorch weights and their indexes, which loaders would read
        /// instead); other files stay.
        #[arg(long)]
        overwrite: bool,
    },
}

pub fn run(a: Args) -> Result<String> {
    match a.command {
        Command::Export { checkpoint, hf, overwrite } => {
            let e = export_hf(&checkpoint, &hf, overwrite)?;
            let config = if e.transformers_config {
                "config.json (transformers MixtralConfig)"
            } else {
                "config.json (Piper's native spec: not a transformers architecture)"
            };
            Ok(format!(
                "exported step {}: {} tensors, {} bytes to {}/model.safetensors and {config}\n",
                e.step,
                e.tensors,
                e.bytes,
                hf.display()
            ))
        }
    }
}
