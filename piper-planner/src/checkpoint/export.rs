//! `piper checkpoint export DIR --hf OUT`: one Hugging Face-style folder from a checkpoint of any
//! layout — `model.safetensors` with every weight (no optimizer state) and a `config.json`. Every shard is
//! checked whole (size and SHA-256) first, and the model must be complete: every layer, every expert.
//!
//! `config.json` is a transformers Mixtral config when the model is Mixtral-shaped (GQA without biases
//! or q/k norms, every layer MoE with softmax top-k routing, no shared experts, RMSNorm); any other
//! model gets its native spec (`"model_type": "piper"`), which `piper` and Piper's loader read.

use std::collections::BTreeSet;
use std::path::Path;

use super::shard::{Source, read_tensors, verify_file, write_shard};
use super::{EXP_AVG, EXP_AVG_SQ, Manifest, resolve};
use crate::error::{Error, Result};
use crate::hf::mixtral_config;
use crate::model::{LayerKind, ModelSpec};

/// What an export wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Exported {
    pub step: u64,
    pub tensors: usize,
    pub bytes: u64,
    /// `true`: `config.json` is a transformers Mixtral config; `false`: Piper's native spec.
    pub transformers_config: bool,
}

/// Checks that `names` hold the whole model: embedding, final norm, every layer's norms, every expert
/// of every MoE layer (three matrices each). The error names the first gap.
fn check_complete(spec: &ModelSpec, names: &BTreeSet<String>, show: &str) -> Result<()> {
    let gap = |what: String| Error::file(show, format!("the checkpoint lacks {what}: a shard is missing"));
    for name in ["model.embed_tokens.weight", "model.norm.weight"] {
        if !names.contains(name) {
            return Err(gap(format!("`{name}`")));
        }
    }
    for (i, kind) in spec.layers.iter().enumerate() {
        let norm = format!("model.layers.{i}.input_layernorm.weight");
        if !names.contains(&norm) {
            return Err(gap(format!("`{norm}`")));
        }
        if *kind == LayerKind::Moe {
            let e = spec.num_experts();
            for x in 0..e {
                let infix = format!("model.layers.{i}.");
                let expert = format!(".experts.{x}.");
                let n = names.iter().filter(|n| n.starts_with(&infix) && n.contains(&expert)).count();
                if n != 3 {
                    return Err(gap(format!("expert {x} of layer {i} ({n} of its 3 matrices)")));
                }
            }
        }
    }
    Ok(())
}

/// Exports the checkpoint `--resume`-style `path` means (a checkpoint folder, or the latest under a
/// checkpoint dir) into the folder `out` (created; existing files of the same names are replaced
/// atomically, nothing else is touched).
pub fn export_hf(path: &Path, out: &Path) -> Result<Exported> {
    let folder = resolve(path)?;
    let manifest = Manifest::load(&folder)?;
    for f in &manifest.files {
        verify_file(&folder, f)?;
    }
    let names: BTreeSet<String> = manifest
        .files
        .iter()
        .flat_map(|f| f.tensors.iter().map(|t| t.name.clone()))
        .filter(|n| !n.ends_with(EXP_AVG) && !n.ends_with(EXP_AVG_SQ))
        .collect();
    check_complete(&manifest.model, &names, &folder.join("manifest.json").display().to_string())?;
    let list: Vec<String> = names.into_iter().collect();
    let (tensors, missing) = read_tensors(&folder, &manifest, &list)?;
    if let Some(m) = missing.first() {
        return Err(Error::file(folder.display().to_string(), format!("no shard holds `{m}`")));
    }
    let named: Vec<Source> =
        list.iter().map(|n| Source::values(n.clone(), tensors[n].0.clone(), &tensors[n].1)).collect();
    let show = out.display().to_string();
    std::fs::create_dir_all(out).map_err(|e| Error::file(&show, format!("cannot create: {e}")))?;
    // The weights go to a temporary name first, then replace model.safetensors in one rename.
    let tmp_name = format!(".model.safetensors.tmp-{}", std::process::id());
    let written = write_shard(out, &tmp_name, 0, &named)?;
    std::fs::rename(out.join(&tmp_name), out.join("model.safetensors"))
        .map_err(|e| Error::file(&show, format!("cannot rename model.safetensors into place: {e}")))?;
    let (config, transformers_config) = match mixtral_config(&manifest.model) {
        Some(c) => (c, true),
        None => {
            let mut v = serde_json::to_value(&manifest.model).expect("specs serialise");
            v["model_type"] = "piper".into();
            (v, false)
        }
    };
    let text = serde_json::to_string_pretty(&config).expect("json");
    crate::atomic::write_atomic(&out.join("config.json"), text.as_bytes())
        .map_err(|e| Error::file(&show, format!("cannot write config.json: {e}")))?;
    Ok(Exported { step: manifest.step, tensors: named.len(), bytes: written.bytes, transformers_config })
}
