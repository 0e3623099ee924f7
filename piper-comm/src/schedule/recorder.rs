//! A communicator that records what an algorithm does, in program order, per rank: every send and
//! receive posted (peer, tag, bytes), every native all-to-all, and every wait with its groups and what is
//! posted when each group arrives (the dependencies of HALO's forwarding of whatever arrives first).

use std::cell::{Cell, RefCell};
use std::time::Duration;

use crate::communicator::{Communicator, Pending, WaitEvent};
use crate::error::{CommError, Result};

/// One recorded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    Send {
        id: u64,
        peer: usize,
        tag: u32,
        bytes: usize,
    },
    Recv {
        id: u64,
        peer: usize,
        tag: u32,
        bytes: usize,
    },
    /// The backend's native variable all-to-all: bytes to and from each rank.
    AllToAll {
        send: Vec<usize>,
        recv: Vec<usize>,
    },
    /// A wait over groups of operations (`None`: an operation that was not recorded).
    WaitBegin(Vec<Vec<Option<u64>>>),
    /// Group g of the current wait arrived; what follows until the next wait event is posted because of it.
    Arrived(usize),
    WaitEnd,
}

/// Records every operation an algorithm runs on `inner`. Splitting is refused (a recorded algorithm must
/// work on the communicator it was given, or its sub-communicators' messages would be missed).
pub struct Recorder<C> {
    inner: C,
    ops: RefCell<Vec<Recorded>>,
    next: Cell<u64>,
}

impl<C: Communicator> Recorder<C> {
    pub fn new(inner: C) -> Self {
        Recorder { inner, ops: RefCell::new(Vec::new()), next: Cell::new(0) }
    }

    /// The operations recorded, in program order.
    pub fn into_recorded(self) -> Vec<Recorded> {
        self.ops.into_inner()
    }

    fn id(&self) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        id
    }
}

struct Traced {
    id: u64,
    inner: Box<dyn Pending>,
}

impl Pending for Traced {
    fn peer(&self) -> usize {
        self.inner.peer()
    }
    fn test(&mut self) -> Result<bool> {
        self.inner.test()
    }
    fn into_data(self: Box<Self>) -> Vec<u8> {
        self.inner.into_data()
    }
    fn abandon(self: Box<Self>) {
        self.inner.abandon()
    }
    fn schedule_id(&self) -> Option<u64> {
        Some(self.id)
    }
}

impl<C: Communicator> Communicator for Recorder<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn group_name(&self) -> &str {
        self.inner.group_name()
    }
    fn world_ranks(&self) -> &[usize] {
        self.inner.world_ranks()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
    fn isend(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<Box<dyn Pending>> {
        let id = self.id();
        self.ops.borrow_mut().push(Recorded::Send { id, peer: dest, tag, bytes: data.len() });
        Ok(Box::new(Traced { id, inner: self.inner.isend(dest, tag, data)? }))
    }
    fn irecv(&self, src: usize, tag: u32, len: usize) -> Result<Box<dyn Pending>> {
        let id = self.id();
        self.ops.borrow_mut().push(Recorded::Recv { id, peer: src, tag, bytes: len });
        Ok(Box::new(Traced { id, inner: self.inner.irecv(src, tag, len)? }))
    }
    fn split(&self, _color: u64, _key: u64, name: &str) -> Result<Box<dyn Communicator>> {
        Err(CommError::invalid(
            "schedule recording",
            "split",
            format!("`{}`: an algorithm that splits its communicator cannot be recorded", name.escape_debug()),
        ))
    }
    fn poison(&self, op: &str) {
        self.inner.poison(op)
    }
    fn check_usable(&self) -> Result<()> {
        self.inner.check_usable()
    }
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        op: &str,
    ) -> Result<Vec<u8>> {
        self.ops.borrow_mut().push(Recorded::AllToAll { send: send_counts.to_vec(), recv: recv_counts.to_vec() });
        self.inner.all_to_all_v_bytes(send, send_counts, recv_counts, op)
    }
    fn all_reduce_sum_f32(&self, _data: &mut [f32], _op: &str) -> Result<()> {
        Err(CommError::invalid(
            "schedule recording",
            "all_reduce_sum_f32",
            "is not part of an all-to-all and is not recorded".to_string(),
        ))
    }
    fn on_wait(&self, event: WaitEvent<'_>) {
        let op = match event {
            WaitEvent::Begin(groups) => Recorded::WaitBegin(groups.to_vec()),
            WaitEvent::Arrived(g) => Recorded::Arrived(g),
            WaitEvent::End => Recorded::WaitEnd,
        };
        self.ops.borrow_mut().push(op);
    }
}
