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
