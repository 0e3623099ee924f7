//! CPU threads per rank. Ranks that `mpirun` (or `srun`) starts on one host share its cores: each rank's
//! thread pool gets cores ÷ ranks on the host, instead of every rank spawning one thread per core (two
//! ranks on two cores ran four busy threads, slowing each step and making the planner's per-rank peak
//! wrong). `RAYON_NUM_THREADS` set by the user wins; a single process keeps every core.

/// Launcher variables holding the number of ranks on this host, in order of trust.
const LOCAL_SIZE_VARS: [&str; 3] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"];

/// Threads each of `local_ranks` ranks on a host of `cores` cores gets (at least one).
pub fn threads_per_rank(cores: usize, local_ranks: usize) -> usize {
    (cores / local_ranks.max(1)).max(1)
}

/// Ranks on this host according to the launcher, if it says (`SLURM_NTASKS_PER_NODE` may read `4(x2)`:
/// its leading count is taken).
fn local_ranks() -> Option<usize> {
    LOCAL_SIZE_VARS.iter().find_map(|var| {
        let text = std::env::var(var).ok()?;
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<usize>().ok().filter(|n| *n > 0)
    })
}

/// Sizes the global thread pool for this rank before anything uses it; returns the threads chosen, or
/// `None` when the pool is left as it is (one rank on the host, or `RAYON_NUM_THREADS` given).
pub fn share_cores() -> Result<Option<usize>, String> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return Ok(None);
    }
    let Some(local) = local_ranks().filter(|n| *n > 1) else { return Ok(None) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = threads_per_rank(cores, local);
    rayon::ThreadPoolBuilder::new().num_threads(n).build_global().map_err(|e| {
        format!("cannot size the thread pool to {n} threads per rank ({local} ranks on {cores} cores): {e}; set RAYON_NUM_THREADS instead")
    })?;
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_the_cores() {
        assert_eq!(threads_per_rank(2, 2), 1);
        assert_eq!(threads_per_rank(16, 4), 4);
        assert_eq!(threads_per_rank(2, 4), 1, "oversubscribed hosts still get one thread per rank");
        assert_eq!(threads_per_rank(8, 3), 2);
    }
}
