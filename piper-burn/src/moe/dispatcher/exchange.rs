//! The expert all-to-all as a differentiable operation: rows go to the expert group's ranks through
//! `piper-comm` (flat, pairwise or HALO) with receive counts the dispatcher already knows; the backward
//! is the reverse exchange of the gradient rows with the transposed counts. A Burn backend extension
//! with a hand-written backward, on every backend the kernels support (Flex, NdArray, the Cube backend
//! of wgpu / ROCm).
//!
//! [`post_rows`] starts an exchange and returns while its rows travel, so independent work (the shared
//! experts) runs before [`PostedRows::finish`] waits for them; the finished exchange is the same
//! differentiable operation.
//!
//! Tensors are staged through host memory (on GPU backends too, until a device-aware path exists). A
//! communication failure inside the op (a dead or hung rank) panics with the communication error — it
//! names the operation, the group and the missing ranks — which ends the process and, under mpirun, the
//! job.
// NdArray is Burn's deprecated CPU backend, still offered as `--backend ndarray`.
#![cfg_attr(feature = "ndarray", allow(deprecated))]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
use piper_comm::alltoall::{Algo, PostedExchange, all_to_all_v_bytes_known, post_all_to_all_v_bytes_known};

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
    /// operation after the previous exchange in the autodiff graph; its value is not used. With
    /// `posted`, `x`'s rows already travel ([`post_rows`]): the operation waits for them.
    fn exchange_rows(
        x: FloatTensor<Self>,
        _chain: FloatTensor<Self>,
        group: ExchangeGroup,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        op: String,
        posted: Option<u64>,
    ) -> FloatTensor<Self> {
        match posted {
            Some(ticket) => finish_host::<Self>(x, &group, ticket, &op),
            None => exchange_host::<Self>(x, &group, &send_counts, &recv_counts, &op),
        }
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
    let (device, width) = (x.device(), x.shape()[1]);
    let data = read_sync(B::float_into_data(x)).expect("reading rows to exchange");
    let values: Vec<f32> = data.convert::<f32>().try_into_vec::<f32>().expect("f32 rows");
    let received = all_to_all_v_bytes_known(
        group.algo,
        group.comm.get(),
        &group.topo,
        bytemuck::cast_slice(&values),
        &row_bytes(send_counts, width),
        &row_bytes(recv_counts, width),
        op,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    rows_from_bytes::<B>(&received, width, &device)
}

/// Bytes of `rows` f32 rows of `width`.
fn row_bytes(rows: &[usize], width: usize) -> Vec<usize> {
    rows.iter().map(|r| r * width * 4).collect()
}

fn rows_from_bytes<B: Backend>(bytes: &[u8], width: usize, device: &B::Device) -> FloatTensor<B> {
    let floats: Vec<f32> = bytemuck::pod_collect_to_vec(bytes);
    let rows = floats.len() / width.max(1);
    B::float_from_data(TensorData::new(floats, Shape::new([rows, width])), device)
}

thread_local! {
    /// Exchanges this rank's thread posted and has not finished, by ticket.
    static POSTED: RefCell<HashMap<u64, PostedExchange>> = RefCell::new(HashMap::new());
}
static TICKETS: AtomicU64 = AtomicU64::new(0);

/// Waits for the exchange posted under `ticket` and returns its rows (`x` only gives the device and
/// width: its rows left when the exchange was posted).
fn finish_host<B: Backend>(x: FloatTensor<B>, group: &ExchangeGroup, ticket: u64, op: &str) -> FloatTensor<B> {
    let _p = kernels_cubecl::profile::op("expert exchange", 0.0);
    let _span = tracing::info_span!("expert_exchange_wait", op).entered();
    let posted = POSTED
        .with(|p| p.borrow_mut().remove(&ticket))
        .unwrap_or_else(|| panic!("{op}: finished twice or on another thread than it was posted on"));
    let received = posted.wait(group.comm.get()).unwrap_or_else(|e| panic!("{e}"));
    rows_from_bytes::<B>(&received, x.shape()[1], &x.device())
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
        posted: Option<u64>,
    ) -> FloatTensor<Self> {
        let (x, node) = x.into_parts();
        let (chain, chain_node) = chain.into_parts();
        match ExchangeBackward.prepare::<C>([node, chain_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (send, recv) = (send_counts.clone(), recv_counts.clone());
                let y = B::exchange_rows(x, chain, group.clone(), send, recv, op.clone(), posted);
                prep.finish(ExchangeState { group, send_counts, recv_counts, op }, y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::exchange_rows(x, chain, group, send_counts, recv_counts, op, posted))
            }
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
    exchange_tensor(x, group, send_counts, recv_counts, op, None)
}

/// Rows whose exchange is posted ([`post_rows`]): [`PostedRows::finish`] waits for them.
#[must_use = "a posted exchange is finished by `finish`"]
pub struct PostedRows {
    x: Tensor<2>,
    group: ExchangeGroup,
    send_counts: Vec<usize>,
    recv_counts: Vec<usize>,
    op: String,
    ticket: u64,
}

/// [`exchange_rows`] started: `x`'s rows are read and posted to their ranks, and this returns while they
/// travel (HALO runs to completion here: its phases wait on each other).
pub fn post_rows(
    x: Tensor<2>,
    group: &ExchangeGroup,
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
) -> PostedRows {
    let _p = kernels_cubecl::profile::op("expert exchange", 0.0);
    let _span = tracing::info_span!("expert_exchange_post", op).entered();
    let width = x.dims()[1];
    let values: Vec<f32> = x.to_data().convert::<f32>().try_into_vec::<f32>().expect("f32 rows");
    let posted = post_all_to_all_v_bytes_known(
        group.algo,
        group.comm.get(),
        &group.topo,
        bytemuck::cast_slice(&values),
        &row_bytes(send_counts, width),
        &row_bytes(recv_counts, width),
        op,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
    POSTED.with(|p| p.borrow_mut().insert(ticket, posted));
    PostedRows {
        x,
        group: group.clone(),
        send_counts: send_counts.to_vec(),
        recv_counts: recv_counts.to_vec(),
        op: op.to_string(),
        ticket,
    }
}

impl PostedRows {
    /// Waits for the rows: the same differentiable exchange as [`exchange_rows`] (its backward is the
    /// reverse exchange).
    pub fn finish(self) -> Tensor<2> {
        let PostedRows { x, group, send_counts, recv_counts, op, ticket } = self;
        exchange_tensor(x, &group, &send_counts, &recv_counts, &op, Some(ticket))
    }
}

fn exchange_tensor(
    x: Tensor<2>,
    group: &ExchangeGroup,
    send_counts: &[usize],
    recv_counts: &[usize],
    op: &str,
    posted: Option<u64>,
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
        posted,
    ));
    *chain = Some(y.clone().sum());
    y
}
