//! CPU threads per rank. Ranks that `mpirun` (or `srun`) starts on one host share its cores: a rank the
//! launcher bound to cores of its own gets those (`srun -c 7` → 7 threads); otherwise each rank's pool
//! gets the cores ÷ ranks on the host, instead of every rank spawning one thread per core (two ranks on
//! two cores ran four busy threads, and the planner's per-rank peak was wrong). `RAYON_NUM_THREADS` set
//! by the user wins; a single process keeps every core it may run on.
//!
//! The calling thread is one of the pool's threads ([`rank_pool`]): a one-thread rank computes on its
//! main thread, with no hand-off to a worker per kernel and one malloc arena, so its peak memory does
//! not depend on which thread freed a buffer last.

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
    let cores = host_cores();
    let local = on_host.or_else(local_ranks);
    let user_set = std::env::var_os("RAYON_NUM_THREADS").is_some();
    let share = decide(cores, local, launcher_bound());
    // `0` lets rayon read RAYON_NUM_THREADS.
    let threads = if user_set { 0 } else { share.threads };
    rank_pool(threads).map_err(|source| RuntimeError::ThreadPool {
        threads: share.threads,
        ranks: local.unwrap_or(1),
        cores,
        source,
    })?;
    Ok((!user_set).then_some(share))
}

/// Builds the global pool with `threads` threads (`0`: as `RAYON_NUM_THREADS` says, else one per core),
/// the calling thread among them. Call it from the thread that drives the rank, before anything uses
/// the pool; that thread must outlive the pool's use (a rank's main thread does).
pub fn rank_pool(threads: usize) -> std::result::Result<(), rayon::ThreadPoolBuildError> {
    pool_builder(threads).build_global()
}

fn pool_builder(threads: usize) -> rayon::ThreadPoolBuilder {
    rayon::ThreadPoolBuilder::new().num_threads(threads).use_current_thread()
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

    #[test]
    fn a_one_thread_rank_computes_on_the_thread_that_drives_it() {
        use rayon::prelude::*;
        std::thread::spawn(|| {
            let pool = pool_builder(1).build().unwrap();
            let driver = std::thread::current().id();
            let ran_on: Vec<_> =
                pool.install(|| (0..256).into_par_iter().map(|_| std::thread::current().id()).collect());
            assert_eq!(pool.current_num_threads(), 1);
            assert_eq!(pool.current_thread_index(), Some(0), "the driving thread is the pool's thread 0");
            assert!(ran_on.iter().all(|t| *t == driver), "no hand-off to a worker thread");
        })
        .join()
        .unwrap();
    }
}
