//! The expert all-to-all as a differentiable operation: rows go to the expert group's ranks through
//! `piper-comm` (flat, pairwise or HALO) with receive counts the dispatcher already knows; the backward
//! is the reverse exchange of the gradient rows with the transposed counts. A Burn backend extension
//! with a hand-written backward, on every backend the kernels support (Flex, NdArray, the Cube backend
//! of wgpu / ROCm).
//!
//! Tensors are staged through host memory (on GPU backends too, until a device-aware path exists). A
//! communication failure inside the op (a dead or hung rank) panics with the communication error — it
//! names the operation, the group and the missing ranks — which ends the process and, under mpirun, the
//! job.
// NdArray is Burn's deprecated CPU backend, still offered as `--backend ndarray`.
#![cfg_attr(feature = "ndarray", allow(deprecated))]

use std::sync::{Arc, Mutex};

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, TensorMetadata, backend_extension, read_sync};
use burn::tensor::{Shape, Tensor, TensorData};
use piper_comm::Topology;
use piper_comm::alltoall::{Algo, all_to_all_v_bytes_known};

use super::shared_comm::SharedComm;

/// An expert group as the exchange operation sees it: its communicator, where its ranks sit, the
/// algorithm, and the ordering chain of the current forward pass.
#[derive(Clone, Debug)]
pub struct ExchangeGroup {
    pub comm: SharedComm,
    pub topo: Arc<Topology>,
    pub algo: Algo,
    /// A scalar depending on the previous exchange's output: each exchange takes it as an extra input,
    /// so autodiff (which runs backward steps deepest-first) runs the backward exchanges in reverse
    /// forward order on every rank, whatever else differs between the ranks' graphs.
    chain: Arc<Mutex<Option<Tensor<1>>>>,
}

impl ExchangeGroup {
    pub fn new(comm: SharedComm, topo: Arc<Topology>, algo: Algo) -> Self {
        ExchangeGroup { comm, topo, algo, chain: Arc::new(Mutex::new(None)) }
    }

    /// Starts a new chain of exchanges (before each forward pass).
    pub fn reset_chain(&self) {
        *self.chain.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Operations the backends provide for expert parallelism.
#[backend_extension(Autodiff, Cube: cfg(feature = "cube-runtime"), Flex, NdArray: cfg(feature = "ndarray"))]
pub trait ExchangeBackend: burn::backend::Backend {
    /// Sends `send_counts[i]` consecutive rows of `x` to rank i of the group; returns the rows
    /// received, grouped by source rank (`recv_counts[i]` from rank i). `_chain` only orders the
    /// operation after the previous exchange in the autodiff graph; its value is not used.
    fn exchange_rows(
        x: FloatTensor<Self>,
        _chain: FloatTensor<Self>,
        group: ExchangeGroup,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        op: String,
    ) -> FloatTensor<Self> {
        exchange_host::<Self>(x, &group, &send_counts, &recv_counts, &op)
    }
}

impl ExchangeBackend for burn::backend::Flex {}
#[cfg(feature = "ndarray")]
impl ExchangeBackend for burn::backend::NdArray {}
#[cfg(feature = "cube-runtime")]
impl ExchangeBackend for burn_cubecl::CubeBackend {}

fn exchange_host<B: Backend>(
    x: FloatTensor<B>,
    group: &ExchangeGroup,
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> FloatTensor<B> {
    // `--profile` books the staging and the wait with the transfer.
    let _p = kernels_cubecl::profile::op("expert exchange", 0.0);
    let _span = tracing::info_span!("expert_exchange", op).entered();
    let device = x.device();
    let width = x.shape()[1];
    let data = read_sync(B::float_into_data(x)).expect("reading rows to exchange");
    let values: Vec<f32> = data.convert::<f32>().try_into_vec::<f32>().expect("f32 rows");
    let bytes: &[u8] = as_bytes(&values);
    let bytes_of = |rows: &[usize]| -> Vec<usize> { rows.iter().map(|c| c * width * 4).collect() };
    let received = all_to_all_v_bytes_known(
        group.algo,
        group.comm.get(),
        &group.topo,
        bytes,
        &bytes_of(send_counts),
        &bytes_of(recv_counts),
        op,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rows = recv_counts.iter().sum::<usize>();
    let floats: Vec<f32> = received.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    B::float_from_data(TensorData::new(floats, Shape::new([rows, width])), &device)
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[derive(Debug, Clone)]
struct ExchangeState {
    group: ExchangeGroup,
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
        let back = exchange_host::<B>(grad, &s.group, &s.recv_counts, &s.send_counts, &format!("{} (backward)", s.op));
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
        group: ExchangeGroup,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        op: String,
    ) -> FloatTensor<Self> {
        let (x, node) = x.into_parts();
        let (chain, chain_node) = chain.into_parts();
        match ExchangeBackward.prepare::<C>([node, chain_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::exchange_rows(x, chain, group.clone(), send_counts.clone(), recv_counts.clone(), op.clone());
                prep.finish(ExchangeState { group, send_counts, recv_counts, op }, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::exchange_rows(x, chain, group, send_counts, recv_counts, op)),
        }
    }
}

/// Exchanges rows `[n, d]` within an expert group (differentiable), chained after the group's previous
/// exchange of this forward pass.
pub fn exchange_rows(
    x: Tensor<2>,
    group: &ExchangeGroup,
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> Tensor<2> {
    let mut chain = group.chain.lock().unwrap_or_else(|e| e.into_inner());
    let link = chain.take().unwrap_or_else(|| Tensor::zeros([1], &x.device()));
    let y: Tensor<2> = Tensor::from_dispatch(Dispatch::exchange_rows(
        x.into_dispatch(),
        link.into_dispatch(),
        group.clone(),
        send_counts.to_vec(),
        recv_counts.to_vec(),
        op.to_string(),
    ));
    *chain = Some(y.clone().sum());
    y
}
