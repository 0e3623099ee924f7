//! HALO: hierarchical, affinity-aware, locality-optimised all-to-all (Piper §VI).
//!
//! Phase I, the exchange between ranks of one node, is posted first and runs beside the inter-node
//! work. Phase II sends, per remote node, one packed message with all of this rank's blocks for that
//! node to its relay there — the member at the same position ("rail"), so each rank drives its own,
//! affine NIC. Phase III: each relay splits what it received and redistributes it inside its node, one
//! remote node at a time, in the order the nodes' messages arrive (not a fixed order).
//!
//! The counts travel the same paths first, so no rank needs the whole P × P count matrix: to relays as
//! one vector per remote node, and — only when the caller does not know its receive counts — to local
//! peers directly and then redistributed by the relays. Zero-size blocks and messages are skipped on
//! both sides; uneven nodes wrap positions onto the smaller node.

use crate::collectives::{check_counts, displacements};
use crate::communicator::{Communicator, Pending, tags, wait_all, wait_groups};
use crate::error::{CommError, Result};
use crate::topology::GroupNodes;

/// What a group of HALO's data receives brings.
enum Arrival {
    /// Phase I: a local peer's block.
    Intra(usize),
    /// Phase II: the blocks of one remote node's relayed sources (the node, then each source with its
    /// counts to every member of this node).
    Relayed(usize, Vec<(usize, Vec<usize>)>),
    /// Phase III: one local relay's packet of these sources' blocks for this rank.
    Redistributed(Vec<usize>),
}

/// Nodes one HALO group may span: each remote node's phase III packets have a tag of their own.
pub const MAX_NODES: usize = (tags::MAX_TAG - tags::HALO_REDIST + 1) as usize;

fn redistribution_tag(node: usize) -> u32 {
    tags::HALO_REDIST + node as u32
}

fn u64s(bytes: &[u8]) -> Vec<usize> {
    bytes
        .chunks_exact(8)
        .map(|c| usize::try_from(u64::from_le_bytes(c.try_into().expect("8 bytes"))).unwrap_or(usize::MAX))
        .collect()
}

fn to_bytes(v: &[usize]) -> Vec<u8> {
    v.iter().flat_map(|x| (*x as u64).to_le_bytes()).collect()
}

/// Remote group ranks whose traffic to this node this rank relays, by remote node (node order).
fn relayed_sources(layout: &GroupNodes, me: usize) -> Vec<(usize, Vec<usize>)> {
    let (my_node, _) = layout.place[me];
    (0..layout.nodes.len())
        .filter(|n| *n != my_node)
        .map(|n| (n, layout.nodes[n].iter().copied().filter(|s| layout.relay(*s, my_node) == me).collect()))
        .collect()
}

/// What each rank needs to know before HALO's data moves.
struct Counts {
    /// Bytes from each source rank.
    recv: Vec<usize>,
    /// Per relayed source (its node, the source, its counts to each member of this node).
    relay: Vec<(usize, usize, Vec<usize>)>,
}

/// HALO variable all-to-all of bytes. `known`: the bytes this rank receives from each source, when the
/// caller knows them (a token dispatcher does) — then only the relays' counts travel, in one round; else
/// two rounds. Returns the received bytes (by source rank) and the count from each source.
pub fn halo_all_to_all_v<C: Communicator + ?Sized>(
    comm: &C,
    layout: &GroupNodes,
    send: &[u8],
    send_counts: &[usize],
    known: Option<&[usize]>,
    op: &str,
) -> Result<(Vec<u8>, Vec<usize>)> {
    comm.check_usable()?;
    let n = comm.size();
    check_counts(op, send.len(), send_counts, n)?;
    if layout.nodes.len() > MAX_NODES {
        return Err(CommError::invalid(
            op,
            "topology",
            format!(
                "HALO spans at most {MAX_NODES} nodes, this group {}; use the flat or pairwise all-to-all",
                layout.nodes.len()
            ),
        ));
    }
    let me = comm.rank();
    if let Some(k) = known.filter(|k| k.len() != n) {
        return Err(CommError::invalid(op, "recv_counts", format!("has {} entries for a group of {n}", k.len())));
    }
    if let Some(k) = known.filter(|k| k[me] != send_counts[me]) {
        return Err(CommError::invalid(
            op,
            "recv_counts",
            format!("expects {} bytes from this rank itself, which sends itself {}", k[me], send_counts[me]),
        ));
    }
    let counts = exchange_halo_counts(comm, layout, send_counts, known, op)?;
    halo_data(comm, layout, send, send_counts, counts, op)
}

/// The counts, before the data. Round 1: each remote node's relay gets one vector (this rank's counts
/// to every member there), and — unless `known` — each local peer its count. Round 2, unless `known`:
/// each relay tells each local member what its relayed sources send it.
fn exchange_halo_counts<C: Communicator + ?Sized>(
    comm: &C,
    layout: &GroupNodes,
    send_counts: &[usize],
    known: Option<&[usize]>,
    op: &str,
) -> Result<Counts> {
    let (n, me) = (comm.size(), comm.rank());
    let (my_node, _) = layout.place[me];
    let local: Vec<usize> = layout.nodes[my_node].iter().copied().filter(|p| *p != me).collect();
    let remote_nodes: Vec<usize> = (0..layout.nodes.len()).filter(|x| *x != my_node).collect();
    let relayed = relayed_sources(layout, me);
    let direct = if known.is_some() { &[][..] } else { &local[..] };

    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    for &p in direct {
        pending.push(comm.irecv(p, tags::COUNTS, 8)?);
    }
    for (_, sources) in &relayed {
        for &s in sources {
            pending.push(comm.irecv(s, tags::COUNTS, 8 * layout.nodes[my_node].len())?);
        }
    }
    for &p in direct {
        pending.push(comm.isend(p, tags::COUNTS, to_bytes(&[send_counts[p]]))?);
    }
    for &m in &remote_nodes {
        let counts: Vec<usize> = layout.nodes[m].iter().map(|d| send_counts[*d]).collect();
        pending.push(comm.isend(layout.relay(me, m), tags::COUNTS, to_bytes(&counts))?);
    }
    let mut got = wait_all(comm, pending, &format!("{op} (HALO counts, phases I/II)"))?.into_iter();
    let mut recv_counts = known.map_or_else(|| vec![0usize; n], <[usize]>::to_vec);
    recv_counts[me] = send_counts[me];
    for &p in direct {
        recv_counts[p] = u64s(&got.next().expect("one per local peer"))[0];
    }
    // relay_counts[(node, source)] = counts from that source to each member of my node.
    let mut relay_counts: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    for (node, sources) in &relayed {
        for &s in sources {
            relay_counts.push((*node, s, u64s(&got.next().expect("one per relayed source"))));
        }
    }
    // What this rank will receive and forward as a relay, checked before anything is allocated for it.
    let announced = relay_counts.iter().flat_map(|(_, s, c)| c.iter().map(move |c| (*s, *c)));
    crate::collectives::check_announced_counts(comm, op, announced)?;
    match known {
        None => redistribute_counts(comm, layout, &relay_counts, &mut recv_counts, op)?,
        // What this rank relays to itself must be what the caller expects from those sources.
        Some(k) => {
            let pos = layout.nodes[my_node].iter().position(|d| *d == me).expect("a member of its node");
            if let Some((_, s, c)) = relay_counts.iter().find(|(_, s, c)| c[pos] != k[*s]) {
                return Err(CommError::invalid(
                    op,
                    "recv_counts",
                    format!("expects {} bytes from rank {s}, which sends {}", k[*s], c[pos]),
                ));
            }
        }
    }
    crate::collectives::check_announced_counts(comm, op, recv_counts.iter().copied().enumerate())?;
    Ok(Counts { recv: recv_counts, relay: relay_counts })
}

/// Round 2 of the counts: each relay tells each local member what its relayed sources send it.
fn redistribute_counts<C: Communicator + ?Sized>(
    comm: &C,
    layout: &GroupNodes,
    relay_counts: &[(usize, usize, Vec<usize>)],
    recv_counts: &mut [usize],
    op: &str,
) -> Result<()> {
    let me = comm.rank();
    let (my_node, _) = layout.place[me];
    let my_members = &layout.nodes[my_node];
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    let mut expect_from: Vec<Vec<usize>> = Vec::new(); // per local relay, the sources it relays to me
    for &q in my_members.iter().filter(|q| **q != me) {
        let sources: Vec<usize> = (0..layout.nodes.len())
            .filter(|m| *m != my_node)
            .flat_map(|m| layout.nodes[m].iter().copied().filter(|s| layout.relay(*s, my_node) == q))
            .collect();
        if !sources.is_empty() {
            pending.push(comm.irecv(q, tags::COUNTS, 8 * sources.len())?);
            expect_from.push(sources);
        }
    }
    for (pos, &d) in my_members.iter().enumerate() {
        let counts: Vec<usize> = relay_counts.iter().map(|(_, _, c)| c[pos]).collect();
        if d == me {
            for ((_, s, _), c) in relay_counts.iter().zip(&counts) {
                recv_counts[*s] = *c;
            }
        } else if !counts.is_empty() {
            pending.push(comm.isend(d, tags::COUNTS, to_bytes(&counts))?);
        }
    }
    let got = wait_all(comm, pending, &format!("{op} (HALO counts, phase III)"))?;
    for (sources, bytes) in expect_from.iter().zip(&got) {
        for (s, c) in sources.iter().zip(u64s(bytes)) {
            recv_counts[*s] = c;
        }
    }
    Ok(())
}

/// The data: phase I beside phase II, and phase III as each remote node's data arrives.
fn halo_data<C: Communicator + ?Sized>(
    comm: &C,
    layout: &GroupNodes,
    send: &[u8],
    send_counts: &[usize],
    counts: Counts,
    op: &str,
) -> Result<(Vec<u8>, Vec<usize>)> {
    let Counts { recv: recv_counts, relay: relay_counts } = counts;
    let me = comm.rank();
    let (my_node, _) = layout.place[me];
    let local: Vec<usize> = layout.nodes[my_node].iter().copied().filter(|p| *p != me).collect();
    let remote_nodes: Vec<usize> = (0..layout.nodes.len()).filter(|x| *x != my_node).collect();
    let relayed = relayed_sources(layout, me);
    let my_members = &layout.nodes[my_node];
    let sdispl = displacements(send_counts);

    // Data. Everything is posted before any wait, so rendezvous-size messages cannot deadlock.
    let rdispl = displacements(&recv_counts);
    let mut out = vec![0u8; recv_counts.iter().sum()];
    out[rdispl[me]..rdispl[me] + recv_counts[me]].copy_from_slice(&send[sdispl[me]..sdispl[me] + send_counts[me]]);
    let block = |d: usize| &send[sdispl[d]..sdispl[d] + send_counts[d]];

    // Phase I: intra-node, started first.
    let mut arrivals: Vec<Arrival> = Vec::new();
    let mut receives: Vec<Vec<Box<dyn Pending>>> = Vec::new();
    for &p in local.iter().filter(|p| recv_counts[**p] > 0) {
        receives.push(vec![comm.irecv(p, tags::HALO_INTRA, recv_counts[p])?]);
        arrivals.push(Arrival::Intra(p));
    }
    let mut sends: Vec<Box<dyn Pending>> = Vec::new();
    for &p in local.iter().filter(|p| send_counts[**p] > 0) {
        sends.push(comm.isend(p, tags::HALO_INTRA, block(p).to_vec())?);
    }
    // Phase III receives from local relays, one per (relay, remote node).
    for &q in &local {
        for &m in &remote_nodes {
            let sources: Vec<usize> =
                layout.nodes[m].iter().copied().filter(|s| layout.relay(*s, my_node) == q).collect();
            let len: usize = sources.iter().map(|s| recv_counts[*s]).sum();
            if len > 0 {
                receives.push(vec![comm.irecv(q, redistribution_tag(m), len)?]);
                arrivals.push(Arrival::Redistributed(sources));
            }
        }
    }
    // Phase II: receives from relayed sources, one group per remote node; one packed send per remote node.
    for (node, sources) in &relayed {
        let mut meta = Vec::new();
        let mut group = Vec::new();
        for &s in sources {
            let counts =
                relay_counts.iter().find(|(_, src, _)| *src == s).expect("counts of every relayed source").2.clone();
            let len: usize = counts.iter().sum();
            if len > 0 {
                group.push(comm.irecv(s, tags::HALO_INTER, len)?);
                meta.push((s, counts));
            }
        }
        if !group.is_empty() {
            receives.push(group);
            arrivals.push(Arrival::Relayed(*node, meta));
        }
    }
    for &m in &remote_nodes {
        let packed: Vec<u8> = layout.nodes[m].iter().flat_map(|d| block(*d).iter().copied()).collect();
        if !packed.is_empty() {
            sends.push(comm.isend(layout.relay(me, m), tags::HALO_INTER, packed)?);
        }
    }
    // Whatever arrives first is used first: a remote node's messages, once all here, are split and
    // redistributed (phase III) while other nodes' are still in flight.
    wait_groups(comm, receives, &format!("{op} (HALO data)"), |g, data| {
        match &arrivals[g] {
            Arrival::Intra(p) => out[rdispl[*p]..rdispl[*p] + data[0].len()].copy_from_slice(&data[0]),
            Arrival::Redistributed(sources) => {
                let mut at = 0;
                for s in sources {
                    out[rdispl[*s]..rdispl[*s] + recv_counts[*s]].copy_from_slice(&data[0][at..at + recv_counts[*s]]);
                    at += recv_counts[*s];
                }
            }
            Arrival::Relayed(node, meta) => {
                for (pos, &d) in my_members.iter().enumerate() {
                    let mut packet = Vec::new();
                    for ((s, counts), data) in meta.iter().zip(&data) {
                        let start: usize = counts[..pos].iter().sum();
                        let piece = &data[start..start + counts[pos]];
                        if d == me {
                            out[rdispl[*s]..rdispl[*s] + piece.len()].copy_from_slice(piece);
                        } else {
                            packet.extend_from_slice(piece);
                        }
                    }
                    if d != me && !packet.is_empty() {
                        sends.push(comm.isend(d, redistribution_tag(*node), packet)?);
                    }
                }
            }
        }
        Ok(())
    })?;
    wait_all(comm, sends, &format!("{op} (HALO sends)"))?;
    Ok((out, recv_counts))
}
