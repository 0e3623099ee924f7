//! `piper checkpoint export`.

use std::path::PathBuf;

use piper_planner::Result;
use piper_planner::checkpoint::export::{DEFAULT_MAX_SHARD_BYTES, ExportOptions, ExportedConfig, export_hf_with};
use piper_planner::checkpoint::shard::StoredDtype;

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
        /// Weights above this many bytes go into shards with a model.safetensors.index.json.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SHARD_BYTES)]
        max_shard_size: u64,
        /// The weights' type: fp32 (the checkpoint's master weights, exact) or bf16 (each rounded to
        /// nearest even: half the bytes; config.json's torch_dtype says bfloat16).
        #[arg(long, value_enum, default_value_t = ExportDtype::Fp32)]
        dtype: ExportDtype,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ExportDtype {
    Fp32,
    Bf16,
}

pub fn run(a: Args) -> Result<String> {
    match a.command {
        Command::Export { checkpoint, hf, overwrite, max_shard_size, dtype } => {
            let dtype = match dtype {
                ExportDtype::Fp32 => StoredDtype::F32,
                ExportDtype::Bf16 => StoredDtype::Bf16,
            };
            let options = ExportOptions { overwrite, max_shard_bytes: max_shard_size, dtype };
            let e = export_hf_with(&checkpoint, &hf, &options)?;
            let config = match &e.config {
                ExportedConfig::Original(t) => format!("config.json (the model's own, {})", t.escape_debug()),
                ExportedConfig::Mixtral => "config.json (transformers MixtralConfig)".into(),
                ExportedConfig::Native => "config.json (Piper's native spec: not a transformers architecture)".into(),
            };
            let weights = if e.shards == 1 {
                "model.safetensors".into()
            } else {
                format!("{} shards and model.safetensors.index.json", e.shards)
            };
            Ok(format!(
                "exported step {}: {} tensors in {}, {} bytes to {}/{weights}, {config}, {} tokenizer files\n",
                e.step,
                e.tensors,
                e.dtype.torch_name(),
                e.bytes,
                hf.display(),
                e.tokenizer_files
            ))
        }
    }
}
