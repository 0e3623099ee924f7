//! Checkpoint folders on disk: the scratch folder a save writes into, the commit that makes it the
//! latest (rename, then `latest`), which folder `--resume DIR` means, and `--keep K`.

use std::path::{Path, PathBuf};

use super::{Manifest, complete_folders};
use crate::atomic::write_atomic;
use crate::error::{Error, Result};

/// `step-NNNNNNNN`.
pub fn folder_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The scratch folder of a save in progress (`DIR/.step-NNNNNNNN.tmp-TAG`); a crash leaves it behind,
/// never in the way of a complete checkpoint.
pub fn scratch_folder(dir: &Path, step: u64, tag: &str) -> PathBuf {
    dir.join(format!(".{}.tmp-{tag}", folder_name(step)))
}

fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::file(path.display().to_string(), format!("{what}: {e}"))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Makes a complete scratch folder (shards and `manifest.json` written and synced) the checkpoint of
/// `step`: renames it to `DIR/step-NNNNNNNN` (an existing folder of that step, from an earlier run, is
/// moved aside first and removed after), then points `DIR/latest` at it. Returns the final folder.
pub fn commit(dir: &Path, scratch: &Path, step: u64) -> Result<PathBuf> {
    sync_dir(scratch);
    let name = folder_name(step);
    let target = dir.join(&name);
    let aside = dir.join(format!(".{name}.old-{}", std::process::id()));
    let had_old = target.exists();
    if had_old {
        std::fs::rename(&target, &aside).map_err(|e| io(&target, "cannot move the older copy aside", e))?;
    }
    std::fs::rename(scratch, &target)
        .map_err(|e| io(&target, "cannot rename the finished checkpoint into place", e))?;
    sync_dir(dir);
    write_atomic(&dir.join("latest"), format!("{name}\n").as_bytes())
        .map_err(|e| io(&dir.join("latest"), "cannot update", e))?;
    if had_old {
        let _ = std::fs::remove_dir_all(&aside);
    }
    Ok(target)
}

/// The checkpoint `--resume PATH` means: PATH itself when it holds a `manifest.json`, else the folder
/// `PATH/latest` names. Never a silent fall-back: a missing or broken latest is an error that lists
/// the other complete checkpoints found.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join("manifest.json").is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(Error::file(path.display().to_string(), "no such checkpoint folder"));
    }
    let others = || {
        let found = complete_folders(path);
        if found.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = found.iter().map(|(_, p)| p.display().to_string()).collect();
            format!("; complete checkpoints here: {} (pass one to --resume)", names.join(", "))
        }
    };
    let latest = path.join("latest");
    let text = std::fs::read_to_string(&latest).map_err(|e| {
        Error::file(
            latest.display().to_string(),
            format!("cannot read ({e}): no checkpoint was committed here{}", others()),
        )
    })?;
    let name = text.trim();
    if name.is_empty() || name.contains('/') || name.contains("..") {
        return Err(Error::file(
            latest.display().to_string(),
            format!("names `{}`, not a checkpoint folder", name.escape_debug()),
        ));
    }
    let folder = path.join(name);
    if !folder.join("manifest.json").is_file() {
        return Err(Error::file(
            folder.display().to_string(),
            format!("`latest` names it but it holds no manifest.json{}", others()),
        ));
    }
    Ok(folder)
}

/// Keeps the `keep` newest complete checkpoints under `dir` (and never the one `latest` names), removes
/// the older ones. Returns the folders removed.
pub fn prune(dir: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let latest = resolve(dir).ok();
    let found = complete_folders(dir);
    let mut removed = Vec::new();
    let excess = found.len().saturating_sub(keep.max(1));
    for (_, folder) in found.into_iter().take(excess) {
        if Some(&folder) == latest.as_ref() {
            continue;
        }
        std::fs::remove_dir_all(&folder).map_err(|e| io(&folder, "cannot remove an old checkpoint", e))?;
        removed.push(folder);
    }
    Ok(removed)
}

/// Loads the manifest `--resume PATH` means (see [`resolve`]).
pub fn load_resume(path: &Path) -> Result<(PathBuf, Manifest)> {
    let folder = resolve(path)?;
    let manifest = Manifest::load(&folder)?;
    Ok((folder, manifest))
}
