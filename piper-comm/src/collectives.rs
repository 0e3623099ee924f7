//! Collectives built on the point-to-point layer, shared by every backend, and typed front-ends.
//!
//! Each collective first exchanges per-peer counts (or arrival tokens) point-to-point, so a timeout knows
//! exactly which ranks never arrived. Zero counts are fine: no message is sent for an empty block.

use bytemuck::Pod;

use crate::communicator::{Communicator, Pending, tags, wait_all};
use crate::error::{CommError, Result};

/// Sends `send_counts[i]` to rank i and returns what each rank sent to this one.
pub fn exchange_counts<C: Communicator + ?Sized>(comm: &C, send_counts: &[usize], op: &str) -> Result<Vec<usize>> {
    comm.check_usable()?;
    let n = comm.size();
    if send_counts.len() != n {
        return Err(CommError::invalid(
            op,
            "send_counts",
            format!("has {} entries for a group of {n}", send_counts.len()),
        ));
    }
    let me = comm.rank();
    let mut pending: Vec<Box<dyn Pending>> = Vec::with_capacity(2 * n);
    for peer in (0..n).filter(|p| *p != me) {
        pending.push(comm.irecv(peer, tags::COUNTS, 8)?);
    }
    for peer in (0..n).filter(|p| *p != me) {
        pending.push(comm.isend(peer, tags::COUNTS, (send_counts[peer] as u64).to_le_bytes().to_vec())?);
    }
    let data = wait_all(comm, pending, &format!("{op} (count exchange)"))?;
    let mut recv = vec![0; n];
    recv[me] = send_counts[me];
    for (peer, bytes) in (0..n).filter(|p| *p != me).zip(data) {
        recv[peer] = usize::try_from(u64::from_le_bytes(bytes.try_into().expect("8-byte count"))).unwrap_or(usize::MAX);
    }
    check_announced_counts(comm, op, recv.iter().copied().enumerate())?;
    Ok(recv)
}

/// This machine's memory (`MemTotal`), or 1 TiB where unknown: the largest total one operation may
/// receive, and the bound on buffers sized by the user.
pub fn max_receive_bytes() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<usize>().ok())
        .and_then(|kib| kib.checked_mul(1024))
        .unwrap_or(1 << 40)
}

/// Checks sizes peers announced, as (group rank, bytes), before anything is allocated for them: their
/// sum must fit this machine's memory. A larger one means the ranks disagree on the operation; the error
/// names the peer.
pub fn check_announced_counts<C: Communicator + ?Sized>(
    comm: &C,
    op: &str,
    counts: impl IntoIterator<Item = (usize, usize)>,
) -> Result<()> {
    let limit = max_receive_bytes();
    let mut total = 0usize;
    for (peer, c) in counts {
        total = total.checked_add(c).filter(|t| *t <= limit).ok_or_else(|| {
            CommError::invalid(
                op,
                "counts",
                format!(
                    "world rank {} announced {c} bytes, beyond the {limit} bytes this machine holds; the ranks disagree on the operation (different code, flags or data?)",
                    comm.world_ranks().get(peer).copied().unwrap_or(peer)
                ),
            )
        })?;
    }
    Ok(())
}

/// Every rank's `data` on rank `root` (in rank order; `None` elsewhere): only the root receives, so a
/// large per-rank record (a trace) costs one message per rank.
pub fn gather_bytes<C: Communicator + ?Sized>(
    comm: &C,
    data: &[u8],
    root: usize,
    op: &str,
) -> Result<Option<Vec<Vec<u8>>>> {
    let (n, me) = (comm.size(), comm.rank());
    if root >= n {
        return Err(CommError::invalid(op, "root", format!("is {root} in a group of {n}")));
    }
    let lens = exchange_counts(comm, &(0..n).map(|p| if p == root { data.len() } else { 0 }).collect::<Vec<_>>(), op)?;
    if me != root {
        if !data.is_empty() {
            wait_all(comm, vec![comm.isend(root, tags::GATHER_ROOT, data.to_vec())?], op)?;
        }
        return Ok(None);
    }
    let peers: Vec<usize> = (0..n).filter(|p| *p != me && lens[*p] > 0).collect();
    let pending = peers.iter().map(|p| comm.irecv(*p, tags::GATHER_ROOT, lens[*p])).collect::<Result<Vec<_>>>()?;
    let mut out = vec![Vec::new(); n];
    out[me] = data.to_vec();
    for (peer, bytes) in peers.into_iter().zip(wait_all(comm, pending, op)?) {
        out[peer] = bytes;
    }
    Ok(Some(out))
}

/// Every rank reaches this point before any leaves it.
pub fn barrier<C: Communicator + ?Sized>(comm: &C, op: &str) -> Result<()> {
    exchange_counts(comm, &vec![0; comm.size()], op).map(|_| ())
}

/// Offsets of consecutive blocks.
pub fn displacements(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// Checks `send` against its counts.
pub fn check_counts(op: &str, send_len: usize, send_counts: &[usize], size: usize) -> Result<()> {
    if send_counts.len() != size {
        return Err(CommError::invalid(
            op,
            "send_counts",
            format!("has {} entries for a group of {size}", send_counts.len()),
        ));
    }
    let total: usize = send_counts.iter().sum();
    if total != send_len {
        return Err(CommError::invalid(
            op,
            "send",
            format!("holds {send_len} elements but the counts add up to {total}"),
        ));
    }
    Ok(())
}

/// Variable all-to-all by point-to-point messages (every peer at once), counts in bytes.
pub fn pairwise_bytes<C: Communicator + ?Sized>(
    comm: &C,
    send: &[u8],
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> Result<Vec<u8>> {
    post_pairwise_bytes(comm, send, send_counts, recv_counts, op)?.wait(comm)
}

/// A pairwise all-to-all whose messages are posted and not yet waited for: work that does not need its
/// rows runs while they travel, then [`PostedExchange::wait`] returns them (grouped by source rank).
pub struct PostedExchange {
    out: Vec<u8>,
    pending: Vec<Box<dyn Pending>>,
    /// The source of each posted receive, in `pending` order (sends follow).
    from: Vec<usize>,
    rdispl: Vec<usize>,
    recv_counts: Vec<usize>,
    op: String,
}

/// Posts [`pairwise_bytes`]' messages (every receive, then every send) and copies this rank's own rows.
pub fn post_pairwise_bytes<C: Communicator + ?Sized>(
    comm: &C,
    send: &[u8],
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> Result<PostedExchange> {
    comm.check_usable()?;
    let n = comm.size();
    check_counts(op, send.len(), send_counts, n)?;
    if recv_counts.len() != n {
        return Err(CommError::invalid(
            op,
            "recv_counts",
            format!("has {} entries for a group of {n}", recv_counts.len()),
        ));
    }
    let me = comm.rank();
    let sdispl = displacements(send_counts);
    let rdispl = displacements(recv_counts);
    let mut out = vec![0u8; recv_counts.iter().sum()];
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    let mut from = Vec::new();
    for peer in (0..n).filter(|p| *p != me && recv_counts[*p] > 0) {
        pending.push(comm.irecv(peer, tags::ALL_TO_ALL, recv_counts[peer])?);
        from.push(peer);
    }
    for peer in (0..n).filter(|p| *p != me && send_counts[*p] > 0) {
        let rows = send[sdispl[peer]..sdispl[peer] + send_counts[peer]].to_vec();
        pending.push(comm.isend(peer, tags::ALL_TO_ALL, rows)?);
    }
    out[rdispl[me]..rdispl[me] + recv_counts[me]].copy_from_slice(&send[sdispl[me]..sdispl[me] + send_counts[me]]);
    Ok(PostedExchange { out, pending, from, rdispl, recv_counts: recv_counts.to_vec(), op: op.to_string() })
}

impl PostedExchange {
    /// An exchange that is already complete (an algorithm whose phases cannot be posted at once).
    pub fn complete(received: Vec<u8>) -> Self {
        PostedExchange {
            out: received,
            pending: Vec::new(),
            from: Vec::new(),
            rdispl: Vec::new(),
            recv_counts: Vec::new(),
            op: String::new(),
        }
    }

    /// Waits for every message (deadline and errors as [`wait_all`]'s) and returns the rows received,
    /// grouped by source rank.
    pub fn wait<C: Communicator + ?Sized>(self, comm: &C) -> Result<Vec<u8>> {
        let PostedExchange { mut out, pending, from, rdispl, recv_counts, op } = self;
        if pending.is_empty() {
            return Ok(out);
        }
        let data = wait_all(comm, pending, &op)?;
        for (peer, bytes) in from.into_iter().zip(data) {
            out[rdispl[peer]..rdispl[peer] + recv_counts[peer]].copy_from_slice(&bytes);
        }
        Ok(out)
    }
}

/// Typed variable all-to-all through the communicator's flat algorithm: exchanges counts first, returns
/// the received elements (grouped by source rank) and the count from each rank.
pub fn all_to_all_v<T: Pod, C: Communicator + ?Sized>(
    comm: &C,
    send: &[T],
    send_counts: &[usize],
    op: &str,
) -> Result<(Vec<T>, Vec<usize>)> {
    check_counts(op, send.len(), send_counts, comm.size())?;
    let recv_counts = exchange_counts(comm, send_counts, op)?;
    let size = std::mem::size_of::<T>();
    let bytes = comm.all_to_all_v_bytes(
        bytemuck::cast_slice(send),
        &send_counts.iter().map(|c| c * size).collect::<Vec<_>>(),
        &recv_counts.iter().map(|c| c * size).collect::<Vec<_>>(),
        op,
    )?;
    Ok((from_bytes(&bytes), recv_counts))
}

/// Gathers every rank's bytes (any length) on every rank, by rank.
pub fn all_gather_bytes<C: Communicator + ?Sized>(comm: &C, data: &[u8], op: &str) -> Result<Vec<Vec<u8>>> {
    let n = comm.size();
    let me = comm.rank();
    let lens = exchange_counts(comm, &vec![data.len(); n], op)?;
    let mut pending: Vec<Box<dyn Pending>> = Vec::new();
    let mut from = Vec::new();
    for peer in (0..n).filter(|p| *p != me && lens[*p] > 0) {
        pending.push(comm.irecv(peer, tags::GATHER, lens[peer])?);
        from.push(peer);
    }
    if !data.is_empty() {
        for peer in (0..n).filter(|p| *p != me) {
            pending.push(comm.isend(peer, tags::GATHER, data.to_vec())?);
        }
    }
    let received = wait_all(comm, pending, op)?;
    let mut out = vec![Vec::new(); n];
    out[me] = data.to_vec();
    for (peer, bytes) in from.into_iter().zip(received) {
        out[peer] = bytes;
    }
    Ok(out)
}

/// Typed all-gather: every rank's slice, by rank.
pub fn all_gather<T: Pod, C: Communicator + ?Sized>(comm: &C, data: &[T], op: &str) -> Result<Vec<Vec<T>>> {
    Ok(all_gather_bytes(comm, bytemuck::cast_slice(data), op)?.iter().map(|b| from_bytes(b)).collect())
}

/// Sum by gathering every contribution and adding in rank order (identical on every rank).
pub fn all_reduce_sum_f32_by_gather<C: Communicator + ?Sized>(comm: &C, data: &mut [f32], op: &str) -> Result<()> {
    let parts = all_gather(comm, data, op)?;
    for (i, x) in data.iter_mut().enumerate() {
        *x = parts.iter().fold(0.0f32, |acc, p| acc + p[i]);
    }
    Ok(())
}

/// Group ranks of `comm` that share `color`, ordered as MPI_Comm_split orders them: by (key, rank).
/// Collective over `comm`.
pub fn split_members<C: Communicator + ?Sized>(comm: &C, color: u64, key: u64, name: &str) -> Result<Vec<usize>> {
    let all = all_gather(comm, &[color, key], &format!("split into `{name}`"))?;
    let mut members: Vec<(u64, usize)> =
        all.iter().enumerate().filter(|(_, ck)| ck[0] == color).map(|(r, ck)| (ck[1], r)).collect();
    members.sort_unstable();
    Ok(members.into_iter().map(|(_, r)| r).collect())
}

/// Copies bytes into a vector of `T` (no alignment requirement on the input).
pub fn from_bytes<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let len = bytes.len() / size;
    let mut out: Vec<T> = vec![T::zeroed(); len];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes[..len * size]);
    out
}
