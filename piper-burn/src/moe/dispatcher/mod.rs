//! Token dispatchers: how an MoE block's permuted rows reach the ranks that hold their experts and come
//! back. One interface ([`TokenDispatcher`]), in the spirit of Megatron-Core's token dispatchers and
//! DeepEP's `dispatch` / `combine`: `dispatch` returns a [`DispatchHandle`] (counts and order) that
//! `combine` and the backward reuse, so the per-expert counts are exchanged once per MoE layer and
//! micro-batch. The dispatcher owns its communicators (expert group, and the ranks that share the
//! layer for the global load-balancing loss).
//!
//! Legend: p = permuted rows sorted by expert position (destination rank, then local slot), q = rows
//! this rank's experts receive, d = model width, e = experts.

pub mod exchange;
pub mod placement;
pub mod shared_comm;

use std::fmt::Debug;

use burn::prelude::*;

use exchange::{ExchangeGroup, exchange_rows, post_rows};
pub use placement::{ExpertPlacement, PlacementError};
pub use shared_comm::SharedComm;

/// What `dispatch` learned, reused by `combine` and (through the autodiff state) the backward.
#[derive(Clone, Debug)]
pub struct DispatchHandle {
    /// Rows sent to each rank of the expert group, by destination.
    pub send_counts: Vec<usize>,
    /// Rows received from each rank of the expert group, by source.
    pub recv_counts: Vec<usize>,
    /// Rows for each local expert (summed over sources), in local-slot order.
    pub local_counts: Vec<usize>,
    /// Received row order → local-expert order, and back (`None`: rows are already in expert order).
    order: Option<(Tensor<1, Int>, Tensor<1, Int>)>,
}

/// Moves an MoE block's rows to the ranks of their experts and back.
pub trait TokenDispatcher: Send + Sync + Debug {
    /// Starts a forward pass (orders this pass's exchanges after each other in the autodiff graph).
    fn begin_forward(&self) {}

    /// Sends the rows `x_pd` (sorted by expert position, `counts_p[i]` rows for position i) to the ranks
    /// holding their experts. Returns this rank's experts' rows, sorted by local expert, and the handle.
    fn dispatch(&self, x_pd: Tensor<2>, counts_p: &[usize]) -> (Tensor<2>, DispatchHandle);

    /// [`Self::dispatch`] with `overlap` (work that does not need the rows: the shared experts) run while
    /// the rows travel, where the dispatcher can post its exchange; otherwise before it.
    fn dispatch_overlapped(
        &self,
        x_pd: Tensor<2>,
        counts_p: &[usize],
        overlap: &mut dyn FnMut(),
    ) -> (Tensor<2>, DispatchHandle) {
        overlap();
        self.dispatch(x_pd, counts_p)
    }

    /// Sends the experts' outputs back (the inverse of `dispatch`), in the order `x_pd` had.
    fn combine(&self, y_qd: Tensor<2>, handle: &DispatchHandle) -> Tensor<2>;

    /// Tokens per expert summed over the ranks that share the layer (the global batch of the
    /// micro-batch, for the global load-balancing loss); the local counts if nobody shares it.
    fn layer_load(&self, counts_e: &[usize]) -> Vec<usize> {
        counts_e.to_vec()
    }
}

/// Sums `counts_e` over `group` (exact for counts below 2^24 per expert and micro-batch).
fn all_reduce_counts(group: &SharedComm, counts_e: &[usize]) -> Vec<usize> {
    let mut v: Vec<f32> = counts_e.iter().map(|c| *c as f32).collect();
    group
        .get()
        .all_reduce_sum_f32(&mut v, "expert load all-reduce (global aux loss)")
        .unwrap_or_else(|e| panic!("{e}"));
    v.iter().map(|c| c.round() as usize).collect()
}

/// Every expert on this rank: rows stay where they are. With `layer_group`, the load of the layer is
/// summed over the data-parallel ranks that share it.
#[derive(Debug, Default)]
pub struct LocalDispatcher {
    pub layer_group: Option<SharedComm>,
}

impl TokenDispatcher for LocalDispatcher {
    fn dispatch(&self, x_pd: Tensor<2>, counts_p: &[usize]) -> (Tensor<2>, DispatchHandle) {
        let rows = counts_p.iter().sum();
        let handle = DispatchHandle {
            send_counts: vec![rows],
            recv_counts: vec![rows],
            local_counts: counts_p.to_vec(),
            order: None,
        };
        (x_pd, handle)
    }

    fn combine(&self, y_qd: Tensor<2>, _handle: &DispatchHandle) -> Tensor<2> {
        y_qd
    }

    fn layer_load(&self, counts_e: &[usize]) -> Vec<usize> {
        match &self.layer_group {
            Some(g) => all_reduce_counts(g, counts_e),
            None => counts_e.to_vec(),
        }
    }
}

/// Expert parallelism: the experts are spread over an expert group, and rows travel by all-to-all
/// (flat, pairwise or HALO).
#[derive(Debug)]
pub struct AllToAllDispatcher {
    pub group: ExchangeGroup,
    /// Experts per rank.
    pub local_experts: usize,
    /// The ranks that share the layer (the stage's EP × DP ranks), for the global load.
    pub layer_group: Option<SharedComm>,
    /// Whether `dispatch_overlapped` posts the exchange and runs its work while the rows travel.
    pub overlap: bool,
}

const DISPATCH: &str = "expert dispatch all-to-all";

/// The rows of one dispatch, from the layer's one count exchange.
struct DispatchCounts {
    /// Rows to and from each rank of the group.
    send: Vec<usize>,
    recv: Vec<usize>,
    /// Rows from each source for each local expert.
    from: Vec<Vec<usize>>,
}

impl AllToAllDispatcher {
    /// Rows per (destination rank, its local expert), and — the one count exchange of this layer and
    /// micro-batch — what every source sends here.
    fn exchange_counts(&self, counts_p: &[usize]) -> DispatchCounts {
        let comm = self.group.comm.get();
        let (n, local) = (comm.size(), self.local_experts);
        assert_eq!(counts_p.len(), n * local, "dispatch: {} counts for {n} ranks × {local} experts", counts_p.len());
        let send: Vec<usize> = counts_p.chunks(local).map(|c| c.iter().sum()).collect();
        let counts_u64: Vec<u64> = counts_p.iter().map(|c| *c as u64).collect();
        let (incoming, _) =
            piper_comm::collectives::all_to_all_v(comm, &counts_u64, &vec![local; n], "expert counts exchange")
                .unwrap_or_else(|e| panic!("{e}"));
        let from: Vec<Vec<usize>> = incoming.chunks(local).map(|c| c.iter().map(|x| *x as usize).collect()).collect();
        let recv = from.iter().map(|c| c.iter().sum()).collect();
        DispatchCounts { send, recv, from }
    }
}

impl DispatchCounts {
    /// The received rows `x_qd` (grouped by source, then local expert) sorted by local expert, and the
    /// handle that undoes it.
    fn by_local_expert(self, x_qd: Tensor<2>) -> (Tensor<2>, DispatchHandle) {
        let DispatchCounts { send, recv, from } = self;
        let (n, local) = (from.len(), from.first().map_or(0, Vec::len));
        let source_start = piper_comm::collectives::displacements(&recv);
        let mut order: Vec<i64> = Vec::with_capacity(recv.iter().sum());
        for j in 0..local {
            for s in 0..n {
                let start = source_start[s] + from[s][..j].iter().sum::<usize>();
                order.extend((start..start + from[s][j]).map(|i| i as i64));
            }
        }
        let mut inverse = vec![0i64; order.len()];
        for (pos, &row) in order.iter().enumerate() {
            inverse[row as usize] = pos as i64;
        }
        let device = x_qd.device();
        let q = order.len();
        let order_q = Tensor::<1, Int>::from_data(TensorData::new(order, [q]), &device);
        let inverse_q = Tensor::<1, Int>::from_data(TensorData::new(inverse, [q]), &device);
        let by_expert = x_qd.select(0, order_q.clone());
        let local_counts = (0..local).map(|j| from.iter().map(|c| c[j]).sum()).collect();
        let order = Some((order_q, inverse_q));
        (by_expert, DispatchHandle { send_counts: send, recv_counts: recv, local_counts, order })
    }
}

impl TokenDispatcher for AllToAllDispatcher {
    fn begin_forward(&self) {
        self.group.reset_chain();
    }

    fn dispatch(&self, x_pd: Tensor<2>, counts_p: &[usize]) -> (Tensor<2>, DispatchHandle) {
        let counts = self.exchange_counts(counts_p);
        let x_qd = exchange_rows(x_pd, &self.group, &counts.send, &counts.recv, DISPATCH);
        counts.by_local_expert(x_qd)
    }

    fn dispatch_overlapped(
        &self,
        x_pd: Tensor<2>,
        counts_p: &[usize],
        overlap: &mut dyn FnMut(),
    ) -> (Tensor<2>, DispatchHandle) {
        if !self.overlap {
            overlap();
            return self.dispatch(x_pd, counts_p);
        }
        let counts = self.exchange_counts(counts_p);
        let posted = post_rows(x_pd, &self.group, &counts.send, &counts.recv, DISPATCH);
        overlap();
        counts.by_local_expert(posted.finish())
    }

    fn combine(&self, y_qd: Tensor<2>, h: &DispatchHandle) -> Tensor<2> {
        let y_qd = match &h.order {
            Some((_, inverse)) => y_qd.select(0, inverse.clone()),
            None => y_qd,
        };
        exchange_rows(y_qd, &self.group, &h.recv_counts, &h.send_counts, "expert combine all-to-all")
    }

    fn layer_load(&self, counts_e: &[usize]) -> Vec<usize> {
        match &self.layer_group {
            Some(g) => all_reduce_counts(g, counts_e),
            None => counts_e.to_vec(),
        }
    }
}
