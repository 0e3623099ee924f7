//! Plain-tensor reference twins of every kernel: the definitions the fast paths are tested against.
//!
//! Legend: t = tokens, p = permuted rows, d = model width, f = expert width, e = experts.

use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;
use burn::tensor::activation::silu;

/// `silu(gate) ⊙ up`, element-wise.
pub fn swiglu_reference<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    silu(gate) * up
}

/// Row gather: `out_pd[i] = x_td[index_p[i]]`.
pub fn permute_rows_reference(x_td: Tensor<2>, index_p: Tensor<1, Int>) -> Tensor<2> {
    x_td.select(0, index_p)
}

/// Weighted row scatter-add: `out_td[index_p[i]] += w_p[i] · y_pd[i]`, `t` output rows.
pub fn combine_rows_reference(
    y_pd: Tensor<2>,
    w_p: Tensor<1>,
    index_p: Tensor<1, Int>,
    num_tokens: usize,
) -> Tensor<2> {
    let [_, d] = y_pd.dims();
    let weighted_pd = y_pd * w_p.unsqueeze_dim::<2>(1);
    Tensor::zeros([num_tokens, d], &weighted_pd.device()).select_assign(0, index_p, weighted_pd, IndexingUpdateOp::Add)
}

/// Grouped SwiGLU experts: rows `[off_e, off_e + counts_e[e])` of `x_pd` go through expert e:
/// `(silu(gate) ⊙ up) · w_down_fn` on Burn's tensor ops.
///
/// # Shapes
/// - `gate`, `up`: `[..., f]`, `w_down_fn`: `[f, n]` → `[..., n]`
pub fn swiglu_down_reference<const D: usize>(gate: Tensor<D>, up: Tensor<D>, w_down_fn: Tensor<2>) -> Tensor<D> {
    linear_reference(swiglu_reference(gate, up), w_down_fn, None)
}

/// `(silu(x · gate_e) ⊙ (x · up_e)) · down_e`.
pub fn grouped_swiglu_reference(
    x_pd: Tensor<2>,
    w_gate_edf: Tensor<3>,
    w_up_edf: Tensor<3>,
    w_down_efd: Tensor<3>,
    counts_e: &[usize],
) -> Tensor<2> {
    let [p, d] = x_pd.dims();
    let [e, _, f] = w_gate_edf.dims();
    assert_eq!(counts_e.len(), e, "one count per expert");
    assert_eq!(counts_e.iter().sum::<usize>(), p, "counts must add up to the rows");
    let mut outs = Vec::new();
    let mut offset = 0;
    for (expert, &n) in counts_e.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let x_nd = x_pd.clone().narrow(0, offset, n);
        let pick = |w: &Tensor<3>, a: usize, b: usize| w.clone().narrow(0, expert, 1).reshape([a, b]);
        let h_nf = swiglu_reference(x_nd.clone().matmul(pick(&w_gate_edf, d, f)), x_nd.matmul(pick(&w_up_edf, d, f)));
        outs.push(h_nf.matmul(pick(&w_down_efd, f, d)));
        offset += n;
    }
    if outs.is_empty() {
        return Tensor::zeros([0, d], &x_pd.device());
    }
    Tensor::cat(outs, 0)
}

/// Routed experts on the three reference twins: dispatch, grouped experts, weighted combine.
/// `token_p`, `slot_p`: the token and flat `t · k + j` slot of each permuted row.
#[allow(clippy::too_many_arguments)]
pub fn routed_experts_reference(
    x_td: Tensor<2>,
    w_tk: Tensor<2>,
    token_p: Tensor<1, Int>,
    slot_p: Tensor<1, Int>,
    w_gate_edf: Tensor<3>,
    w_up_edf: Tensor<3>,
    w_down_efd: Tensor<3>,
    counts_e: &[usize],
) -> Tensor<2> {
    let [t, k] = w_tk.dims();
    let y_pd = grouped_swiglu_reference(
        permute_rows_reference(x_td, token_p.clone()),
        w_gate_edf,
        w_up_edf,
        w_down_efd,
        counts_e,
    );
    let w_p = w_tk.reshape([t * k]).select(0, slot_p);
    combine_rows_reference(y_pd, w_p, token_p, t)
}

/// Softmax top-k gating: per token the k largest of `softmax(logits_te)`, descending, as
/// `(w_tk, idx_tk)`; divided by their sum when `renormalize`.
pub fn topk_softmax_reference(logits_te: Tensor<2>, k: usize, renormalize: bool) -> (Tensor<2>, Tensor<2, Int>) {
    let probs_te = burn::tensor::activation::softmax(logits_te, 1);
    let (w_tk, idx_tk) = probs_te.topk_with_indices(k, 1);
    if renormalize {
        let sum_t1 = w_tk.clone().sum_dim(1);
        return (w_tk / sum_t1, idx_tk);
    }
    (w_tk, idx_tk)
}

/// Sigmoid top-k gating (DeepSeek-V3's router): the `k` largest of `sigmoid(logits_te) + bias_e` per
/// token, descending, chosen on detached scores; the weights are the scores themselves (divided by
/// `Σ + 1e-20` when `renormalize`), as `(w_tk, idx_tk)`.
pub fn topk_sigmoid_reference(
    logits_te: Tensor<2>,
    bias_e: Tensor<1>,
    k: usize,
    renormalize: bool,
) -> (Tensor<2>, Tensor<2, Int>) {
    let scores_te = burn::tensor::activation::sigmoid(logits_te);
    let select_te = scores_te.clone().detach() + bias_e.unsqueeze::<2>();
    let (_, idx_tk) = select_te.topk_with_indices(k, 1);
    let w_tk = scores_te.gather(1, idx_tk.clone());
    if renormalize {
        let sum_t1 = w_tk.clone().sum_dim(1) + 1e-20;
        return (w_tk / sum_t1, idx_tk);
    }
    (w_tk, idx_tk)
}

/// A linear layer on tensor ops: `x · w_kn + b_n`, the weight broadcast over the leading dims of `x`.
///
/// # Shapes
/// - `x` `[..., k]`, `w_kn` `[k, n]`, `b_n` `[n]` → `[..., n]`
pub fn linear_reference<const D: usize>(x: Tensor<D>, w_kn: Tensor<2>, b_n: Option<Tensor<1>>) -> Tensor<D> {
    let y = x.matmul(w_kn.unsqueeze::<D>());
    match b_n {
        Some(b_n) => y + b_n.unsqueeze::<D>(),
        None => y,
    }
}

/// RMS normalisation over the last dim on tensor ops, Burn's `RmsNorm` formula: `x / √(mean(x²) + eps) · gamma`.
///
/// # Shapes
/// - `x` `[..., d]`, `gamma_d` `[d]` → `[..., d]`
pub fn rms_norm_reference<const D: usize>(x: Tensor<D>, gamma_d: Tensor<1>, eps: f64) -> Tensor<D> {
    let rms = (x.clone().square().mean_dim(D - 1) + eps).sqrt();
    (x / rms) * gamma_d.unsqueeze()
}

/// Causal attention on Burn's tensor ops, the textbook way: heads moved to dim 1, key/value
/// heads repeated for their query heads, an explicit `−∞` mask above the diagonal, a full softmax.
///
/// # Shapes
/// - `q_bshc` `[b, s, h, c]`, `k_bsgc` `[b, s, g, c]`, `v_bsge` `[b, s, g, e]` → `[b, s, h, e]`
pub fn causal_attention_reference(q_bshc: Tensor<4>, k_bsgc: Tensor<4>, v_bsge: Tensor<4>, scale: f32) -> Tensor<4> {
    let [b, s, h, _] = q_bshc.dims();
    let g = k_bsgc.dims()[2];
    let repeat = |t: Tensor<4>| {
        let [_, _, _, w] = t.dims();
        t.swap_dims(1, 2).unsqueeze_dim::<5>(2).expand([b, g, h / g, s, w]).reshape([b, h, s, w])
    };
    let scores_bhss = q_bshc.swap_dims(1, 2).matmul(repeat(k_bsgc).swap_dims(2, 3)) * scale as f64;
    let future_ss = Tensor::<2, Bool>::tril_mask([s, s], 0, &scores_bhss.device());
    let scores_bhss = scores_bhss.mask_fill(future_ss.unsqueeze::<4>().expand([b, h, s, s]), f32::NEG_INFINITY);
    burn::tensor::activation::softmax(scores_bhss, 3).matmul(repeat(v_bsge)).swap_dims(1, 2)
}

/// Rotary embedding on tensor ops: `x · cos + [−x2, x1] · sin` with `x = [x1, x2]` halves.
///
/// # Shapes
/// - `x_bshk` `[b, s, h, k]`, `cos_sk`/`sin_sk` `[s, k]` → `[b, s, h, k]`
pub fn rotary_reference(x_bshk: Tensor<4>, cos_sk: Tensor<2>, sin_sk: Tensor<2>) -> Tensor<4> {
    let [_, s, _, k] = x_bshk.dims();
    let half = k / 2;
    let rotated = Tensor::cat(vec![x_bshk.clone().narrow(3, half, half).neg(), x_bshk.clone().narrow(3, 0, half)], 3);
    x_bshk * cos_sk.reshape([1, s, 1, k]) + rotated * sin_sk.reshape([1, s, 1, k])
}

/// Cross-entropy of each row against its target through Burn's `log_softmax`: `−log_softmax(row)[target]`.
///
/// # Shapes
/// - `logits_nv` `[n, v]`, `targets_n` `[n]` → `[n]`
pub fn cross_entropy_reference(logits_nv: Tensor<2>, targets_n: Tensor<1, Int>) -> Tensor<1> {
    let n = logits_nv.dims()[0];
    let log_probs_nv = burn::tensor::activation::log_softmax(logits_nv, 1);
    log_probs_nv.gather(1, targets_n.reshape([n, 1])).reshape([n]).neg()
}

/// One AdamW step on tensor ops, PyTorch's rule: `(p, m, v)` after it (see [`crate::adamw_step`]).
pub fn adamw_step_reference(
    param_n: Tensor<1>,
    grad_n: Tensor<1>,
    m_n: Tensor<1>,
    v_n: Tensor<1>,
    st: crate::AdamWStep,
) -> (Tensor<1>, Tensor<1>, Tensor<1>) {
    let g = grad_n * st.grad_scale;
    let m = m_n * st.beta_1 + g.clone() * (1.0 - st.beta_1);
    let v = v_n * st.beta_2 + g.powi_scalar(2) * (1.0 - st.beta_2);
    let update = (m.clone() / st.bias_1) / ((v.clone() / st.bias_2).sqrt() + st.epsilon);
    (param_n * (1.0 - st.lr * st.weight_decay) - update * st.lr, m, v)
}

/// `Σ x²` on tensor ops (see [`crate::square_sum`]).
pub fn square_sum_reference<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    x.powi_scalar(2).sum()
}

/// Each head's `[a | r]` on tensor ops: a broadcast and a concatenation (see [`crate::concat_heads`]).
pub fn concat_heads_reference(a_bshn: Tensor<4>, r_bsgr: Tensor<4>) -> Tensor<4> {
    let [b, s, h, _] = a_bshn.dims();
    let w = r_bsgr.dims()[3];
    Tensor::cat(vec![a_bshn, r_bsgr.expand([b, s, h, w])], 3)
}
