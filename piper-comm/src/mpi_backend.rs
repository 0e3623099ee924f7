//! MPI backend (feature `mpi`): rsmpi for start-up and communicator splits, and MPI's nonblocking calls
//! (MPI_Isend/Irecv, MPI_Ialltoallv, MPI_Iallreduce) through `mpi::ffi` for everything that waits, so
//! every wait is a poll with a deadline. Buffers are owned by the pending operation; one abandoned after
//! a timeout is leaked on purpose (MPI may still write into it) and the communicator is poisoned.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::Communicator as _;

use crate::collectives::{displacements, split_members};
use crate::communicator::{Communicator, Pending, check_peer, timeout_error};
use crate::error::{CommError, Result};

/// Default timeout of MPI communicators (override with `PIPER_COMM_TIMEOUT_S`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Keeps MPI initialised; finalises on drop.
pub struct MpiRuntime {
    _universe: mpi::environment::Universe,
}

// SAFETY: the runtime guard only finalises MPI on drop; it is created and dropped on the main thread.
unsafe impl Send for MpiRuntime {}

/// One rank's view of an MPI communicator.
pub struct MpiComm {
    comm: SimpleCommunicator,
    name: String,
    world_ranks: Vec<usize>,
    timeout: Duration,
    poisoned: RefCell<Option<String>>,
}

/// Initialises MPI and returns the runtime guard and the world communicator.
/// MPI started: the runtime to keep alive, the world, and the world's ranks on this host (MPI's own
/// count, `MPI_Comm_split_type` with `MPI_COMM_TYPE_SHARED`, whatever the launcher's variables say).
pub fn init() -> Result<(MpiRuntime, MpiComm, usize)> {
    let universe =
        mpi::initialize().ok_or_else(|| CommError::invalid("MPI_Init", "mpi", "MPI was already initialised"))?;
    let world = universe.world();
    // Errors come back as codes (a truncated receive is reported, not an abort of the job).
    // SAFETY: the world communicator is valid after MPI_Init; the handler is a predefined one.
    check("MPI_Comm_set_errhandler", unsafe {
        mpi::ffi::MPI_Comm_set_errhandler(world.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN)
    })?;
    let size = world.size() as usize;
    let on_host = world.split_shared(world.rank()).size() as usize;
    let timeout = crate::communicator::timeout_from_env()?.unwrap_or(DEFAULT_TIMEOUT);
    let comm = MpiComm {
        comm: world,
        name: "world".into(),
        world_ranks: (0..size).collect(),
        timeout,
        poisoned: RefCell::new(None),
    };
    Ok((MpiRuntime { _universe: universe }, comm, on_host))
}

fn check(op: &str, code: c_int) -> Result<()> {
    if code == 0 { Ok(()) } else { Err(CommError::Mpi { op: op.into(), code }) }
}

fn to_c_int(op: &str, field: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| {
        CommError::invalid(op, field, format!("{v} bytes exceed MPI's 2^31 − 1 count limit; split the transfer"))
    })
}

/// An outstanding MPI request and the buffer it owns.
struct MpiPending {
    req: mpi::ffi::MPI_Request,
    buf: Vec<u8>,
    peer: usize,
    done: bool,
    recv: bool,
    /// A point-to-point receive: its status carries the message length, checked against `buf`.
    p2p_recv: bool,
}

impl MpiPending {
    fn test_raw(&mut self) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        let mut status = MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
        // SAFETY: `req` is a live request created by this module; MPI_Test completes or leaves it.
        let code = unsafe { mpi::ffi::MPI_Test(&mut self.req, &mut flag, status.as_mut_ptr()) };
        if code != 0 && self.p2p_recv {
            // The communicator returns errors (MPI_ERRORS_RETURN): a message longer than the posted
            // receive is MPI_ERR_TRUNCATE, reported instead of aborting the job.
            self.done = true;
            return Err(self.length_error(None, code));
        }
        check("MPI_Test", code)?;
        self.done = flag != 0;
        if self.done && self.p2p_recv {
            let mut count: c_int = 0;
            // SAFETY: the request completed, so `status` was written by MPI_Test.
            check("MPI_Get_count", unsafe {
                mpi::ffi::MPI_Get_count(status.as_ptr(), mpi::ffi::RSMPI_UINT8_T, &mut count)
            })?;
            if count as usize != self.buf.len() {
                return Err(self.length_error(Some(count as usize), 0));
            }
        }
        Ok(self.done)
    }

    /// A received message whose length differs from the posted receive: the ranks disagree on a size.
    fn length_error(&self, got: Option<usize>, code: c_int) -> CommError {
        let got = got.map_or_else(|| format!("more (MPI error {code}, truncated)"), |n| n.to_string());
        CommError::invalid(
            "MPI receive",
            "len",
            format!(
                "expected {} bytes from group rank {}, got {got}; the ranks disagree on a message size (do they run the same configuration?)",
                self.buf.len(),
                self.peer
            ),
        )
    }
}

impl Drop for MpiPending {
    fn drop(&mut self) {
        if !self.done {
            // Dropped while MPI may still use the buffer (an error cut a wait short): leak it.
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

impl Pending for MpiPending {
    fn peer(&self) -> usize {
        self.peer
    }
    fn test(&mut self) -> Result<bool> {
        self.test_raw()
    }
    fn into_data(mut self: Box<Self>) -> Vec<u8> {
        if self.recv { std::mem::take(&mut self.buf) } else { Vec::new() }
    }
    fn abandon(self: Box<Self>) {
        // MPI may still read or write the buffer: `drop` leaks it while the request is incomplete.
    }
}

impl MpiComm {
    fn raw(&self) -> mpi::ffi::MPI_Comm {
        self.comm.as_raw()
    }

    /// Polls a collective request until done or the deadline; on timeout the buffers are leaked.
    fn wait_collective(&self, mut p: MpiPending, keep_alive: Vec<Vec<c_int>>, op: &str) -> Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let mut idle = crate::communicator::Idle::new();
        while !p.test_raw()? {
            if Instant::now() >= deadline {
                std::mem::forget(keep_alive);
                Box::new(p).abandon();
                self.poison(op);
                return Err(timeout_error(self, op, Vec::new()));
            }
            idle.pause();
        }
        drop(keep_alive);
        Ok(std::mem::take(&mut p.buf))
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
    fn size(&self) -> usize {
        self.comm.size() as usize
    }
    fn group_name(&self) -> &str {
        &self.name
    }
    fn world_ranks(&self) -> &[usize] {
        &self.world_ranks
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn isend(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<Box<dyn Pending>> {
        self.check_usable()?;
        check_peer(self, dest, "MPI_Isend")?;
        let mut p = MpiPending {
            req: unsafe { mpi::ffi::RSMPI_REQUEST_NULL },
            buf: data,
            peer: dest,
            done: false,
            recv: false,
            p2p_recv: false,
        };
        let len = to_c_int("MPI_Isend", "data", p.buf.len())?;
        // SAFETY: the buffer is owned by `p` (heap, does not move) until the request completes or is leaked.
        check("MPI_Isend", unsafe {
            mpi::ffi::MPI_Isend(
                p.buf.as_ptr().cast(),
                len,
                mpi::ffi::RSMPI_UINT8_T,
                dest as c_int,
                tag as c_int,
                self.raw(),
                &mut p.req,
            )
        })?;
        Ok(Box::new(p))
    }

    fn irecv(&self, src: usize, tag: u32, len: usize) -> Result<Box<dyn Pending>> {
        self.check_usable()?;
        check_peer(self, src, "MPI_Irecv")?;
        let mut p = MpiPending {
            req: unsafe { mpi::ffi::RSMPI_REQUEST_NULL },
            buf: vec![0u8; len],
            peer: src,
            done: false,
            recv: true,
            p2p_recv: true,
        };
        let count = to_c_int("MPI_Irecv", "len", len)?;
        // SAFETY: as for MPI_Isend.
        check("MPI_Irecv", unsafe {
            mpi::ffi::MPI_Irecv(
                p.buf.as_mut_ptr().cast(),
                count,
                mpi::ffi::RSMPI_UINT8_T,
                src as c_int,
                tag as c_int,
                self.raw(),
                &mut p.req,
            )
        })?;
        Ok(Box::new(p))
    }

    fn split(&self, color: u64, key: u64, name: &str) -> Result<Box<dyn Communicator>> {
        let op = format!("split into `{name}`");
        let color_i = to_c_int(&op, "color", color as usize)?;
        let key_i = to_c_int(&op, "key", key as usize)?;
        // Members and their world ranks, computed like MPI_Comm_split orders them: by (key, rank).
        let members = split_members(self, color, key, name)?;
        let comm = self
            .comm
            .split_by_color_with_key(Color::with_value(color_i), key_i)
            .ok_or_else(|| CommError::invalid(&op, "color", "MPI returned no communicator"))?;
        Ok(Box::new(MpiComm {
            comm,
            name: name.to_string(),
            world_ranks: members.iter().map(|r| self.world_ranks[*r]).collect(),
            timeout: self.timeout,
            poisoned: RefCell::new(None),
        }))
    }

    fn poison(&self, op: &str) {
        *self.poisoned.borrow_mut() = Some(op.to_string());
    }

    fn check_usable(&self) -> Result<()> {
        match &*self.poisoned.borrow() {
            Some(op) => Err(CommError::Poisoned { group: self.name.clone(), op: op.clone() }),
            None => Ok(()),
        }
    }

    /// MPI_Ialltoallv on bytes, polled with the timeout (the count exchange before it found every rank).
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        op: &str,
    ) -> Result<Vec<u8>> {
        self.check_usable()?;
        crate::collectives::check_counts(op, send.len(), send_counts, self.size())?;
        let conv = |v: &[usize], field: &str| v.iter().map(|x| to_c_int(op, field, *x)).collect::<Result<Vec<c_int>>>();
        let scounts = conv(send_counts, "send_counts")?;
        let sdispl = conv(&displacements(send_counts), "send displacements")?;
        let rcounts = conv(recv_counts, "recv_counts")?;
        let rdispl = conv(&displacements(recv_counts), "recv displacements")?;
        // One spare byte each: distinct allocations even when empty (MPI rejects sendbuf == recvbuf).
        let mut send_buf = Vec::with_capacity(send.len() + 1);
        send_buf.extend_from_slice(send);
        send_buf.push(0);
        let total: usize = recv_counts.iter().sum();
        let mut p = MpiPending {
            req: unsafe { mpi::ffi::RSMPI_REQUEST_NULL },
            buf: vec![0u8; total + 1],
            peer: 0,
            done: false,
            recv: true,
            p2p_recv: false,
        };
        // SAFETY: every buffer and count array is owned here and kept alive (or leaked) until completion.
        check("MPI_Ialltoallv", unsafe {
            mpi::ffi::MPI_Ialltoallv(
                send_buf.as_ptr().cast(),
                scounts.as_ptr(),
                sdispl.as_ptr(),
                mpi::ffi::RSMPI_UINT8_T,
                p.buf.as_mut_ptr().cast(),
                rcounts.as_ptr(),
                rdispl.as_ptr(),
                mpi::ffi::RSMPI_UINT8_T,
                self.raw(),
                &mut p.req,
            )
        })?;
        let out = self.wait_collective(p, vec![scounts, sdispl, rcounts, rdispl], op);
        match out {
            Ok(mut v) => {
                v.truncate(total);
                Ok(v)
            }
            Err(e) => {
                std::mem::forget(send_buf);
                Err(e)
            }
        }
    }

    /// MPI_Iallreduce (sum) after an arrival check, polled with the timeout.
    fn all_reduce_sum_f32(&self, data: &mut [f32], op: &str) -> Result<()> {
        crate::collectives::barrier(self, &format!("{op} (arrival)"))?;
        let count = to_c_int(op, "data", data.len())?;
        let send: Vec<f32> = data.to_vec();
        let mut p = MpiPending {
            req: unsafe { mpi::ffi::RSMPI_REQUEST_NULL },
            buf: vec![0u8; data.len() * 4],
            peer: 0,
            done: false,
            recv: true,
            p2p_recv: false,
        };
        // SAFETY: buffers owned here until completion (or leaked on timeout).
        check("MPI_Iallreduce", unsafe {
            mpi::ffi::MPI_Iallreduce(
                send.as_ptr().cast(),
                p.buf.as_mut_ptr().cast(),
                count,
                mpi::ffi::RSMPI_FLOAT,
                mpi::ffi::RSMPI_SUM,
                self.raw(),
                &mut p.req,
            )
        })?;
        match self.wait_collective(p, Vec::new(), op) {
            Ok(bytes) => {
                data.copy_from_slice(&crate::collectives::from_bytes::<f32>(&bytes));
                Ok(())
            }
            Err(e) => {
                std::mem::forget(send);
                Err(e)
            }
        }
    }
}
