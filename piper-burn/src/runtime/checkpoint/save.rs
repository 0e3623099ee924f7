//! Saving a checkpoint: every rank writes the tensors it owns into the save's scratch folder, rank 0
//! writes the manifest and commits the folder, and every rank learns whether all of that succeeded.
//! A save killed between the shards and the commit leaves the previous checkpoint as `latest`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::ParamId;
use piper_comm::Communicator;
use piper_comm::collectives::all_gather_bytes;
use piper_planner::checkpoint::companions::{Companions, TokenizerSources, keep_tokenizer_files};
use piper_planner::checkpoint::shard::{Source, write_shard};
use piper_planner::checkpoint::{
    EXP_AVG, EXP_AVG_SQ, FORMAT, FORMAT_VERSION, Manifest, MigrationWindow, OptimizerState, SavedPlacement, ShardFile,
    commit, folder_name, prune, scratch_folder,
};
use piper_planner::run_plan::RunPlan;

use super::Share;
use crate::hf::state_dict::{Entry, HostValues, Part, Target, host_values};
use crate::model::StageModel;
use crate::moe::dispatcher::ExpertPlacement;
use crate::runtime::error::{Result, RuntimeError};
use crate::runtime::fault;
use crate::runtime::optim::AdamW;

/// What a checkpoint records beyond the model and the optimizer.
pub struct RunState<'a> {
    pub step: u64,
    pub model_config: &'a str,
    pub seed: u64,
    pub plan: &'a RunPlan,
    pub data: serde_json::Value,
    pub placements: &'a [ExpertPlacement],
    pub window: Option<MigrationWindow>,
    /// The model's own config.json and the tokenizer files, kept for the export.
    pub hf_config: Option<&'a serde_json::Value>,
    pub tokenizer_files: &'a TokenizerSources,
}

/// Saves a checkpoint of the job after `state.step` steps under `dir`, keeping the newest `keep`.
/// Collective over `world`: every rank writes its shard; rank 0 writes the manifest and commits. Every
/// rank learns whether it succeeded. Returns the checkpoint folder.
pub fn save<M: StageModel>(
    world: &dyn Communicator,
    model: &M,
    optim: &AdamW,
    share: &Share,
    state: &RunState,
    dir: &Path,
    keep: usize,
) -> Result<PathBuf> {
    let fail = |e: RuntimeError| RuntimeError::Checkpoint { step: state.step, source: Box::new(e) };
    // A scratch folder named by rank 0 (its pid): a crashed save's leftovers never collide with this one.
    let tag = all_gather_bytes(world, &std::process::id().to_le_bytes(), "checkpoint name")?;
    let tag = u32::from_le_bytes(
        tag[0][..4].try_into().map_err(|_| RuntimeError::Internal("checkpoint name: short message"))?,
    );
    let scratch = scratch_folder(dir, state.step, &tag.to_string());
    let prepared = if world.rank() == 0 { prepare(dir, &scratch) } else { Ok(()) };
    agree(world, prepared, "checkpoint folder").map_err(fail)?;

    let owned = Owned::new(model, optim, share, state.placements);
    let mine: std::result::Result<Option<ShardFile>, String> = if owned.entries.is_empty() {
        Ok(None)
    } else {
        let name = format!("shard-{:05}.safetensors", world.rank());
        write_shard(&scratch, &name, world.rank() as u64, &owned.sources()).map(Some).map_err(|e| e.to_string())
    };
    drop(owned);
    fault::in_save(world.rank(), state.step);
    let files = gather_shard_files(world, &mine).map_err(fail)?;
    let committed = if world.rank() == 0 {
        write_manifest(&scratch, optim, share, state, files).and_then(|_| {
            let folder = commit(dir, &scratch, state.step)?;
            prune(dir, keep)?;
            Ok(folder)
        })
    } else {
        Ok(dir.join(folder_name(state.step)))
    };
    agree(world, committed, "checkpoint commit").map_err(fail)
}

/// Rank 0: `dir` exists and the scratch folder is fresh.
fn prepare(dir: &Path, scratch: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .and_then(|_| {
            let _ = std::fs::remove_dir_all(scratch);
            std::fs::create_dir(scratch)
        })
        .map_err(|e| RuntimeError::file("checkpoint.dir", dir, e))
}

/// Every rank's shard entry (or its error), on every rank.
fn gather_shard_files(
    world: &dyn Communicator,
    mine: &std::result::Result<Option<ShardFile>, String>,
) -> Result<Vec<ShardFile>> {
    let encoded = serde_json::to_vec(mine).map_err(RuntimeError::json("checkpoint shard entry"))?;
    let gathered = all_gather_bytes(world, &encoded, "checkpoint shard list")?;
    let mut files = Vec::new();
    for (rank, bytes) in gathered.iter().enumerate() {
        match serde_json::from_slice::<std::result::Result<Option<ShardFile>, String>>(bytes) {
            Ok(Ok(Some(f))) => files.push(f),
            Ok(Ok(None)) => {}
            Ok(Err(why)) => return Err(RuntimeError::PeerShard { rank, why }),
            Err(e) => {
                return Err(RuntimeError::invalid(format!("rank {rank}'s shard entry"), format!("is garbled: {e}")));
            }
        }
    }
    Ok(files)
}

/// Rank 0: the manifest of the save, written atomically into the scratch folder.
fn write_manifest(scratch: &Path, optim: &AdamW, share: &Share, state: &RunState, files: Vec<ShardFile>) -> Result<()> {
    let mut manifest = manifest(optim, share, state, files);
    manifest.companions = Companions {
        hf_config: state.hf_config.cloned(),
        tokenizer_files: keep_tokenizer_files(scratch, state.tokenizer_files).map_err(RuntimeError::from)?,
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(RuntimeError::json("checkpoint manifest"))?;
    let path = scratch.join("manifest.json");
    piper_planner::atomic::write_atomic(&path, &text).map_err(|e| RuntimeError::file("checkpoint.dir", &path, e))
}

fn manifest(optim: &AdamW, share: &Share, state: &RunState, files: Vec<ShardFile>) -> Manifest {
    let s = optim.settings;
    Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        step: state.step,
        model: share.spec.clone(),
        model_config: state.model_config.into(),
        seed: state.seed,
        layout: state.plan.layout(),
        split: state.plan.split().0,
        plan: state.plan.clone(),
        optimizer: OptimizerState {
            steps: optim.steps,
            beta_1: s.beta_1,
            beta_2: s.beta_2,
            epsilon: s.epsilon,
            weight_decay: s.weight_decay,
        },
        data: state.data.clone(),
        placements: state
            .placements
            .iter()
            .map(|p| SavedPlacement { rank_of: p.ranks_of(), slot_of: p.slots().iter().map(|s| *s as u64).collect() })
            .collect(),
        migration_window: state.window.clone(),
        files,
        companions: Default::default(),
    }
}

/// Every rank learns whether any rank failed (an all-reduce of failure flags): this rank's own error,
/// or a note that another one failed.
fn agree<T>(world: &dyn Communicator, mine: Result<T>, what: &str) -> Result<T> {
    let mut flag = [if mine.is_err() { 1.0f32 } else { 0.0 }];
    world.all_reduce_sum_f32(&mut flag, what)?;
    match mine {
        Ok(_) if flag[0] > 0.0 => Err(RuntimeError::PeerFailed { what: what.into() }),
        other => other,
    }
}

/// Whether this rank writes `entry` (each tensor exists once in a checkpoint).
fn owns(entry: &Entry, share: &Share) -> bool {
    match (entry.part, entry.expert) {
        (_, Some(_)) => share.dp_rank == 0,
        (Part::Layer(_), None) => share.data_rank == 0,
        (Part::Embedding, None) => share.data_rank == 0 && share.stage == 0,
        (Part::Head, None) => share.data_rank == 0 && share.is_last,
    }
}

/// Host copies of what this rank writes: values by target, moments by parameter.
struct Owned {
    entries: Vec<Entry>,
    host: HostValues,
    moments: HashMap<ParamId, (Vec<f32>, Vec<f32>)>,
}

impl Owned {
    fn new<M: StageModel>(model: &M, optim: &AdamW, share: &Share, placements: &[ExpertPlacement]) -> Self {
        let entries: Vec<Entry> = share.entries(model, placements).into_iter().filter(|e| owns(e, share)).collect();
        let mut moments = HashMap::new();
        for e in &entries {
            if let Target::Param(id) = e.target
                && !moments.contains_key(&id)
                && let Some(mv) = optim.host(id)
            {
                moments.insert(id, mv);
            }
        }
        Owned { entries, host: host_values(model, &model.moe_blocks()), moments }
    }

    /// The tensors to write, as views of the host copies (weights, then both moments where they exist).
    fn sources(&self) -> Vec<Source<'_>> {
        let mut out = Vec::new();
        for e in &self.entries {
            let (dims, values) = &self.host[&e.target];
            let (shape, fill) = e.hf_view(dims, values);
            out.push(Source { name: e.name.clone(), shape, fill });
            if let Target::Param(id) = e.target
                && let Some((m, v)) = self.moments.get(&id)
            {
                for (suffix, x) in [(EXP_AVG, m), (EXP_AVG_SQ, v)] {
                    let (shape, fill) = e.hf_view(dims, x);
                    out.push(Source { name: format!("{}{suffix}", e.name), shape, fill });
                }
            }
        }
        out
    }
}
