//! `Autodiff` for the MoE operations: each records its inputs and calls the inner backend's own
//! backward operation (so on the Cube backend the backward runs the CubeCL kernels too).
//!
//! Legend: see [`crate::backend`].

use burn::backend::Backend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::{FloatTensor, IntTensor};

use crate::backend::MoeBackend;
use crate::routed::{RoutedExpertsBackward, RoutedState};

#[derive(Debug)]
struct SwigluBackward;

impl<B: MoeBackend> Backward<B, 2> for SwigluBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_gate, node_up] = ops.parents;
        let grad_h = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        let (d_gate, d_up) = B::swiglu_backward(gate, up, grad_h);
        if let Some(node) = node_gate {
            grads.register::<B>(node.id, d_gate);
        }
        if let Some(node) = node_up {
            grads.register::<B>(node.id, d_up);
        }
    }
}

/// [`MoeBackend::swiglu_down`]'s backward; the state is `(g, u, w)`, not their product.
#[derive(Debug)]
struct SwigluDownBackward;

impl<B: MoeBackend> Backward<B, 3> for SwigluDownBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_g, node_u, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (g, u, w) = ops.state;
        let (dg, du, dw) = B::swiglu_down_backward(dy, g, u, w);
        for (node, grad) in [(node_g, dg), (node_u, du), (node_w, dw)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct PermuteRowsBackward;

impl<B: MoeBackend> Backward<B, 1> for PermuteRowsBackward {
    type State = IntTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy_pd = grads.consume::<B>(&ops.node);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::permute_rows_backward(dy_pd, ops.state));
        }
    }
}

#[derive(Debug)]
struct CombineRowsBackward;

impl<B: MoeBackend> Backward<B, 2> for CombineRowsBackward {
    /// `(y_pd, w_tk, row_tk, slot_p)`.
    type State = (FloatTensor<B>, FloatTensor<B>, IntTensor<B>, IntTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_y, node_w] = ops.parents;
        let dout_td = grads.consume::<B>(&ops.node);
        let (y_pd, w_tk, row_tk, slot_p) = ops.state;
        let (dy_pd, dw_tk) = B::combine_rows_backward(dout_td, y_pd, w_tk, row_tk, slot_p);
        if let Some(node) = node_y {
            grads.register::<B>(node.id, dy_pd);
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, dw_tk);
        }
    }
}

#[derive(Debug)]
struct TopkSoftmaxBackward;

impl<B: MoeBackend> Backward<B, 1> for TopkSoftmaxBackward {
    /// `(logits_te, idx_tk, w_tk, renormalize)`.
    type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>, bool);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let dw_tk = grads.consume::<B>(&ops.node);
        let (logits_te, idx_tk, w_tk, renormalize) = ops.state;
        if let Some(node) = node_logits {
            grads.register::<B>(node.id, B::topk_softmax_backward(logits_te, idx_tk, w_tk, dw_tk, renormalize));
        }
    }
}

#[derive(Debug)]
struct TopkSigmoidBackward;

impl<B: MoeBackend> Backward<B, 1> for TopkSigmoidBackward {
    /// `(logits_te, idx_tk, renormalize)`.
    type State = (FloatTensor<B>, IntTensor<B>, bool);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let dw_tk = grads.consume::<B>(&ops.node);
        let (logits_te, idx_tk, renormalize) = ops.state;
        if let Some(node) = node_logits {
            grads.register::<B>(node.id, B::topk_sigmoid_backward(logits_te, idx_tk, dw_tk, renormalize));
        }
    }
}

impl<B: MoeBackend, C: CheckpointStrategy> MoeBackend for Autodiff<B, C> {
    fn grouped_swiglu(
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> FloatTensor<Self> {
        let (x, x_node) = x_pd.into_parts();
        let (wg, wg_node) = w_gate_edf.into_parts();
        let (wu, wu_node) = w_up_edf.into_parts();
        let (wd, wd_node) = w_down_efd.into_parts();
        match GroupedSwigluBackward.prepare::<C>([x_node, wg_node, wu_node, wd_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, g, u) =
                    B::grouped_swiglu_forward(x.clone(), wg.clone(), wu.clone(), wd.clone(), counts_e.clone());
                let state =
                    GroupedState { x_pd: x, w_gate_edf: wg, w_up_edf: wu, w_down_efd: wd, g_pf: g, u_pf: u, counts_e };
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::grouped_swiglu(x, wg, wu, wd, counts_e)),
        }
    }

    fn routed_experts(
        x_td: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        token_p: IntTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> FloatTensor<Self> {
        let (x, x_node) = x_td.into_parts();
        let (w, w_node) = w_tk.into_parts();
        let (wg, wg_node) = w_gate_edf.into_parts();
        let (wu, wu_node) = w_up_edf.into_parts();
        let (wd, wd_node) = w_down_efd.into_parts();
        let nodes = [x_node, w_node, wg_node, wu_node, wd_node];
        match RoutedExpertsBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, g, u, y) = B::routed_experts_forward(
                    x.clone(),
                    w.clone(),
                    token_p.clone(),
                    row_tk.clone(),
                    slot_p.clone(),
                    wg.clone(),
                    wu.clone(),
                    wd.clone(),
                    counts_e.clone(),
                );
                let state = RoutedState {
                    x_td: x,
                    w_tk: w,
                    token_p,
                    row_tk,
                    slot_p,
                    w_gate_edf: wg,
                    w_up_edf: wu,
                    w_down_efd: wd,
                    g_pf: g,
                    u_pf: u,
                    y_pd: y,
                    counts_e,
                };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::routed_experts(x, w, token_p, row_tk, slot_p, wg, wu, wd, counts_e))
            }
        }
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let (gate, gate_node) = gate.into_parts();
        let (up, up_node) = up.into_parts();
        match SwigluBackward.prepare::<C>([gate_node, up_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let h = B::swiglu(gate.clone(), up.clone());
                prep.finish((gate, up), h)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu(gate, up)),
        }
    }

    fn swiglu_down(g_rf: FloatTensor<Self>, u_rf: FloatTensor<Self>, w_fn: FloatTensor<Self>) -> FloatTensor<Self> {
        let (g, g_node) = g_rf.into_parts();
        let (u, u_node) = u_rf.into_parts();
        let (w, w_node) = w_fn.into_parts();
        match SwigluDownBackward.prepare::<C>([g_node, u_node, w_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::swiglu_down(g.clone(), u.clone(), w.clone());
                prep.finish((g, u, w), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu_down(g, u, w)),
        }
    }

    fn permute_rows(x_td: FloatTensor<Self>, token_p: IntTensor<Self>, row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        let (x, x_node) = x_td.into_parts();
        match PermuteRowsBackward.prepare::<C>([x_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::permute_rows(x, token_p, row_tk.clone());
                prep.finish(row_tk, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::permute_rows(x, token_p, row_tk)),
        }
    }

    fn combine_rows(
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let (y, y_node) = y_pd.into_parts();
        let (w, w_node) = w_tk.into_parts();
        match CombineRowsBackward.prepare::<C>([y_node, w_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::combine_rows(y.clone(), w.clone(), row_tk.clone(), slot_p.clone());
                prep.finish((y, w, row_tk, slot_p), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::combine_rows(y, w, row_tk, slot_p)),
        }
    }

    fn topk_softmax(logits_te: FloatTensor<Self>, k: usize, renormalize: bool) -> (FloatTensor<Self>, IntTensor<Self>) {
        let (logits, node) = logits_te.into_parts();
        let (w_tk, idx_tk) = B::topk_softmax(logits.clone(), k, renormalize);
        let w = match TopkSoftmaxBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((logits, idx_tk.clone(), w_tk.clone(), renormalize), w_tk),
            OpsKind::UnTracked(prep) => prep.finish(w_tk),
        };
        (w, idx_tk)
    }

    fn topk_sigmoid(
        logits_te: FloatTensor<Self>,
        bias_e: FloatTensor<Self>,
        k: usize,
        renormalize: bool,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        let (logits, node) = logits_te.into_parts();
        // The bias only steers the choice: no gradient flows to it.
        let (bias, _) = bias_e.into_parts();
        let (w_tk, idx_tk) = B::topk_sigmoid(logits.clone(), bias, k, renormalize);
        let w = match TopkSigmoidBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((logits, idx_tk.clone(), renormalize), w_tk),
            OpsKind::UnTracked(prep) => prep.finish(w_tk),
        };
        (w, idx_tk)
    }
}

/// What the backward needs.
#[derive(Debug, Clone)]
pub(crate) struct GroupedState<B: Backend> {
    pub(crate) x_pd: FloatTensor<B>,
    pub(crate) w_gate_edf: FloatTensor<B>,
    pub(crate) w_up_edf: FloatTensor<B>,
    pub(crate) w_down_efd: FloatTensor<B>,
    pub(crate) g_pf: FloatTensor<B>,
    pub(crate) u_pf: FloatTensor<B>,
    pub(crate) counts_e: Vec<usize>,
}

#[derive(Debug)]
pub(crate) struct GroupedSwigluBackward;

impl<B: MoeBackend> Backward<B, 4> for GroupedSwigluBackward {
    type State = GroupedState<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_wg, node_wu, node_wd] = ops.parents;
        let dy_pd = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let (dx, dwg, dwu, dwd) = B::grouped_swiglu_backward(
            dy_pd,
            s.x_pd,
            s.w_gate_edf,
            s.w_up_edf,
            s.w_down_efd,
            s.g_pf,
            s.u_pf,
            s.counts_e,
        );
        if let Some(node) = node_x {
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_wg {
            grads.register::<B>(node.id, dwg);
        }
        if let Some(node) = node_wu {
            grads.register::<B>(node.id, dwu);
        }
        if let Some(node) = node_wd {
            grads.register::<B>(node.id, dwd);
        }
    }
}
