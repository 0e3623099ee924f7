//! Starting a job: the MPI world when the program runs under `mpirun` / `srun` (and was built with the
//! `mpi` feature), a single in-process rank otherwise.

use crate::communicator::Communicator;
#[cfg(not(feature = "mpi"))]
use crate::error::CommError;
use crate::error::Result;
use crate::local::LocalComm;

pub use crate::host::{host_cores, launcher_bound, local_ranks, local_ranks_in, threads_per_rank};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::env;

    #[test]
    fn launches_are_recognised_by_their_launchers_variables() {
        assert!(launched_by_mpi_in(&env(&[("OMPI_COMM_WORLD_SIZE", "4")])));
        assert!(launched_by_mpi_in(&env(&[("PMI_SIZE", "2")])));
        assert!(launched_by_mpi_in(&env(&[("PMIX_RANK", "0"), ("SLURM_STEP_NUM_TASKS", "2")])), "srun --mpi=pmix");
        assert!(!launched_by_mpi_in(&env(&[("PMIX_RANK", "0"), ("SLURM_STEP_NUM_TASKS", "1")])));
        assert!(!launched_by_mpi_in(&env(&[("SLURM_NTASKS", "8")])), "a batch script is not a rank");
        assert!(!launched_by_mpi_in(&env(&[("OMPI_COMM_WORLD_SIZE", "1")])));
    }
}
