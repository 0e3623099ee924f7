//! The checkpoint format, with no Burn in it (the runtime fills it, `piper checkpoint` reads it).
//!
//! A checkpoint is a folder `DIR/step-NNNNNNNN/` holding one safetensors shard per rank that owned
//! something (`shard-RRRRR.safetensors`: weights under their Hugging Face names, AdamW moments as
//! `NAME.exp_avg` / `NAME.exp_avg_sq`, DeepSeek router biases) and `manifest.json`: format version,
//! model spec and Burn config, layout and plan it was saved from, step, optimizer settings and step count,
//! data position, expert placement per MoE layer, migration window, and every file with its size,
//! SHA-256 and tensors (each with its own SHA-256, so a rank that reads only what it needs still checks
//! it). Non-expert tensors are written once per stage, experts once per expert-group rank: no rank gathers
//! the model, and every tensor exists exactly once.
//!
//! Atomicity: shards and manifest go to `DIR/.step-NNNNNNNN.tmp-PID/`, are fsynced, and the folder is
//! renamed to its final name only when complete; then `DIR/latest` (one line, the folder name) is
//! replaced atomically. A crash at any point leaves the previous checkpoint and `latest` intact.

pub mod companions;
pub mod export;
mod files;
pub mod shard;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use files::{commit, folder_name, load_resume, prune, resolve, scratch_folder};

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::model::ModelSpec;
use crate::run_plan::RunPlan;

/// What [`Manifest::format`] must say.
pub const FORMAT: &str = "piper-checkpoint";
/// The format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Suffixes of the AdamW moments' tensor names (PyTorch's state names).
pub const EXP_AVG: &str = ".exp_avg";
pub const EXP_AVG_SQ: &str = ".exp_avg_sq";

/// AdamW's settings and step count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerState {
    /// Optimizer steps taken (the bias correction's `t`).
    pub steps: u64,
    pub beta_1: f64,
    pub beta_2: f64,
    pub epsilon: f64,
    pub weight_decay: f64,
}

/// One MoE layer's placement: expert id → rank of the expert group, and → local slot on that rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedPlacement {
    pub rank_of: Vec<u64>,
    pub slot_of: Vec<u64>,
}

/// Tokens per expert summed since the last migration check, the steps they cover, and the migration
/// policy's evidence per MoE layer (empty in checkpoints written before the policy kept any).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationWindow {
    pub steps: u64,
    pub counts: Vec<Vec<f64>>,
    #[serde(default)]
    pub evidence: Vec<crate::migration_payoff::LayerEvidence>,
}

/// One tensor of a shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<u64>,
    pub sha256: String,
}

/// One shard file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardFile {
    pub name: String,
    /// World rank that wrote it.
    pub rank: u64,
    pub bytes: u64,
    pub sha256: String,
    pub tensors: Vec<TensorEntry>,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Optimizer steps completed; a resumed run trains steps `step..`.
    pub step: u64,
    pub model: ModelSpec,
    /// The Burn model configuration, as JSON (compared on resume).
    pub model_config: String,
    pub seed: u64,
    pub layout: Layout,
    /// Layers per stage of the layout it was saved from.
    pub split: Vec<u64>,
    pub plan: RunPlan,
    pub optimizer: OptimizerState,
    /// Where the data stream stands (the corpus's own description of its position).
    pub data: serde_json::Value,
    pub placements: Vec<SavedPlacement>,
    #[serde(default)]
    pub migration_window: Option<MigrationWindow>,
    pub files: Vec<ShardFile>,
    /// The model's own config.json and tokenizer files, for its export.
    #[serde(default)]
    pub companions: companions::Companions,
}

impl Manifest {
    /// Reads `FOLDER/manifest.json` and checks the format, the version and every file's presence and
    /// size (contents are checked as they are read). Errors name the file.
    pub fn load(folder: &Path) -> Result<Manifest> {
        let path = folder.join("manifest.json");
        let show = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::file(&show, format!("cannot read ({e}); is {} a complete checkpoint?", folder.display()))
        })?;
        let head: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::file(&show, format!("not valid JSON ({e})")))?;
        if head.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(Error::file(&show, format!("not a Piper checkpoint manifest (`format` is not `{FORMAT}`)")));
        }
        match head.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == FORMAT_VERSION as u64 => {}
            Some(v) if v > FORMAT_VERSION as u64 => {
                return Err(Error::file(
                    &show,
                    format!("format version {v} was written by a newer piper; this one reads version {FORMAT_VERSION}"),
                ));
            }
            other => {
                return Err(Error::file(&show, format!("format version {other:?}; this piper reads {FORMAT_VERSION}")));
            }
        }
        let manifest: Manifest =
            serde_json::from_value(head).map_err(|e| Error::file(&show, format!("malformed manifest ({e})")))?;
        // The model and the plan it records are checked as if read from their own files.
        manifest.model.validate().map_err(|e| Error::file(&show, format!("its `model`: {e}")))?;
        manifest.plan.validate(&format!("{show}: its `plan`"))?;
        manifest.check_files(folder)?;
        Ok(manifest)
    }

    fn check_files(&self, folder: &Path) -> Result<()> {
        self.check_each_once(folder)?;
        for f in &self.files {
            if f.name.contains('/') || f.name.contains("..") || f.name.chars().any(crate::limits::hides_text) {
                return Err(Error::file(
                    folder.join("manifest.json").display().to_string(),
                    format!("shard file name `{}` is not a plain file name in the folder", f.name.escape_debug()),
                ));
            }
            let path = folder.join(&f.name);
            let meta = std::fs::metadata(&path)
                .map_err(|e| Error::file(path.display().to_string(), format!("missing shard ({e})")))?;
            if meta.len() != f.bytes {
                return Err(Error::file(
                    path.display().to_string(),
                    format!("has {} bytes, the manifest says {}: truncated or replaced", meta.len(), f.bytes),
                ));
            }
        }
        Ok(())
    }

    /// Each shard file is listed once and each tensor is in one shard once (the runtime writes every
    /// tensor from the one rank that owns it): a second entry would make which copy is read an accident.
    fn check_each_once(&self, folder: &Path) -> Result<()> {
        let show = || folder.join("manifest.json").display().to_string();
        let mut files = std::collections::BTreeSet::new();
        let mut tensors = std::collections::BTreeMap::new();
        for f in &self.files {
            if !files.insert(f.name.as_str()) {
                return Err(Error::file(show(), format!("lists shard file `{}` twice", f.name.escape_debug())));
            }
            for t in &f.tensors {
                if let Some(first) = tensors.insert(t.name.as_str(), f.name.as_str()) {
                    return Err(Error::file(
                        show(),
                        format!(
                            "lists tensor `{}` twice (in `{}` and `{}`); a checkpoint holds each tensor once",
                            t.name.escape_debug(),
                            first.escape_debug(),
                            f.name.escape_debug()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The shard holding tensor `name`, if any.
    pub fn shard_of(&self, name: &str) -> Option<&ShardFile> {
        self.files.iter().find(|f| f.tensors.iter().any(|t| t.name == name))
    }

    /// Checks that the checkpoint is of `spec` with Burn config `model_config`; the error says which
    /// model it holds.
    pub fn check_model(&self, folder: &Path, spec: &ModelSpec, model_config: &str) -> Result<()> {
        let show = folder.join("manifest.json").display().to_string();
        if !same_model(&self.model, spec) {
            return Err(Error::file(
                show,
                format!(
                    "is a checkpoint of model `{}` ({} layers, d = {}), but this job trains `{}` ({} layers, d = {}); pass the same --model",
                    self.model.name,
                    self.model.num_layers,
                    self.model.hidden_size,
                    spec.name,
                    spec.num_layers,
                    spec.hidden_size
                ),
            ));
        }
        if self.model_config != model_config {
            return Err(Error::file(
                show,
                "was saved with a different Burn model configuration (same spec, other options); pass the same model flags",
            ));
        }
        Ok(())
    }
}

/// Whether a checkpoint's model is `spec`. A manifest written before specs carried the load-balancing
/// weight has none; it is the same model whatever weight the spec now reads from its config.
fn same_model(saved: &ModelSpec, spec: &ModelSpec) -> bool {
    let mut saved = saved.clone();
    if let (Some(s), Some(m)) = (saved.moe.as_mut(), spec.moe.as_ref())
        && s.router_aux_loss_coef.is_none()
    {
        s.router_aux_loss_coef = m.router_aux_loss_coef;
    }
    saved == *spec
}

/// Checkpoint folders `step-*` under `dir` that hold a manifest, by step, oldest first.
pub fn complete_folders(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse::<u64>().ok()?;
            e.path().join("manifest.json").is_file().then(|| (step, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// A manifest of `model` (trained one step on one rank) listing `files`, for tests.
#[cfg(test)]
pub(crate) fn test_manifest(model: ModelSpec, files: Vec<ShardFile>) -> Manifest {
    let platform = crate::platform::preset("local").unwrap();
    let mut req = crate::planner::PlanRequest::new(1, 8, 32);
    req.base.dtype = "fp32".into();
    let best = crate::planner::plan(&model, &platform, &req).unwrap().plans.remove(0);
    Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        step: 1,
        model_config: String::new(),
        seed: 0,
        layout: Layout { pp: 1, ep: 1, dp: 1 },
        split: vec![model.num_layers],
        plan: RunPlan::from_candidate(&model, "local", 32, "fp32", &best),
        optimizer: OptimizerState { steps: 1, beta_1: 0.9, beta_2: 0.95, epsilon: 1e-8, weight_decay: 0.1 },
        data: serde_json::Value::Null,
        placements: vec![],
        migration_window: None,
        files,
        model,
        companions: Default::default(),
    }
}
