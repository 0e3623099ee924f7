//! Communication errors: every one names the operation, the group and the ranks involved.

use std::time::Duration;

pub type Result<T> = std::result::Result<T, CommError>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// A blocking operation did not complete in time. `missing` are world ranks that never took part
    /// (empty for a native collective, where MPI does not say which members have not joined).
    #[error(
        "{op} on group `{group}` (world ranks {members:?}) timed out after {timeout:?} on world rank {me}: {}",
        missing_text(missing)
    )]
    Timeout { op: String, group: String, members: Vec<usize>, me: usize, missing: Vec<usize>, timeout: Duration },
    /// A previous timeout left this communicator unusable (an MPI request is still outstanding).
    #[error(
        "group `{group}` is unusable after an earlier timeout in {op}; end the job (MPI cannot cancel collectives)"
    )]
    Poisoned { group: String, op: String },
    /// Arguments that cannot work (counts, buffer sizes, ranks).
    #[error("{op}: `{field}` {why}")]
    Invalid { op: String, field: String, why: String },
    /// The MPI library returned an error code.
    #[error("{op}: MPI error {code}")]
    Mpi { op: String, code: i32 },
    /// A peer of an in-process world is gone (its thread ended).
    #[error("{op} on group `{group}`: world rank {peer} has exited")]
    PeerGone { op: String, group: String, peer: usize },
}

fn missing_text(missing: &[usize]) -> String {
    if missing.is_empty() {
        // MPI's non-blocking collectives do not say which members have not joined.
        "the collective did not complete (MPI cannot tell which ranks have not joined: look for ranks that did not report this operation)".into()
    } else {
        format!("still waiting for world ranks {missing:?}")
    }
}

impl CommError {
    pub fn invalid(op: &str, field: &str, why: impl Into<String>) -> Self {
        CommError::Invalid { op: op.into(), field: field.into(), why: why.into() }
    }
}
