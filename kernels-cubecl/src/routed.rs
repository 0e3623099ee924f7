//! Routed experts — dispatch, grouped SwiGLU experts and combine — as one operation with a
//! hand-written backward, so that a backend can fuse the three ([`crate::flex`] gathers the token rows
//! inside the expert GEMMs and never materialises the `[t · k, d]` copies); backends that do not run the
//! three operations' own kernels ([`crate::backend::MoeBackend::routed_experts_forward`]).
//!
//! Legend: t = tokens, k = experts per token, p = permuted rows (t · k), d = model width, f = expert
//! width, e = experts.

use burn::backend::Backend;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::{FloatTensor, IntTensor};

use crate::backend::MoeBackend;

/// What the backward needs.
#[derive(Debug, Clone)]
pub(crate) struct RoutedState<B: Backend> {
    pub(crate) x_td: FloatTensor<B>,
    pub(crate) w_tk: FloatTensor<B>,
    pub(crate) token_p: IntTensor<B>,
    pub(crate) row_tk: IntTensor<B>,
    pub(crate) slot_p: IntTensor<B>,
    pub(crate) w_gate_edf: FloatTensor<B>,
    pub(crate) w_up_edf: FloatTensor<B>,
    pub(crate) w_down_efd: FloatTensor<B>,
    pub(crate) g_pf: FloatTensor<B>,
    pub(crate) u_pf: FloatTensor<B>,
    /// The experts' output rows, or `[0, d]` where the backend's backward does not read them.
    pub(crate) y_pd: FloatTensor<B>,
    pub(crate) counts_e: Vec<usize>,
}

/// Parents: `[x_td, w_tk, w_gate_edf, w_up_edf, w_down_efd]`.
#[derive(Debug)]
pub(crate) struct RoutedExpertsBackward;

impl<B: MoeBackend> Backward<B, 5> for RoutedExpertsBackward {
    type State = RoutedState<B>;

    fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let dout_td = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let (dx, dw, dwg, dwu, dwd) = B::routed_experts_backward(
            dout_td,
            s.x_td,
            s.w_tk,
            s.token_p,
            s.row_tk,
            s.slot_p,
            s.w_gate_edf,
            s.w_up_edf,
            s.w_down_efd,
            s.g_pf,
            s.u_pf,
            s.y_pd,
            s.counts_e,
        );
        for (node, grad) in ops.parents.into_iter().zip([dx, dw, dwg, dwu, dwd]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}
