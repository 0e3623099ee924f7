//! The history of training runs: each run appends one JSON line — the model, the plan it ran, the
//! settings the planner prices it with, and what it measured — to a file that outlives every run, and
//! `piper calibrate --refine` refits the platform from its recent lines (a resource model that improves
//! as it is used).
//!
//! Where: `--history FILE` of the trainer, else `$PIPER_HISTORY`, else
//! `$XDG_DATA_HOME/piper/history.jsonl`, else `~/.local/share/piper/history.jsonl`; `off` (flag or
//! variable) keeps none.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::layout::TrainConfig;
use crate::model::ModelSpec;
use crate::run_plan::RunPlan;

/// The version of a history line.
pub const HISTORY_VERSION: u32 = 1;

/// One training run, as the history keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRecord {
    pub version: u32,
    /// When the run ended, seconds since the Unix epoch.
    pub unix_time_s: u64,
    pub model: ModelSpec,
    /// The plan it ran; `plan.platform` names the platform it was priced on, `plan.predicted` is
    /// what that platform predicted then.
    pub plan: RunPlan,
    /// The settings the planner prices the run with (dtype, bytes per parameter, attention).
    pub config: TrainConfig,
    /// Cores of rank 0's node, and ranks on it.
    pub cores: u64,
    pub node_ranks: u64,
    pub steps: u64,
    /// The run's median step time (the steps after the first three).
    pub step_time_median_s: f64,
    /// The largest rank's peak RSS.
    pub peak_rss_bytes: f64,
    /// CPU time other guests of the host took while the steps ran (Linux `steal`).
    pub steal_share: Option<f64>,
}

/// Where the history goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryTarget {
    Off,
    File(PathBuf),
}

impl HistoryTarget {
    /// `flag` (the trainer's `--history`), else `$PIPER_HISTORY`, else the default file (see the
    /// module); `off` keeps none, and so does a system without a home folder. An empty flag or variable
    /// counts as not given (`PIPER_HISTORY= cmd` is not a file named "").
    pub fn resolve(flag: Option<&Path>) -> Self {
        Self::resolve_from(flag, std::env::var_os("PIPER_HISTORY"))
    }

    /// [`HistoryTarget::resolve`] with the variable's value given.
    fn resolve_from(flag: Option<&Path>, env: Option<std::ffi::OsString>) -> Self {
        let given = |p: &PathBuf| !p.as_os_str().is_empty();
        let chosen = flag.map(Path::to_path_buf).filter(given).or_else(|| env.map(PathBuf::from).filter(given));
        match chosen {
            Some(p) if p.as_os_str() == "off" => HistoryTarget::Off,
            Some(p) => HistoryTarget::File(p),
            None => default_path().map_or(HistoryTarget::Off, HistoryTarget::File),
        }
    }
}

/// `$XDG_DATA_HOME/piper/history.jsonl`, else `~/.local/share/piper/history.jsonl`.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("share")))?;
    Some(base.join("piper").join("history.jsonl"))
}

/// Appends `record` as one line (one `write` on a file opened for appending: lines of runs ending at
/// once do not interleave). Creates the file and its folder; refuses a path that exists and is not a
/// regular file (a device or FIFO is never written to or replaced).
pub fn append(path: &Path, record: &HistoryRecord) -> Result<()> {
    let shown = path.display().to_string();
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        return Err(Error::file(shown, "is not a regular file; pass --history FILE or --history off"));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::file(dir.display().to_string(), format!("cannot create: {e}")))?;
    }
    let mut line = serde_json::to_string(record).expect("a history record always serialises");
    line.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::file(shown.clone(), format!("cannot open for appending: {e}")))?;
    f.write_all(line.as_bytes()).map_err(|e| Error::file(shown, format!("cannot append: {e}")))
}

/// Every line of the history at `path`, oldest first. A line that is not a record is an error naming
/// its number (a history is only ever appended to by the runtime; a damaged one is worth a look).
pub fn read(path: &Path) -> Result<Vec<HistoryRecord>> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(shown.clone(), format!("cannot read: {e}")))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let at = format!("{shown} line {}", i + 1);
            let record: HistoryRecord = serde_json::from_str(l)
                .map_err(|e| Error::file(at.clone(), format!("is not a history record: {e}")))?;
            if record.version != HISTORY_VERSION {
                return Err(Error::invalid(
                    at,
                    "version",
                    format!("is {}; this piper reads version {HISTORY_VERSION}", record.version),
                ));
            }
            Ok(record)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::StageSplit;
    use crate::model::resolve_model;
    use crate::planner::price;
    use crate::platform::preset;

    /// A record of a one-rank run of `model` priced on the `frontier` preset.
    fn record(model: &str, step_s: f64, peak: f64) -> HistoryRecord {
        let spec = resolve_model(model).unwrap();
        let platform = preset("frontier").unwrap();
        let cfg = TrainConfig { micro_batch_size: 2, ..TrainConfig::new(64) };
        let layout = crate::layout::Layout { pp: 1, ep: 1, dp: 1 };
        let split = StageSplit::even(spec.num_layers, 1);
        let c = price(&spec, &platform, &layout, &cfg, crate::comm::A2aAlgo::Flat, &split).unwrap();
        HistoryRecord {
            version: HISTORY_VERSION,
            unix_time_s: 1,
            plan: RunPlan::from_candidate(&spec, &platform.name, 64, "bf16", &c),
            model: spec,
            config: cfg,
            cores: 2,
            node_ranks: 1,
            steps: 10,
            step_time_median_s: step_s,
            peak_rss_bytes: peak,
            steal_share: Some(0.0),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("piper-history-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn appended_lines_read_back_in_order() {
        let path = scratch("order").join("nested").join("history.jsonl");
        let (a, b) = (record("tiny", 0.01, 1e8), record("tiny", 0.02, 2e8));
        append(&path, &a).unwrap();
        append(&path, &b).unwrap();
        assert_eq!(read(&path).unwrap(), vec![a, b]);
    }

    #[test]
    fn a_damaged_line_is_named_by_its_number() {
        let path = scratch("damaged").join("history.jsonl");
        append(&path, &record("tiny", 0.01, 1e8)).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"\n{\"version\": 1}\n").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("history.jsonl line 3") && e.contains("missing field"), "{e}");
        let mut newer = record("tiny", 0.01, 1e8);
        newer.version = 2;
        let path = scratch("newer").join("history.jsonl");
        append(&path, &newer).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("`version` is 2"), "{e}");
    }

    #[test]
    fn a_path_that_is_not_a_regular_file_is_refused_not_replaced() {
        let dir = scratch("dir");
        std::fs::create_dir_all(&dir).unwrap();
        let e = append(&dir, &record("tiny", 0.01, 1e8)).unwrap_err().to_string();
        assert!(e.contains("is not a regular file") && e.contains("--history off"), "{e}");
        assert!(dir.is_dir());
    }

    #[test]
    fn off_keeps_none_and_a_flag_wins() {
        assert_eq!(HistoryTarget::resolve(Some(Path::new("off"))), HistoryTarget::Off);
        assert_eq!(HistoryTarget::resolve(Some(Path::new("h.jsonl"))), HistoryTarget::File("h.jsonl".into()));
        let env = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(HistoryTarget::resolve_from(None, env("e.jsonl")), HistoryTarget::File("e.jsonl".into()));
        assert_eq!(
            HistoryTarget::resolve_from(Some(Path::new("h.jsonl")), env("off")),
            HistoryTarget::File("h.jsonl".into())
        );
        assert_eq!(HistoryTarget::resolve_from(None, env("off")), HistoryTarget::Off);
    }

    /// An empty `$PIPER_HISTORY` or `--history ""` is not a path: the next source decides.
    #[test]
    fn empty_counts_as_not_given() {
        let env = |v: &str| Some(std::ffi::OsString::from(v));
        let default = HistoryTarget::resolve_from(None, None);
        assert_eq!(HistoryTarget::resolve_from(None, env("")), default);
        assert_eq!(HistoryTarget::resolve_from(Some(Path::new("")), env("off")), HistoryTarget::Off);
        assert_ne!(default, HistoryTarget::File(PathBuf::new()));
    }
}
