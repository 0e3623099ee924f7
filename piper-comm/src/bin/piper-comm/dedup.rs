//! Token dispatch with per-node deduplication: a token routed to several experts on one remote node
//! crosses the slow link once (to this rank's relay on that node) and is replicated there.
//!
//! Semantics equal the flat dispatch of the expanded token copies: rank d receives, for each source rank
//! in order, that source's rows for d in token order (a token routed twice to d arrives twice). Counts
//! travel first, so every receive has a known size: sizes to local peers and relays, then packets, then
//! per-source row counts from relays, then the relayed rows.
//!
//! A benchmark of `piper-comm bench --dispatch-top-k`: the runtime's token dispatcher does not use it.
//! Its messages take user tags (nothing else is in flight while it runs).

use piper_comm::communicator::{MAX_USER_TAG, wait_all};
use piper_comm::{CommError, Communicator, GroupNodes, Pending, Result};

/// The dispatch's message tags: counts, rows sent straight to a local peer, packets to a remote node's
/// relay, and the rows a relay forwards.
mod tags {
    use super::MAX_USER_TAG;
    pub const COUNTS: u32 = MAX_USER_TAG - 3;
    pub const HALO_INTRA: u32 = MAX_USER_TAG - 2;
    pub const DEDUP_INTER: u32 = MAX_USER_TAG - 1;
    pub const DEDUP_LOCAL: u32 = MAX_USER_TAG;
}

/// What a dispatch moved over the network (between nodes), for the report on savings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchTraffic {
    /// Rows a flat dispatch would send to other nodes.
    pub flat_inter_node_rows: usize,
    /// Rows this dispatch sent to other nodes.
    pub dedup_inter_node_rows: usize,
}

fn u64s(bytes: &[u8]) -> Vec<usize> {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize).collect()
}

fn le(v: usize) -> Vec<u8> {
    (v as u64).to_le_bytes().to_vec()
}

/// Dispatches `rows` (each `row_bytes` long) to `dests[t]` (group ranks, repeats allowed). Returns the
/// rows received (by source rank, token order), rows per source, and the traffic it caused.
pub fn dispatch_dedup<C: Communicator + ?Sized>(
    comm: &C,
    layout: &GroupNodes,
    rows: &[u8],
    row_bytes: usize,
    dests: &[Vec<usize>],
    op: &str,
) -> Result<(Vec<u8>, Vec<usize>, DispatchTraffic)> {
    comm.check_usable()?;
    let n = comm.size();
    if row_bytes == 0 || rows.len() != dests.len() * row_bytes {
        return Err(CommError::invalid(
            op,
            "rows",
            format!("holds {} bytes, expected {} rows of {row_bytes} bytes", rows.len(), dests.len()),
        ));
    }
    if let Some(d) = dests.iter().flatten().find(|d| **d >= n) {
        return Err(CommError::invalid(op, "dests", format!("rank {d} is outside the group of {n}")));
    }
    let me = comm.rank();
    let (my_node, _) = layout.place[me];
    let members = &layout.nodes[my_node];
    let local: Vec<usize> = members.iter().copied().filter(|p| *p != me).collect();
    let remote_nodes: Vec<usize> = (0..layout.nodes.len()).filter(|x| *x != my_node).collect();
    let row = |t: usize| &rows[t * row_bytes..(t + 1) * row_bytes];
    let mut traffic = DispatchTraffic::default();

    // Rows for each local rank (expanded), and per remote node a packet of distinct tokens with their
    // local destinations: [n_tokens][per token: n_dests, positions...] then the rows.
    let mut direct: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut headers: Vec<Vec<usize>> = vec![Vec::new(); layout.nodes.len()];
    let mut payloads: Vec<Vec<u8>> = vec![Vec::new(); layout.nodes.len()];
    let mut tokens_to: Vec<usize> = vec![0; layout.nodes.len()];
    for (t, ds) in dests.iter().enumerate() {
        for &d in ds {
            if layout.place[d].0 == my_node {
                direct[d].extend_from_slice(row(t));
            } else {
                traffic.flat_inter_node_rows += 1;
            }
        }
        for &m in &remote_nodes {
            let positions: Vec<usize> =
                ds.iter().filter(|d| layout.place[**d].0 == m).map(|d| layout.place[*d].1).collect();
            if !positions.is_empty() {
                headers[m].push(positions.len());
                headers[m].extend(positions);
                payloads[m].extend_from_slice(row(t));
                tokens_to[m] += 1;
                traffic.dedup_inter_node_rows += 1;
            }
        }
    }
    let packets: Vec<Vec<u8>> = (0..layout.nodes.len())
        .map(|m| {
            if tokens_to[m] == 0 {
                return Vec::new();
            }
            let mut p = le(tokens_to[m]);
            for h in &headers[m] {
                p.extend(le(*h));
            }
            p.extend_from_slice(&payloads[m]);
            p
        })
        .collect();

    // Round 1: sizes to local peers (rows) and relays (packet bytes).
    let relayed: Vec<usize> = remote_nodes
        .iter()
        .flat_map(|m| layout.nodes[*m].iter().copied().filter(|s| layout.relay(*s, my_node) == me))
        .collect();
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    for &p in local.iter().chain(&relayed) {
        pending.push(comm.irecv(p, tags::COUNTS, 8)?);
    }
    for &p in &local {
        pending.push(comm.isend(p, tags::COUNTS, le(direct[p].len() / row_bytes))?);
    }
    for &m in &remote_nodes {
        pending.push(comm.isend(layout.relay(me, m), tags::COUNTS, le(packets[m].len()))?);
    }
    let received = local.len() + relayed.len();
    let sizes: Vec<usize> =
        wait_all(comm, pending, &format!("{op} (dedup sizes)"))?.iter().take(received).map(|b| u64s(b)[0]).collect();
    let (direct_rows, packet_sizes) = sizes.split_at(local.len());

    // Round 2: direct rows inside the node, packets to relays.
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    for (&p, &r) in local.iter().zip(direct_rows) {
        pending.push(comm.irecv(p, tags::HALO_INTRA, r * row_bytes)?);
    }
    for (&s, &len) in relayed.iter().zip(packet_sizes) {
        pending.push(comm.irecv(s, tags::DEDUP_INTER, len)?);
    }
    let mut sends: Vec<Box<dyn Pending>> = Vec::new();
    for &p in &local {
        sends.push(comm.isend(p, tags::HALO_INTRA, std::mem::take(&mut direct[p]))?);
    }
    for &m in &remote_nodes {
        // Zero-length packets are still sent: the relay posted a receive for every relayed source.
        sends.push(comm.isend(layout.relay(me, m), tags::DEDUP_INTER, packets[m].clone())?);
    }
    let got = wait_all(comm, pending, &format!("{op} (dedup data)"))?;
    let (direct_in, packets_in) = got.split_at(local.len());

    // Expand relayed packets: rows for each local member, per relayed source.
    let mut expanded: Vec<Vec<Vec<u8>>> = vec![vec![Vec::new(); relayed.len()]; members.len()];
    for (i, packet) in packets_in.iter().enumerate() {
        if packet.is_empty() {
            continue;
        }
        let tokens = u64s(&packet[..8])[0];
        let mut at = 8;
        let mut dest_lists = Vec::with_capacity(tokens);
        for _ in 0..tokens {
            let k = u64s(&packet[at..at + 8])[0];
            dest_lists.push(u64s(&packet[at + 8..at + 8 + 8 * k]));
            at += 8 + 8 * k;
        }
        for (t, positions) in dest_lists.iter().enumerate() {
            let r = &packet[at + t * row_bytes..at + (t + 1) * row_bytes];
            for pos in positions {
                expanded[*pos][i].extend_from_slice(r);
            }
        }
    }

    // Round 3: each relay tells each local member how many rows per relayed source; round 4: the rows.
    let my_pos = layout.place[me].1;
    let mut expect: Vec<(usize, Vec<usize>)> = Vec::new(); // (relay, sources it relays to this node)
    for &q in &local {
        let sources: Vec<usize> = remote_nodes
            .iter()
            .flat_map(|m| layout.nodes[*m].iter().copied().filter(|s| layout.relay(*s, my_node) == q))
            .collect();
        if !sources.is_empty() {
            expect.push((q, sources));
        }
    }
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    for (q, sources) in &expect {
        pending.push(comm.irecv(*q, tags::COUNTS, 8 * sources.len())?);
    }
    for (pos, &d) in members.iter().enumerate().filter(|(_, d)| **d != me && !relayed.is_empty()) {
        let counts: Vec<u8> = expanded[pos].iter().flat_map(|rows| le(rows.len() / row_bytes)).collect();
        sends.push(comm.isend(d, tags::COUNTS, counts)?);
    }
    let relay_counts: Vec<Vec<usize>> =
        wait_all(comm, pending, &format!("{op} (dedup relay counts)"))?.iter().map(|b| u64s(b)).collect();
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    for ((q, _), counts) in expect.iter().zip(&relay_counts) {
        pending.push(comm.irecv(*q, tags::DEDUP_LOCAL, counts.iter().sum::<usize>() * row_bytes)?);
    }
    for (pos, &d) in members.iter().enumerate().filter(|(_, d)| **d != me && !relayed.is_empty()) {
        sends.push(comm.isend(d, tags::DEDUP_LOCAL, expanded[pos].concat())?);
    }
    let relayed_rows = wait_all(comm, pending, &format!("{op} (dedup relayed rows)"))?;

    // Assemble by source rank.
    let mut by_source: Vec<Vec<u8>> = vec![Vec::new(); n];
    for (&p, data) in local.iter().zip(direct_in) {
        by_source[p] = data.clone();
    }
    by_source[me] = dests
        .iter()
        .enumerate()
        .flat_map(|(t, ds)| ds.iter().filter(|d| **d == me).flat_map(move |_| row(t).to_vec()))
        .collect();
    for (i, s) in relayed.iter().enumerate() {
        by_source[*s] = std::mem::take(&mut expanded[my_pos][i]);
    }
    for (((_, sources), counts), data) in expect.iter().zip(&relay_counts).zip(&relayed_rows) {
        let mut at = 0;
        for (s, c) in sources.iter().zip(counts) {
            by_source[*s] = data[at..at + c * row_bytes].to_vec();
            at += c * row_bytes;
        }
    }
    wait_all(comm, sends, &format!("{op} (dedup sends)"))?;
    let counts = by_source.iter().map(|b| b.len() / row_bytes).collect();
    Ok((by_source.concat(), counts, traffic))
}
