//! Shard files: safetensors (f32, or bf16 for an export; little-endian) written with their checksums,
//! and read back tensor by tensor — a rank seeks to the tensors it needs instead of reading whole shards, and checks each one's
//! SHA-256 against the manifest.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{Manifest, ShardFile, TensorEntry};
use crate::error::{Error, Result};

/// A named f32 tensor: (name, shape, values in row-major order).
pub type Named = (String, Vec<usize>, Vec<f32>);

/// Fills values from a row-major index on (see [`Source`]).
pub type Fill<'a> = Box<dyn Fn(usize, &mut [f32]) + 'a>;

/// One tensor to write without materialising it: `fill(start, out)` writes its values from row-major
/// index `start` on into `out` (e.g. a transposed view of a parameter).
pub struct Source<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub fill: Fill<'a>,
}

impl<'a> Source<'a> {
    /// A tensor whose values are at hand.
    pub fn values(name: String, shape: Vec<usize>, values: &'a [f32]) -> Self {
        Source { name, shape, fill: Box::new(move |start, out| out.copy_from_slice(&values[start..start + out.len()])) }
    }
}
/// Tensors by name: shape and values.
pub type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;
/// One tensor in a safetensors header: dtype (`F32`, `BF16`, ...), shape, byte range in the data section
/// (inside the file), and its element count (the shape's product, which fits `u64`).
#[derive(Clone, Debug, PartialEq)]
pub struct Located {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub range: [u64; 2],
    pub elements: u64,
}

impl Located {
    /// Whether its byte range holds exactly its elements at `element_bytes` each.
    pub fn holds(&self, element_bytes: u64) -> bool {
        self.elements.checked_mul(element_bytes) == Some(self.range[1] - self.range[0])
    }
}

/// A safetensors header: tensor name → where it is.
pub type Index = HashMap<String, Located>;

/// Hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The element type a shard stores its values in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoredDtype {
    /// IEEE f32: what checkpoints keep (the fp32 master weights and optimizer state).
    #[default]
    F32,
    /// bfloat16, each value rounded to nearest even (`half`): half the bytes, f32's range.
    Bf16,
}

impl StoredDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::Bf16 => 2,
        }
    }

    /// The safetensors header's name of the type.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::Bf16 => "BF16",
        }
    }

    /// transformers' `torch_dtype` of the type.
    pub fn torch_name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "float32",
            StoredDtype::Bf16 => "bfloat16",
        }
    }

    /// Appends `values` to `out`, little-endian, in this type.
    fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            StoredDtype::F32 => out.extend(values.iter().flat_map(|x| x.to_le_bytes())),
            StoredDtype::Bf16 => out.extend(values.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())),
        }
    }
}

/// Writes `tensors` as `folder/name` (safetensors, f32) and returns its manifest entry (see
/// [`write_shard_as`]).
pub fn write_shard(folder: &Path, name: &str, rank: u64, tensors: &[Source]) -> Result<ShardFile> {
    write_shard_as(folder, name, rank, tensors, StoredDtype::F32)
}

/// Writes `tensors` as `folder/name` (safetensors, in `dtype`) and returns its manifest entry. Streamed:
/// the header is built from the shapes, then each tensor's bytes go to the file through one small
/// buffer while both its own and the file's SHA-256 are computed — no second copy of the shard in
/// memory.
pub fn write_shard_as(
    folder: &Path,
    name: &str,
    rank: u64,
    tensors: &[Source],
    dtype: StoredDtype,
) -> Result<ShardFile> {
    let path = folder.join(name);
    let show = || path.display().to_string();
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + dtype.bytes() * t.shape.iter().product::<usize>() as u64;
        let entry =
            serde_json::json!({"dtype": dtype.safetensors_name(), "shape": t.shape, "data_offsets": [offset, end]});
        if header.insert(t.name.clone(), entry).is_some() {
            return Err(Error::file(show(), format!("tensor `{}` is listed twice", t.name)));
        }
        offset = end;
    }
    let mut text = serde_json::to_vec(&header).expect("a header serialises");
    // safetensors pads the header with spaces so the data starts 8-byte aligned.
    text.resize(text.len().next_multiple_of(8), b' ');
    let write_err = |e: std::io::Error| Error::file(show(), format!("cannot write: {e}"));
    let file = std::fs::File::create(&path).map_err(|e| Error::file(show(), format!("cannot create: {e}")))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut whole = Sha256::new();
    let prefix = (text.len() as u64).to_le_bytes();
    for part in [&prefix[..], &text] {
        out.write_all(part).map_err(write_err)?;
        whole.update(part);
    }
    let mut entries = Vec::with_capacity(tensors.len());
    const BLOCK: usize = 1 << 14;
    let (mut values, mut chunk) = (vec![0f32; BLOCK], Vec::with_capacity(4 * BLOCK));
    for t in tensors {
        let mut own = Sha256::new();
        let n = t.shape.iter().product::<usize>();
        for start in (0..n).step_by(BLOCK) {
            let block = &mut values[..BLOCK.min(n - start)];
            (t.fill)(start, block);
            chunk.clear();
            dtype.encode(block, &mut chunk);
            out.write_all(&chunk).map_err(write_err)?;
            own.update(&chunk);
            whole.update(&chunk);
        }
        let sha256 = hex(&own.finalize());
        entries.push(TensorEntry { name: t.name.clone(), shape: t.shape.iter().map(|d| *d as u64).collect(), sha256 });
    }
    let file = out.into_inner().map_err(|e| write_err(e.into_error()))?;
    file.sync_all().map_err(write_err)?;
    let bytes = 8 + text.len() as u64 + offset;
    Ok(ShardFile { name: name.into(), rank, bytes, sha256: hex(&whole.finalize()), tensors: entries })
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The safetensors header of an open file, and where its data section starts; `show` names the file in
/// errors. Every entry's shape product must fit `u64` and its byte range lie inside the file, so no
/// reader allocates more than the file holds.
pub fn header(file: &mut std::fs::File, show: &str) -> Result<(Index, u64)> {
    let bad = |why: String| Error::file(show, why);
    let file_len = file.metadata().map_err(|e| bad(format!("cannot read its size: {e}")))?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| bad(format!("cannot read the safetensors header: {e}")))?;
    let n = u64::from_le_bytes(len);
    if n > (100 << 20).min(file_len.saturating_sub(8)) {
        return Err(bad(format!("safetensors header of {n} bytes in a file of {file_len}: corrupted")));
    }
    let data_len = file_len.saturating_sub(8 + n);
    let mut text = vec![0u8; n as usize];
    file.read_exact(&mut text).map_err(|e| bad(format!("cannot read the safetensors header: {e}")))?;
    let doc: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&text).map_err(|e| bad(format!("corrupted safetensors header: {e}")))?;
    let mut out = HashMap::new();
    for (name, v) in doc {
        if name == "__metadata__" {
            continue;
        }
        let parse = || -> Option<Located> {
            let dtype = v.get("dtype")?.as_str()?.to_string();
            let shape = v
                .get("shape")?
                .as_array()?
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<Vec<_>>>()?;
            let off = v.get("data_offsets")?.as_array()?;
            let range = [off.first()?.as_u64()?, off.get(1)?.as_u64()?];
            let elements = shape.iter().try_fold(1u64, |acc, d| acc.checked_mul(*d as u64))?;
            (range[0] <= range[1] && range[1] <= data_len).then_some(Located { dtype, shape, range, elements })
        };
        let entry = parse().ok_or_else(|| {
            bad(format!(
                "corrupted safetensors header entry `{}` (no dtype, shape and data offsets inside the file's {data_len} data bytes)",
                name.escape_debug()
            ))
        })?;
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
            let located = index.get(name).ok_or_else(|| {
                Error::file(&show, format!("holds no tensor `{}` although the manifest lists it", name.escape_debug()))
            })?;
            let Located { dtype, shape, range: [a, b], .. } = located;
            let want_shape: Vec<usize> = entry.shape.iter().map(|d| *d as usize).collect();
            if dtype != "F32" || *shape != want_shape || !located.holds(4) {
                return Err(Error::file(
                    &show,
                    format!(
                        "tensor `{}` is {} of shape {shape:?} in {} bytes; the manifest says F32 of {want_shape:?}",
                        name.escape_debug(),
                        dtype.escape_debug(),
                        b - a
                    ),
                ));
            }
            let mut bytes = vec![0u8; (b - a) as usize];
            f.seek(SeekFrom::Start(data_start + a)).and_then(|_| f.read_exact(&mut bytes)).map_err(|e| {
                Error::file(&show, format!("cannot read tensor `{}` ({e}): truncated?", name.escape_debug()))
            })?;
            if sha256_hex(&bytes) != entry.sha256 {
                return Err(Error::file(
                    &show,
                    format!("tensor `{}` fails its SHA-256 check: the file is corrupted", name.escape_debug()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_safetensors_files_and_read_back_tensor_by_tensor() {
        let dir = std::env::temp_dir().join(format!("piper-shard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tensors: Vec<Named> = vec![
            ("a.weight".into(), vec![2, 3], (0..6).map(|x| x as f32 * 0.5 - 1.0).collect()),
            ("b".into(), vec![5], vec![f32::MIN_POSITIVE, -0.0, 3.25, 1e30, -7.0]),
            ("c.empty".into(), vec![0, 4], vec![]),
        ];
        let sources: Vec<Source> = tensors.iter().map(|(n, s, v)| Source::values(n.clone(), s.clone(), v)).collect();
        let f = write_shard(&dir, "s.safetensors", 3, &sources).unwrap();
        let bytes = std::fs::read(dir.join("s.safetensors")).unwrap();
        assert_eq!((f.bytes, f.sha256.as_str()), (bytes.len() as u64, sha256_hex(&bytes).as_str()));
        // The safetensors crate reads it: same names, shapes and values.
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, shape, values) in &tensors {
            let view = st.tensor(name).unwrap();
            assert_eq!(view.shape(), &shape[..]);
            let got: Vec<f32> =
                view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(&got, values);
        }
        let manifest_files = vec![f];
        let manifest = crate::checkpoint::test_manifest(crate::model::preset("tiny").unwrap(), manifest_files);
        let want = vec!["b".to_string(), "nope".to_string()];
        let (got, missing) = read_tensors(&dir, &manifest, &want).unwrap();
        assert_eq!(got["b"].1, tensors[1].2);
        assert_eq!(missing, vec!["nope".to_string()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
