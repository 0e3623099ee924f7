//! Hugging Face model folders on disk: `config.json` with `model.safetensors`, or the shards a
//! `model.safetensors.index.json` names. Tensors are read by name — each from the file that holds it,
//! seeking to it rather than reading whole files — and converted to f32 from F32, BF16 or F16.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::checkpoint::shard::{Located, TensorMap, header};
use crate::error::{Error, Result};

/// The weight files of a model folder: tensor name → file, from the index when there is one (`None`:
/// a single `model.safetensors` holds everything).
pub fn weight_map(dir: &Path) -> Result<Option<HashMap<String, PathBuf>>> {
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        if !dir.join("model.safetensors").is_file() {
            return Err(Error::file(
                dir.display().to_string(),
                "holds neither model.safetensors nor model.safetensors.index.json",
            ));
        }
        return Ok(None);
    }
    let show = index.display().to_string();
    let text = std::fs::read_to_string(&index).map_err(|e| Error::file(&show, format!("cannot read: {e}")))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::file(&show, format!("not valid JSON: {e}")))?;
    let map = doc
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::missing(&show, "weight_map", Some("tensor name → shard file".into())))?;
    let mut out = HashMap::new();
    for (name, file) in map {
        let file = file.as_str().filter(|f| !f.contains('/') && !f.contains(".."));
        let file = file.ok_or_else(|| {
            Error::invalid(&show, format!("weight_map.{}", name.escape_debug()), "must name a file in the folder")
        })?;
        out.insert(name.clone(), dir.join(file));
    }
    Ok(Some(out))
}

/// Decodes one tensor's little-endian bytes to f32; `None` for a dtype that is not a float Piper reads
/// (F32, BF16, F16).
pub fn decode(dtype: &str, bytes: &[u8]) -> Option<Vec<f32>> {
    match dtype {
        "F32" => Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()),
        "BF16" => Some(bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        "F16" => Some(bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        _ => None,
    }
}

fn element_bytes(dtype: &str) -> u64 {
    if dtype == "F32" { 4 } else { 2 }
}

/// Reads the tensors in `names` from the model folder `dir` as f32. Names no file holds are returned
/// in the second list; a tensor of another dtype, a bad header or a short file is an error naming the
/// file and the tensor.
pub fn read_hf_tensors(dir: &Path, names: &[String]) -> Result<(TensorMap, Vec<String>)> {
    let map = weight_map(dir)?;
    let single = dir.join("model.safetensors");
    let mut by_file: HashMap<PathBuf, Vec<&String>> = HashMap::new();
    let mut missing = Vec::new();
    for name in names {
        match &map {
            Some(m) => match m.get(name) {
                Some(f) => by_file.entry(f.clone()).or_default().push(name),
                None => missing.push(name.clone()),
            },
            None => by_file.entry(single.clone()).or_default().push(name),
        }
    }
    let mut out = TensorMap::new();
    for (path, wanted) in by_file {
        let show = path.display().to_string();
        let mut f = std::fs::File::open(&path).map_err(|e| Error::file(&show, format!("cannot open: {e}")))?;
        let (index, start) = header(&mut f, &show)?;
        for name in wanted {
            let Some(located) = index.get(name) else {
                missing.push(name.clone());
                continue;
            };
            let Located { dtype, shape, range: [a, b], .. } = located;
            if !located.holds(element_bytes(dtype)) {
                let why = format!(
                    "tensor `{}` ({}, {shape:?}) has {} bytes",
                    name.escape_debug(),
                    dtype.escape_debug(),
                    b - a
                );
                return Err(Error::file(&show, why));
            }
            let mut bytes = vec![0u8; (b - a) as usize];
            f.seek(SeekFrom::Start(start + a)).and_then(|_| f.read_exact(&mut bytes)).map_err(|e| {
                Error::file(&show, format!("cannot read tensor `{}` ({e}): truncated?", name.escape_debug()))
            })?;
            let values = decode(dtype, &bytes).ok_or_else(|| {
                Error::file(
                    &show,
                    format!(
                        "tensor `{}` is {}; Piper reads F32, BF16 and F16 weights",
                        name.escape_debug(),
                        dtype.escape_debug()
                    ),
                )
            })?;
            // Once, on load: a NaN or inf weight would only show later as a NaN loss or gradient.
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                let why = format!(
                    "tensor `{}` holds {} at element {i} of {}; the weights are damaged: download or export them again",
                    name.escape_debug(),
                    values[i],
                    values.len()
                );
                return Err(Error::file(&show, why));
            }
            out.insert(name.clone(), (shape.clone(), values));
        }
    }
    Ok((out, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NaN or inf weight is refused on load, naming the file, the tensor and the element.
    #[test]
    fn non_finite_weights_are_refused_naming_the_tensor() {
        let dir = std::env::temp_dir().join(format!("piper-hf-nan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
            let (ok, w): (Vec<u8>, Vec<u8>) = (
                [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
                [1.0f32, 2.0, bad].iter().flat_map(|v| v.to_le_bytes()).collect(),
            );
            let views = [
                ("norm.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &ok).unwrap()),
                ("proj.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &w).unwrap()),
            ];
            safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
            let (read, _) = read_hf_tensors(&dir, &["norm.weight".into()]).unwrap();
            assert_eq!(read["norm.weight"].1, vec![1.0, 2.0]);
            let err = read_hf_tensors(&dir, &["proj.weight".into()]).unwrap_err().to_string();
            let want = format!("model.safetensors: tensor `proj.weight` holds {shown} at element 2 of 3");
            assert!(err.contains(&want), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn half_precision_decodes_as_ieee_says() {
        // 1.0, −2.0, 65504 (largest), 2^−24 (smallest subnormal), 0.333251953125, +inf.
        for (bits, want) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x7bff, 65504.0),
            (0x0001, 2f32.powi(-24)),
            (0x3555, 0.333_251_95),
            (0x7c00, f32::INFINITY),
        ] {
            assert_eq!(decode("F16", &bits.to_le_bytes()), Some(vec![want]), "{bits:#06x}");
        }
        assert!(decode("F16", &0x7e00u16.to_le_bytes()).unwrap()[0].is_nan());
        assert_eq!(decode("BF16", &[0x80, 0x3f]), Some(vec![1.0]));
        assert_eq!(decode("I64", &[0; 8]), None);
    }
}
