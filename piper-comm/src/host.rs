//! What the host and the launcher say about this process: the ranks started on this host, the cores
//! it may use, whether the launcher bound it to cores of its own, and so the threads a rank gets and
//! whether ranks share cores.

/// Launcher variables holding the number of ranks on this host, in order of trust (a world started with
/// MPI counts them with MPI instead: [`World::local_ranks`]).
const LOCAL_SIZE_VARS: [&str; 4] =
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"];

/// Ranks the launcher started on this host, if it says (Slurm's `4(x2)` or `4,3`: the leading count is
/// taken).
pub fn local_ranks() -> Option<usize> {
    local_ranks_in(&|name| std::env::var(name).ok())
}

/// [`local_ranks`] over an environment.
pub fn local_ranks_in(env: &dyn Fn(&str) -> Option<String>) -> Option<usize> {
    LOCAL_SIZE_VARS.iter().find_map(|var| {
        let text = env(var)?;
        let digits: String = text.trim().chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<usize>().ok().filter(|n| *n > 0)
    })
}

/// Threads each of `local_ranks` ranks on a host of `cores` cores gets: the cores shared out, at least
/// one.
pub fn threads_per_rank(cores: usize, local_ranks: usize) -> usize {
    (cores / local_ranks.max(1)).max(1)
}

/// Whether the launcher bound this rank to cores of its own, so that its affinity mask is its share:
/// OpenMPI's `mpirun` says so in `OMPI_MCA_orte_bound_at_launch`, Slurm's `srun` in
/// `SLURM_CPU_BIND_TYPE` (anything but `none`).
pub fn launcher_bound() -> bool {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    var("OMPI_MCA_orte_bound_at_launch").is_some_and(|v| v.trim() == "1")
        || var("SLURM_CPU_BIND_TYPE").is_some_and(|v| !v.trim().starts_with("none"))
}

/// The cores this process may run on (its affinity mask and the container's CPU quota).
pub fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether this host's ranks share cores: the launcher started more ranks here than the cores this
/// process may use, and did not bind each rank to cores of its own.
pub fn ranks_outnumber_cores() -> bool {
    outnumber(local_ranks(), host_cores(), launcher_bound())
}

/// [`ranks_outnumber_cores`] from the launcher's rank count on the host, the cores and the binding.
fn outnumber(local_ranks: Option<usize>, cores: usize, bound: bool) -> bool {
    !bound && local_ranks.is_some_and(|ranks| ranks > cores)
}

/// A launcher's environment made of `vars`, for the tests of what is read from it.
#[cfg(test)]
pub(crate) fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launchers_rank_counts_are_read() {
        assert_eq!(local_ranks_in(&env(&[("SLURM_STEP_TASKS_PER_NODE", "4(x2)")])), Some(4));
        assert_eq!(
            local_ranks_in(&env(&[("SLURM_STEP_TASKS_PER_NODE", "3,2"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")])),
            Some(2)
        );
        assert_eq!(local_ranks_in(&env(&[("SLURM_NTASKS_PER_NODE", "x")])), None);
    }

    #[test]
    fn ranks_outnumber_the_cores_only_unbound_and_beyond_them() {
        assert!(outnumber(Some(4), 2, false));
        assert!(!outnumber(Some(2), 2, false), "a core each");
        assert!(!outnumber(Some(8), 1, true), "bound: the mask is the rank's own share");
        assert!(!outnumber(None, 1, false), "one process, no launcher");
    }

    #[test]
    fn ranks_share_the_cores() {
        assert_eq!(threads_per_rank(2, 2), 1);
        assert_eq!(threads_per_rank(16, 4), 4);
        assert_eq!(threads_per_rank(2, 4), 1, "oversubscribed hosts still get one thread per rank");
        assert_eq!(threads_per_rank(8, 3), 2);
    }
}
