//! Replays a schedule without data, matching messages as MPI does (per source, destination and tag, in
//! posting order, sizes equal), handing a wait's groups over as they complete: every rank must finish,
//! or the schedule would hang a simulator. Counts what it moves, within and across nodes.

use std::collections::{HashMap, VecDeque};

use super::{Schedule, Size, Step};
use crate::error::{CommError, Result};

/// Messages and bytes a schedule moves at some bytes per peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub intra_messages: u64,
    pub intra_bytes: u64,
    pub inter_messages: u64,
    pub inter_bytes: u64,
}

struct Rank<'a> {
    /// Top-level steps left, next first.
    steps: VecDeque<&'a Step<Size>>,
    done: HashMap<u64, bool>,
    /// The wait under way: groups handed over so far.
    handed: Option<Vec<bool>>,
}

type Key = (usize, usize, u32); // (source, destination, tag)

struct World<'a> {
    schedule: &'a Schedule,
    bytes: u64,
    ranks: Vec<Rank<'a>>,
    /// Unmatched sends (rank, id, size) and receives by key, in posting order.
    sends: HashMap<Key, VecDeque<(u64, u64)>>,
    recvs: HashMap<Key, VecDeque<(u64, u64)>>,
    traffic: Traffic,
}

fn stuck(why: String) -> CommError {
    CommError::invalid("schedule check", "schedule", why)
}

/// Replays `schedule` at `bytes_per_peer` and returns what it moved; an error names a rank that cannot
/// finish or a message whose sizes disagree.
pub fn check(schedule: &Schedule, bytes_per_peer: u64) -> Result<Traffic> {
    let ranks =
        schedule.ranks.iter().map(|s| Rank { steps: s.iter().collect(), done: HashMap::new(), handed: None }).collect();
    let mut w = World {
        schedule,
        bytes: bytes_per_peer,
        ranks,
        sends: HashMap::new(),
        recvs: HashMap::new(),
        traffic: Traffic::default(),
    };
    loop {
        let mut progressed = false;
        for r in 0..w.ranks.len() {
            while w.advance(r)? {
                progressed = true;
            }
        }
        if w.all_at_collective() {
            w.collective()?;
            progressed = true;
        }
        if w.ranks.iter().all(|r| r.steps.is_empty()) {
            let unmatched = w.sends.values().chain(w.recvs.values()).map(VecDeque::len).sum::<usize>();
            if unmatched > 0 {
                return Err(stuck(format!("{unmatched} messages were posted and never matched")));
            }
            return Ok(w.traffic);
        }
        if !progressed {
            let waiting: Vec<usize> = (0..w.ranks.len()).filter(|r| !w.ranks[*r].steps.is_empty()).collect();
            return Err(stuck(format!("ranks {waiting:?} can never finish")));
        }
    }
}

impl<'a> World<'a> {
    /// Runs rank r's next step if it can; false when it is blocked (or done).
    fn advance(&mut self, r: usize) -> Result<bool> {
        let Some(step) = self.ranks[r].steps.front().copied() else { return Ok(false) };
        match step {
            Step::Send { .. } | Step::Recv { .. } => self.post(r, step)?,
            Step::AllToAll { .. } => return Ok(false),
            Step::Wait { groups, then } => {
                let handed = self.ranks[r].handed.get_or_insert_with(|| vec![false; groups.len()]).clone();
                let mut handed_now = handed.clone();
                for (g, ids) in groups.iter().enumerate().filter(|(g, _)| !handed[*g]) {
                    if ids.iter().all(|id| self.ranks[r].done.get(id).copied().unwrap_or(false)) {
                        handed_now[g] = true;
                        for s in &then[g] {
                            self.post(r, s)?;
                        }
                    }
                }
                let progressed = handed_now != handed;
                if handed_now.iter().all(|h| *h) {
                    self.ranks[r].handed = None;
                    self.ranks[r].steps.pop_front();
                    return Ok(true);
                }
                self.ranks[r].handed = Some(handed_now);
                return Ok(progressed);
            }
        }
        self.ranks[r].steps.pop_front();
        Ok(true)
    }

    /// Posts a send or a receive of rank r, matching it with its peer's if one is waiting.
    fn post(&mut self, r: usize, step: &Step<Size>) -> Result<()> {
        let (id, key, size, is_send) = match step {
            Step::Send { id, peer, tag, size } => (*id, (r, *peer, *tag), size.at(self.bytes), true),
            Step::Recv { id, peer, tag, size } => (*id, (*peer, r, *tag), size.at(self.bytes), false),
            _ => return Err(stuck(format!("rank {r}: a wait posts something other than a message"))),
        };
        if key.0 >= self.ranks.len() || key.1 >= self.ranks.len() {
            return Err(stuck(format!("rank {r}: a message to or from rank {} outside the world", key.0.max(key.1))));
        }
        self.ranks[r].done.insert(id, false);
        let (mine, theirs) =
            if is_send { (&mut self.sends, &mut self.recvs) } else { (&mut self.recvs, &mut self.sends) };
        let Some((other, other_size)) = theirs.get_mut(&key).and_then(VecDeque::pop_front) else {
            mine.entry(key).or_default().push_back((id, size));
            return Ok(());
        };
        if other_size != size {
            return Err(stuck(format!(
                "rank {} sends {} bytes to rank {} (tag {}) that receives {}",
                key.0,
                if is_send { size } else { other_size },
                key.1,
                key.2,
                if is_send { other_size } else { size }
            )));
        }
        let (sender_id, receiver_id) = if is_send { (id, other) } else { (other, id) };
        self.ranks[key.0].done.insert(sender_id, true);
        self.ranks[key.1].done.insert(receiver_id, true);
        self.count(key.0, key.1, size);
        Ok(())
    }

    fn count(&mut self, from: usize, to: usize, bytes: u64) {
        let t = &mut self.traffic;
        if self.schedule.node_of[from] == self.schedule.node_of[to] {
            t.intra_messages += 1;
            t.intra_bytes += bytes;
        } else {
            t.inter_messages += 1;
            t.inter_bytes += bytes;
        }
    }

    fn all_at_collective(&self) -> bool {
        self.ranks.iter().all(|r| matches!(r.steps.front(), Some(Step::AllToAll { .. })))
    }

    /// Every rank's native all-to-all at once: what i sends j is what j receives from i.
    fn collective(&mut self) -> Result<()> {
        let n = self.ranks.len();
        let sizes: Vec<(Vec<u64>, Vec<u64>)> = (0..n)
            .map(|r| match self.ranks[r].steps.pop_front() {
                Some(Step::AllToAll { send, recv }) if send.len() == n && recv.len() == n => Ok((
                    send.iter().map(|s| s.at(self.bytes)).collect(),
                    recv.iter().map(|s| s.at(self.bytes)).collect(),
                )),
                _ => Err(stuck(format!("rank {r}: an all-to-all over a group of another size"))),
            })
            .collect::<Result<_>>()?;
        for i in 0..n {
            for j in (0..n).filter(|j| *j != i) {
                if sizes[i].0[j] != sizes[j].1[i] {
                    return Err(stuck(format!(
                        "all-to-all: rank {i} sends {} bytes to rank {j}, which receives {}",
                        sizes[i].0[j], sizes[j].1[i]
                    )));
                }
                if sizes[i].0[j] > 0 {
                    self.count(i, j, sizes[i].0[j]);
                }
            }
        }
        Ok(())
    }
}
