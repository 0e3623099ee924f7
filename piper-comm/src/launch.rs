//! Starting a job: the MPI world when the program runs under `mpirun` / `srun` (and was built with the
//! `mpi` feature), a single in-process rank otherwise.

use crate::communicator::Communicator;
#[cfg(not(feature = "mpi"))]
use crate::error::CommError;
use crate::error::Result;
use crate::local::LocalComm;

/// The job's world communicator and whatever keeps its runtime alive.
pub struct World {
    pub comm: Box<dyn Communicator>,
    /// The world's ranks on this host, as MPI counts them (`None`: one process, no MPI).
    pub local_ranks: Option<usize>,
    _runtime: Option<Box<dyn std::any::Any>>,
}

/// Whether the environment says this process is one rank of a multi-process launch.
pub fn launched_by_mpi() -> bool {
    launched_by_mpi_in(&|name| std::env::var(name).ok())
}

/// [`launched_by_mpi`] over an environment: OpenMPI's `mpirun` (`OMPI_COMM_WORLD_SIZE`), PMI launchers
/// (`PMI_SIZE`: MPICH, Cray's `srun` on Frontier), and PMIx launchers, which give each rank
/// `PMIX_RANK` but no size (`srun --mpi=pmix`: the step's task count is `SLURM_STEP_NUM_TASKS`).
pub fn launched_by_mpi_in(env: &dyn Fn(&str) -> Option<String>) -> bool {
    let more_than_one = |name: &str| env(name).is_some_and(|s| s.trim().parse::<usize>().is_ok_and(|n| n > 1));
    more_than_one("OMPI_COMM_WORLD_SIZE")
        || more_than_one("PMI_SIZE")
        || (env("PMIX_RANK").is_some() && (more_than_one("SLURM_STEP_NUM_TASKS") || more_than_one("SLURM_NTASKS")))
}

/// The world of this process.
pub fn init_world() -> Result<World> {
    if launched_by_mpi() {
        #[cfg(feature = "mpi")]
        {
            let (runtime, comm, on_host) = crate::mpi_backend::init()?;
            return Ok(World { comm: Box::new(comm), local_ranks: Some(on_host), _runtime: Some(Box::new(runtime)) });
        }
        #[cfg(not(feature = "mpi"))]
        return Err(CommError::invalid(
            "launch",
            "mpi",
            "this program runs under an MPI launcher but was built without MPI; rebuild with `--features mpi`",
        ));
    }
    Ok(World { comm: Box::new(LocalComm::single()), local_ranks: None, _runtime: None })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launches_are_recognised_by_their_launchers_variables() {
        assert!(launched_by_mpi_in(&env(&[("OMPI_COMM_WORLD_SIZE", "4")])));
        assert!(launched_by_mpi_in(&env(&[("PMI_SIZE", "2")])));
        assert!(launched_by_mpi_in(&env(&[("PMIX_RANK", "0"), ("SLURM_STEP_NUM_TASKS", "2")])), "srun --mpi=pmix");
        assert!(!launched_by_mpi_in(&env(&[("PMIX_RANK", "0"), ("SLURM_STEP_NUM_TASKS", "1")])));
        assert!(!launched_by_mpi_in(&env(&[("SLURM_NTASKS", "8")])), "a batch script is not a rank");
        assert!(!launched_by_mpi_in(&env(&[("OMPI_COMM_WORLD_SIZE", "1")])));
        assert_eq!(local_ranks_in(&env(&[("SLURM_STEP_TASKS_PER_NODE", "4(x2)")])), Some(4));
        assert_eq!(
            local_ranks_in(&env(&[("SLURM_STEP_TASKS_PER_NODE", "3,2"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")])),
            Some(2)
        );
        assert_eq!(local_ranks_in(&env(&[("SLURM_NTASKS_PER_NODE", "x")])), None);
    }

    #[test]
    fn ranks_share_the_cores() {
        assert_eq!(threads_per_rank(2, 2), 1);
        assert_eq!(threads_per_rank(16, 4), 4);
        assert_eq!(threads_per_rank(2, 4), 1, "oversubscribed hosts still get one thread per rank");
        assert_eq!(threads_per_rank(8, 3), 2);
    }
}
