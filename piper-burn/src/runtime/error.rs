//! The runtime's errors. Every message is one line a user can act on: it names the job's field (a run
//! configuration, layout or checkpoint field, `resume`, `init_hf`), the file or the rank, and what would
//! fix it; the command line names its flags instead ([`cli::as_flags`](super::cli::as_flags)). Binaries
//! print it after `error: `.

use crate::corpus::DataError;
use crate::hf::state_dict::StateDictError;
use crate::model::Unsupported;
use crate::moe::dispatcher::PlacementError;

/// Runtime result.
pub type Result<T> = std::result::Result<T, RuntimeError>;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An input that cannot work — a flag, a run-configuration or plan field, a model/plan/data
    /// mismatch: `field` names it, `why` says what is wrong and what would work.
    #[error("{field} {why}")]
    Invalid { field: String, why: String },
    /// A file or folder a field or flag points at (`checkpoint.dir`, `init_hf`, `resume`, `--metrics`,
    /// `--summary`) that cannot be used.
    #[error("{flag} {path}: {why}")]
    File { flag: &'static str, path: String, why: String },
    /// An error of what a field or flag named, prefixed by it (`plan FILE`, `resume DIR`, `init_hf DIR`).
    #[error("{flag} {source}")]
    Flag { flag: &'static str, source: Box<RuntimeError> },
    #[error(transparent)]
    Planner(#[from] piper_planner::Error),
    #[error(transparent)]
    Comm(#[from] piper_comm::CommError),
    #[error(transparent)]
    Model(#[from] Unsupported),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error(transparent)]
    StateDict(#[from] StateDictError),
    /// The loss of a step is not a finite number.
    #[error("step {step}: the loss is {loss}; lower the learning rate")]
    Diverged { step: usize, loss: f64 },
    /// The global gradient norm is not a finite number.
    #[error("the gradient norm is {norm}; lower the learning rate")]
    GradientNorm { norm: f64 },
    /// Saving the checkpoint of `step` failed (every rank reports it).
    #[error("checkpoint at step {step}: {source}")]
    Checkpoint { step: u64, source: Box<RuntimeError> },
    /// A collective step failed on another rank, whose own error names the cause.
    #[error("{what} failed on another rank (its error names the cause)")]
    PeerFailed { what: String },
    /// A rank's shard of a checkpoint could not be written there.
    #[error("rank {rank} could not write its shard: {why}")]
    PeerShard { rank: usize, why: String },
    /// Expert migration of one MoE layer could not be decided.
    #[error("expert migration of MoE layer {layer}: {source}")]
    Migration { layer: usize, source: piper_planner::Error },
    /// Migration tags `TAG_BASE + expert` would leave the communicator's tag space.
    #[error("expert migration: {experts} experts exceed the {tags} message tags")]
    MigrationTags { experts: usize, tags: u32 },
    /// Ranks that would run something else than rank 0 (the fingerprint of `field` differs).
    #[error(
        "ranks disagree before the start: the {field} of world rank(s) {ranks:?} differs from rank 0's; every rank must run the same command, model and plan"
    )]
    RanksDisagree { field: String, ranks: Vec<usize> },
    /// The device sums a micro-batch's tokens wrong (Burn/CubeCL on lavapipe stop at 65 532 rows).
    #[error(
        "this device's reductions are wrong over {rows} rows: summing {rows} ones gave {got} (Burn/CubeCL on \
         wgpu through lavapipe stop at 65 532). A micro-batch here has {tokens} tokens per rank, and the \
         loss, the load-balancing loss and the norm gradients reduce over them, so training would be \
         silently wrong: lower --batch-size or --seq-len, or raise --micro-batches, to at most 65 532 \
         tokens per micro-batch per rank, or train on the CPU (--backend flex)"
    )]
    WrongReductions { rows: usize, got: f32, tokens: usize },
    /// The thread pool was started before this rank could size it.
    #[error(
        "cannot size the thread pool to {threads} threads per rank ({ranks} ranks on {cores} cores): {source}; set RAYON_NUM_THREADS instead"
    )]
    ThreadPool { threads: usize, ranks: usize, cores: usize, source: rayon::ThreadPoolBuildError },
    /// The backend could not hand a tensor back to the host.
    #[error("{what}: {why}")]
    Device { what: &'static str, why: String },
    /// A JSON document the runtime writes or exchanges could not be formed or read.
    #[error("{what}: {source}")]
    Json { what: &'static str, source: serde_json::Error },
    /// A broken invariant of the executor (a schedule that does not fit its instructions).
    #[error("{0}")]
    Internal(&'static str),
}

impl RuntimeError {
    pub fn invalid(field: impl Into<String>, why: impl Into<String>) -> Self {
        RuntimeError::Invalid { field: field.into(), why: why.into() }
    }

    pub fn file(flag: &'static str, path: &std::path::Path, why: impl std::fmt::Display) -> Self {
        RuntimeError::File { flag, path: path.display().to_string(), why: why.to_string() }
    }

    /// `self`, prefixed by the flag that named what failed.
    pub fn under(self, flag: &'static str) -> Self {
        RuntimeError::Flag { flag, source: Box::new(self) }
    }

    /// A backend's error reading `what` back to the host.
    pub fn device(what: &'static str, e: impl std::fmt::Debug) -> Self {
        RuntimeError::Device { what, why: format!("{e:?}") }
    }

    pub fn json(what: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| RuntimeError::Json { what, source }
    }
}

/// The values of a float tensor on the host, as f32.
pub(crate) fn host_f32<const D: usize>(t: burn::tensor::Tensor<D>, what: &'static str) -> Result<Vec<f32>> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().map_err(|e| RuntimeError::device(what, e))
}
