//! # piper-comm
//!
//! The communication layer of Piper: a [`Communicator`] trait (point-to-point and collectives with
//! timeouts that name the operation, the group and the missing ranks), an in-process backend for
//! single-rank runs and tests, an MPI backend (feature `mpi`), the machine [`Topology`], and the expert
//! all-to-all algorithms — flat (MPI_Alltoallv), pairwise and HALO. The binary `piper-comm` (feature
//! `mpi`) runs the multi-rank self-test and the benchmarks (with a deduplicating dispatch); [`calibrate`]
//! measures the links and peak that `piper calibrate` starts from.

pub mod alltoall;
pub mod calibrate;
pub mod collectives;
pub mod communicator;
pub mod error;
pub mod host;
pub mod launch;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi_backend;
#[cfg(feature = "rccl")]
pub mod rccl;
pub mod schedule;
pub mod topology;

pub use alltoall::Algo;
pub use communicator::{Communicator, Pending};
pub use error::{CommError, Result};
pub use local::{LocalComm, LocalWorld};
pub use topology::{GroupNodes, Topology};
