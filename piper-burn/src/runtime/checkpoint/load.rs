//! Loading a rank's part of the model: from a checkpoint (weights, AdamW moments, the placements its
//! migrations left) under any layout, or from a Hugging Face model folder (`--init-hf`). Each rank reads
//! only the tensors its part needs.

use std::path::Path;

use piper_planner::checkpoint::shard::read_tensors;
use piper_planner::checkpoint::{EXP_AVG, EXP_AVG_SQ};
use piper_planner::hf::read_hf_tensors;

use super::{Resume, Share};
use crate::hf::state_dict::{Entry, Part, Target, assemble, host_dims, replace, replace_router_biases};
use crate::model::StageModel;
use crate::moe::dispatcher::ExpertPlacement;
use crate::runtime::error::{Result, RuntimeError};
use crate::runtime::optim::AdamW;

/// The placements a resumed run uses: the checkpoint's (after its migrations) when it was saved with the
/// same expert-parallel degree, else the plan's (`fresh`).
pub fn resumed_placements(resume: &Resume, fresh: &[ExpertPlacement], ep: usize) -> Result<Vec<ExpertPlacement>> {
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
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| RuntimeError::file("resume", &resume.folder, e))
}

/// The entries this rank's part of the model uses: its stage's layers with its experts, the embedding on
/// the first stage, the final norm and head on the last.
fn used_entries<M: StageModel>(model: &M, share: &Share, placements: &[ExpertPlacement]) -> Vec<Entry> {
    share
        .entries(model, placements)
        .into_iter()
        .filter(|e| match e.part {
            Part::Embedding => share.stage == 0,
            Part::Head => share.is_last,
            Part::Layer(_) => true,
        })
        .collect()
}

/// `--init-hf DIR`: replaces this rank's weights by those of the Hugging Face model folder `dir`
/// (`model.safetensors` or a sharded index; F32, BF16 or F16), reading only the tensors its part of the
/// model needs. The optimizer starts fresh.
pub fn init_from_hf<M: StageModel>(model: M, share: &Share, placements: &[ExpertPlacement], dir: &Path) -> Result<M> {
    let entries = used_entries(&model, share, placements);
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let (tensors, missing) = read_hf_tensors(dir, &names).map_err(|e| RuntimeError::from(e).under("init_hf"))?;
    if let Some(name) = missing.first() {
        let why = format!("the checkpoint has no tensor `{name}` ({} missing)", missing.len());
        return Err(RuntimeError::file("init_hf", dir, why));
    }
    let values = assemble(&entries, &host_dims(&model, &model.moe_blocks()), &tensors, &|e| e.name.clone())
        .map_err(|e| RuntimeError::file("init_hf", dir, e))?;
    Ok(replaced(model, &values))
}

/// `model` with its parameters and router biases replaced by `values`.
fn replaced<M: StageModel>(model: M, values: &std::collections::HashMap<Target, Vec<f32>>) -> M {
    let mut model = replace(model, values);
    replace_router_biases(model.moe_blocks_mut(), values);
    model
}

/// Loads this rank's part of the model and its optimizer state from `resume` (the model's layers laid
/// out as `placements` say). Reads only the tensors it needs; each is checked against the manifest.
pub fn restore<M: StageModel>(
    model: M,
    optim: &mut AdamW,
    share: &Share,
    placements: &[ExpertPlacement],
    resume: &Resume,
) -> Result<M> {
    let refuse = |why: &dyn std::fmt::Display| RuntimeError::file("resume", &resume.folder, why);
    check_optimizer(optim, resume)?;
    let entries = used_entries(&model, share, placements);
    let mut names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    names.extend(entries.iter().flat_map(|e| [format!("{}{EXP_AVG}", e.name), format!("{}{EXP_AVG_SQ}", e.name)]));
    let (tensors, missing) = read_tensors(&resume.folder, &resume.manifest, &names)?;
    if let Some(name) = missing.iter().find(|n| !n.ends_with(EXP_AVG) && !n.ends_with(EXP_AVG_SQ)) {
        return Err(refuse(&format!("the checkpoint has no tensor `{name}` (is a shard missing from its manifest?)")));
    }
    let dims = host_dims(&model, &model.moe_blocks());
    let values = assemble(&entries, &dims, &tensors, &|e| e.name.clone()).map_err(|e| refuse(&e))?;
    // Moments: a parameter has them when every tensor it is made of has them.
    let params: Vec<&Entry> = entries.iter().filter(|e| matches!(e.target, Target::Param(_))).collect();
    let has_moment = |e: &&Entry| tensors.contains_key(&format!("{}{EXP_AVG}", e.name));
    let with_moments: Vec<Entry> = params
        .iter()
        .filter(|e| params.iter().filter(|o| o.target == e.target).all(has_moment))
        .map(|e| (*e).clone())
        .collect();
    let m = assemble(&with_moments, &dims, &tensors, &|e| format!("{}{EXP_AVG}", e.name)).map_err(|e| refuse(&e))?;
    let mut v =
        assemble(&with_moments, &dims, &tensors, &|e| format!("{}{EXP_AVG_SQ}", e.name)).map_err(|e| refuse(&e))?;
    let device = model.devices().into_iter().next().ok_or(RuntimeError::Internal("a model without a device"))?;
    optim.moments.clear();
    for (target, m) in m {
        if let (Target::Param(id), Some(v)) = (target, v.remove(&target)) {
            optim.set(id, m, v, &device);
        }
    }
    optim.steps = resume.manifest.optimizer.steps;
    Ok(replaced(model, &values))
}

/// The checkpoint's AdamW settings must be this run's (a resume continues the same optimizer).
fn check_optimizer(optim: &AdamW, resume: &Resume) -> Result<()> {
    let (o, s) = (&resume.manifest.optimizer, optim.settings);
    if (s.beta_1, s.beta_2, s.epsilon, s.weight_decay) != (o.beta_1, o.beta_2, o.epsilon, o.weight_decay) {
        let why = format!(
            "the checkpoint's AdamW (β {}, {}, ε {}, weight decay {}) differs from this run's",
            o.beta_1, o.beta_2, o.epsilon, o.weight_decay
        );
        return Err(RuntimeError::file("resume", &resume.folder, why));
    }
    Ok(())
}
