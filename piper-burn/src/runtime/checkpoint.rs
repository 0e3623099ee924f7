//! Checkpoints of a running job — saving each rank's share, resuming bit-exact, resharding to any
//! layout — in the format of [`piper_planner::checkpoint`] (manifest + one safetensors shard per rank).
//!
//! Save: each rank writes what it owns — its stage's layers (non-expert tensors by the stage's first
//! replica, expert tensors by every expert-group rank of the first data-parallel replica, each expert
//! under its global id), the embedding (first stage), final norm and head (last stage) — weights and
//! AdamW moments, into the save's scratch folder; rank 0 gathers the shard entries, writes the manifest
//! and commits the folder. Resume: each rank lists the tensors its part of the model needs under the
//! *current* layout and placement, finds them through the manifest and reads only those, so any layout
//! (PP, EP, DP, split) resumes any checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::ParamId;
use piper_comm::Communicator;
use piper_comm::collectives::all_gather_bytes;
use piper_planner::checkpoint::shard::{Source, read_tensors, write_shard};
use piper_planner::checkpoint::{
    EXP_AVG, EXP_AVG_SQ, FORMAT, FORMAT_VERSION, Manifest, MigrationWindow, OptimizerState, SavedPlacement, ShardFile,
    commit, load_resume, prune, scratch_folder,
};
use piper_planner::hf_files::read_hf_tensors;
use piper_planner::model::ModelSpec;
use piper_planner::run_plan::RunPlan;

use super::optim::AdamW;
use crate::dispatcher::ExpertPlacement;
use crate::lm::CausalLm;
use crate::state_dict::{self, Entry, Target};

/// `--checkpoint-dir DIR --save-every N --keep K` and `--resume PATH`.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointSettings {
    pub dir: Option<PathBuf>,
    /// Save every N steps (and after the last one); 0: only after the last step.
    pub save_every: usize,
    /// Complete checkpoints to keep under `dir` (the newest).
    pub keep: usize,
    pub resume: Option<PathBuf>,
}

impl Default for CheckpointSettings {
    /// No checkpoints (keep 2 when there are).
    fn default() -> Self {
        CheckpointSettings { dir: None, save_every: 0, keep: 2, resume: None }
    }
}

impl CheckpointSettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.dir.is_none() && self.save_every > 0 {
            return Err("--save-every needs --checkpoint-dir DIR (where to save)".into());
        }
        if self.keep == 0 {
            return Err("--keep is 0; it must be ≥ 1 (the newest checkpoint is always kept)".into());
        }
        Ok(())
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
pub fn open_resume(path: &Path) -> Result<Resume, String> {
    let (folder, manifest) = load_resume(path).map_err(|e| format!("--resume {e}"))?;
    Ok(Resume { folder, manifest })
}

/// Where this rank's part of the model sits.
pub(crate) struct Share<'a> {
    pub spec: &'a ModelSpec,
    pub stage: usize,
    pub is_last: bool,
    pub first_layer: usize,
    /// Index (among the model's MoE layers) of the stage's first MoE layer.
    pub first_moe: usize,
    pub ep_rank: usize,
    pub dp_rank: usize,
    pub data_rank: usize,
}

/// The state dict of this rank's part of `model` under `placements` (one per MoE layer of the model).
fn rank_entries(model: &CausalLm, share: &Share, placements: &[ExpertPlacement]) -> Vec<Entry> {
    let moe_index: Vec<Option<usize>> = model
        .layers
        .iter()
        .scan(share.first_moe, |next, l| {
            Some(l.moe.as_ref().map(|_| {
                *next += 1;
                *next - 1
            }))
        })
        .collect();
    let experts_of = |i: usize| moe_index[i].map_or_else(Vec::new, |k| placements[k].experts_of(share.ep_rank));
    state_dict::entries(model, share.spec, share.first_layer, &experts_of)
}

/// Whether this rank writes `entry` (each tensor exists once in a checkpoint).
fn owns(entry: &Entry, share: &Share) -> bool {
    match (entry.layer, entry.expert) {
        (_, Some(_)) => share.dp_rank == 0,
        (Some(_), None) => share.data_rank == 0,
        (None, None) if entry.name.starts_with("model.embed_tokens") => share.data_rank == 0 && share.stage == 0,
        (None, None) => share.data_rank == 0 && share.is_last,
    }
}

/// Host copies of what this rank writes: values by target, moments by parameter.
struct Owned {
    entries: Vec<Entry>,
    host: state_dict::HostValues,
    moments: HashMap<ParamId, (Vec<f32>, Vec<f32>)>,
}

impl Owned {
    fn new(model: &CausalLm, optim: &AdamW, share: &Share, placements: &[ExpertPlacement]) -> Self {
        let entries: Vec<Entry> =
            rank_entries(model, share, placements).into_iter().filter(|e| owns(e, share)).collect();
        let mut moments = HashMap::new();
        for e in &entries {
            if let Target::Param(id) = e.target
                && !moments.contains_key(&id)
                && let Some(mv) = optim.host(id)
            {
                moments.insert(id, mv);
            }
        }
        Owned { entries, host: state_dict::host_values(model), moments }
    }

    /// The tensors to write, as views of the host copies (weights, then both moments where they exist).
    fn sources(&self) -> Vec<Source<'_>> {
        let mut out = Vec::new();
        for e in &self.entries {
            let (dims, values) = &self.host[&e.target];
            let (shape, fill) = state_dict::hf_view(e, dims, values);
            out.push(Source { name: e.name.clone(), shape, fill });
            if let Target::Param(id) = e.target
                && let Some((m, v)) = self.moments.get(&id)
            {
                for (suffix, x) in [(EXP_AVG, m), (EXP_AVG_SQ, v)] {
                    let (shape, fill) = state_dict::hf_view(e, dims, x);
                    out.push(Source { name: format!("{}{suffix}", e.name), shape, fill });
                }
            }
        }
        out
    }
}

/// What a checkpoint records beyond the model and the optimizer.
pub(crate) struct RunState<'a> {
    pub step: u64,
    pub model_config: &'a str,
    pub seed: u64,
    pub plan: &'a RunPlan,
    pub data: serde_json::Value,
    pub placements: &'a [ExpertPlacement],
    pub window: Option<MigrationWindow>,
}

/// Saves a checkpoint of the job after `state.step` steps under `dir`, keeping the newest `keep`.
/// Collective over `world`: every rank writes its shard; rank 0 writes the manifest and commits. Every
/// rank learns whether it succeeded. Returns the checkpoint folder.
pub(crate) fn save(
    world: &dyn Communicator,
    model: &CausalLm,
    optim: &AdamW,
    share: &Share,
    state: &RunState,
    dir: &Path,
    keep: usize,
) -> Result<PathBuf, String> {
    let fail = |e: String| format!("checkpoint at step {}: {e}", state.step);
    // A scratch folder named by rank 0 (its pid): a crashed save's leftovers never collide with this one.
    let tag =
        all_gather_bytes(world, &std::process::id().to_le_bytes(), "checkpoint name").map_err(|e| e.to_string())?;
    let tag = u32::from_le_bytes(tag[0][..4].try_into().map_err(|_| "checkpoint name: short message")?);
    let scratch = scratch_folder(dir, state.step, &tag.to_string());
    let prepared = if world.rank() == 0 {
        std::fs::create_dir_all(dir)
            .and_then(|_| {
                let _ = std::fs::remove_dir_all(&scratch);
                std::fs::create_dir(&scratch)
            })
            .map_err(|e| format!("--checkpoint-dir {}: {e}", dir.display()))
    } else {
        Ok(())
    };
    agree(world, prepared.as_ref().err(), "checkpoint folder").map_err(fail)?;

    let owned = Owned::new(model, optim, share, state.placements);
    let mine: Result<Option<ShardFile>, String> = if owned.entries.is_empty() {
        Ok(None)
    } else {
        let name = format!("shard-{:05}.safetensors", world.rank());
        write_shard(&scratch, &name, world.rank() as u64, &owned.sources()).map(Some).map_err(|e| e.to_string())
    };
    drop(owned);
    super::report::fault_in_save(world.rank(), state.step);
    let encoded = serde_json::to_vec(&mine).map_err(|e| e.to_string())?;
    let gathered = all_gather_bytes(world, &encoded, "checkpoint shard list").map_err(|e| fail(e.to_string()))?;
    let mut files = Vec::new();
    for (rank, bytes) in gathered.iter().enumerate() {
        match serde_json::from_slice::<Result<Option<ShardFile>, String>>(bytes) {
            Ok(Ok(Some(f))) => files.push(f),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => return Err(fail(format!("rank {rank} could not write its shard: {e}"))),
            Err(e) => return Err(fail(format!("rank {rank}'s shard entry is garbled: {e}"))),
        }
    }
    let committed = if world.rank() == 0 {
        let manifest = manifest(optim, share.spec, state, files);
        serde_json::to_vec_pretty(&manifest)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                piper_planner::atomic::write_atomic(&scratch.join("manifest.json"), &text).map_err(|e| e.to_string())
            })
            .and_then(|_| commit(dir, &scratch, state.step).map_err(|e| e.to_string()))
            .and_then(|folder| prune(dir, keep).map(|_| folder).map_err(|e| e.to_string()))
    } else {
        Ok(dir.join(piper_planner::checkpoint::folder_name(state.step)))
    };
    agree(world, committed.as_ref().err(), "checkpoint commit").map_err(fail)?;
    committed.map_err(fail)
}

fn manifest(optim: &AdamW, spec: &ModelSpec, state: &RunState, files: Vec<ShardFile>) -> Manifest {
    let s = optim.settings;
    Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        step: state.step,
        model: spec.clone(),
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
    }
}

/// Every rank learns whether any rank failed (an all-reduce of failure flags); the error of this rank,
/// or a note that another one failed.
fn agree(world: &dyn Communicator, mine: Option<&String>, what: &str) -> Result<(), String> {
    let mut flag = [if mine.is_some() { 1.0f32 } else { 0.0 }];
    world.all_reduce_sum_f32(&mut flag, what).map_err(|e| e.to_string())?;
    match (mine, flag[0] > 0.0) {
        (Some(e), _) => Err(e.clone()),
        (None, true) => Err(format!("{what} failed on another rank (its error names the cause)")),
        (None, false) => Ok(()),
    }
}

/// The placements a resumed run uses: the checkpoint's (after its migrations) when it was saved with the
/// same expert-parallel degree, else the plan's (`fresh`).
pub(crate) fn resumed_placements(
    resume: &Resume,
    fresh: &[ExpertPlacement],
    ep: usize,
) -> Result<Vec<ExpertPlacement>, String> {
    let m = &resume.manifest;
    if m.layout.ep as usize != ep || m.placements.len() != fresh.len() {
        return Ok(fresh.to_vec());
    }
    m.placements
        .iter()
        .map(|p| {
            let v = |x: &Vec<u64>| x.iter().map(|r| *r as usize).collect::<Vec<_>>();
            ExpertPlacement::from_parts(v(&p.rank_of), v(&p.slot_of), ep)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--resume {}: {e}", resume.folder.display()))
}

/// The entries this rank's part of the model uses: its stage's layers with its experts, the embedding on
/// the first stage, the final norm and head on the last.
fn used_entries(model: &CausalLm, share: &Share, placements: &[ExpertPlacement]) -> Vec<Entry> {
    rank_entries(model, share, placements)
        .into_iter()
        .filter(|e| match (e.layer, e.name.starts_with("model.embed_tokens")) {
            (None, true) => share.stage == 0,
            (None, false) => share.is_last,
            _ => true,
        })
        .collect()
}

/// `--init-hf DIR`: replaces this rank's weights by those of the Hugging Face model folder `dir`
/// (`model.safetensors` or a sharded index; F32, BF16 or F16), reading only the tensors its part of the
/// model needs. The optimizer starts fresh.
pub(crate) fn init_from_hf(
    model: CausalLm,
    share: &Share,
    placements: &[ExpertPlacement],
    dir: &Path,
) -> Result<CausalLm, String> {
    let show = dir.display().to_string();
    let entries = used_entries(&model, share, placements);
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let (tensors, missing) = read_hf_tensors(dir, &names).map_err(|e| format!("--init-hf {e}"))?;
    if let Some(name) = missing.first() {
        return Err(format!("--init-hf {show}: the checkpoint has no tensor `{name}` ({} missing)", missing.len()));
    }
    let dims: HashMap<Target, Vec<usize>> =
        state_dict::host_values(&model).into_iter().map(|(t, (d, _))| (t, d)).collect();
    let values = state_dict::assemble(&entries, &dims, &tensors, &|e| e.name.clone())
        .map_err(|e| format!("--init-hf {show}: {e}"))?;
    Ok(state_dict::replace(model, &values))
}

/// Loads this rank's part of the model and its optimizer state from `resume` (the model's layers laid
/// out as `placements` say). Reads only the tensors it needs; each is checked against the manifest.
pub(crate) fn restore(
    model: CausalLm,
    optim: &mut AdamW,
    share: &Share,
    placements: &[ExpertPlacement],
    resume: &Resume,
) -> Result<CausalLm, String> {
    let show = resume.folder.display().to_string();
    let entries = used_entries(&model, share, placements);
    let mut names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    names.extend(entries.iter().flat_map(|e| [format!("{}{EXP_AVG}", e.name), format!("{}{EXP_AVG_SQ}", e.name)]));
    let (tensors, missing) = read_tensors(&resume.folder, &resume.manifest, &names).map_err(|e| e.to_string())?;
    if let Some(name) = missing.iter().find(|n| !n.ends_with(EXP_AVG) && !n.ends_with(EXP_AVG_SQ)) {
        return Err(format!(
            "--resume {show}: the checkpoint has no tensor `{name}` (is a shard missing from its manifest?)"
        ));
    }
    let host = state_dict::host_values(&model);
    let dims: HashMap<Target, Vec<usize>> = host.into_iter().map(|(t, (d, _))| (t, d)).collect();
    let values = state_dict::assemble(&entries, &dims, &tensors, &|e| e.name.clone())
        .map_err(|e| format!("--resume {show}: {e}"))?;
    // Moments: a parameter has them when every tensor it is made of has them.
    let params: Vec<Entry> = entries.iter().filter(|e| matches!(e.target, Target::Param(_))).cloned().collect();
    let with_moments: Vec<Entry> = params
        .iter()
        .filter(|e| {
            params
                .iter()
                .filter(|o| o.target == e.target)
                .all(|o| tensors.contains_key(&format!("{}{EXP_AVG}", o.name)))
        })
        .cloned()
        .collect();
    let m = state_dict::assemble(&with_moments, &dims, &tensors, &|e| format!("{}{EXP_AVG}", e.name))
        .map_err(|e| format!("--resume {show}: {e}"))?;
    let mut v = state_dict::assemble(&with_moments, &dims, &tensors, &|e| format!("{}{EXP_AVG_SQ}", e.name))
        .map_err(|e| format!("--resume {show}: {e}"))?;
    let device = model.norm.gamma.val().device();
    optim.moments.clear();
    for (target, m) in m {
        if let (Target::Param(id), Some(v)) = (target, v.remove(&target)) {
            optim.set(id, m, v, &device);
        }
    }
    let o = &resume.manifest.optimizer;
    optim.steps = o.steps;
    let s = optim.settings;
    if (s.beta_1, s.beta_2, s.epsilon, s.weight_decay) != (o.beta_1, o.beta_2, o.epsilon, o.weight_decay) {
        return Err(format!(
            "--resume {show}: the checkpoint's AdamW (β {}, {}, ε {}, weight decay {}) differs from this run's",
            o.beta_1, o.beta_2, o.epsilon, o.weight_decay
        ));
    }
    Ok(state_dict::replace(model, &values))
}
