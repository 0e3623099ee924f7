//! A communicator shared by the modules and autodiff operations of one rank.
//!
//! Communicators are not `Send` (an MPI communicator belongs to its rank's thread), but Burn modules and
//! the state of autodiff operations must be. [`SharedComm`] makes that sound by checking, on every use,
//! that it is used on the thread that created it; dropped elsewhere, it leaks the communicator rather
//! than freeing it on a foreign thread.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::thread::ThreadId;

use piper_comm::Communicator;

struct Bound {
    owner: ThreadId,
    comm: ManuallyDrop<Box<dyn Communicator>>,
}

// SAFETY: the communicator is only reached through `SharedComm::get`, which refuses any thread but the
// owner, and `Drop` frees it only on the owner thread.
unsafe impl Send for Bound {}
unsafe impl Sync for Bound {}

impl Drop for Bound {
    fn drop(&mut self) {
        if std::thread::current().id() == self.owner {
            // SAFETY: dropped once, here.
            unsafe { ManuallyDrop::drop(&mut self.comm) }
        }
    }
}

/// A communicator owned by a dispatcher (and cloned into the autodiff state of its exchanges).
#[derive(Clone)]
pub struct SharedComm(Arc<Bound>);

impl SharedComm {
    /// Binds `comm` to the calling thread.
    pub fn new(comm: Box<dyn Communicator>) -> Self {
        SharedComm(Arc::new(Bound { owner: std::thread::current().id(), comm: ManuallyDrop::new(comm) }))
    }

    /// The communicator. Panics when called from another thread than the one that created it (a rank's
    /// modules are used by that rank's thread only).
    pub fn get(&self) -> &dyn Communicator {
        assert_eq!(
            std::thread::current().id(),
            self.0.owner,
            "communicator `{}` used outside the thread of its rank",
            self.0.comm.group_name()
        );
        self.0.comm.as_ref()
    }
}

impl fmt::Debug for SharedComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedComm({}, world ranks {:?})", self.0.comm.group_name(), self.0.comm.world_ranks())
    }
}
