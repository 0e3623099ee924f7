//! The runtime side of checkpoints — saving each rank's share ([`save`]), resuming bit-exact and
//! resharding to any layout, and starting from a Hugging Face folder ([`load`]) — in the format of
//! [`piper_planner::checkpoint`] (manifest + one safetensors shard per rank), which `piper checkpoint
//! export` reads without Burn. Tensors keep their Hugging Face names (the state-dict adapter's).
//!
//! Save: each rank writes what it owns — its stage's layers (non-expert tensors by the stage's first
//! replica, expert tensors by every expert-group rank of the first data-parallel replica, each expert
//! under its global id), the embedding (first stage), final norm and head (last stage) — weights and
//! AdamW moments, into the save's scratch folder; rank 0 gathers the shard entries, writes the manifest
//! and commits the folder. Resume: each rank lists the tensors its part of the model needs under the
//! *current* layout and placement, finds them through the manifest and reads only those, so any layout
//! (PP, EP, DP, split) resumes any checkpoint.

pub mod load;
pub mod save;

use std::path::{Path, PathBuf};

use piper_planner::checkpoint::companions::TokenizerSources;
use piper_planner::checkpoint::{Manifest, load_resume};
use piper_planner::model::ModelSpec;

use super::error::{Result, RuntimeError};
use crate::hf::state_dict::Entry;
use crate::model::StageModel;
use crate::moe::dispatcher::ExpertPlacement;

pub use load::{init_from_hf, restore, resumed_placements};
pub use save::{RunState, save};

/// `--checkpoint-dir DIR --save-every N --keep K` (the checkpoint a run continues from is the job's
/// [`resume`](super::job::Job::resume)).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointSettings {
    pub dir: Option<PathBuf>,
    /// Save every N steps (and after the last one); 0: only after the last step.
    pub save_every: usize,
    /// Complete checkpoints to keep under `dir` (the newest).
    pub keep: usize,
    /// The model's own Hugging Face config.json, kept in every checkpoint for its export.
    pub hf_config: Option<serde_json::Value>,
    /// Tokenizer files kept in every checkpoint (`tokenizer/`), for its export.
    pub tokenizer_files: TokenizerSources,
}

impl Default for CheckpointSettings {
    /// No checkpoints (keep 2 when there are).
    fn default() -> Self {
        CheckpointSettings { dir: None, save_every: 0, keep: 2, hf_config: None, tokenizer_files: Vec::new() }
    }
}

impl CheckpointSettings {
    pub fn validate(&self) -> Result<()> {
        if self.dir.is_none() && self.save_every > 0 {
            return Err(RuntimeError::invalid("checkpoint.save_every", "needs `checkpoint.dir` DIR (where to save)"));
        }
        if self.keep == 0 {
            return Err(RuntimeError::invalid(
                "checkpoint.keep",
                "is 0; it must be ≥ 1 (the newest checkpoint is always kept)",
            ));
        }
        Ok(())
    }

    /// Whether the step `step` (0-based) of a run of `steps` ends with a save.
    pub fn saves_after(&self, step: usize, steps: usize) -> bool {
        self.dir.is_some() && ((self.save_every > 0 && (step + 1).is_multiple_of(self.save_every)) || step + 1 == steps)
    }
}

/// A checkpoint to resume from: its folder and its checked manifest.
#[derive(Clone, Debug)]
pub struct Resume {
    pub folder: PathBuf,
    pub manifest: Manifest,
}

/// Opens what `--resume PATH` means (a checkpoint folder, or the latest under a checkpoint dir); the
/// error names the file and never falls back to another checkpoint silently.
pub fn open_resume(path: &Path) -> Result<Resume> {
    let (folder, manifest) = load_resume(path).map_err(|e| RuntimeError::from(e).under("resume"))?;
    Ok(Resume { folder, manifest })
}

/// Where this rank's part of the model sits.
pub struct Share {
    pub spec: ModelSpec,
    pub stage: usize,
    pub is_last: bool,
    pub first_layer: usize,
    /// Index (among the model's MoE layers) of the stage's first MoE layer.
    pub first_moe: usize,
    pub ep_rank: usize,
    pub dp_rank: usize,
    pub data_rank: usize,
}

impl Share {
    /// The state dict of this rank's part of `model` under `placements` (one per MoE layer of the model).
    fn entries<M: StageModel>(&self, model: &M, placements: &[ExpertPlacement]) -> Vec<Entry> {
        let experts_of = |k: usize| placements[self.first_moe + k].experts_of(self.ep_rank);
        model.state_entries(&self.spec, self.first_layer, &experts_of)
    }
}
