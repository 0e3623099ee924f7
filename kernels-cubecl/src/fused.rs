//! The dense parts of a decoder step as fused Burn backend-extension operations: linear layers, RMS
//! normalisation, causal attention (with grouped-query heads), rotary embedding and softmax
//! cross-entropy, each forward and backward, and the AdamW step.
//! Each default body is the plain definition on Burn's primitive ops — what the Cube backend and NdArray
//! run; Flex overrides them with one host kernel each ([`crate::flex`]); `Autodiff` adds the
//! hand-written backward passes ([`crate::fused_autodiff`]).
//!
//! Attention keeps no `s × s` tensor between forward and backward: the forward saves the log-sum-exp
//! of each query row and the backward recomputes the probabilities from it (as FlashAttention does).
//!
//! Legend: b = batch, s = sequence, h = query heads, g = key/value heads (h a multiple of g), c = query
//! and key head width, e = value head width, k = rotary head width, n = rows, v = vocabulary; for linear
//! layers r = rows, k = input width, n = output width; for [`concat_heads`] n and r are the widths of
//! the two parts.

#![cfg_attr(feature = "ndarray", allow(deprecated))]

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{IndexingUpdateOp, Shape, Slice, TensorData};

/// A linear layer, `x · w_kn (+ b_n)` over the last dim of `x` — what Burn's `Linear::forward` computes with
/// its `[k, n]` weight — as one product over all rows (every leading dim of `x`).
///
/// # Shapes
/// - `x` `[..., k]`, `w_kn` `[k, n]`, `b_n` `[n]` → `[..., n]`
///
/// # Panics
/// If the last dim of `x` is not `k` or the bias is not `[n]`.
pub fn linear<const D: usize>(
    x: burn::Tensor<D>,
    w_kn: burn::Tensor<2>,
    b_n: Option<burn::Tensor<1>>,
) -> burn::Tensor<D> {
    let dims = x.dims();
    let [k, n] = w_kn.dims();
    assert!(
        D >= 1 && dims[D - 1] == k && b_n.as_ref().is_none_or(|b| b.dims() == [n]),
        "linear: x {dims:?} must end in the weight's input width {k}, and the bias {:?} be [{n}]",
        b_n.as_ref().map(|b| b.dims())
    );
    let rows = dims[..D - 1].iter().product();
    let (x_rk, w_kn) = (x.reshape([rows, k]).into_dispatch(), w_kn.into_dispatch());
    let y_rn = match b_n {
        Some(b_n) => Dispatch::dense_linear_bias(x_rk, w_kn, b_n.into_dispatch()),
        None => Dispatch::dense_linear(x_rk, w_kn),
    };
    let mut out = dims;
    out[D - 1] = n;
    burn::Tensor::<2>::from_dispatch(y_rn).reshape(out)
}

/// RMS normalisation over the last dim, as Burn's `RmsNorm::forward`: `x / √(mean(x²) + eps) · gamma`,
/// one pass forward and one backward.
///
/// # Shapes
/// - `x` `[..., d]`, `gamma_d` `[d]` → `[..., d]`
///
/// # Panics
/// If the last dim of `x` is not `d`.
pub fn rms_norm<const D: usize>(x: burn::Tensor<D>, gamma_d: burn::Tensor<1>, eps: f64) -> burn::Tensor<D> {
    let dims = x.dims();
    let [d] = gamma_d.dims();
    assert!(D >= 1 && dims[D - 1] == d, "rms_norm: x {dims:?} must end in gamma's width {d}");
    let rows = dims[..D - 1].iter().product();
    let (y_rd, _rstd) = Dispatch::rms_norm(x.reshape([rows, d]).into_dispatch(), gamma_d.into_dispatch(), eps);
    burn::Tensor::<2>::from_dispatch(y_rd).reshape(dims)
}

/// Causal softmax attention with grouped-query heads (query head j reads key/value head `j / (h / g)`),
/// scores scaled by `scale`.
///
/// # Shapes
/// - `q_bshc` `[b, s, h, c]`, `k_bsgc` `[b, s, g, c]`, `v_bsge` `[b, s, g, e]` → `[b, s, h, e]`
///
/// # Panics
/// If the batch, sequence or head widths disagree or `g` does not divide `h`.
pub fn causal_attention(
    q_bshc: burn::Tensor<4>,
    k_bsgc: burn::Tensor<4>,
    v_bsge: burn::Tensor<4>,
    scale: f32,
) -> burn::Tensor<4> {
    let ([b, s, h, c], [kb, ks, g, kc], [vb, vs, vg, _]) = (q_bshc.dims(), k_bsgc.dims(), v_bsge.dims());
    assert!(
        [kb, ks, kc, vb, vs, vg] == [b, s, c, b, s, g] && g > 0 && h.is_multiple_of(g),
        "causal_attention: q {:?}, k {:?} and v {:?} must be [b, s, h, c], [b, s, g, c], [b, s, g, e] with g dividing h",
        q_bshc.dims(),
        k_bsgc.dims(),
        v_bsge.dims()
    );
    let (o, _lse) =
        Dispatch::causal_attention(q_bshc.into_dispatch(), k_bsgc.into_dispatch(), v_bsge.into_dispatch(), scale);
    burn::Tensor::from_dispatch(o)
}

/// Each head's `[a | r]`: `a_bshn` and `r_bsgr` joined along the head width, `r` broadcast over the
/// heads when it has one (`g = 1`: MLA's rotary key part, shared by every head) — one pass forward and
/// one backward (which sums a broadcast part over the heads), instead of a broadcast copy, a
/// concatenation and, backward, strided slices that later operations copy again.
///
/// # Shapes
/// - `a_bshn` `[b, s, h, n]`, `r_bsgr` `[b, s, g, r]` with `g = h` or `g = 1` → `[b, s, h, n + r]`
///
/// # Panics
/// If the batch, sequence or head counts disagree.
pub fn concat_heads(a_bshn: burn::Tensor<4>, r_bsgr: burn::Tensor<4>) -> burn::Tensor<4> {
    let ([b, s, h, _], [rb, rs, g, _]) = (a_bshn.dims(), r_bsgr.dims());
    assert!(
        (rb, rs) == (b, s) && (g == h || g == 1),
        "concat_heads: a {:?} and r {:?} must be [b, s, h, n] and [b, s, h or 1, r]",
        a_bshn.dims(),
        r_bsgr.dims()
    );
    burn::Tensor::from_dispatch(Dispatch::concat_heads(a_bshn.into_dispatch(), r_bsgr.into_dispatch()))
}

/// Rotary embedding (`rotate_half` convention) of `x_bshk` with per-position tables.
///
/// # Shapes
/// - `x_bshk` `[b, s, h, k]`, `cos_sk`/`sin_sk` `[s, k]` → `[b, s, h, k]`
///
/// # Panics
/// If `k` is odd or the tables are not `[s, k]`.
pub fn rotary(x_bshk: burn::Tensor<4>, cos_sk: burn::Tensor<2>, sin_sk: burn::Tensor<2>) -> burn::Tensor<4> {
    let [_, s, _, k] = x_bshk.dims();
    assert!(k.is_multiple_of(2), "rotary: the head width {k} must be even");
    assert!(
        cos_sk.dims() == [s, k] && sin_sk.dims() == [s, k],
        "rotary: cos {:?} and sin {:?} must be [s, k] = [{s}, {k}]",
        cos_sk.dims(),
        sin_sk.dims()
    );
    burn::Tensor::from_dispatch(Dispatch::rotary(
        x_bshk.into_dispatch(),
        cos_sk.into_dispatch(),
        sin_sk.into_dispatch(),
    ))
}

/// Softmax cross-entropy of each row of `logits_nv` against its target: `logsumexp(row) − row[target]`;
/// NaN for a target outside `0..v`.
///
/// # Shapes
/// - `logits_nv` `[n, v]`, `targets_n` `[n]` → `[n]`
///
/// # Panics
/// If `targets_n` does not have one target per row.
pub fn cross_entropy(logits_nv: burn::Tensor<2>, targets_n: burn::Tensor<1, burn::tensor::Int>) -> burn::Tensor<1> {
    let n = logits_nv.dims()[0];
    assert_eq!(targets_n.dims(), [n], "cross_entropy: one target per row of the [{n}, v] logits");
    let (loss, _lse) = Dispatch::cross_entropy(logits_nv.into_dispatch(), targets_n.into_dispatch());
    burn::Tensor::from_dispatch(loss)
}

/// The scalars of one AdamW step (PyTorch's `torch.optim.AdamW` rule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta_1: f64,
    pub beta_2: f64,
    pub epsilon: f64,
    pub weight_decay: f64,
    /// `1 − β₁ᵗ` and `1 − β₂ᵗ` at this step.
    pub bias_1: f64,
    pub bias_2: f64,
    /// Multiplies the gradient first (the global-norm clipping factor; 1 without clipping).
    pub grad_scale: f64,
}

/// One AdamW step on a flattened parameter, its gradient and moments: with `g = grad · grad_scale`,
/// `m ← β₁m + (1 − β₁)g`, `v ← β₂v + (1 − β₂)g²`, `p ← p(1 − lr·wd) − lr·(m / bias₁) / (√(v / bias₂) + ε)`;
/// returns `(p, m, v)`.
///
/// # Shapes
/// - `param_n`, `grad_n`, `m_n`, `v_n`: `[n]` → three `[n]`
///
/// # Panics
/// If the four lengths differ.
pub fn adamw_step(
    param_n: burn::Tensor<1>,
    grad_n: burn::Tensor<1>,
    m_n: burn::Tensor<1>,
    v_n: burn::Tensor<1>,
    step: AdamWStep,
) -> (burn::Tensor<1>, burn::Tensor<1>, burn::Tensor<1>) {
    let n = param_n.dims();
    assert!(
        grad_n.dims() == n && m_n.dims() == n && v_n.dims() == n,
        "adamw_step: param {n:?}, grad {:?}, m {:?} and v {:?} must have one length",
        grad_n.dims(),
        m_n.dims(),
        v_n.dims()
    );
    let (p, m, v) = Dispatch::adamw_step(
        param_n.into_dispatch(),
        grad_n.into_dispatch(),
        m_n.into_dispatch(),
        v_n.into_dispatch(),
        step,
    );
    (burn::Tensor::from_dispatch(p), burn::Tensor::from_dispatch(m), burn::Tensor::from_dispatch(v))
}

/// `Σ x²` over every element of `x`, as a one-element tensor: the square of the gradient norm that global
/// clipping needs, in one pass (accumulated in f64 on Flex) instead of a squared copy and a sum.
///
/// # Shapes
/// - `x`: any → `[1]`
pub fn square_sum<const D: usize>(x: burn::Tensor<D>) -> burn::Tensor<1> {
    let n = x.shape().num_elements();
    burn::Tensor::from_dispatch(Dispatch::square_sum(x.reshape([n]).into_dispatch()))
}

/// The fused dense operations a backend provides.
#[backend_extension(Autodiff, Cube: cfg(feature = "cube-runtime"), Flex, NdArray: cfg(feature = "ndarray"))]
pub trait FusedBackend: burn::backend::Backend {
    /// `y_rn = x_rk · w_kn`.
    fn dense_linear(x_rk: FloatTensor<Self>, w_kn: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::linear::<Self>(x_rk, w_kn)
    }

    /// `y_rn = x_rk · w_kn + b_n`.
    fn dense_linear_bias(
        x_rk: FloatTensor<Self>,
        w_kn: FloatTensor<Self>,
        b_n: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        generic::linear_bias::<Self>(x_rk, w_kn, b_n)
    }

    /// The input gradient of a linear layer: `dx_rk = dy_rn · w_knᵀ`.
    fn dense_linear_backward_x(dy_rn: FloatTensor<Self>, w_kn: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::linear_backward_x::<Self>(dy_rn, w_kn)
    }

    /// The weight gradient of a linear layer: `dw_kn = x_rkᵀ · dy_rn`.
    fn dense_linear_backward_w(dy_rn: FloatTensor<Self>, x_rk: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::linear_backward_w::<Self>(dy_rn, x_rk)
    }

    /// The bias gradient of a linear layer: `db_n = Σ_rows dy_rn`.
    fn dense_linear_backward_b(dy_rn: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::linear_backward_b::<Self>(dy_rn)
    }

    /// RMS normalisation of each row: `(y_rd = x · rstd · gamma, rstd_r = 1 / √(mean(x²) + eps))`.
    fn rms_norm(
        x_rd: FloatTensor<Self>,
        gamma_d: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::rms_norm::<Self>(x_rd, gamma_d, eps)
    }

    /// Backward of [`Self::rms_norm`] from `dy_rd`: with `g = dy · gamma`,
    /// `dx = rstd · g − x · rstd³ · ⟨g, x⟩ / d` and `dgamma = Σ_rows dy · x · rstd`.
    fn rms_norm_backward(
        dy_rd: FloatTensor<Self>,
        x_rd: FloatTensor<Self>,
        gamma_d: FloatTensor<Self>,
        rstd_r: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::rms_norm_backward::<Self>(dy_rd, x_rd, gamma_d, rstd_r)
    }

    /// Causal softmax attention: query i of head j attends keys 0..=i of key/value head `j / (h / g)`,
    /// scores scaled by `scale`. `q_bshc` `[b, s, h, c]`, `k_bsgc` `[b, s, g, c]`, `v_bsge` `[b, s, g, e]`
    /// → `(o_bshe [b, s, h, e], lse_bhs [b, h, s])`, the log-sum-exp of each row's scaled scores.
    fn causal_attention(
        q_bshc: FloatTensor<Self>,
        k_bsgc: FloatTensor<Self>,
        v_bsge: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::attention_forward::<Self>(q_bshc, k_bsgc, v_bsge, scale)
    }

    /// Backward of [`Self::causal_attention`] from `do_bshe`: `(dq, dk, dv)`.
    #[allow(clippy::too_many_arguments)]
    fn causal_attention_backward(
        do_bshe: FloatTensor<Self>,
        q_bshc: FloatTensor<Self>,
        k_bsgc: FloatTensor<Self>,
        v_bsge: FloatTensor<Self>,
        o_bshe: FloatTensor<Self>,
        lse_bhs: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        generic::attention_backward::<Self>(do_bshe, q_bshc, k_bsgc, v_bsge, o_bshe, lse_bhs, scale)
    }

    /// Rotary embedding in the `rotate_half` convention: with `x = [x1, x2]` (the halves of the last
    /// dim), `x · cos + [−x2, x1] · sin`. `x_bshk` `[b, s, h, k]`, `cos_sk`/`sin_sk` `[s, k]`. Its backward
    /// is the same rotation with `−sin`.
    fn rotary(x_bshk: FloatTensor<Self>, cos_sk: FloatTensor<Self>, sin_sk: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::rotary::<Self>(x_bshk, cos_sk, sin_sk)
    }

    /// Each head's `[a | r]`, see [`concat_heads`].
    fn concat_heads(a_bshn: FloatTensor<Self>, r_bsgr: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::concat_heads::<Self>(a_bshn, r_bsgr)
    }

    /// Backward of [`Self::concat_heads`] from `dout_bshx`: `(da [b, s, h, n], dr [b, s, g, r])`, `dr`
    /// summed over the heads when `g = 1`.
    fn concat_heads_backward(
        dout_bshx: FloatTensor<Self>,
        n: usize,
        g: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::concat_heads_backward::<Self>(dout_bshx, n, g)
    }

    /// Softmax cross-entropy of each row of `logits_nv` against `targets_n`: `(loss_n, lse_n)` with
    /// `loss = lse − logit[target]`; a target outside `0..v` gives a NaN loss.
    fn cross_entropy(
        logits_nv: FloatTensor<Self>,
        targets_n: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        generic::cross_entropy::<Self>(logits_nv, targets_n)
    }

    /// Backward of [`Self::cross_entropy`] from `dloss_n`: `dlogits = (softmax − onehot(target)) · dloss`.
    fn cross_entropy_backward(
        logits_nv: FloatTensor<Self>,
        targets_n: IntTensor<Self>,
        lse_n: FloatTensor<Self>,
        dloss_n: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        generic::cross_entropy_backward::<Self>(logits_nv, targets_n, lse_n, dloss_n)
    }

    /// One AdamW step, see [`adamw_step`]: `(param, m, v)` after it. Not differentiable (the optimiser
    /// runs outside the graph).
    fn adamw_step(
        param_n: FloatTensor<Self>,
        grad_n: FloatTensor<Self>,
        m_n: FloatTensor<Self>,
        v_n: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        generic::adamw_step::<Self>(param_n, grad_n, m_n, v_n, step)
    }

    /// `Σ x²` of `x_n` as `[1]`, see [`square_sum`]. Not differentiable (clipping runs outside the graph).
    fn square_sum(x_n: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::square_sum::<Self>(x_n)
    }
}

#[cfg(feature = "ndarray")]
impl FusedBackend for burn::backend::NdArray {}

/// The definitions on Burn's primitive ops.
pub(crate) mod generic {
    use super::*;

    pub(crate) fn linear<B: Backend>(x_rk: FloatTensor<B>, w_kn: FloatTensor<B>) -> FloatTensor<B> {
        B::float_matmul(x_rk, w_kn)
    }

    pub(crate) fn linear_bias<B: Backend>(
        x_rk: FloatTensor<B>,
        w_kn: FloatTensor<B>,
        b_n: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let n = b_n.shape()[0];
        B::float_add(B::float_matmul(x_rk, w_kn), B::float_reshape(b_n, Shape::new([1, n])))
    }

    pub(crate) fn linear_backward_x<B: Backend>(dy_rn: FloatTensor<B>, w_kn: FloatTensor<B>) -> FloatTensor<B> {
        B::float_matmul(dy_rn, B::float_swap_dims(w_kn, 0, 1))
    }

    pub(crate) fn linear_backward_w<B: Backend>(dy_rn: FloatTensor<B>, x_rk: FloatTensor<B>) -> FloatTensor<B> {
        B::float_matmul(B::float_swap_dims(x_rk, 0, 1), dy_rn)
    }

    pub(crate) fn linear_backward_b<B: Backend>(dy_rn: FloatTensor<B>) -> FloatTensor<B> {
        let n = dy_rn.shape()[1];
        B::float_reshape(B::float_sum_dim(dy_rn, 0), Shape::new([n]))
    }

    pub(crate) fn rms_norm<B: Backend>(
        x_rd: FloatTensor<B>,
        gamma_d: FloatTensor<B>,
        eps: f64,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let [r, d] = [x_rd.shape()[0], x_rd.shape()[1]];
        let mean_r1 = B::float_mean_dim(B::float_mul(x_rd.clone(), x_rd.clone()), 1);
        let rstd_r1 = B::float_recip(B::float_sqrt(B::float_add_scalar(mean_r1, eps.into())));
        let y_rd = B::float_mul(B::float_mul(x_rd, rstd_r1.clone()), B::float_reshape(gamma_d, Shape::new([1, d])));
        (y_rd, B::float_reshape(rstd_r1, Shape::new([r])))
    }

    pub(crate) fn rms_norm_backward<B: Backend>(
        dy_rd: FloatTensor<B>,
        x_rd: FloatTensor<B>,
        gamma_d: FloatTensor<B>,
        rstd_r: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let [r, d] = [x_rd.shape()[0], x_rd.shape()[1]];
        let rstd_r1 = B::float_reshape(rstd_r, Shape::new([r, 1]));
        let xhat_rd = B::float_mul(x_rd, rstd_r1.clone());
        let dgamma_d =
            B::float_reshape(B::float_sum_dim(B::float_mul(dy_rd.clone(), xhat_rd.clone()), 0), Shape::new([d]));
        let g_rd = B::float_mul(dy_rd, B::float_reshape(gamma_d, Shape::new([1, d])));
        // dx = rstd · (g − x̂ · mean(g · x̂)).
        let mean_r1 = B::float_mean_dim(B::float_mul(g_rd.clone(), xhat_rd.clone()), 1);
        let dx_rd = B::float_mul(B::float_sub(g_rd, B::float_mul(xhat_rd, mean_r1)), rstd_r1);
        (dx_rd, dgamma_d)
    }

    fn dims4<B: Backend>(t: &FloatTensor<B>) -> [usize; 4] {
        let s = t.shape();
        [s[0], s[1], s[2], s[3]]
    }

    /// `[b, s, g, w]` → `[b, h, s, w]` with key/value head `j / (h / g)` for query head j.
    fn heads_repeated<B: Backend>(x_bsgw: FloatTensor<B>, h: usize) -> FloatTensor<B> {
        let [b, s, g, w] = dims4::<B>(&x_bsgw);
        let x_bgsw = B::float_swap_dims(x_bsgw, 1, 2);
        let x = B::float_expand(B::float_reshape(x_bgsw, Shape::new([b, g, 1, s, w])), Shape::new([b, g, h / g, s, w]));
        B::float_reshape(x, Shape::new([b, h, s, w]))
    }

    /// `[b, h, s, w]` summed over the query heads of each key/value head → `[b, s, g, w]`.
    fn heads_reduced<B: Backend>(x_bhsw: FloatTensor<B>, g: usize) -> FloatTensor<B> {
        let [b, h, s, w] = dims4::<B>(&x_bhsw);
        let x = B::float_sum_dim(B::float_reshape(x_bhsw, Shape::new([b, g, h / g, s, w])), 2);
        B::float_swap_dims(B::float_reshape(x, Shape::new([b, g, s, w])), 1, 2)
    }

    /// `0` on and below the diagonal, `−∞` above, `[1, 1, s, s]`.
    fn causal_bias<B: Backend>(s: usize, like: &FloatTensor<B>) -> FloatTensor<B> {
        let bias: Vec<f32> = (0..s * s).map(|i| if i % s > i / s { f32::NEG_INFINITY } else { 0.0 }).collect();
        let t = B::float_from_data(TensorData::new(bias, [1, 1, s, s]), &like.device());
        B::float_cast(t, like.dtype().into())
    }

    /// Scaled, masked scores `[b, h, s, s]` of queries `[b, h, s, c]` against keys `[b, h, s, c]`.
    fn scores<B: Backend>(q_bhsc: FloatTensor<B>, k_bhsc: FloatTensor<B>, scale: f32) -> FloatTensor<B> {
        let s = q_bhsc.shape()[2];
        let raw = B::float_matmul(q_bhsc, B::float_swap_dims(k_bhsc, 2, 3));
        let scaled = B::float_mul_scalar(raw, scale.into());
        let bias = causal_bias::<B>(s, &scaled);
        B::float_add(scaled, bias)
    }

    pub(crate) fn attention_forward<B: Backend>(
        q_bshc: FloatTensor<B>,
        k_bsgc: FloatTensor<B>,
        v_bsge: FloatTensor<B>,
        scale: f32,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let [b, s, h, _] = dims4::<B>(&q_bshc);
        let q_bhsc = B::float_swap_dims(q_bshc, 1, 2);
        let scores_bhss = scores::<B>(q_bhsc, heads_repeated::<B>(k_bsgc, h), scale);
        let max_bhs1 = B::float_max_dim(scores_bhss.clone(), 3);
        let exp_bhss = B::float_exp(B::float_sub(scores_bhss, max_bhs1.clone()));
        let sum_bhs1 = B::float_sum_dim(exp_bhss.clone(), 3);
        let lse_bhs1 = B::float_add(max_bhs1, B::float_log(sum_bhs1.clone()));
        let probs_bhss = B::float_div(exp_bhss, sum_bhs1);
        let o_bhse = B::float_matmul(probs_bhss, heads_repeated::<B>(v_bsge, h));
        (B::float_swap_dims(o_bhse, 1, 2), B::float_reshape(lse_bhs1, Shape::new([b, h, s])))
    }

    pub(crate) fn attention_backward<B: Backend>(
        do_bshe: FloatTensor<B>,
        q_bshc: FloatTensor<B>,
        k_bsgc: FloatTensor<B>,
        v_bsge: FloatTensor<B>,
        o_bshe: FloatTensor<B>,
        lse_bhs: FloatTensor<B>,
        scale: f32,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let [b, s, h, _] = dims4::<B>(&q_bshc);
        let g = k_bsgc.shape()[2];
        let q_bhsc = B::float_swap_dims(q_bshc, 1, 2);
        let k_bhsc = heads_repeated::<B>(k_bsgc, h);
        let v_bhse = heads_repeated::<B>(v_bsge, h);
        let do_bhse = B::float_swap_dims(do_bshe, 1, 2);
        let lse_bhs1 = B::float_reshape(lse_bhs, Shape::new([b, h, s, 1]));
        let probs_bhss = B::float_exp(B::float_sub(scores::<B>(q_bhsc.clone(), k_bhsc.clone(), scale), lse_bhs1));
        let dv_bhse = B::float_matmul(B::float_swap_dims(probs_bhss.clone(), 2, 3), do_bhse.clone());
        let dp_bhss = B::float_matmul(do_bhse.clone(), B::float_swap_dims(v_bhse, 2, 3));
        // Σ_j P_ij dP_ij = ⟨dO_i, O_i⟩.
        let delta_bhs1 = B::float_sum_dim(B::float_mul(do_bhse, B::float_swap_dims(o_bshe, 1, 2)), 3);
        let ds_bhss = B::float_mul_scalar(B::float_mul(probs_bhss, B::float_sub(dp_bhss, delta_bhs1)), scale.into());
        let dq_bhsc = B::float_matmul(ds_bhss.clone(), k_bhsc);
        let dk_bhsc = B::float_matmul(B::float_swap_dims(ds_bhss, 2, 3), q_bhsc);
        (B::float_swap_dims(dq_bhsc, 1, 2), heads_reduced::<B>(dk_bhsc, g), heads_reduced::<B>(dv_bhse, g))
    }

    pub(crate) fn rotary<B: Backend>(
        x_bshk: FloatTensor<B>,
        cos_sk: FloatTensor<B>,
        sin_sk: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let [b, s, h, k] = dims4::<B>(&x_bshk);
        let half = k / 2;
        let part =
            |r: std::ops::Range<usize>| [Slice::from(0..b), Slice::from(0..s), Slice::from(0..h), Slice::from(r)];
        let x1 = B::float_slice(x_bshk.clone(), &part(0..half));
        let x2 = B::float_slice(x_bshk.clone(), &part(half..k));
        let rotated = B::float_cat(vec![B::float_neg(x2), x1], 3);
        let table = |t: FloatTensor<B>| B::float_reshape(t, Shape::new([1, s, 1, k]));
        B::float_add(B::float_mul(x_bshk, table(cos_sk)), B::float_mul(rotated, table(sin_sk)))
    }

    pub(crate) fn cross_entropy<B: Backend>(
        logits_nv: FloatTensor<B>,
        targets_n: IntTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let n = logits_nv.shape()[0];
        let max_n1 = B::float_max_dim(logits_nv.clone(), 1);
        let sum_n1 = B::float_sum_dim(B::float_exp(B::float_sub(logits_nv.clone(), max_n1.clone())), 1);
        let lse_n1 = B::float_add(max_n1, B::float_log(sum_n1));
        let picked_n1 = B::float_gather(1, logits_nv, B::int_reshape(targets_n, Shape::new([n, 1])));
        let loss_n = B::float_reshape(B::float_sub(lse_n1.clone(), picked_n1), Shape::new([n]));
        (loss_n, B::float_reshape(lse_n1, Shape::new([n])))
    }

    pub(crate) fn cross_entropy_backward<B: Backend>(
        logits_nv: FloatTensor<B>,
        targets_n: IntTensor<B>,
        lse_n: FloatTensor<B>,
        dloss_n: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let n = logits_nv.shape()[0];
        let probs_nv = B::float_exp(B::float_sub(logits_nv, B::float_reshape(lse_n, Shape::new([n, 1]))));
        let dloss_n1 = B::float_reshape(dloss_n, Shape::new([n, 1]));
        let dtype = probs_nv.dtype();
        let ones_n1 = B::float_ones(Shape::new([n, 1]), &probs_nv.device(), dtype.into());
        let zeros_nv = B::float_zeros(probs_nv.shape(), &probs_nv.device(), dtype.into());
        let targets_n1 = B::int_reshape(targets_n, Shape::new([n, 1]));
        let onehot_nv = B::float_scatter(1, zeros_nv, targets_n1, ones_n1, IndexingUpdateOp::Add);
        B::float_mul(B::float_sub(probs_nv, onehot_nv), dloss_n1)
    }

    pub(crate) fn concat_heads<B: Backend>(a_bshn: FloatTensor<B>, r_bsgr: FloatTensor<B>) -> FloatTensor<B> {
        let [b, s, h, _] = a_bshn.shape().dims::<4>();
        let r = r_bsgr.shape()[3];
        B::float_cat(vec![a_bshn, B::float_expand(r_bsgr, Shape::new([b, s, h, r]))], 3)
    }

    pub(crate) fn concat_heads_backward<B: Backend>(
        dout_bshx: FloatTensor<B>,
        n: usize,
        g: usize,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let [b, s, h, x] = dout_bshx.shape().dims::<4>();
        let part = |from: usize, to: usize| {
            let slices = [Slice::from(0..b), Slice::from(0..s), Slice::from(0..h), Slice::from(from..to)];
            B::float_slice(dout_bshx.clone(), &slices)
        };
        let (da, dr) = (part(0, n), part(n, x));
        (da, if g == h { dr } else { B::float_sum_dim(dr, 2) })
    }

    pub(crate) fn square_sum<B: Backend>(x_n: FloatTensor<B>) -> FloatTensor<B> {
        // Summed as `[rows, cols]`, then over the rows, then the remainder: Burn's full reduction on wgpu
        // (lavapipe) summed only the first 65 536 elements of a longer tensor (the parity case of 100 003
        // squares came out 34% low), and so did the reduction of one long dim.
        let n = x_n.shape()[0];
        let (device, dtype) = (x_n.device(), x_n.dtype());
        let squares = B::float_mul(x_n.clone(), x_n);
        let cols = n.div_ceil(16_384).max(1024);
        let rows = n / cols;
        let part = |from: usize, to: usize| B::float_slice(squares.clone(), &[Slice::from(from..to)]);
        let mut sum = B::float_zeros(Shape::new([1]), &device, dtype.into());
        if rows > 0 {
            let block = B::float_reshape(part(0, rows * cols), Shape::new([rows, cols]));
            let total = B::float_sum_dim(B::float_sum_dim(block, 1), 0);
            sum = B::float_add(sum, B::float_reshape(total, Shape::new([1])));
        }
        if rows * cols < n {
            sum = B::float_add(sum, B::float_sum_dim(part(rows * cols, n), 0));
        }
        sum
    }

    pub(crate) fn adamw_step<B: Backend>(
        p: FloatTensor<B>,
        grad: FloatTensor<B>,
        m: FloatTensor<B>,
        v: FloatTensor<B>,
        st: AdamWStep,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let g = B::float_mul_scalar(grad, st.grad_scale.into());
        let m = B::float_add(
            B::float_mul_scalar(m, st.beta_1.into()),
            B::float_mul_scalar(g.clone(), (1.0 - st.beta_1).into()),
        );
        let g2 = B::float_mul(g.clone(), g);
        let v =
            B::float_add(B::float_mul_scalar(v, st.beta_2.into()), B::float_mul_scalar(g2, (1.0 - st.beta_2).into()));
        let denom =
            B::float_add_scalar(B::float_sqrt(B::float_div_scalar(v.clone(), st.bias_2.into())), st.epsilon.into());
        let update = B::float_div(B::float_div_scalar(m.clone(), st.bias_1.into()), denom);
        let decayed = B::float_mul_scalar(p, (1.0 - st.lr * st.weight_decay).into());
        (B::float_sub(decayed, B::float_mul_scalar(update, st.lr.into())), m, v)
    }
}
