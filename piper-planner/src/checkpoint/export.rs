//! `piper checkpoint export DIR --hf OUT`: one Hugging Face folder from a checkpoint of any layout — the
//! weights (no optimizer state; the checkpoint's fp32 masters, in f32 or rounded to bf16 on request) in
//! `model.safetensors`, or above `max_shard_bytes` in
//! `model-0000i-of-0000n.safetensors` shards with a `model.safetensors.index.json`, a `config.json`, and
//! the tokenizer files the checkpoint kept. Every shard is checked whole (size and SHA-256) first, and
//! the model must be complete: every layer, every expert.
//!
//! `config.json` is the model's own (its family's, kept in the manifest) when it came from a Hugging
//! Face config; else a transformers Mixtral config when the model is Mixtral-shaped (GQA without biases
//! or q/k norms, every layer MoE with softmax top-k routing, no shared experts, RMSNorm); else its native
//! spec (`"model_type": "piper"`), which `piper` and Piper's loader read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::companions::export_tokenizer_files;
use super::shard::{Source, StoredDtype, read_tensors, verify_file, write_shard_as};
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
    /// The type the weights were written in.
    pub dtype: StoredDtype,
    /// Weight files (1: `model.safetensors`; more: shards with `model.safetensors.index.json`).
    pub shards: usize,
    pub config: ExportedConfig,
    /// Tokenizer files copied.
    pub tokenizer_files: usize,
}

/// Which `config.json` an export wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportedConfig {
    /// The model's own, of this Hugging Face `model_type`.
    Original(String),
    /// A transformers Mixtral config built from the spec.
    Mixtral,
    /// Piper's native spec: not a transformers architecture.
    Native,
}

/// transformers' default largest shard (`max_shard_size="5GB"`).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// How to export.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportOptions {
    /// Write into a folder that holds files (see [`export_hf`]).
    pub overwrite: bool,
    /// Weights above this go into shards with an index.
    pub max_shard_bytes: u64,
    /// The type to write the weights in (`config.json`'s `torch_dtype` says it).
    pub dtype: StoredDtype,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions { overwrite: false, max_shard_bytes: DEFAULT_MAX_SHARD_BYTES, dtype: StoredDtype::F32 }
    }
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

/// Checks that the shards hold nothing the manifest's model lacks — no layer past its layers, no expert
/// past its routed experts — and that the embedding is `[vocab, d]` and every norm `[d]`: a manifest and
/// shards of different models would otherwise export one model's config with the other's weights.
fn check_shapes_match(spec: &ModelSpec, shapes: &BTreeMap<String, Vec<u64>>, show: &str) -> Result<()> {
    let disagree = |name: &str, why: String| {
        Error::file(
            show,
            format!(
                "the shards hold `{}` but {why}: the manifest and the shards are of different models",
                name.escape_debug()
            ),
        )
    };
    let index_after = |name: &str, key: &str| -> Option<u64> {
        let rest = &name[name.find(key)? + key.len()..];
        rest.split('.').next()?.parse().ok()
    };
    let d = spec.hidden_size;
    for (name, shape) in shapes {
        if name.starts_with("model.layers.")
            && let Some(i) = index_after(name, "model.layers.")
            && i >= spec.num_layers
        {
            return Err(disagree(name, format!("the model has {} layers", spec.num_layers)));
        }
        if let Some(x) = index_after(name, ".experts.")
            && x >= spec.num_experts()
        {
            return Err(disagree(name, format!("the model has {} routed experts", spec.num_experts())));
        }
        let want = if name == "model.embed_tokens.weight" {
            Some(vec![spec.vocab_size, d])
        } else if name == "model.norm.weight"
            || name.ends_with(".input_layernorm.weight")
            || name.ends_with(".post_attention_layernorm.weight")
        {
            Some(vec![d])
        } else {
            None
        };
        if let Some(want) = want.filter(|w| w != shape) {
            return Err(disagree(name, format!("of shape {shape:?}, and the model's is {want:?}")));
        }
    }
    Ok(())
}

/// Names in a model folder that Hugging Face loaders read as its weights (one file, shards, PyTorch
/// weights, their indexes): left beside an export that did not write them, another model's files
/// would be loaded instead.
fn shadows_export(name: &str) -> bool {
    matches!(
        name,
        "model.safetensors" | "model.safetensors.index.json" | "pytorch_model.bin" | "pytorch_model.bin.index.json"
    ) || (name.starts_with("model-") && name.ends_with(".safetensors"))
        || (name.starts_with("pytorch_model-") && name.ends_with(".bin"))
}

/// Refuses an output folder that holds anything unless `overwrite`; with it, the names that would
/// shadow the export (see [`shadows_export`]), to be removed once the export is written.
fn check_output(out: &Path, overwrite: bool) -> Result<Vec<std::path::PathBuf>> {
    let show = out.display().to_string();
    let entries: Vec<String> = match std::fs::read_dir(out) {
        Ok(dir) => dir.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::file(&show, format!("cannot read the output folder: {e}"))),
    };
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    if !overwrite {
        let mut shown: Vec<String> = entries.iter().take(3).map(|n| format!("`{}`", n.escape_debug())).collect();
        if entries.len() > 3 {
            shown.push("…".into());
        }
        return Err(Error::invalid(
            "piper checkpoint export",
            "--hf",
            format!(
                "{show} is not empty ({}); export into a new folder, or pass --overwrite to replace the model in it",
                shown.join(", ")
            ),
        ));
    }
    Ok(entries.iter().filter(|n| shadows_export(n)).map(|n| out.join(n)).collect())
}

/// Exports the checkpoint `--resume`-style `path` means (a checkpoint folder, or the latest under a
/// checkpoint dir) into the folder `out`: created, or empty, or with `overwrite` one whose weights,
/// `config.json` and tokenizer files are replaced atomically and whose other weight files (sharded or
/// PyTorch, which loaders would read instead) are removed once the export is written; nothing else in
/// it is touched. Shards at 5 GB.
pub fn export_hf(path: &Path, out: &Path, overwrite: bool) -> Result<Exported> {
    export_hf_with(path, out, &ExportOptions { overwrite, ..ExportOptions::default() })
}

/// [`export_hf`] with its options.
pub fn export_hf_with(path: &Path, out: &Path, options: &ExportOptions) -> Result<Exported> {
    if options.max_shard_bytes == 0 {
        return Err(Error::invalid("piper checkpoint export", "--max-shard-size", "is 0; give a size in bytes ≥ 1"));
    }
    let shadowing = check_output(out, options.overwrite)?;
    let folder = resolve(path)?;
    let manifest = Manifest::load(&folder)?;
    for f in &manifest.files {
        verify_file(&folder, f)?;
    }
    let shapes: BTreeMap<String, Vec<u64>> = manifest
        .files
        .iter()
        .flat_map(|f| f.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())))
        .filter(|(n, _)| !n.ends_with(EXP_AVG) && !n.ends_with(EXP_AVG_SQ))
        .collect();
    let names: BTreeSet<String> = shapes.keys().cloned().collect();
    let show_manifest = folder.join("manifest.json").display().to_string();
    check_shapes_match(&manifest.model, &shapes, &show_manifest)?;
    check_complete(&manifest.model, &names, &show_manifest)?;
    let list: Vec<String> = names.into_iter().collect();
    let (tensors, missing) = read_tensors(&folder, &manifest, &list)?;
    if let Some(m) = missing.first() {
        return Err(Error::file(folder.display().to_string(), format!("no shard holds `{m}`")));
    }
    let named: Vec<Source> =
        list.iter().map(|n| Source::values(n.clone(), tensors[n].0.clone(), &tensors[n].1)).collect();
    let show = out.display().to_string();
    std::fs::create_dir_all(out).map_err(|e| Error::file(&show, format!("cannot create: {e}")))?;
    let weights = write_weights(out, &named, options.max_shard_bytes, options.dtype)?;
    let (config, kind) = export_config(&manifest, options.dtype);
    let text = serde_json::to_string_pretty(&config).expect("json");
    crate::atomic::write_atomic(&out.join("config.json"), text.as_bytes())
        .map_err(|e| Error::file(&show, format!("cannot write config.json: {e}")))?;
    export_tokenizer_files(&folder, &manifest.companions.tokenizer_files, out)?;
    for stale in shadowing.iter().filter(|p| !weights.files.iter().any(|w| p.ends_with(w))) {
        std::fs::remove_file(stale).map_err(|e| {
            Error::file(stale.display().to_string(), format!("cannot remove (it would shadow the export): {e}"))
        })?;
    }
    Ok(Exported {
        step: manifest.step,
        tensors: named.len(),
        bytes: weights.bytes,
        dtype: options.dtype,
        shards: weights.files.iter().filter(|f| f.ends_with(".safetensors")).count(),
        config: kind,
        tokenizer_files: manifest.companions.tokenizer_files.len(),
    })
}

/// The weight files an export wrote and their bytes.
struct Weights {
    files: Vec<String>,
    bytes: u64,
}

/// The weights in `dtype`, in one `model.safetensors`, or in shards of at most `max_bytes` (a larger
/// tensor gets its own) with `model.safetensors.index.json`; each file under a temporary name first,
/// then renamed into place.
fn write_weights(out: &Path, named: &[Source], max_bytes: u64, dtype: StoredDtype) -> Result<Weights> {
    let size = |t: &Source| dtype.bytes() * t.shape.iter().product::<usize>() as u64;
    // Consecutive runs of tensors (names in order), each within `max_bytes` unless one tensor alone.
    let mut runs = vec![std::ops::Range { start: 0, end: 0 }];
    let mut used = 0;
    for (i, t) in named.iter().enumerate() {
        let run = runs.last_mut().expect("one run");
        if run.end > run.start && used + size(t) > max_bytes {
            runs.push(i..i);
            used = 0;
        }
        runs.last_mut().expect("one run").end = i + 1;
        used += size(t);
    }
    let n = runs.len();
    let show = out.display().to_string();
    let mut weights = Weights { files: Vec::new(), bytes: 0 };
    let mut weight_map = serde_json::Map::new();
    for (i, run) in runs.into_iter().enumerate() {
        let name =
            if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) };
        let tmp = format!(".{name}.tmp-{}", std::process::id());
        let written = write_shard_as(out, &tmp, 0, &named[run.clone()], dtype)?;
        std::fs::rename(out.join(&tmp), out.join(&name))
            .map_err(|e| Error::file(&show, format!("cannot rename {name} into place: {e}")))?;
        weights.bytes += written.bytes;
        for t in &named[run] {
            weight_map.insert(t.name.clone(), name.clone().into());
        }
        weights.files.push(name);
    }
    if n > 1 {
        let total: u64 = named.iter().map(size).sum();
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let text = serde_json::to_string_pretty(&index).expect("json");
        crate::atomic::write_atomic(&out.join("model.safetensors.index.json"), text.as_bytes())
            .map_err(|e| Error::file(&show, format!("cannot write model.safetensors.index.json: {e}")))?;
        weights.files.push("model.safetensors.index.json".into());
    }
    Ok(weights)
}

/// The model's own config (its dtype now the export's), else a Mixtral config, else the native spec.
fn export_config(manifest: &Manifest, dtype: StoredDtype) -> (serde_json::Value, ExportedConfig) {
    // transformers 5 names it `dtype`, 4 `torch_dtype`: the key the config has, else the older one.
    let set_dtype = |c: &mut serde_json::Value| {
        let keys: Vec<&str> = ["torch_dtype", "dtype"].into_iter().filter(|k| c.get(k).is_some()).collect();
        for key in if keys.is_empty() { vec!["torch_dtype"] } else { keys } {
            c[key] = dtype.torch_name().into();
        }
    };
    if let Some(mut c) = manifest.companions.hf_config.clone().filter(|c| c.is_object()) {
        let model_type = c.get("model_type").and_then(|t| t.as_str()).unwrap_or("").to_string();
        set_dtype(&mut c);
        return (c, ExportedConfig::Original(model_type));
    }
    match mixtral_config(&manifest.model) {
        Some(mut c) => {
            set_dtype(&mut c);
            (c, ExportedConfig::Mixtral)
        }
        None => {
            let mut v = serde_json::to_value(&manifest.model).expect("specs serialise");
            v["model_type"] = "piper".into();
            (v, ExportedConfig::Native)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::shard::{Named, write_shard};
    use crate::checkpoint::test_manifest;
    use crate::model::preset;

    /// Every weight the export checks for, of `spec` (Mixtral names), zeros: `[vocab, d]`, norms `[d]`,
    /// three matrices per expert.
    fn weights(spec: &ModelSpec) -> Vec<Named> {
        let (d, f) = (spec.hidden_size as usize, spec.moe.as_ref().unwrap().expert.intermediate_size as usize);
        let mut out: Vec<Named> = vec![
            ("model.embed_tokens.weight".into(), vec![spec.vocab_size as usize, d], vec![]),
            ("model.norm.weight".into(), vec![d], vec![]),
        ];
        for i in 0..spec.num_layers {
            out.push((format!("model.layers.{i}.input_layernorm.weight"), vec![d], vec![]));
            for x in 0..spec.num_experts() {
                for (w, shape) in [("w1", vec![f, d]), ("w2", vec![d, f]), ("w3", vec![f, d])] {
                    out.push((format!("model.layers.{i}.block_sparse_moe.experts.{x}.{w}.weight"), shape, vec![]));
                }
            }
        }
        for t in &mut out {
            t.2 = vec![0.0; t.1.iter().product()];
        }
        out
    }

    /// A checkpoint folder in `dir` whose manifest describes `model` and whose one shard holds `tensors`.
    fn checkpoint(dir: &Path, model: ModelSpec, tensors: &[Named]) -> std::path::PathBuf {
        let folder = dir.join("step-1");
        std::fs::create_dir_all(&folder).unwrap();
        let sources: Vec<Source> = tensors.iter().map(|(n, s, v)| Source::values(n.clone(), s.clone(), v)).collect();
        let shard = write_shard(&folder, "rank-0.safetensors", 0, &sources).unwrap();
        let manifest = test_manifest(model, vec![shard]);
        std::fs::write(folder.join("manifest.json"), serde_json::to_string(&manifest).unwrap()).unwrap();
        folder
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("piper-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A new folder is written; a folder with files is refused (naming them) unless --overwrite, which
    /// replaces the model and removes the weight files loaders would read instead, and keeps the rest.
    #[test]
    fn an_occupied_output_folder_is_refused_or_cleared_of_shadowing_weights() {
        let dir = scratch("out");
        let spec = preset("tiny").unwrap();
        let ckpt = checkpoint(&dir, spec.clone(), &weights(&spec));
        let out = dir.join("hf");
        let e = export_hf(&ckpt, &out, false).unwrap();
        assert_eq!(e.tensors, weights(&spec).len());
        let err = export_hf(&ckpt, &out, false).unwrap_err().to_string();
        assert!(err.contains("--hf") && err.contains("not empty") && err.contains("--overwrite"), "{err}");
        let stale = ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "pytorch_model.bin"];
        for name in stale.iter().chain(&["tokenizer.json"]) {
            std::fs::write(out.join(name), "another model").unwrap();
        }
        let err = export_hf(&ckpt, &out, false).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        assert!(stale.iter().all(|n| out.join(n).exists()), "a refusal touches nothing");
        export_hf(&ckpt, &out, true).unwrap();
        for name in stale {
            assert!(!out.join(name).exists(), "{name} would shadow the export");
        }
        assert_eq!(std::fs::read_to_string(out.join("tokenizer.json")).unwrap(), "another model");
        assert!(out.join("model.safetensors").is_file() && out.join("config.json").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Above the shard size the weights go into `model-0000i-of-0000n.safetensors` files of at most that
    /// size (a larger tensor alone) with an index naming each tensor's file, holding what one file holds;
    /// exporting one file over them with --overwrite removes the shards and the index, and vice versa.
    #[test]
    fn large_exports_are_sharded_with_an_index() {
        let dir = scratch("sharded");
        let spec = preset("tiny").unwrap();
        let ckpt = checkpoint(&dir, spec.clone(), &weights(&spec));
        let (one, sharded) = (dir.join("one"), dir.join("sharded"));
        export_hf(&ckpt, &one, false).unwrap();
        let max = 200_000;
        let options = ExportOptions { max_shard_bytes: max, ..ExportOptions::default() };
        let e = export_hf_with(&ckpt, &sharded, &options).unwrap();
        assert!(e.shards > 2, "{e:?}");
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sharded.join("model.safetensors.index.json")).unwrap())
                .unwrap();
        let map = index["weight_map"].as_object().unwrap();
        assert_eq!(map.len(), weights(&spec).len());
        let (a, _) = crate::hf::read_hf_tensors(&one, &map.keys().cloned().collect::<Vec<_>>()).unwrap();
        let (b, missing) = crate::hf::read_hf_tensors(&sharded, &map.keys().cloned().collect::<Vec<_>>()).unwrap();
        assert!(missing.is_empty() && a == b, "the shards hold what one file holds");
        let biggest = weights(&spec).iter().map(|t| 4 * t.2.len() as u64).max().unwrap();
        for i in 1..=e.shards {
            let f = sharded.join(format!("model-{i:05}-of-{:05}.safetensors", e.shards));
            let len = std::fs::metadata(&f).unwrap().len();
            assert!(len <= max.max(biggest) + 64 * 1024, "{} holds {len} bytes", f.display());
        }
        assert!(!sharded.join("model.safetensors").exists());
        export_hf(&ckpt, &sharded, true).unwrap();
        let names: Vec<String> = std::fs::read_dir(&sharded)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n == "model.safetensors" || n == "config.json"), "{names:?}");
        export_hf_with(
            &ckpt,
            &one,
            &ExportOptions { overwrite: true, max_shard_bytes: max, ..ExportOptions::default() },
        )
        .unwrap();
        assert!(!one.join("model.safetensors").exists(), "a stale single file would shadow the shards");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// bf16 by round-to-nearest-even on the f32 bits (ties to the even mantissa), for finite values.
    fn bf16_rounded_bits(x: f32) -> u16 {
        let b = x.to_bits();
        ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
    }

    /// `--dtype bf16` writes every weight as BF16, each the f32 master rounded to nearest even (ties
    /// included), in half the bytes, and says so in config.json; f32 stays exact.
    #[test]
    fn bf16_exports_round_the_masters_to_nearest_even() {
        let dir = scratch("bf16");
        let spec = preset("tiny").unwrap();
        // Values with every low-half pattern, ties (0x8000) among them.
        let mut tensors = weights(&spec);
        for (i, t) in tensors.iter_mut().enumerate() {
            for (j, v) in t.2.iter_mut().enumerate() {
                let low = [0x8000u32, 0x7fff, 0x8001, 0, (j as u32).wrapping_mul(2_654_435_761) & 0xffff][j % 5];
                *v = f32::from_bits(((0x3c00 + (i * 7 + j) as u32 % 0x800) << 16) | low) * [1.0, -1.0][j % 2];
            }
        }
        let ckpt = checkpoint(&dir, spec.clone(), &tensors);
        let (fp32, bf16) = (dir.join("fp32"), dir.join("bf16"));
        let f = export_hf(&ckpt, &fp32, false).unwrap();
        let b = export_hf_with(&ckpt, &bf16, &ExportOptions { dtype: StoredDtype::Bf16, ..ExportOptions::default() })
            .unwrap();
        assert_eq!((f.dtype, b.dtype), (StoredDtype::F32, StoredDtype::Bf16));
        let bytes = std::fs::read(bf16.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let exact = std::fs::read(fp32.join("model.safetensors")).unwrap();
        let exact = safetensors::SafeTensors::deserialize(&exact).unwrap();
        let (mut ties, mut values) = (0, 0);
        for (name, _, want) in &tensors {
            let (view, master) = (st.tensor(name).unwrap(), exact.tensor(name).unwrap());
            assert_eq!((view.dtype(), master.dtype()), (safetensors::Dtype::BF16, safetensors::Dtype::F32), "{name}");
            let got: Vec<u16> = view.data().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
            let kept: Vec<f32> =
                master.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(&kept, want, "{name}: the f32 export is the masters");
            assert_eq!(got.len(), want.len(), "{name}");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(*g, bf16_rounded_bits(*w), "{name}: {w:e}");
                ties += usize::from(w.to_bits() & 0xffff == 0x8000);
                values += 1;
            }
        }
        assert!(ties > values / 10, "ties exercised: {ties} of {values}");
        let header = |file: &[u8]| 8 + u64::from_le_bytes(file[..8].try_into().unwrap());
        let exact_file = std::fs::read(fp32.join("model.safetensors")).unwrap();
        assert_eq!(b.bytes - header(&bytes), 2 * values as u64, "two bytes a value");
        assert_eq!(f.bytes - header(&exact_file), 4 * values as u64, "four bytes a value");
        let config = |d: &Path| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
        };
        assert_eq!(
            (config(&fp32)["torch_dtype"].clone(), config(&bf16)["torch_dtype"].clone()),
            ("float32".into(), "bfloat16".into())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Shards of another model than the manifest's — a layer or an expert more, a norm or an embedding of
    /// another width — are refused, naming the tensor; nothing is written.
    #[test]
    fn shards_that_disagree_with_the_manifest_are_refused() {
        let spec = preset("tiny").unwrap();
        let d = spec.hidden_size as usize;
        let layers = spec.num_layers;
        let experts = spec.num_experts();
        let extra = |name: String, shape: Vec<usize>| {
            let mut w = weights(&spec);
            let n = shape.iter().product();
            w.push((name, shape, vec![0.0; n]));
            w
        };
        let reshaped = |name: &str, shape: Vec<usize>| {
            let mut w = weights(&spec);
            let t = w.iter_mut().find(|t| t.0 == name).unwrap();
            t.2 = vec![0.0; shape.iter().product()];
            t.1 = shape;
            w
        };
        let cases = [
            (extra(format!("model.layers.{layers}.input_layernorm.weight"), vec![d]), format!("{layers} layers")),
            (
                extra(format!("model.layers.0.block_sparse_moe.experts.{experts}.w1.weight"), vec![4, d]),
                format!("{experts} routed experts"),
            ),
            (reshaped("model.layers.1.input_layernorm.weight", vec![d + 1]), format!("[{d}]")),
            (reshaped("model.embed_tokens.weight", vec![7, d]), format!("[{}, {d}]", spec.vocab_size)),
        ];
        for (i, (tensors, want)) in cases.into_iter().enumerate() {
            let dir = scratch(&format!("mismatch-{i}"));
            let ckpt = checkpoint(&dir, spec.clone(), &tensors);
            let err = export_hf(&ckpt, &dir.join("hf"), false).unwrap_err().to_string();
            assert!(err.contains("different models") && err.contains(&want), "case {i}: {err}");
            assert!(!dir.join("hf").exists(), "case {i}: wrote before refusing");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
