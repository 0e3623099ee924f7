//! Message schedules of the all-to-all algorithms, recorded from the real code for replay in a network
//! simulator (`scripts/simulate-alltoall.sh` replays them in SimGrid's SMPI).
//!
//! [`record_uniform`] runs an algorithm on an in-process world in which every rank sends the same
//! number of bytes to every peer, as the MoE dispatch and combine run it (receive counts known), through
//! a [`Recorder`], twice: with one and with two bytes per peer.
//! Every message of a uniform all-to-all is `fixed + per_byte · B` bytes long (counts are fixed, data
//! blocks are B each, HALO's packets hold whole blocks), so the two runs give each message's size at
//! any B > 0 exactly, and a schedule recorded on a small world scales to any message size. The two runs
//! must agree on every operation but the sizes, or recording fails.
//!
//! A schedule is, per rank, what the algorithm posts in program order and how it waits: a [`Step::Wait`]
//! names its groups of earlier operations and, per group, what the algorithm posts once that group has
//! arrived (HALO's phase III forwarding). A replay must hand groups over in the order they complete, as
//! the real code does. [`check`] replays a schedule here, matching messages as MPI does, and counts what
//! crosses nodes.

mod check;
pub mod recorder;
mod text;

pub use check::{Traffic, check};
pub use recorder::{Recorded, Recorder};
pub use text::write_rank;

use crate::alltoall::{Algo, all_to_all_v_bytes_known};
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::local::LocalWorld;
use crate::topology::Topology;

/// A message's size when every rank sends B bytes to every peer: `fixed + per_byte · B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    pub fixed: u64,
    pub per_byte: u64,
}

impl Size {
    pub fn at(&self, bytes_per_peer: u64) -> u64 {
        self.fixed + self.per_byte * bytes_per_peer
    }
}

/// One step of a rank's schedule; `S` is a size (bytes while recording, [`Size`] in a schedule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<S> {
    Send {
        id: u64,
        peer: usize,
        tag: u32,
        size: S,
    },
    Recv {
        id: u64,
        peer: usize,
        tag: u32,
        size: S,
    },
    /// The backend's native variable all-to-all: sizes to and from each rank.
    AllToAll {
        send: Vec<S>,
        recv: Vec<S>,
    },
    /// Waits for groups of earlier operations; `then[g]` is posted as soon as group g has arrived.
    Wait {
        groups: Vec<Vec<u64>>,
        then: Vec<Vec<Step<S>>>,
    },
}

/// The schedule of one all-to-all algorithm on a world of ranks placed on nodes.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub algo: Algo,
    /// Node of each rank.
    pub node_of: Vec<usize>,
    /// Steps of each rank.
    pub ranks: Vec<Vec<Step<Size>>>,
}

/// Timeout of the recording's in-process waits.
const RECORDING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1800);

fn invalid(field: &str, why: String) -> CommError {
    CommError::invalid("schedule recording", field, why)
}

/// Records `algo` on `topo`'s ranks, every rank sending the same number of bytes to every peer.
pub fn record_uniform(algo: Algo, topo: &Topology) -> Result<Schedule> {
    let one = record_run(algo, topo, 1)?;
    let two = record_run(algo, topo, 2)?;
    let ranks = one
        .into_iter()
        .zip(two)
        .enumerate()
        .map(|(r, (a, b))| affine(&a, &b).map_err(|e| invalid("schedule", format!("rank {r}: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    Ok(Schedule { algo, node_of: topo.node_of.clone(), ranks })
}

/// One recorded run at `b` bytes per peer: each rank's canonical steps.
fn record_run(algo: Algo, topo: &Topology, b: usize) -> Result<Vec<Vec<Step<usize>>>> {
    let n = topo.world_size();
    LocalWorld::run(n, |mut comm| {
        // Hundreds of rank threads share the host's cores: waits take longer than in a run.
        comm.set_timeout(RECORDING_TIMEOUT);
        let recorder = Recorder::new(comm);
        let send = vec![0u8; b * n];
        // As a token dispatcher runs it: the receive counts are known (flat and pairwise move only the
        // data; HALO routes its relays' counts in-band).
        let out =
            all_to_all_v_bytes_known(algo, &recorder, topo, &send, &vec![b; n], &vec![b; n], "recorded all-to-all")?;
        if out.len() != b * n {
            return Err(invalid("result", format!("received {} bytes, expected {}", out.len(), b * n)));
        }
        canonical(nest(recorder.into_recorded())?)
    })
    .into_iter()
    .collect()
}

/// The wait being recorded: its groups, what each posts, and the group that arrived last.
type OpenWait = (Vec<Vec<u64>>, Vec<Vec<Step<usize>>>, Option<usize>);

/// Nests the recorded operations: what a wait's groups post goes under the wait.
fn nest(ops: Vec<Recorded>) -> Result<Vec<Step<usize>>> {
    let mut top: Vec<Step<usize>> = Vec::new();
    let mut open: Option<OpenWait> = None;
    for op in ops {
        let step = match op {
            Recorded::Send { id, peer, tag, bytes } => Step::Send { id, peer, tag, size: bytes },
            Recorded::Recv { id, peer, tag, bytes } => Step::Recv { id, peer, tag, size: bytes },
            Recorded::AllToAll { send, recv } => Step::AllToAll { send, recv },
            Recorded::WaitBegin(groups) => {
                if open.is_some() {
                    return Err(invalid("wait", "a wait inside a wait is not supported".into()));
                }
                let groups = groups
                    .into_iter()
                    .map(|g| g.into_iter().collect::<Option<Vec<u64>>>())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| invalid("wait", "waits for an operation that was not recorded".into()))?;
                let then = vec![Vec::new(); groups.len()];
                open = Some((groups, then, None));
                continue;
            }
            Recorded::Arrived(g) => {
                match open.as_mut() {
                    Some((groups, _, last)) if g < groups.len() => *last = Some(g),
                    _ => return Err(invalid("wait", format!("group {g} arrived outside its wait"))),
                }
                continue;
            }
            Recorded::WaitEnd => {
                let (groups, then, _) = open.take().ok_or_else(|| invalid("wait", "ends without a start".into()))?;
                top.push(Step::Wait { groups, then });
                continue;
            }
        };
        match open.as_mut() {
            None => top.push(step),
            Some((_, then, Some(g))) if !matches!(step, Step::AllToAll { .. }) => then[*g].push(step),
            Some(_) => return Err(invalid("wait", "an operation inside a wait before any group arrived".into())),
        }
    }
    match open {
        Some(_) => Err(invalid("wait", "a wait never ended".into())),
        None => Ok(top),
    }
}

/// Renumbers operations in the order a canonical walk meets them (a wait's groups sorted by their
/// operations), so two runs whose groups arrived in different orders compare equal.
fn canonical(steps: Vec<Step<usize>>) -> Result<Vec<Step<usize>>> {
    let mut ids = std::collections::HashMap::new();
    renumber(steps, &mut ids)
}

fn renumber(steps: Vec<Step<usize>>, ids: &mut std::collections::HashMap<u64, u64>) -> Result<Vec<Step<usize>>> {
    let fresh = |old: u64, ids: &mut std::collections::HashMap<u64, u64>| {
        let new = ids.len() as u64;
        ids.insert(old, new);
        new
    };
    let mut out = Vec::with_capacity(steps.len());
    for step in steps {
        out.push(match step {
            Step::Send { id, peer, tag, size } => Step::Send { id: fresh(id, ids), peer, tag, size },
            Step::Recv { id, peer, tag, size } => Step::Recv { id: fresh(id, ids), peer, tag, size },
            Step::AllToAll { send, recv } => Step::AllToAll { send, recv },
            Step::Wait { groups, then } => {
                let groups = groups
                    .into_iter()
                    .map(|g| g.into_iter().map(|id| ids.get(&id).copied()).collect::<Option<Vec<u64>>>())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| invalid("wait", "waits for an operation not posted before it".into()))?;
                // Groups in the order of their operations, not the order the recording listed them.
                let mut pairs: Vec<(Vec<u64>, Vec<Step<usize>>)> = groups
                    .into_iter()
                    .map(|mut g| {
                        g.sort_unstable();
                        g
                    })
                    .zip(then)
                    .collect();
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
                let (groups, then): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
                let then = then.into_iter().map(|t| renumber(t, ids)).collect::<Result<Vec<_>>>()?;
                Step::Wait { groups, then }
            }
        });
    }
    Ok(out)
}

/// Sizes as `fixed + per_byte · B` from the runs at B = 1 (`a`) and B = 2 (`b`).
fn affine(a: &[Step<usize>], b: &[Step<usize>]) -> std::result::Result<Vec<Step<Size>>, String> {
    if a.len() != b.len() {
        return Err(format!("{} steps at 1 byte per peer, {} at 2", a.len(), b.len()));
    }
    let size = |x: usize, y: usize| -> std::result::Result<Size, String> {
        let per_byte = y.checked_sub(x).ok_or(format!("a message shrinks from {x} to {y} bytes"))?;
        let fixed = x.checked_sub(per_byte).ok_or(format!("a message of {x} then {y} bytes is not affine"))?;
        Ok(Size { fixed: fixed as u64, per_byte: per_byte as u64 })
    };
    let sizes = |x: &[usize], y: &[usize]| -> std::result::Result<Vec<Size>, String> {
        x.iter().zip(y).map(|(x, y)| size(*x, *y)).collect()
    };
    a.iter()
        .zip(b)
        .map(|pair| match pair {
            (Step::Send { id, peer, tag, size: x }, Step::Send { id: i2, peer: p2, tag: t2, size: y })
                if (id, peer, tag) == (i2, p2, t2) =>
            {
                Ok(Step::Send { id: *id, peer: *peer, tag: *tag, size: size(*x, *y)? })
            }
            (Step::Recv { id, peer, tag, size: x }, Step::Recv { id: i2, peer: p2, tag: t2, size: y })
                if (id, peer, tag) == (i2, p2, t2) =>
            {
                Ok(Step::Recv { id: *id, peer: *peer, tag: *tag, size: size(*x, *y)? })
            }
            (Step::AllToAll { send: s1, recv: r1 }, Step::AllToAll { send: s2, recv: r2 })
                if s1.len() == s2.len() && r1.len() == r2.len() =>
            {
                Ok(Step::AllToAll { send: sizes(s1, s2)?, recv: sizes(r1, r2)? })
            }
            (Step::Wait { groups: g1, then: t1 }, Step::Wait { groups: g2, then: t2 }) if g1 == g2 => {
                let then = t1.iter().zip(t2).map(|(x, y)| affine(x, y)).collect::<std::result::Result<_, _>>()?;
                Ok(Step::Wait { groups: g1.clone(), then })
            }
            (x, y) => Err(format!("the runs differ beyond sizes: {x:?} vs {y:?}")),
        })
        .collect()
}
