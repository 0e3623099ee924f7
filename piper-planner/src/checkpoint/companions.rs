//! What a checkpoint keeps beside the weights so that its export is the model it came from: the model's
//! own Hugging Face `config.json` (a Qwen3-MoE or DeepSeek-V3 model exports as that family, not as a
//! Mixtral-shaped approximation) and its tokenizer files, copied into the checkpoint's `tokenizer/`
//! folder with their size and SHA-256.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::shard::sha256_hex;
use crate::error::{Error, Result};

/// The checkpoint's folder of tokenizer files.
pub const TOKENIZER_FOLDER: &str = "tokenizer";

/// The files of a Hugging Face model folder that make up its tokenizer (fast and slow), kept when
/// present.
pub const TOKENIZER_FILES: [&str; 8] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
];

/// `manifest.json`'s record of the companions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Companions {
    /// The model's `config.json`, when it came from one of a Hugging Face family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_config: Option<serde_json::Value>,
    /// Files under `tokenizer/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokenizer_files: Vec<CompanionFile>,
}

/// One kept file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompanionFile {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The tokenizer files a run keeps with its checkpoints: `(source, name in the checkpoint)`.
pub type TokenizerSources = Vec<(PathBuf, String)>;

/// The tokenizer files of the Hugging Face folder `dir` that exist.
pub fn folder_tokenizer_files(dir: &Path) -> TokenizerSources {
    TOKENIZER_FILES.iter().map(|n| (dir.join(n), n.to_string())).filter(|(p, _)| p.is_file()).collect()
}

/// Copies `sources` into `checkpoint/tokenizer/` (a save's scratch folder) and records them.
pub fn keep_tokenizer_files(checkpoint: &Path, sources: &TokenizerSources) -> Result<Vec<CompanionFile>> {
    if sources.is_empty() {
        return Ok(Vec::new());
    }
    let folder = checkpoint.join(TOKENIZER_FOLDER);
    std::fs::create_dir_all(&folder)
        .map_err(|e| Error::file(folder.display().to_string(), format!("cannot create: {e}")))?;
    sources
        .iter()
        .map(|(source, name)| {
            let bytes = std::fs::read(source).map_err(|e| {
                Error::file(source.display().to_string().escape_debug().to_string(), format!("tokenizer file: {e}"))
            })?;
            let path = folder.join(name);
            std::fs::write(&path, &bytes).map_err(|e| Error::file(path.display().to_string(), e.to_string()))?;
            Ok(CompanionFile { name: name.clone(), bytes: bytes.len() as u64, sha256: sha256_hex(&bytes) })
        })
        .collect()
}

/// Copies the checkpoint `folder`'s tokenizer files into `out` (each written atomically), each checked
/// against its size and SHA-256 first.
pub fn export_tokenizer_files(folder: &Path, files: &[CompanionFile], out: &Path) -> Result<()> {
    for f in files {
        if f.name.contains(['/', '\\']) || f.name.starts_with('.') {
            return Err(Error::file(
                folder.join("manifest.json").display().to_string(),
                format!("tokenizer file name `{}` is not a plain file name", f.name.escape_debug()),
            ));
        }
        let path = folder.join(TOKENIZER_FOLDER).join(&f.name);
        let show = path.display().to_string();
        let bytes = std::fs::read(&path).map_err(|e| Error::file(&show, format!("missing tokenizer file ({e})")))?;
        if bytes.len() as u64 != f.bytes || sha256_hex(&bytes) != f.sha256 {
            return Err(Error::file(&show, "fails its size or SHA-256 check: truncated or corrupted"));
        }
        crate::atomic::write_atomic(&out.join(&f.name), &bytes)
            .map_err(|e| Error::file(out.join(&f.name).display().to_string(), format!("cannot write: {e}")))?;
    }
    Ok(())
}
