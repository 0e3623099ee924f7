//! Shard files: safetensors (f32, little-endian) written with their checksums, and read back tensor by
//! tensor — a rank seeks to the tensors it needs instead of reading whole shards, and checks each one's
//! SHA-256 against the manifest.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use sha2::{Digest, Sha256};

use super::{Manifest, ShardFile, TensorEntry};
use crate::error::{Error, Result};

/// A named f32 tensor: (name, shape, values in row-major order).
pub type Named = (String, Vec<usize>, Vec<f32>);
/// Tensors by name: shape and values.
pub type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;
/// A shard's header: tensor name → (shape, byte range in the data section).
type Index = HashMap<String, (Vec<usize>, [u64; 2])>;

/// Hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `tensors` as `folder/name` (safetensors, synced) and returns its manifest entry.
pub fn write_shard(folder: &Path, name: &str, rank: u64, tensors: &[Named]) -> Result<ShardFile> {
    let path = folder.join(name);
    let show = || path.display().to_string();
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(n, s, v)| (n.clone(), s.clone(), le_bytes(v))).collect();
    for (n, s, b) in &bytes {
        if s.iter().product::<usize>() * 4 != b.len() {
            return Err(Error::file(show(), format!("tensor `{n}` has {} values for shape {s:?}", b.len() / 4)));
        }
    }
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| {
            Ok((n.clone(), TensorView::new(Dtype::F32, s.clone(), b).map_err(|e| Error::file(show(), e.to_string()))?))
        })
        .collect::<Result<_>>()?;
    let data = safetensors::serialize(views, None).map_err(|e| Error::file(show(), format!("cannot encode: {e}")))?;
    let mut f = std::fs::File::create(&path).map_err(|e| Error::file(show(), format!("cannot create: {e}")))?;
    f.write_all(&data).and_then(|_| f.sync_all()).map_err(|e| Error::file(show(), format!("cannot write: {e}")))?;
    let entries = bytes
        .iter()
        .map(|(n, s, b)| TensorEntry {
            name: n.clone(),
            shape: s.iter().map(|d| *d as u64).collect(),
            sha256: sha256_hex(b),
        })
        .collect();
    Ok(ShardFile { name: name.into(), rank, bytes: data.len() as u64, sha256: sha256_hex(&data), tensors: entries })
}

/// The safetensors header of an open shard: name → (shape, byte range within the data section), and
/// where the data section starts.
fn header(file: &mut std::fs::File, show: &str) -> Result<(Index, u64)> {
    let bad = |why: String| Error::file(show, why);
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| bad(format!("cannot read the safetensors header: {e}")))?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return Err(bad(format!("safetensors header of {n} bytes: corrupted")));
    }
    let mut text = vec![0u8; n as usize];
    file.read_exact(&mut text).map_err(|e| bad(format!("cannot read the safetensors header: {e}")))?;
    let doc: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&text).map_err(|e| bad(format!("corrupted safetensors header: {e}")))?;
    let mut out = HashMap::new();
    for (name, v) in doc {
        if name == "__metadata__" {
            continue;
        }
        let parse = || -> Option<(Vec<usize>, [u64; 2])> {
            (v.get("dtype")?.as_str()? == "F32").then_some(())?;
            let shape = v
                .get("shape")?
                .as_array()?
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<Vec<_>>>()?;
            let off = v.get("data_offsets")?.as_array()?;
            Some((shape, [off.first()?.as_u64()?, off.get(1)?.as_u64()?]))
        };
        let entry = parse().ok_or_else(|| bad(format!("corrupted safetensors header entry `{name}`")))?;
        out.insert(name, entry);
    }
    Ok((out, 8 + n))
}

/// Reads the tensors named in `names` from the checkpoint in `folder`, each from the shard the manifest
/// says holds it, checking its shape and SHA-256. A name no shard holds is returned in the second list
/// (the caller decides whether it is optional, like optimizer moments for an export).
pub fn read_tensors(folder: &Path, manifest: &Manifest, names: &[String]) -> Result<(TensorMap, Vec<String>)> {
    let mut by_file: HashMap<&str, Vec<(&String, &TensorEntry)>> = HashMap::new();
    let mut missing = Vec::new();
    for name in names {
        match manifest.files.iter().find_map(|f| f.tensors.iter().find(|t| &t.name == name).map(|t| (f, t))) {
            Some((f, t)) => by_file.entry(f.name.as_str()).or_default().push((name, t)),
            None => missing.push(name.clone()),
        }
    }
    let mut out = HashMap::new();
    for (file, wanted) in by_file {
        let path = folder.join(file);
        let show = path.display().to_string();
        let mut f = std::fs::File::open(&path).map_err(|e| Error::file(&show, format!("missing shard ({e})")))?;
        let (index, data_start) = header(&mut f, &show)?;
        for (name, entry) in wanted {
            let (shape, [a, b]) = index.get(name).ok_or_else(|| {
                Error::file(&show, format!("holds no tensor `{name}` although the manifest lists it"))
            })?;
            let want_shape: Vec<usize> = entry.shape.iter().map(|d| *d as usize).collect();
            if *shape != want_shape || b < a || (b - a) != 4 * shape.iter().product::<usize>() as u64 {
                return Err(Error::file(
                    &show,
                    format!("tensor `{name}` has shape {shape:?}, the manifest says {want_shape:?}"),
                ));
            }
            let mut bytes = vec![0u8; (b - a) as usize];
            f.seek(SeekFrom::Start(data_start + a))
                .and_then(|_| f.read_exact(&mut bytes))
                .map_err(|e| Error::file(&show, format!("cannot read tensor `{name}` ({e}): truncated?")))?;
            if sha256_hex(&bytes) != entry.sha256 {
                return Err(Error::file(
                    &show,
                    format!("tensor `{name}` fails its SHA-256 check: the file is corrupted"),
                ));
            }
            let values = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
            out.insert(name.clone(), (shape.clone(), values));
        }
    }
    Ok((out, missing))
}

/// Checks a whole shard against its manifest entry (size and SHA-256), e.g. before an export.
pub fn verify_file(folder: &Path, file: &ShardFile) -> Result<()> {
    let path = folder.join(&file.name);
    let show = path.display().to_string();
    let bytes = std::fs::read(&path).map_err(|e| Error::file(&show, format!("missing shard ({e})")))?;
    if bytes.len() as u64 != file.bytes || sha256_hex(&bytes) != file.sha256 {
        return Err(Error::file(&show, "fails its size or SHA-256 check: truncated or corrupted"));
    }
    Ok(())
}
