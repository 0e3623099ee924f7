//! All-to-all algorithms behind one interface: `flat` (the backend's native MPI_Alltoallv), `pairwise`
//! (point-to-point messages to every peer) and `halo` (hierarchical, see [`halo`]), plus a host-side
//! reference that computes what every rank must receive.

pub mod halo;

use bytemuck::Pod;

pub use crate::collectives::PostedExchange;
use crate::collectives::{check_counts, exchange_counts, from_bytes, pairwise_bytes, post_pairwise_bytes};
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::topology::{GroupNodes, Topology};

/// An all-to-all algorithm: the planner's enum (one enum for planner, comm and runtime).
pub use piper_planner::comm::A2aAlgo as Algo;

/// Runs one variable all-to-all of bytes with `algo` over `comm` (whose ranks sit as `topo` says).
/// Returns the received bytes, grouped by source rank, and the byte count from each source.
pub fn all_to_all_v_bytes<C: Communicator + ?Sized>(
    algo: Algo,
    comm: &C,
    topo: &Topology,
    send: &[u8],
    send_counts: &[usize],
    op: &str,
) -> Result<(Vec<u8>, Vec<usize>)> {
    check_counts(op, send.len(), send_counts, comm.size())?;
    match algo {
        Algo::Flat => {
            let recv_counts = exchange_counts(comm, send_counts, op)?;
            Ok((comm.all_to_all_v_bytes(send, send_counts, &recv_counts, op)?, recv_counts))
        }
        Algo::Pairwise => {
            let recv_counts = exchange_counts(comm, send_counts, op)?;
            Ok((pairwise_bytes(comm, send, send_counts, &recv_counts, op)?, recv_counts))
        }
        Algo::Halo => halo::halo_all_to_all_v(comm, &GroupNodes::new(comm, topo)?, send, send_counts, None, op),
    }
}

/// A variable all-to-all of bytes whose receive counts are already known (a token dispatcher's handle
/// keeps them): flat and pairwise move only the data, with no count exchange. HALO sends only the counts
/// its relays need, in one round before its data; a relayed count that disagrees with `recv_counts` is an
/// error, and every receive is posted at the size `recv_counts` gives.
pub fn all_to_all_v_bytes_known<C: Communicator + ?Sized>(
    algo: Algo,
    comm: &C,
    topo: &Topology,
    send: &[u8],
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> Result<Vec<u8>> {
    check_counts(op, send.len(), send_counts, comm.size())?;
    if recv_counts.len() != comm.size() {
        return Err(CommError::invalid(
            op,
            "recv_counts",
            format!("has {} entries for a group of {}", recv_counts.len(), comm.size()),
        ));
    }
    match algo {
        Algo::Flat => comm.all_to_all_v_bytes(send, send_counts, recv_counts, op),
        Algo::Pairwise => pairwise_bytes(comm, send, send_counts, recv_counts, op),
        Algo::Halo => {
            let layout = GroupNodes::new(comm, topo)?;
            Ok(halo::halo_all_to_all_v(comm, &layout, send, send_counts, Some(recv_counts), op)?.0)
        }
    }
}

/// [`all_to_all_v_bytes_known`] posted: returns while the rows travel, so independent work can run
/// before [`PostedExchange::wait`]. Flat and pairwise post every peer's message at once (point to
/// point: a posted flat exchange is the pairwise one); HALO's phases wait on each other, so it runs to
/// completion here and nothing overlaps it.
pub fn post_all_to_all_v_bytes_known<C: Communicator + ?Sized>(
    algo: Algo,
    comm: &C,
    topo: &Topology,
    send: &[u8],
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> Result<PostedExchange> {
    match algo {
        Algo::Flat | Algo::Pairwise => post_pairwise_bytes(comm, send, send_counts, recv_counts, op),
        Algo::Halo => Ok(PostedExchange::complete(all_to_all_v_bytes_known(
            algo,
            comm,
            topo,
            send,
            send_counts,
            recv_counts,
            op,
        )?)),
    }
}

/// Typed variable all-to-all: `send_counts` in elements. Returns elements by source and counts.
pub fn all_to_all_v<T: Pod, C: Communicator + ?Sized>(
    algo: Algo,
    comm: &C,
    topo: &Topology,
    send: &[T],
    send_counts: &[usize],
    op: &str,
) -> Result<(Vec<T>, Vec<usize>)> {
    check_counts(op, send.len(), send_counts, comm.size())?;
    let size = std::mem::size_of::<T>();
    let byte_counts: Vec<usize> = send_counts.iter().map(|c| c * size).collect();
    let (bytes, counts) = all_to_all_v_bytes(algo, comm, topo, bytemuck::cast_slice(send), &byte_counts, op)?;
    Ok((from_bytes(&bytes), counts.iter().map(|c| c / size).collect()))
}

/// What each rank receives when rank `s` sends `sends[s]` split by `counts[s]`: the host-side reference.
pub fn reference<T: Clone>(sends: &[Vec<T>], counts: &[Vec<usize>]) -> Vec<Vec<T>> {
    let n = sends.len();
    (0..n)
        .map(|d| {
            (0..n)
                .flat_map(|s| {
                    let start: usize = counts[s][..d].iter().sum();
                    sends[s][start..start + counts[s][d]].to_vec()
                })
                .collect()
        })
        .collect()
}
