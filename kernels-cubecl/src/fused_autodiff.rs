//! `Autodiff` for the fused dense operations: each records what its backward needs and calls the inner
//! backend's backward operation.
//!
//! Legend: see [`crate::fused`].

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{AutodiffBackend, TensorMetadata};

use crate::fused::{AdamWStep, FusedBackend};

/// A linear layer's backward, with (`N` = 3) or without (`N` = 2) a bias; the state is `(x, w)`.
#[derive(Debug)]
struct LinearBackward<const N: usize>;

impl<B: FusedBackend, const N: usize> Backward<B, N> for LinearBackward<N> {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (x, w) = ops.state;
        let [node_x, node_w, node_b] = [0, 1, 2].map(|i| ops.parents.get(i).cloned().flatten());
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::dense_linear_backward_x(dy.clone(), w));
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::dense_linear_backward_w(dy.clone(), x));
        }
        if let Some(node) = node_b {
            grads.register::<B>(node.id, B::dense_linear_backward_b(dy));
        }
    }
}

#[derive(Debug)]
struct RmsNormBackward;

impl<B: FusedBackend> Backward<B, 2> for RmsNormBackward {
    /// `(x, gamma, rstd)`.
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_gamma] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, gamma, rstd) = ops.state;
        let (dx, dgamma) = B::rms_norm_backward(dy, x, gamma, rstd);
        for (node, grad) in [(node_x, dx), (node_gamma, dgamma)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct AttentionBackward;

/// What the attention backward reads: `(q, k, v, o, lse, scale)`.
type AttentionState<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, f32);

impl<B: FusedBackend> Backward<B, 3> for AttentionBackward {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let do_bshe = grads.consume::<B>(&ops.node);
        let (q, k, v, o, lse, scale) = ops.state;
        let (dq, dk, dv) = B::causal_attention_backward(do_bshe, q, k, v, o, lse, scale);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct RotaryBackward;

impl<B: FusedBackend> Backward<B, 1> for RotaryBackward {
    /// `(cos, sin)`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (cos, sin) = ops.state;
        if let Some(node) = node_x {
            // The transpose of a rotation by θ is the rotation by −θ.
            grads.register::<B>(node.id, B::rotary(dy, cos, B::float_neg(sin)));
        }
    }
}

#[derive(Debug)]
struct ConcatHeadsBackward;

impl<B: FusedBackend> Backward<B, 2> for ConcatHeadsBackward {
    /// `(n, g)`: the first part's width and the second part's head count.
    type State = (usize, usize);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_a, node_r] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let (n, g) = ops.state;
        let (da, dr) = B::concat_heads_backward(dout, n, g);
        for (node, grad) in [(node_a, da), (node_r, dr)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: FusedBackend> Backward<B, 1> for CrossEntropyBackward {
    /// `(logits, targets, lse)`.
    type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let dloss = grads.consume::<B>(&ops.node);
        let (logits, targets, lse) = ops.state;
        if let Some(node) = node_logits {
            grads.register::<B>(node.id, B::cross_entropy_backward(logits, targets, lse, dloss));
        }
    }
}

impl<B: FusedBackend, C: CheckpointStrategy> FusedBackend for Autodiff<B, C> {
    fn dense_linear(x_rk: FloatTensor<Self>, w_kn: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, x_node) = x_rk.into_parts();
        let (w, w_node) = w_kn.into_parts();
        match LinearBackward::<2>.prepare::<C>([x_node, w_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::dense_linear(x.clone(), w.clone());
                prep.finish((x, w), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::dense_linear(x, w)),
        }
    }

    fn dense_linear_bias(
        x_rk: FloatTensor<Self>,
        w_kn: FloatTensor<Self>,
        b_n: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (x, x_node) = x_rk.into_parts();
        let (w, w_node) = w_kn.into_parts();
        let (b, b_node) = b_n.into_parts();
        match LinearBackward::<3>.prepare::<C>([x_node, w_node, b_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::dense_linear_bias(x.clone(), w.clone(), b);
                prep.finish((x, w), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::dense_linear_bias(x, w, b)),
        }
    }

    fn rms_norm(
        x_rd: FloatTensor<Self>,
        gamma_d: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, x_node) = x_rd.into_parts();
        let (gamma, gamma_node) = gamma_d.into_parts();
        let (y, rstd) = B::rms_norm(x.clone(), gamma.clone(), eps);
        let y = match RmsNormBackward.prepare::<C>([x_node, gamma_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((x, gamma, rstd.clone()), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        // The reciprocal RMS is an output for the backward, not a differentiable one.
        (y, Autodiff::<B, C>::from_inner(rstd))
    }

    fn causal_attention(
        q_bshc: FloatTensor<Self>,
        k_bsgc: FloatTensor<Self>,
        v_bsge: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (q, q_node) = q_bshc.into_parts();
        let (k, k_node) = k_bsgc.into_parts();
        let (v, v_node) = v_bsge.into_parts();
        let (o, lse) = B::causal_attention(q.clone(), k.clone(), v.clone(), scale);
        let o = match AttentionBackward.prepare::<C>([q_node, k_node, v_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((q, k, v, o.clone(), lse.clone(), scale), o),
            OpsKind::UnTracked(prep) => prep.finish(o),
        };
        // The log-sum-exp is an output for the backward, not a differentiable one.
        (o, Autodiff::<B, C>::from_inner(lse))
    }

    fn rotary(x_bshk: FloatTensor<Self>, cos_sk: FloatTensor<Self>, sin_sk: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, x_node) = x_bshk.into_parts();
        let (cos, sin) = (cos_sk.into_primitive(), sin_sk.into_primitive());
        match RotaryBackward.prepare::<C>([x_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::rotary(x, cos.clone(), sin.clone());
                prep.finish((cos, sin), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rotary(x, cos, sin)),
        }
    }

    fn concat_heads(a_bshn: FloatTensor<Self>, r_bsgr: FloatTensor<Self>) -> FloatTensor<Self> {
        let (a, a_node) = a_bshn.into_parts();
        let (r, r_node) = r_bsgr.into_parts();
        let (n, g) = (a.shape()[3], r.shape()[2]);
        match ConcatHeadsBackward.prepare::<C>([a_node, r_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((n, g), B::concat_heads(a, r)),
            OpsKind::UnTracked(prep) => prep.finish(B::concat_heads(a, r)),
        }
    }

    fn cross_entropy(
        logits_nv: FloatTensor<Self>,
        targets_n: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (logits, node) = logits_nv.into_parts();
        let (loss, lse) = B::cross_entropy(logits.clone(), targets_n.clone());
        let loss = match CrossEntropyBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((logits, targets_n, lse.clone()), loss),
            OpsKind::UnTracked(prep) => prep.finish(loss),
        };
        (loss, Autodiff::<B, C>::from_inner(lse))
    }

    fn adamw_step(
        param_n: FloatTensor<Self>,
        grad_n: FloatTensor<Self>,
        m_n: FloatTensor<Self>,
        v_n: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let inner = |t: FloatTensor<Self>| t.into_primitive();
        let (p, m, v) = B::adamw_step(inner(param_n), inner(grad_n), inner(m_n), inner(v_n), step);
        (Autodiff::<B, C>::from_inner(p), Autodiff::<B, C>::from_inner(m), Autodiff::<B, C>::from_inner(v))
    }

    fn square_sum(x_n: FloatTensor<Self>) -> FloatTensor<Self> {
        Autodiff::<B, C>::from_inner(B::square_sum(x_n.into_primitive()))
    }
}
