//! CPU threads per rank. Ranks that `mpirun` (or `srun`) starts on one host share its cores: each rank's
//! thread pool gets cores ÷ ranks on the host, instead of every rank spawning one thread per core (two
//! ranks on two cores ran four busy threads, and the planner's per-rank peak was wrong). `RAYON_NUM_THREADS`
//! set by the user wins; a single process keeps every core.

use piper_comm::launch::{host_cores, local_ranks, threads_per_rank};

use super::error::{Result, RuntimeError};

/// Sizes the global thread pool for this rank before anything uses it; returns the threads chosen, or
/// `None` when the pool is left as it is (one rank on the host, or `RAYON_NUM_THREADS` given).
pub fn share_cores() -> Result<Option<usize>> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return Ok(None);
    }
    let Some(local) = local_ranks().filter(|n| *n > 1) else { return Ok(None) };
    let cores = host_cores();
    let n = threads_per_rank(cores, local);
    rayon::ThreadPoolBuilder::new().num_threads(n).build_global().map_err(|source| RuntimeError::ThreadPool {
        threads: n,
        ranks: local,
        cores,
        source,
    })?;
    Ok(Some(n))
}
