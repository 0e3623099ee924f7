//! The expert all-to-all as a differentiable operation: rows go to the expert group's ranks through
//! `piper-comm` (flat or HALO); the backward is the reverse exchange of the gradient rows with the
//! transposed counts. Implemented as a Burn backend extension with a hand-written backward.
//!
//! Tensors are staged through host memory (on GPU backends too, until a device-aware path exists).
//! Communicators are not `Send`, so each thread keeps its expert groups in a registry and the
//! operation carries the group's handle. A communication failure inside the op (a dead or hung rank)
//! panics with the communication error — it names the operation, the group and the missing ranks —
//! which ends the process and, under mpirun, the job.

use std::cell::RefCell;

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, TensorMetadata, backend_extension, read_sync};
use burn::tensor::{Shape, Tensor, TensorData};
use piper_comm::alltoall::{Algo, all_to_all_v_bytes};
use piper_comm::{Communicator, Topology};

struct Group {
    comm: Option<Box<dyn Communicator>>,
    topo: Topology,
    algo: Algo,
    /// A scalar depending on the previous exchange's output: each exchange takes it as an extra
    /// input, so autodiff (which runs backward steps deepest-first) runs the backward exchanges in
    /// reverse forward order on every rank, whatever else differs between the ranks' graphs.
    chain: Option<Tensor<1>>,
}

thread_local! {
    static GROUPS: RefCell<Vec<Group>> = const { RefCell::new(Vec::new()) };
}

/// A registered expert group (valid on the thread that registered it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupHandle(pub u64);

/// Registers an expert group's communicator for the exchange operation.
pub fn register_group(comm: Box<dyn Communicator>, topo: Topology, algo: Algo) -> GroupHandle {
    GROUPS.with(|g| {
        let mut g = g.borrow_mut();
        g.push(Group { comm: Some(comm), topo, algo, chain: None });
        GroupHandle(g.len() as u64 - 1)
    })
}

/// Releases a group's communicator (before MPI is finalised).
pub fn release_group(handle: GroupHandle) {
    GROUPS.with(|g| {
        if let Some(group) = g.borrow_mut().get_mut(handle.0 as usize) {
            group.comm = None;
        }
    });
}

/// Starts a new chain of exchanges (call before each forward pass).
pub fn reset_chain(handle: GroupHandle) {
    GROUPS.with(|g| {
        if let Some(group) = g.borrow_mut().get_mut(handle.0 as usize) {
            group.chain = None;
        }
    });
}

fn take_chain(handle: GroupHandle) -> Option<Tensor<1>> {
    GROUPS.with(|g| g.borrow_mut().get_mut(handle.0 as usize).and_then(|group| group.chain.take()))
}

fn set_chain(handle: GroupHandle, t: Tensor<1>) {
    GROUPS.with(|g| {
        if let Some(group) = g.borrow_mut().get_mut(handle.0 as usize) {
            group.chain = Some(t);
        }
    });
}

/// Releases the group when dropped.
pub struct GroupGuard(pub GroupHandle);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        release_group(self.0);
    }
}

/// Runs `f` with a registered group.
pub fn with_group<R>(handle: GroupHandle, f: impl FnOnce(&dyn Communicator, &Topology, Algo) -> R) -> R {
    GROUPS.with(|g| {
        let g = g.borrow();
        let group = g.get(handle.0 as usize).expect("expert group handle registered on this thread");
        let comm = group.comm.as_ref().expect("expert group used after it was released");
        f(comm.as_ref(), &group.topo, group.algo)
    })
}

/// Operations the backends provide for expert parallelism.
#[backend_extension(Autodiff, Flex)]
pub trait ExchangeBackend: burn::backend::Backend {
    /// Sends `send_counts[i]` consecutive rows of `x` to rank i of the group; returns the rows
    /// received, grouped by source rank (`recv_counts[i]` from rank i). `_chain` only orders the
    /// operation after the previous exchange in the autodiff graph; its value is not used.
    fn exchange_rows(
        x: FloatTensor<Self>,
        _chain: FloatTensor<Self>,
        group: u64,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        op: String,
    ) -> FloatTensor<Self> {
        exchange_host::<Self>(x, group, &send_counts, &recv_counts, &op)
    }
}

impl ExchangeBackend for burn::backend::Flex {}

fn exchange_host<B: Backend>(
    x: FloatTensor<B>,
    group: u64,
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> FloatTensor<B> {
    let device = x.device();
    let width = x.shape()[1];
    let data = read_sync(B::float_into_data(x)).expect("reading rows to exchange");
    let values: Vec<f32> = data.convert::<f32>().try_into_vec::<f32>().expect("f32 rows");
    let bytes: &[u8] = bytemuck_cast(&values);
    let byte_counts: Vec<usize> = send_counts.iter().map(|c| c * width * 4).collect();
    let (received, counts) = with_group(GroupHandle(group), |comm, topo, algo| {
        all_to_all_v_bytes(algo, comm, topo, bytes, &byte_counts, op)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let got_rows: Vec<usize> = counts.iter().map(|c| c / (width * 4)).collect();
    assert_eq!(got_rows, recv_counts, "{op}: received row counts differ from the announced ones");
    let rows = recv_counts.iter().sum::<usize>();
    let floats: Vec<f32> = received.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    B::float_from_data(TensorData::new(floats, Shape::new([rows, width])), &device)
}

fn bytemuck_cast(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[derive(Debug, Clone)]
struct ExchangeState {
    group: u64,
    send_counts: Vec<usize>,
    recv_counts: Vec<usize>,
    op: String,
}

#[derive(Debug)]
struct ExchangeBackward;

impl<B: Backend> Backward<B, 2> for ExchangeBackward {
    type State = ExchangeState;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node, chain] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let device = grad.device();
        let dtype = grad.dtype().into();
        // The gradient of an exchange is the reverse exchange.
        let back = exchange_host::<B>(grad, s.group, &s.recv_counts, &s.send_counts, &format!("{} (backward)", s.op));
        if let Some(node) = node {
            grads.register::<B>(node.id, back);
        }
        // The ordering input carries no gradient.
        if let Some(chain) = chain {
            grads.register::<B>(chain.id, B::float_zeros(Shape::new([1]), &device, dtype));
        }
    }
}

impl<B: ExchangeBackend, C: CheckpointStrategy> ExchangeBackend for Autodiff<B, C> {
    fn exchange_rows(
        x: FloatTensor<Self>,
        chain: FloatTensor<Self>,
        group: u64,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        op: String,
    ) -> FloatTensor<Self> {
        let (x, node) = x.into_parts();
        let (chain, chain_node) = chain.into_parts();
        match ExchangeBackward.prepare::<C>([node, chain_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::exchange_rows(x, chain, group, send_counts.clone(), recv_counts.clone(), op.clone());
                prep.finish(ExchangeState { group, send_counts, recv_counts, op }, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::exchange_rows(x, chain, group, send_counts, recv_counts, op)),
        }
    }
}

/// Exchanges rows `[n, d]` within an expert group (differentiable).
pub fn exchange_rows(
    x: Tensor<2>,
    group: GroupHandle,
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> Tensor<2> {
    let chain = take_chain(group).unwrap_or_else(|| Tensor::zeros([1], &x.device()));
    let y: Tensor<2> = Tensor::from_dispatch(Dispatch::exchange_rows(
        x.into_dispatch(),
        chain.into_dispatch(),
        group.0,
        send_counts.to_vec(),
        recv_counts.to_vec(),
        op.to_string(),
    ));
    set_chain(group, y.clone().sum());
    y
}
