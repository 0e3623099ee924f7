//! The MoE operations as a Burn backend extension. Each default body is the plain definition on
//! Burn's primitive ops — what NdArray runs, and Flex for dtypes its fused host code
//! ([`crate::flex`]) does not cover; the Cube backend (wgpu, and ROCm where built) overrides them
//! with the CubeCL kernels in [`crate::cube`]; `Autodiff` adds the hand-written backward passes
//! ([`crate::autodiff`]).
//!
//! Legend: t = tokens, k = experts per token, p = permuted rows (t · k), d = row width, e = experts,
//! f = expert width. `row_tk[t, j]` is the permuted row holding (token t, slot j); `slot_p[i]` is the
//! flat `t · k + j` slot of permuted row i — the two are inverse permutations.

// NdArray is deprecated in Burn 0.22 but still a `--backend` choice of the examples.
#![cfg_attr(feature = "ndarray", allow(deprecated))]

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, backend_extension};

use crate::grouped::{grouped_backward, grouped_forward};

/// The MoE operations a backend provides.
#[backend_extension(Autodiff, Cube: cfg(feature = "cube-runtime"), Flex, NdArray: cfg(feature = "ndarray"))]
pub trait MoeBackend: burn::backend::Backend {
    /// Grouped SwiGLU experts: `x_pd` `[p, d]` sorted by expert, `w_gate_edf`/`w_up_edf` `[e, d, f]`,
    /// `w_down_efd` `[e, f, d]`, `counts_e[i]` rows for expert i → `[p, d]`.
    fn grouped_swiglu(
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> FloatTensor<Self> {
        Self::grouped_swiglu_forward(x_pd, w_gate_edf, w_up_edf, w_down_efd, counts_e).0
    }

    /// [`Self::grouped_swiglu`] that also returns the gate and up projections `[p, f]` (for the backward).
    fn grouped_swiglu_forward(
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        grouped_forward::<Self>(x_pd, w_gate_edf, w_up_edf, w_down_efd, &counts_e)
    }

    /// Backward of [`Self::grouped_swiglu`] from `dy_pd`: `(dx_pd, dw_gate_edf, dw_up_edf, dw_down_efd)`.
    #[allow(clippy::too_many_arguments)]
    fn grouped_swiglu_backward(
        dy_pd: FloatTensor<Self>,
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        g_pf: FloatTensor<Self>,
        u_pf: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        grouped_backward::<Self>(dy_pd, x_pd, w_gate_edf, w_up_edf, w_down_efd, g_pf, u_pf, &counts_e)
    }

    /// Routed experts, dispatch and combine in one: `out_td[t] = Σ_j w_tk[t, j] · y[row_tk[t, j]]` where
    /// `y` is [`Self::grouped_swiglu`] of the token rows in expert order (`x_td[token_p[i]]`,
    /// `counts_e[i]` rows for expert i).
    #[allow(clippy::too_many_arguments)]
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
        Self::routed_experts_forward(x_td, w_tk, token_p, row_tk, slot_p, w_gate_edf, w_up_edf, w_down_efd, counts_e).0
    }

    /// [`Self::routed_experts`] that also returns what its backward needs: the gate and up projections
    /// `[p, f]` and the experts' output rows `y_pd` `[p, d]` when the backend's backward reads them
    /// (this definition's does; a backend whose backward does not may return `[0, d]`).
    #[allow(clippy::too_many_arguments)]
    fn routed_experts_forward(
        x_td: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        token_p: IntTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        generic::routed_experts_forward::<Self>(
            x_td, w_tk, token_p, row_tk, slot_p, w_gate_edf, w_up_edf, w_down_efd, counts_e,
        )
    }

    /// Backward of [`Self::routed_experts`] from `dout_td`, given what its forward returned:
    /// `(dx_td, dw_tk, dw_gate_edf, dw_up_edf, dw_down_efd)`.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn routed_experts_backward(
        dout_td: FloatTensor<Self>,
        x_td: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        token_p: IntTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        g_pf: FloatTensor<Self>,
        u_pf: FloatTensor<Self>,
        y_pd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        generic::routed_experts_backward::<Self>(
            dout_td, x_td, w_tk, token_p, row_tk, slot_p, w_gate_edf, w_up_edf, w_down_efd, g_pf, u_pf, y_pd, counts_e,
        )
    }

    /// `silu(gate) ⊙ up`, element-wise, any shape.
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let sig = Self::sigmoid(gate.clone());
        Self::float_mul(Self::float_mul(gate, sig), up)
    }

    /// Backward of [`Self::swiglu`] from `grad_h`: `(d gate, d up)`.
    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad_h: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let sig = Self::sigmoid(gate.clone());
        let silu = Self::float_mul(gate.clone(), sig.clone());
        // silu'(g) = σ(g) · (1 + g · (1 − σ(g)))
        let one_minus = Self::float_add_scalar(Self::float_neg(sig.clone()), 1.0f32.into());
        let dsilu = Self::float_mul(sig, Self::float_add_scalar(Self::float_mul(gate, one_minus), 1.0f32.into()));
        let d_gate = Self::float_mul(Self::float_mul(grad_h.clone(), up), dsilu);
        (d_gate, Self::float_mul(grad_h, silu))
    }

    /// A SwiGLU MLP's down projection from its gate and up projections: `y_rn = (silu(g_rf) ⊙ u_rf) · w_fn`,
    /// [`Self::swiglu`] then the product of `crate::FusedBackend::dense_linear` (same values). Under
    /// `Autodiff` it holds `g` and `u` but not their product, which its backward recomputes (selective
    /// activation recompute).
    fn swiglu_down(g_rf: FloatTensor<Self>, u_rf: FloatTensor<Self>, w_fn: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::fused::generic::linear::<Self>(Self::swiglu(g_rf, u_rf), w_fn)
    }

    /// Backward of [`Self::swiglu_down`] from `dy_rn`, `silu(g) ⊙ u` recomputed: `(dg_rf, du_rf, dw_fn)`.
    fn swiglu_down_backward(
        dy_rn: FloatTensor<Self>,
        g_rf: FloatTensor<Self>,
        u_rf: FloatTensor<Self>,
        w_fn: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let h_rf = Self::swiglu(g_rf.clone(), u_rf.clone());
        let dw_fn = crate::fused::generic::linear_backward_w::<Self>(dy_rn.clone(), h_rf);
        let dh_rf = crate::fused::generic::linear_backward_x::<Self>(dy_rn, w_fn);
        let (dg_rf, du_rf) = Self::swiglu_backward(g_rf, u_rf, dh_rf);
        (dg_rf, du_rf, dw_fn)
    }

    /// Dispatch permute: `out_pd[i] = x_td[token_p[i]]`; `row_tk` (the inverse map) is for the backward.
    fn permute_rows(x_td: FloatTensor<Self>, token_p: IntTensor<Self>, row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        generic::permute_rows::<Self>(x_td, token_p, row_tk)
    }

    /// Backward of [`Self::permute_rows`]: `dx_td[t] = Σ_j dy_pd[row_tk[t, j]]`.
    fn permute_rows_backward(dy_pd: FloatTensor<Self>, row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        generic::permute_rows_backward::<Self>(dy_pd, row_tk)
    }

    /// Combine: `out_td[t] = Σ_j w_tk[t, j] · y_pd[row_tk[t, j]]`; `slot_p` is for the backward.
    fn combine_rows(
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        generic::combine_rows::<Self>(y_pd, w_tk, row_tk, slot_p)
    }

    /// Backward of [`Self::combine_rows`] from `dout_td`: `(dy_pd, dw_tk)` with
    /// `dy_pd[i] = w[slot_p[i]] · dout_td[slot_p[i] / k]` and `dw_tk[t, j] = ⟨dout_td[t], y_pd[row_tk[t, j]]⟩`.
    fn combine_rows_backward(
        dout_td: FloatTensor<Self>,
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::combine_rows_backward::<Self>(dout_td, y_pd, w_tk, row_tk, slot_p)
    }

    /// Softmax top-k gating: the `k` largest of `softmax(logits_te)` per token in descending order,
    /// as `(w_tk, idx_tk)`, the weights divided by their sum when `renormalize`.
    fn topk_softmax(logits_te: FloatTensor<Self>, k: usize, renormalize: bool) -> (FloatTensor<Self>, IntTensor<Self>) {
        generic::topk_softmax::<Self>(logits_te, k, renormalize)
    }

    /// Backward of [`Self::topk_softmax`] from `dw_tk`, given its outputs: `d logits_te`.
    fn topk_softmax_backward(
        logits_te: FloatTensor<Self>,
        idx_tk: IntTensor<Self>,
        w_tk: FloatTensor<Self>,
        dw_tk: FloatTensor<Self>,
        renormalize: bool,
    ) -> FloatTensor<Self> {
        generic::topk_softmax_backward::<Self>(logits_te, idx_tk, w_tk, dw_tk, renormalize)
    }

    /// Sigmoid top-k gating (DeepSeek-V3): per token the `k` experts with the largest
    /// `sigmoid(logits_te) + bias_e` (the bias steers the choice only), in descending order, as
    /// `(w_tk, idx_tk)` with `w` their sigmoid scores, divided by `Σ w + 1e-20` when `renormalize`.
    fn topk_sigmoid(
        logits_te: FloatTensor<Self>,
        bias_e: FloatTensor<Self>,
        k: usize,
        renormalize: bool,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        generic::topk_sigmoid::<Self>(logits_te, bias_e, k, renormalize)
    }

    /// Backward of [`Self::topk_sigmoid`] from `dw_tk`, given the experts it picked: `d logits_te`
    /// (zero outside the picked experts; the bias gets none).
    fn topk_sigmoid_backward(
        logits_te: FloatTensor<Self>,
        idx_tk: IntTensor<Self>,
        dw_tk: FloatTensor<Self>,
        renormalize: bool,
    ) -> FloatTensor<Self> {
        generic::topk_sigmoid_backward::<Self>(logits_te, idx_tk, dw_tk, renormalize)
    }
}

/// NdArray (Burn's deprecated CPU backend, `--backend ndarray`) runs the generic definitions above.
#[cfg(feature = "ndarray")]
impl MoeBackend for burn::backend::NdArray {}

/// Row-wise softmax of `[t, e]`, max-subtracted.
fn softmax_rows<B: Backend>(logits_te: FloatTensor<B>) -> FloatTensor<B> {
    let max_t1 = B::float_max_dim(logits_te.clone(), 1);
    let exp_te = B::float_exp(B::float_sub(logits_te, max_t1));
    let sum_t1 = B::float_sum_dim(exp_te.clone(), 1);
    B::float_div(exp_te, sum_t1)
}

/// The generic definitions on Burn's primitive ops, also the fallback of backends that override an op
/// for some dtypes only.
pub(crate) mod generic {
    use burn::backend::tensor::{FloatTensor, IntTensor};
    use burn::backend::{Backend, TensorMetadata, get_or_init_device_settings};
    use burn::tensor::{IndexingUpdateOp, Shape};

    use super::MoeBackend;

    /// [`super::MoeBackend::topk_sigmoid`] on Burn's ops.
    pub(crate) fn topk_sigmoid<B: Backend>(
        logits_te: FloatTensor<B>,
        bias_e: FloatTensor<B>,
        k: usize,
        renormalize: bool,
    ) -> (FloatTensor<B>, IntTensor<B>) {
        let [e] = bias_e.shape().dims::<1>();
        let scores_te = B::sigmoid(logits_te);
        let select_te = B::float_add(scores_te.clone(), B::float_reshape(bias_e, Shape::new([1, e])));
        let int_dtype = get_or_init_device_settings::<B>(&scores_te.device()).int_dtype;
        let (_, idx_tk) = B::float_topk_with_indices(select_te, 1, k, int_dtype);
        let w_tk = B::float_gather(1, scores_te, idx_tk.clone());
        if renormalize {
            let sum_t1 = B::float_add_scalar(B::float_sum_dim(w_tk.clone(), 1), 1e-20f32.into());
            return (B::float_div(w_tk, sum_t1), idx_tk);
        }
        (w_tk, idx_tk)
    }

    /// [`super::MoeBackend::topk_sigmoid_backward`] on Burn's ops: with `s` the picked scores and
    /// `D = Σ s + 1e-20`, `∂L/∂s = (dw − ⟨dw, s / D⟩) / D` when renormalised (else `dw`), times
    /// `s · (1 − s)`, scattered to the picked experts.
    pub(crate) fn topk_sigmoid_backward<B: Backend>(
        logits_te: FloatTensor<B>,
        idx_tk: IntTensor<B>,
        dw_tk: FloatTensor<B>,
        renormalize: bool,
    ) -> FloatTensor<B> {
        let (shape, device, dtype) = (logits_te.shape(), logits_te.device(), logits_te.dtype());
        let s_tk = B::sigmoid(B::float_gather(1, logits_te, idx_tk.clone()));
        let ds_tk = if renormalize {
            let d_t1 = B::float_add_scalar(B::float_sum_dim(s_tk.clone(), 1), 1e-20f32.into());
            let w_tk = B::float_div(s_tk.clone(), d_t1.clone());
            let dot_t1 = B::float_sum_dim(B::float_mul(dw_tk.clone(), w_tk), 1);
            B::float_div(B::float_sub(dw_tk, dot_t1), d_t1)
        } else {
            dw_tk
        };
        let one_minus = B::float_add_scalar(B::float_neg(s_tk.clone()), 1.0f32.into());
        let dl_tk = B::float_mul(ds_tk, B::float_mul(s_tk, one_minus));
        let zeros = B::float_zeros(shape, &device, dtype.into());
        B::float_scatter(1, zeros, idx_tk, dl_tk, IndexingUpdateOp::Add)
    }

    /// [`MoeBackend::routed_experts_forward`] as dispatch, grouped experts and combine (the backend's own).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn routed_experts_forward<B: MoeBackend>(
        x_td: FloatTensor<B>,
        w_tk: FloatTensor<B>,
        token_p: IntTensor<B>,
        row_tk: IntTensor<B>,
        slot_p: IntTensor<B>,
        w_gate_edf: FloatTensor<B>,
        w_up_edf: FloatTensor<B>,
        w_down_efd: FloatTensor<B>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let x_pd = B::permute_rows(x_td, token_p, row_tk.clone());
        let (y_pd, g_pf, u_pf) = B::grouped_swiglu_forward(x_pd, w_gate_edf, w_up_edf, w_down_efd, counts_e);
        let out_td = B::combine_rows(y_pd.clone(), w_tk, row_tk, slot_p);
        (out_td, g_pf, u_pf, y_pd)
    }

    /// [`MoeBackend::routed_experts_backward`] as the backwards of combine, grouped experts and dispatch.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(crate) fn routed_experts_backward<B: MoeBackend>(
        dout_td: FloatTensor<B>,
        x_td: FloatTensor<B>,
        w_tk: FloatTensor<B>,
        token_p: IntTensor<B>,
        row_tk: IntTensor<B>,
        slot_p: IntTensor<B>,
        w_gate_edf: FloatTensor<B>,
        w_up_edf: FloatTensor<B>,
        w_down_efd: FloatTensor<B>,
        g_pf: FloatTensor<B>,
        u_pf: FloatTensor<B>,
        y_pd: FloatTensor<B>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let (dy_pd, dw_tk) = B::combine_rows_backward(dout_td, y_pd, w_tk, row_tk.clone(), slot_p);
        // The dispatched rows again (one gather) rather than kept since the forward.
        let x_pd = B::permute_rows(x_td, token_p, row_tk.clone());
        let (dx_pd, dwg, dwu, dwd) =
            B::grouped_swiglu_backward(dy_pd, x_pd, w_gate_edf, w_up_edf, w_down_efd, g_pf, u_pf, counts_e);
        (B::permute_rows_backward(dx_pd, row_tk), dw_tk, dwg, dwu, dwd)
    }

    /// [`super::MoeBackend::topk_softmax`] on Burn's ops.
    pub(crate) fn topk_softmax<B: Backend>(
        logits_te: FloatTensor<B>,
        k: usize,
        renormalize: bool,
    ) -> (FloatTensor<B>, IntTensor<B>) {
        let probs = super::softmax_rows::<B>(logits_te);
        let int_dtype = get_or_init_device_settings::<B>(&probs.device()).int_dtype;
        let (w_tk, idx_tk) = B::float_topk_with_indices(probs, 1, k, int_dtype);
        if renormalize {
            let sum_t1 = B::float_sum_dim(w_tk.clone(), 1);
            return (B::float_div(w_tk, sum_t1), idx_tk);
        }
        (w_tk, idx_tk)
    }

    /// [`super::MoeBackend::topk_softmax_backward`] on Burn's ops.
    pub(crate) fn topk_softmax_backward<B: Backend>(
        logits_te: FloatTensor<B>,
        idx_tk: IntTensor<B>,
        w_tk: FloatTensor<B>,
        dw_tk: FloatTensor<B>,
        renormalize: bool,
    ) -> FloatTensor<B> {
        let probs_te = super::softmax_rows::<B>(logits_te);
        // g = ∂L/∂p at the picked experts.
        let g_tk = if renormalize {
            let mass_t1 = B::float_sum_dim(B::float_gather(1, probs_te.clone(), idx_tk.clone()), 1);
            let dot_t1 = B::float_sum_dim(B::float_mul(dw_tk.clone(), w_tk), 1);
            B::float_div(B::float_sub(dw_tk, dot_t1), mass_t1)
        } else {
            dw_tk
        };
        let zeros = B::float_zeros(probs_te.shape(), &probs_te.device(), probs_te.dtype().into());
        let g_te = B::float_scatter(1, zeros, idx_tk, g_tk, IndexingUpdateOp::Add);
        let gp_t1 = B::float_sum_dim(B::float_mul(g_te.clone(), probs_te.clone()), 1);
        B::float_mul(probs_te, B::float_sub(g_te, gp_t1))
    }

    pub(crate) fn permute_rows<B: Backend>(
        x_td: FloatTensor<B>,
        token_p: IntTensor<B>,
        row_tk: IntTensor<B>,
    ) -> FloatTensor<B> {
        let _ = row_tk;
        B::float_select(x_td, 0, token_p)
    }

    pub(crate) fn permute_rows_backward<B: Backend>(dy_pd: FloatTensor<B>, row_tk: IntTensor<B>) -> FloatTensor<B> {
        let (t, k, d) = (row_tk.shape()[0], row_tk.shape()[1], dy_pd.shape()[1]);
        let rows = B::float_select(dy_pd, 0, B::int_reshape(row_tk, Shape::new([t * k])));
        B::float_reshape(B::float_sum_dim(B::float_reshape(rows, Shape::new([t, k, d])), 1), Shape::new([t, d]))
    }

    pub(crate) fn combine_rows<B: Backend>(
        y_pd: FloatTensor<B>,
        w_tk: FloatTensor<B>,
        row_tk: IntTensor<B>,
        slot_p: IntTensor<B>,
    ) -> FloatTensor<B> {
        let _ = slot_p;
        let (t, k, d) = (row_tk.shape()[0], row_tk.shape()[1], y_pd.shape()[1]);
        let rows = B::float_select(y_pd, 0, B::int_reshape(row_tk, Shape::new([t * k])));
        let weighted =
            B::float_mul(B::float_reshape(rows, Shape::new([t, k, d])), B::float_reshape(w_tk, Shape::new([t, k, 1])));
        B::float_reshape(B::float_sum_dim(weighted, 1), Shape::new([t, d]))
    }

    pub(crate) fn combine_rows_backward<B: Backend>(
        dout_td: FloatTensor<B>,
        y_pd: FloatTensor<B>,
        w_tk: FloatTensor<B>,
        row_tk: IntTensor<B>,
        slot_p: IntTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let (t, k, d) = (row_tk.shape()[0], row_tk.shape()[1], y_pd.shape()[1]);
        let p = slot_p.shape()[0];
        let token_p = B::int_div_scalar(slot_p.clone(), (k as i64).into());
        let w_p = B::float_select(B::float_reshape(w_tk, Shape::new([t * k])), 0, slot_p);
        let dy_pd =
            B::float_mul(B::float_select(dout_td.clone(), 0, token_p), B::float_reshape(w_p, Shape::new([p, 1])));
        let rows = B::float_select(y_pd, 0, B::int_reshape(row_tk, Shape::new([t * k])));
        let prod = B::float_mul(
            B::float_reshape(rows, Shape::new([t, k, d])),
            B::float_reshape(dout_td, Shape::new([t, 1, d])),
        );
        (dy_pd, B::float_reshape(B::float_sum_dim(prod, 2), Shape::new([t, k])))
    }
}
