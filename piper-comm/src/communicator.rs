//! The `Communicator` trait: a group of ranks with nonblocking point-to-point messages of bytes, plus
//! collectives (variable all-to-all, all-reduce, all-gather, barrier) that every backend gets from the
//! point-to-point layer and may override with native calls (MPI_Alltoallv, MPI_Allreduce).
//!
//! Every blocking wait has the communicator's timeout; on expiry it returns [`CommError::Timeout`] naming
//! the operation, the group, and the world ranks that never took part — never a silent hang.

use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// Tags at or above this are reserved for collectives.
pub const INTERNAL_TAG_BASE: u32 = 16384;
/// Largest user tag (MPI guarantees tags up to 32767).
pub const MAX_USER_TAG: u32 = INTERNAL_TAG_BASE - 1;

pub(crate) mod tags {
    use super::INTERNAL_TAG_BASE;
    pub const COUNTS: u32 = INTERNAL_TAG_BASE;
    pub const ALL_TO_ALL: u32 = INTERNAL_TAG_BASE + 1;
    pub const GATHER: u32 = INTERNAL_TAG_BASE + 2;
    pub const GATHER_ROOT: u32 = INTERNAL_TAG_BASE + 3;
    pub const HALO_INTRA: u32 = INTERNAL_TAG_BASE + 10;
    pub const HALO_INTER: u32 = INTERNAL_TAG_BASE + 11;
    /// HALO phase III: a relay's packet of one remote node's blocks carries `HALO_REDIST + node`, so a
    /// relay may forward the nodes in the order their data arrives.
    pub const HALO_REDIST: u32 = INTERNAL_TAG_BASE + 64;
    /// MPI guarantees tags up to 32767.
    pub const MAX_TAG: u32 = 32767;
}

/// An outstanding nonblocking send or receive.
pub trait Pending {
    /// Group rank of the peer.
    fn peer(&self) -> usize;
    /// Whether it has completed (polls the transport).
    fn test(&mut self) -> Result<bool>;
    /// The received bytes (empty for a send). Only after `test` returned true.
    fn into_data(self: Box<Self>) -> Vec<u8>;
    /// Gives up on an incomplete operation (after a timeout). The transport may keep its buffer alive.
    fn abandon(self: Box<Self>);
    /// The operation's number in a recorded schedule ([`crate::schedule::Recorder`]); `None` elsewhere.
    fn schedule_id(&self) -> Option<u64> {
        None
    }
}

/// What [`wait_groups`] tells its communicator, so that a recorder can tell which operations a wait
/// covers and what is posted once each group has arrived (the schedule's dependencies).
pub enum WaitEvent<'a> {
    /// A wait over these groups begins (each operation's [`Pending::schedule_id`]).
    Begin(&'a [Vec<Option<u64>>]),
    /// Group g has arrived; what is posted until the next event is posted because of it.
    Arrived(usize),
    /// The wait is over.
    End,
}

/// A group of ranks.
pub trait Communicator {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Human name of the group, used in errors ("world", "node 1", "expert group 0").
    fn group_name(&self) -> &str;
    /// World rank of each member, by group rank.
    fn world_ranks(&self) -> &[usize];
    /// Limit for every blocking wait.
    fn timeout(&self) -> Duration;
    /// Changes the limit for every blocking wait.
    fn set_timeout(&mut self, timeout: Duration);
    /// Starts sending `data` to group rank `dest`. Tags above [`MAX_USER_TAG`] are reserved.
    fn isend(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<Box<dyn Pending>>;
    /// Starts receiving exactly `len` bytes from group rank `src`.
    fn irecv(&self, src: usize, tag: u32, len: usize) -> Result<Box<dyn Pending>>;
    /// New communicators for the members sharing `color`, ordered by (`key`, rank). Collective.
    fn split(&self, color: u64, key: u64, name: &str) -> Result<Box<dyn Communicator>>;
    /// Marks the communicator unusable after an abandoned operation.
    fn poison(&self, op: &str);
    /// `Err(Poisoned)` if an earlier timeout left the group unusable.
    fn check_usable(&self) -> Result<()>;

    /// Flat variable all-to-all of bytes: `send` holds the blocks for ranks 0.., `send_counts[i]` bytes
    /// each; `recv_counts[i]` bytes come from rank i. A native call where the backend has one, else
    /// [`pairwise_bytes`](crate::collectives::pairwise_bytes).
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        op: &str,
    ) -> Result<Vec<u8>>;

    /// Elementwise sum of `f32`s over the group, identical on every rank (ranks' contributions are added
    /// in rank order). A native all-reduce where the backend has one, else
    /// [`all_reduce_sum_f32_by_gather`](crate::collectives::all_reduce_sum_f32_by_gather).
    fn all_reduce_sum_f32(&self, data: &mut [f32], op: &str) -> Result<()>;

    /// Told by [`wait_groups`] where a wait begins, which group arrives, and where it ends. Nothing by
    /// default; a schedule recorder keeps it.
    fn on_wait(&self, _event: WaitEvent<'_>) {}
}

impl<C: Communicator + ?Sized> Communicator for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn group_name(&self) -> &str {
        (**self).group_name()
    }
    fn world_ranks(&self) -> &[usize] {
        (**self).world_ranks()
    }
    fn timeout(&self) -> Duration {
        (**self).timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        (**self).set_timeout(timeout)
    }
    fn isend(&self, dest: usize, tag: u32, data: Vec<u8>) -> Result<Box<dyn Pending>> {
        (**self).isend(dest, tag, data)
    }
    fn irecv(&self, src: usize, tag: u32, len: usize) -> Result<Box<dyn Pending>> {
        (**self).irecv(src, tag, len)
    }
    fn split(&self, color: u64, key: u64, name: &str) -> Result<Box<dyn Communicator>> {
        (**self).split(color, key, name)
    }
    fn poison(&self, op: &str) {
        (**self).poison(op)
    }
    fn check_usable(&self) -> Result<()> {
        (**self).check_usable()
    }
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        op: &str,
    ) -> Result<Vec<u8>> {
        (**self).all_to_all_v_bytes(send, send_counts, recv_counts, op)
    }
    fn all_reduce_sum_f32(&self, data: &mut [f32], op: &str) -> Result<()> {
        (**self).all_reduce_sum_f32(data, op)
    }
    fn on_wait(&self, event: WaitEvent<'_>) {
        (**self).on_wait(event)
    }
}

/// Waits for every pending operation, polling with a short back-off, until no operation has completed
/// for the communicator's timeout (the deadline moves with progress, so a long exchange that keeps
/// completing messages is never cut off).
/// Returns the data of each, in order. On timeout the incomplete ones are abandoned, the communicator is
/// poisoned, and the error names the peers that never completed.
pub fn wait_all<C: Communicator + ?Sized>(comm: &C, pending: Vec<Box<dyn Pending>>, op: &str) -> Result<Vec<Vec<u8>>> {
    let mut out = vec![Vec::new(); pending.len()];
    wait_groups(comm, pending.into_iter().map(|p| vec![p]).collect(), op, |i, mut data| {
        out[i] = data.pop().expect("a group of one");
        Ok(())
    })?;
    Ok(out)
}

/// Waits for groups of pending operations and hands each group's data (in the group's order) to
/// `arrived` as soon as every operation of the group has completed: groups are handed over in the order
/// they complete, not the order given, so whatever arrives first is used first. An empty group is handed
/// over at once. Deadline and timeout error as [`wait_all`]'s.
pub fn wait_groups<C: Communicator + ?Sized>(
    comm: &C,
    groups: Vec<Vec<Box<dyn Pending>>>,
    op: &str,
    mut arrived: impl FnMut(usize, Vec<Vec<u8>>) -> Result<()>,
) -> Result<()> {
    let ids: Vec<Vec<Option<u64>>> = groups.iter().map(|g| g.iter().map(|p| p.schedule_id()).collect()).collect();
    comm.on_wait(WaitEvent::Begin(&ids));
    let mut deadline = Instant::now() + comm.timeout();
    let mut slots: Vec<Vec<(bool, Box<dyn Pending>)>> =
        groups.into_iter().map(|g| g.into_iter().map(|p| (false, p)).collect()).collect();
    let mut left: Vec<usize> = slots.iter().map(Vec::len).collect();
    let mut handed: Vec<bool> = vec![false; slots.len()];
    let mut idle = Idle::new();
    loop {
        let mut progressed = false;
        for (g, group) in slots.iter_mut().enumerate() {
            for (done, pending) in group.iter_mut().filter(|(done, _)| !*done) {
                if pending.test()? {
                    *done = true;
                    left[g] -= 1;
                    progressed = true;
                }
            }
            if left[g] == 0 && !handed[g] {
                handed[g] = true;
                comm.on_wait(WaitEvent::Arrived(g));
                arrived(g, std::mem::take(group).into_iter().map(|(_, p)| p.into_data()).collect())?;
            }
        }
        if handed.iter().all(|h| *h) {
            comm.on_wait(WaitEvent::End);
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(abandon(comm, op, slots));
        }
        if progressed {
            idle = Idle::new();
            deadline = Instant::now() + comm.timeout();
        } else {
            idle.pause();
        }
    }
}

/// Abandons the operations that have not completed, poisons the communicator and names their peers.
fn abandon<C: Communicator + ?Sized>(comm: &C, op: &str, slots: Vec<Vec<(bool, Box<dyn Pending>)>>) -> CommError {
    let mut missing: Vec<usize> = Vec::new();
    for (done, p) in slots.into_iter().flatten() {
        if !done {
            missing.push(comm.world_ranks()[p.peer()]);
            p.abandon();
        }
    }
    missing.sort_unstable();
    missing.dedup();
    comm.poison(op);
    timeout_error(comm, op, missing)
}

/// Longest timeout a collective may be given (a day): beyond it a hang is never noticed.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Parses a timeout in seconds: finite, > 0 and at most a day; the error names `field`.
pub fn parse_timeout(text: &str, field: &str) -> Result<Duration> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| CommError::invalid("timeout", field, format!("`{text}` is not a number of seconds (e.g. 120)")))?;
    if !(secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT.as_secs_f64()) {
        return Err(CommError::invalid("timeout", field, format!("is {secs}; it must be > 0 and ≤ 86400 seconds")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `PIPER_COMM_TIMEOUT_S` if set (checked by [`parse_timeout`]).
pub fn timeout_from_env() -> Result<Option<Duration>> {
    match std::env::var("PIPER_COMM_TIMEOUT_S") {
        Ok(v) => parse_timeout(&v, "PIPER_COMM_TIMEOUT_S").map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(CommError::invalid("timeout", "PIPER_COMM_TIMEOUT_S", "is not valid UTF-8"))
        }
    }
}

/// The timeout error for `op` on `comm`.
pub fn timeout_error<C: Communicator + ?Sized>(comm: &C, op: &str, missing: Vec<usize>) -> CommError {
    CommError::Timeout {
        op: op.to_string(),
        group: comm.group_name().to_string(),
        members: comm.world_ranks().to_vec(),
        me: comm.world_ranks()[comm.rank()],
        missing,
        timeout: comm.timeout(),
    }
}

/// Checks a peer index and a user tag.
pub fn check_peer<C: Communicator + ?Sized>(comm: &C, peer: usize, op: &str) -> Result<()> {
    if peer >= comm.size() {
        return Err(CommError::invalid(
            op,
            "peer",
            format!("rank {peer} is outside group `{}` of {} ranks", comm.group_name(), comm.size()),
        ));
    }
    Ok(())
}

/// Waiting without starving the transport: MPI moves large (rendezvous) messages only while it is being
/// polled, so the first moments of a wait only yield the core; a long wait (another pipeline stage
/// still computing) then sleeps in short steps. Where every rank of the host has a core of its own, the
/// yielding lasts 20 ms (a sleeping rank wakes late: two ranks on two cores train 3–11% slower when
/// they sleep after 1 ms); where the ranks outnumber the cores, 1 ms (a yielding rank takes the core
/// from one that computes: four expert-parallel ranks on two cores train 10% faster). Measured in
/// `benchmarks/README.md` (ranks on one node).
pub struct Idle {
    since: std::time::Instant,
}

/// How long a wait yields before it sleeps (see [`Idle`]).
fn yield_window() -> Duration {
    static WINDOW: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *WINDOW.get_or_init(|| {
        if crate::host::ranks_outnumber_cores() { Duration::from_millis(1) } else { Duration::from_millis(20) }
    })
}

impl Idle {
    pub fn new() -> Self {
        Idle { since: std::time::Instant::now() }
    }

    pub fn pause(&mut self) {
        if self.since.elapsed() < yield_window() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Default for Idle {
    fn default() -> Self {
        Idle::new()
    }
}
