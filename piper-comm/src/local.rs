//! In-process communicators: a world of N ranks as threads of one process, exchanging messages through
//! shared mailboxes. `LocalComm::single()` is the communicator of a single-rank run; `LocalWorld::run`
//! runs SPMD code on N threads (tests of the algorithms without mpirun, and any-size emulation).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::collectives::{all_reduce_sum_f32_by_gather, pairwise_bytes, split_members};
use crate::communicator::{Communicator, MAX_USER_TAG, Pending, check_peer};
use crate::error::{CommError, Result};

type Key = (u64, usize, u32); // (communicator id, source world rank, tag)

/// Messages to one rank. As in MPI, messages with the same key match receives in the order the
/// receives were posted: the n-th send of a key is taken by the n-th receive posted for it.
#[derive(Default)]
struct Mailbox {
    queue: Mutex<HashMap<Key, Channel>>,
}

#[derive(Default)]
struct Channel {
    sent: u64,
    posted: u64,
    messages: HashMap<u64, Vec<u8>>,
}

struct Shared {
    boxes: Vec<Mailbox>,
}

/// Default timeout of in-process communicators.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One rank's view of an in-process group.
pub struct LocalComm {
    shared: Arc<Shared>,
    id: u64,
    rank: usize,
    world_ranks: Vec<usize>,
    name: String,
    timeout: Duration,
    splits: Cell<u64>,
    poisoned: RefCell<Option<String>>,
}

/// Builder of in-process worlds.
pub struct LocalWorld;

impl LocalWorld {
    /// One communicator per rank of a new world of `size` ranks.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(size: usize) -> Vec<LocalComm> {
        let shared = Arc::new(Shared { boxes: (0..size).map(|_| Mailbox::default()).collect() });
        (0..size)
            .map(|rank| LocalComm {
                shared: shared.clone(),
                id: 0,
                rank,
                world_ranks: (0..size).collect(),
                name: "world".into(),
                timeout: DEFAULT_TIMEOUT,
                splits: Cell::new(0),
                poisoned: RefCell::new(None),
            })
            .collect()
    }

    /// Runs `f` on `size` threads, one rank each, and returns their results by rank.
    pub fn run<R: Send, F: Fn(LocalComm) -> R + Sync>(size: usize, f: F) -> Vec<R> {
        let comms = LocalWorld::new(size);
        std::thread::scope(|s| {
            let handles: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
        })
    }
}

impl LocalComm {
    /// The communicator of a single-rank run.
    pub fn single() -> LocalComm {
        LocalWorld::new(1).pop().expect("one rank")
    }
}

struct Done;

impl Pending for (usize, Done) {
    fn peer(&self) -> usize {
        self.0
    }
    fn test(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn into_data(self: Box<Self>) -> Vec<u8> {
        Vec::new()
    }
    fn abandon(self: Box<Self>) {}
}

struct LocalRecv {
    shared: Arc<Shared>,
    me_world: usize,
    key: Key,
    ticket: u64,
    peer: usize,
    len: usize,
    data: Option<Vec<u8>>,
}

impl Pending for LocalRecv {
    fn peer(&self) -> usize {
        self.peer
    }
    fn test(&mut self) -> Result<bool> {
        if self.data.is_some() {
            return Ok(true);
        }
        let mut q = self.shared.boxes[self.me_world].queue.lock().expect("mailbox lock");
        if let Some(msg) = q.get_mut(&self.key).and_then(|c| c.messages.remove(&self.ticket)) {
            if msg.len() != self.len {
                return Err(CommError::invalid(
                    "receive",
                    "len",
                    format!(
                        "expected {} bytes from world rank {} (tag {}), got {}",
                        self.len,
                        self.key.1,
                        self.key.2,
                        msg.len()
                    ),
                ));
            }
            self.data = Some(msg);
            return Ok(true);
        }
        Ok(false)
    }
    fn into_data(self: Box<Self>) -> Vec<u8> {
        self.data.unwrap_or_default()
    }
    fn abandon(self: Box<Self>) {}
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.world_ranks.len()
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
        check_peer(self, dest, "send")?;
        let key = (self.id, self.world_ranks[self.rank], tag);
        let mut q = self.shared.boxes[self.world_ranks[dest]].queue.lock().expect("mailbox lock");
        let channel = q.entry(key).or_default();
        channel.messages.insert(channel.sent, data);
        channel.sent += 1;
        Ok(Box::new((dest, Done)))
    }
    fn irecv(&self, src: usize, tag: u32, len: usize) -> Result<Box<dyn Pending>> {
        check_peer(self, src, "receive")?;
        let me_world = self.world_ranks[self.rank];
        let key = (self.id, self.world_ranks[src], tag);
        let ticket = {
            let mut q = self.shared.boxes[me_world].queue.lock().expect("mailbox lock");
            let channel = q.entry(key).or_default();
            channel.posted += 1;
            channel.posted - 1
        };
        Ok(Box::new(LocalRecv { shared: self.shared.clone(), me_world, key, ticket, peer: src, len, data: None }))
    }
    /// Point-to-point messages to every peer (threads have no native all-to-all).
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv_counts: &[usize],
        op: &str,
    ) -> Result<Vec<u8>> {
        pairwise_bytes(self, send, send_counts, recv_counts, op)
    }
    /// Gathers every rank's values and adds them in rank order.
    fn all_reduce_sum_f32(&self, data: &mut [f32], op: &str) -> Result<()> {
        all_reduce_sum_f32_by_gather(self, data, op)
    }
    fn split(&self, color: u64, key: u64, name: &str) -> Result<Box<dyn Communicator>> {
        let members = split_members(self, color, key, name)?;
        let seq = self.splits.get();
        self.splits.set(seq + 1);
        let mut h = DefaultHasher::new();
        (self.id, seq, color).hash(&mut h);
        let rank = members.iter().position(|r| *r == self.rank).expect("a rank is in its own color");
        Ok(Box::new(LocalComm {
            shared: self.shared.clone(),
            id: h.finish(),
            rank,
            world_ranks: members.iter().map(|r| self.world_ranks[*r]).collect(),
            name: name.to_string(),
            timeout: self.timeout,
            splits: Cell::new(0),
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
}

/// Rejects user tags in the reserved range.
pub fn check_user_tag(tag: u32, op: &str) -> Result<()> {
    if tag > MAX_USER_TAG {
        return Err(CommError::invalid(
            op,
            "tag",
            format!("{tag} is reserved for collectives; use 0..={MAX_USER_TAG}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::{all_to_all_v, barrier, exchange_counts};

    #[test]
    fn all_to_all_v_delivers_every_block() {
        let out = LocalWorld::run(4, |c| {
            let me = c.rank() as u32;
            // Rank r sends (r + d) % 3 values to rank d, each encoding (src, dst, index).
            let counts: Vec<usize> = (0..4).map(|d| ((me as usize) + d) % 3).collect();
            let send: Vec<u32> =
                (0..4u32).flat_map(|d| (0..counts[d as usize] as u32).map(move |i| me * 10000 + d * 100 + i)).collect();
            all_to_all_v(&c, &send, &counts, "test").unwrap()
        });
        for (me, (recv, counts)) in out.into_iter().enumerate() {
            let expect: Vec<u32> = (0..4u32)
                .flat_map(|s| (0..((s as usize + me) % 3) as u32).map(move |i| s * 10000 + me as u32 * 100 + i))
                .collect();
            assert_eq!(recv, expect);
            assert_eq!(counts, (0..4).map(|s| (s + me) % 3).collect::<Vec<_>>());
        }
    }

    #[test]
    fn split_groups_by_color_and_orders_by_key() {
        let out = LocalWorld::run(6, |c| {
            let node = c.split((c.rank() / 3) as u64, (5 - c.rank()) as u64, "node").unwrap();
            let mut v = [c.rank() as f32];
            node.all_reduce_sum_f32(&mut v, "sum").unwrap();
            (node.rank(), node.world_ranks().to_vec(), v[0])
        });
        assert_eq!(out[0], (2, vec![2, 1, 0], 3.0));
        assert_eq!(out[4], (1, vec![5, 4, 3], 12.0));
    }

    #[test]
    fn a_missing_rank_is_named_in_the_timeout() {
        let out = LocalWorld::run(3, |mut c| {
            c.set_timeout(Duration::from_millis(200));
            if c.rank() == 2 {
                return None; // never arrives
            }
            Some(barrier(&c, "barrier").unwrap_err().to_string())
        });
        let msg = out[0].as_ref().unwrap();
        assert!(
            msg.contains("barrier")
                && msg.contains("group `world`")
                && msg.contains("still waiting for world ranks [2]"),
            "{msg}"
        );
    }

    #[test]
    fn an_absurd_announced_size_is_refused_naming_the_peer() {
        // Rank 1 announces 2^62 bytes to rank 0 (as a rank running other code or data might).
        let out = LocalWorld::run(2, |c| {
            let counts = if c.rank() == 1 { vec![1usize << 62, 0] } else { vec![0, 8] };
            exchange_counts(&c, &counts, "dispatch").map_err(|e| e.to_string())
        });
        let err = out[0].as_ref().unwrap_err();
        assert!(err.contains("dispatch") && err.contains("world rank 1 announced 4611686018427387904 bytes"), "{err}");
        assert_eq!(out[1], Ok(vec![8, 0]));
    }

    #[test]
    fn the_deadline_moves_with_progress() {
        // Rank 1 sends one message every 100 ms, five in all, with a 250 ms timeout: the wait as a whole
        // takes ~500 ms but never goes 250 ms without progress, so it must succeed.
        let out = LocalWorld::run(2, |mut c| {
            c.set_timeout(Duration::from_millis(250));
            if c.rank() == 1 {
                for i in 0..5u32 {
                    std::thread::sleep(Duration::from_millis(100));
                    let p = c.isend(0, 100 + i, vec![i as u8]).unwrap();
                    crate::communicator::wait_all(&c, vec![p], "send").unwrap();
                }
                return Ok(vec![]);
            }
            let pending = (0..5u32).map(|i| c.irecv(1, 100 + i, 1).unwrap()).collect();
            crate::communicator::wait_all(&c, pending, "slow but steady").map_err(|e| e.to_string())
        });
        assert_eq!(out[0], Ok((0..5u8).map(|i| vec![i]).collect::<Vec<_>>()));
    }

    #[test]
    fn single_rank_is_trivial() {
        let c = LocalComm::single();
        assert_eq!(exchange_counts(&c, &[5], "x").unwrap(), vec![5]);
        let (v, _) = all_to_all_v(&c, &[1u8, 2, 3], &[3], "x").unwrap();
        assert_eq!(v, vec![1, 2, 3]);
    }
}
