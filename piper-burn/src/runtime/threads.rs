//! CPU threads per rank. Ranks that `mpirun` (or `srun`) starts on one host share its cores: a rank the
//! launcher bound to cores of its own gets those (`srun -c 7` → 7 threads); otherwise each rank's pool
//! gets the cores ÷ ranks on the host, instead of every rank spawning one thread per core (two ranks on
//! two cores ran four busy threads, and the planner's per-rank peak was wrong). `RAYON_NUM_THREADS` set
//! by the user wins; a single process keeps every core it may run on.

use piper_comm::launch::{host_cores, launcher_bound, local_ranks, threads_per_rank};

use super::error::{Result, RuntimeError};

/// The threads a rank runs on, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadShare {
    pub threads: usize,
    pub why: String,
}

/// The share of a rank whose affinity mask allows `cores` cores, with `local` ranks on the host (when the
/// launcher says) and `bound` when the launcher bound it; `None` when the pool keeps its default.
pub fn decide(cores: usize, local: Option<usize>, bound: bool) -> ThreadShare {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    match local.filter(|n| *n > 1) {
        Some(_) if bound => ThreadShare {
            threads: cores.max(1),
            why: format!("the {cores} core{} the launcher bound this rank to", plural(cores)),
        },
        Some(ranks) => ThreadShare {
            threads: threads_per_rank(cores, ranks),
            why: format!("{cores} core{} shared by {ranks} ranks on the host", plural(cores)),
        },
        None => ThreadShare { threads: cores.max(1), why: format!("every core this process may use ({cores})") },
    }
}

/// Sizes the global thread pool for this rank before anything uses it; returns the share (`None` when
/// `RAYON_NUM_THREADS` decides). `on_host`: the world's ranks on this host as MPI counts them
/// ([`World::local_ranks`](piper_comm::launch::World)); without it, the launcher's variables.
pub fn share_cores(on_host: Option<usize>) -> Result<Option<ThreadShare>> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return Ok(None);
    }
    let cores = host_cores();
    let local = on_host.or_else(local_ranks);
    let share = decide(cores, local, launcher_bound());
    rayon::ThreadPoolBuilder::new().num_threads(share.threads).build_global().map_err(|source| {
        RuntimeError::ThreadPool { threads: share.threads, ranks: local.unwrap_or(1), cores, source }
    })?;
    Ok(Some(share))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_rank_keeps_its_cores_and_an_unbound_one_shares_the_host() {
        assert_eq!(decide(7, Some(8), true).threads, 7, "srun -c 7 --ntasks-per-node=8");
        assert_eq!(decide(56, Some(8), false).threads, 7, "56 cores unbound, 8 ranks");
        assert_eq!(decide(2, Some(4), false).threads, 1, "oversubscribed: one thread each");
        assert_eq!(decide(16, None, false).threads, 16);
        assert_eq!(decide(16, Some(1), true).threads, 16);
        assert!(decide(7, Some(8), true).why.contains("bound"));
    }
}
