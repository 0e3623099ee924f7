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
    _runtime: Option<Box<dyn std::any::Any>>,
}

/// Whether the environment says this process is one rank of a multi-process launch.
pub fn launched_by_mpi() -> bool {
    // OpenMPI's mpirun, and PMI launchers (MPICH, Cray's srun on Frontier).
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| s.parse::<usize>().is_ok_and(|n| n > 1)))
}

/// The world of this process.
pub fn init_world() -> Result<World> {
    if launched_by_mpi() {
        #[cfg(feature = "mpi")]
        {
            let (runtime, comm) = crate::mpi_backend::init()?;
            return Ok(World { comm: Box::new(comm), _runtime: Some(Box::new(runtime)) });
        }
        #[cfg(not(feature = "mpi"))]
        return Err(CommError::invalid(
            "launch",
            "mpi",
            "this program runs under an MPI launcher but was built without MPI; rebuild with `--features mpi`",
        ));
    }
    Ok(World { comm: Box::new(LocalComm::single()), _runtime: None })
}
