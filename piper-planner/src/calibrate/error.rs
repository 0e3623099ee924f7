//! What can stop a calibration, each naming the binary, file or setting and the fix.

use std::path::PathBuf;

/// Calibration result.
pub type Result<T> = std::result::Result<T, CalibrateError>;

#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// A worker binary is not built (or not where `--bin-dir` says).
    #[error("{name} not found in {dir} or {dir}/examples; build the workers with `{build}` (or pass --bin-dir)")]
    MissingWorker { name: &'static str, dir: PathBuf, build: &'static str },
    /// No MPI launcher on the PATH.
    #[error("mpirun not found on the PATH; install OpenMPI (scripts/test-mpi.sh does) and retry")]
    NoMpirun,
    /// A worker could not start, or ended with an error.
    #[error("{what}: {why}")]
    Worker { what: String, why: String },
    /// The work folder or the output could not be written or read.
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    /// The planner refused a measurement or a fit.
    #[error(transparent)]
    Planner(#[from] crate::Error),
}

impl CalibrateError {
    pub fn file(path: impl Into<PathBuf>, why: impl std::fmt::Display) -> Self {
        CalibrateError::File { path: path.into(), why: why.to_string() }
    }
}
