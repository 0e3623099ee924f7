//! The binaries `piper calibrate` launches — the trainer (`mixtral_train`) and the measuring worker
//! (`calibrate_runtime`), both built with MPI — and how: several processes at once, each a rank of its
//! own thread pool, or one launch under `mpirun` without core binding (each rank sizes its pool to the
//! cores it shares, as training ranks do).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::error::{CalibrateError, Result};

/// The one build command that makes every worker.
pub const BUILD: &str = "cargo build --release --features mpi --example mixtral_train --example calibrate_runtime";

/// Where the workers are.
#[derive(Clone, Debug)]
pub struct Workers {
    pub trainer: PathBuf,
    pub measurer: PathBuf,
    mpirun: Vec<String>,
}

/// The trainer's command line for a measurement run: each `(flag, value)` of `flags`, then
/// `--no-progress` (its output goes to a log) and `switches`.
pub fn trainer_args<'a>(flags: impl IntoIterator<Item = (&'a str, String)>, switches: &[&str]) -> Vec<String> {
    let pairs = flags.into_iter().flat_map(|(flag, value)| [flag.to_string(), value]);
    pairs.chain(["--no-progress"].iter().chain(switches).map(|s| s.to_string())).collect()
}

/// A process to start: its program, arguments and extra environment, and what it is for (for errors).
pub struct Job {
    pub what: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Workers {
    /// The workers in `dir` or `dir/examples` (cargo puts examples there), and `mpirun` on the PATH.
    pub fn find(dir: &Path) -> Result<Self> {
        let find = |name: &'static str| {
            [dir.join(name), dir.join("examples").join(name)]
                .into_iter()
                .find(|p| p.is_file())
                .ok_or_else(|| CalibrateError::MissingWorker { name, dir: dir.to_path_buf(), build: BUILD })
        };
        let (trainer, measurer) = (find("mixtral_train")?, find("calibrate_runtime")?);
        let mpirun = std::env::var_os("PATH")
            .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("mpirun")).find(|p| p.is_file()))
            .ok_or(CalibrateError::NoMpirun)?;
        let mut launcher =
            vec![mpirun.display().to_string(), "--oversubscribe".into(), "--bind-to".into(), "none".into()];
        if running_as_root() {
            launcher.push("--allow-run-as-root".into());
        }
        Ok(Workers { trainer, measurer, mpirun: launcher })
    }

    /// `program args` as `ranks` MPI ranks.
    pub fn under_mpirun(&self, what: String, ranks: u64, program: &Path, args: Vec<String>) -> Job {
        let mut all: Vec<String> = self.mpirun[1..].to_vec();
        all.extend(["-np".to_string(), ranks.to_string(), program.display().to_string()]);
        all.extend(args);
        Job { what, program: PathBuf::from(&self.mpirun[0]), args: all, env: Vec::new() }
    }
}

#[cfg(unix)]
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(not(unix))]
fn running_as_root() -> bool {
    false
}

/// Starts every job at once and waits for all of them; the first that fails is the error, with the end
/// of what it wrote to stderr (kept in `log_dir`).
pub fn run_at_once(jobs: Vec<Job>, log_dir: &Path) -> Result<()> {
    let mut running: Vec<(Job, PathBuf, Child)> = Vec::new();
    let mut failure = None;
    for (i, job) in jobs.into_iter().enumerate() {
        let log = log_dir.join(format!("worker-{i}.stderr"));
        match start(&job, &log) {
            Ok(child) => running.push((job, log, child)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    for (job, log, mut child) in running {
        let status = child.wait().map_err(|e| CalibrateError::Worker { what: job.what.clone(), why: e.to_string() });
        let failed = match status {
            Ok(s) if s.success() => None,
            Ok(s) => Some(CalibrateError::Worker { what: job.what, why: format!("{s}; it said: {}", tail(&log)) }),
            Err(e) => Some(e),
        };
        failure = failure.or(failed);
    }
    failure.map_or(Ok(()), Err)
}

fn start(job: &Job, log: &Path) -> Result<Child> {
    let stderr = std::fs::File::create(log).map_err(|e| CalibrateError::file(log, e))?;
    Command::new(&job.program)
        .args(&job.args)
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| CalibrateError::Worker { what: job.what.clone(), why: format!("{}: {e}", job.program.display()) })
}

/// The last lines of a worker's stderr, on one line.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() { "nothing".into() } else { tail.escape_debug().to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_run_takes_its_flags_then_no_progress_then_its_switches() {
        let args = trainer_args([("--steps", "8".to_string()), ("--summary", "s.json".into())], &["--profile"]);
        assert_eq!(args, ["--steps", "8", "--summary", "s.json", "--no-progress", "--profile"]);
        assert_eq!(trainer_args([], &[]), ["--no-progress"]);
    }

    #[test]
    fn a_missing_worker_names_the_build_command() {
        let dir = std::env::temp_dir().join(format!("piper-no-workers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Workers::find(&dir).unwrap_err().to_string();
        assert!(e.contains("mixtral_train not found") && e.contains(BUILD), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_worker_is_an_error_with_its_words() {
        let dir = std::env::temp_dir().join(format!("piper-failing-worker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let job = |code: &str| Job {
            what: format!("job {code}"),
            program: "sh".into(),
            args: vec!["-c".into(), format!("echo 'bad flag --x' >&2; exit {code}")],
            env: Vec::new(),
        };
        assert!(run_at_once(vec![job("0"), job("0")], &dir).is_ok());
        let e = run_at_once(vec![job("0"), job("3")], &dir).unwrap_err().to_string();
        assert!(e.starts_with("job 3:") && e.contains("bad flag --x"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
