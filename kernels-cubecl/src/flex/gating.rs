//! Softmax top-k gating on Flex: one multi-threaded pass over the tokens' rows forward (softmax, the
//! `k` largest picked by insertion, renormalised) and one backward, instead of the generic definition's
//! row softmax, full sort of every row, gather and sums as separate single-threaded tensor ops (1.7% of
//! a Qwen3-style training step on the calling thread alone).
//!
//! Sigmoid top-k gating (DeepSeek-V3: sigmoid scores, a selection-only bias) the same way: one pass
//! each way, where the generic definition ran a sigmoid, a bias add, a full sort of every row on the
//! calling thread, a gather and the sums as separate tensor ops.
//!
//! Legend: t = tokens, e = experts, k = experts per token.

use rayon::prelude::*;

use super::simd::{self, multiversion};

/// Tokens per parallel task.
const TOKENS_PER_TASK: usize = 64;

multiversion! {
    /// `p = softmax(row)` into `p` (max-subtracted; NaN in, NaN out), with the crate's vectorised `exp`.
    fn softmax_row(row: &[f32], p: &mut [f32]) {
        let max = simd::max(row);
        for (q, &x) in p.iter_mut().zip(row) {
            *q = simd::exp(x - max);
        }
        let inv = 1.0 / simd::sum(p);
        p.iter_mut().for_each(|q| *q *= inv);
    }
}

/// Indices of the `k` largest of `p` in descending order (`f32::total_cmp`, so a NaN ranks above
/// every number, as Burn's sort puts it; ties keep the lower index first), into `idx`.
fn top_k(p: &[f32], idx: &mut [usize]) {
    let k = idx.len();
    let mut n = 0;
    for (i, &x) in p.iter().enumerate() {
        // Position of x among the kept ones: after every kept value ≥ x.
        let mut at = n;
        while at > 0 && x.total_cmp(&p[idx[at - 1]]).is_gt() {
            at -= 1;
        }
        if at < k {
            let end = n.min(k - 1);
            idx.copy_within(at..end, at + 1);
            idx[at] = i;
            n = (n + 1).min(k);
        }
    }
}

/// Forward: `(w_tk, idx_tk)`, the `k` largest softmax probabilities of each row of `logits_te` in
/// descending order, divided by their sum when `renormalize`.
pub(super) fn topk_softmax(logits_te: &[f32], e: usize, k: usize, renormalize: bool) -> (Vec<f32>, Vec<usize>) {
    per_token(logits_te, e, k, |row, scratch, idx, w| {
        let p = &mut scratch[..e];
        softmax_row(row, p);
        // Picked on the logits, which the softmax orders the same way: exactly, whatever `exp`
        // rounds to (two logits a few ulps apart may share a probability).
        top_k(row, idx);
        for (wj, &ej) in w.iter_mut().zip(idx.iter()) {
            *wj = p[ej];
        }
        if renormalize {
            let sum: f32 = w.iter().sum();
            w.iter_mut().for_each(|wj| *wj /= sum);
        }
    })
}

/// The gating forward's driver: `pick(row, scratch, idx, w)` fills each token's `k` picks and weights
/// from its row of `e` logits (`scratch`: `2e` floats, reused), tokens in parallel tasks.
fn per_token(
    logits_te: &[f32],
    e: usize,
    k: usize,
    pick: impl Fn(&[f32], &mut [f32], &mut [usize], &mut [f32]) + Sync,
) -> (Vec<f32>, Vec<usize>) {
    let t = logits_te.len().checked_div(e).unwrap_or(0);
    let (mut w_tk, mut idx_tk) = (vec![0f32; t * k], vec![0usize; t * k]);
    let rows = TOKENS_PER_TASK * k.max(1);
    w_tk.par_chunks_mut(rows).zip(idx_tk.par_chunks_mut(rows)).enumerate().for_each(|(c, (w_out, idx_out))| {
        let mut scratch = vec![0f32; 2 * e];
        for (i, (w, idx)) in w_out.chunks_mut(k).zip(idx_out.chunks_mut(k)).enumerate() {
            let tok = c * TOKENS_PER_TASK + i;
            pick(&logits_te[tok * e..(tok + 1) * e], &mut scratch, idx, w);
        }
    });
    (w_tk, idx_tk)
}

/// Backward of [`topk_softmax`] from `dw_tk`, given its outputs: `dlogits_te`. With `p` the row's
/// softmax, `g` the gradient at the picked probabilities (`(dw − ⟨dw, w⟩) / Σ p_picked` when
/// renormalised) scattered to its experts: `dlogits = p ⊙ (g − ⟨g, p⟩)`.
pub(super) fn topk_softmax_backward(
    logits_te: &[f32],
    idx_tk: &[usize],
    w_tk: &[f32],
    dw_tk: &[f32],
    (e, k): (usize, usize),
    renormalize: bool,
) -> Vec<f32> {
    per_token_backward(logits_te.len(), (e, k), |tok, dl, scratch| {
        let (g, picked) = scratch.split_at_mut(k);
        let (idx, w, dw) =
            (&idx_tk[tok * k..(tok + 1) * k], &w_tk[tok * k..(tok + 1) * k], &dw_tk[tok * k..(tok + 1) * k]);
        softmax_row(&logits_te[tok * e..(tok + 1) * e], dl);
        g.copy_from_slice(dw);
        if renormalize {
            let mass: f32 = idx.iter().map(|&j| dl[j]).sum();
            let dot: f32 = dw.iter().zip(w).map(|(a, b)| a * b).sum();
            g.iter_mut().for_each(|gj| *gj = (*gj - dot) / mass);
        }
        let gp: f32 = g.iter().zip(idx).map(|(gj, &j)| gj * dl[j]).sum();
        // dl holds p: every expert gets −p·⟨g, p⟩, the picked ones p·g on top.
        picked.iter_mut().zip(idx).for_each(|(pj, &j)| *pj = dl[j]);
        dl.iter_mut().for_each(|p| *p *= -gp);
        for ((&j, &gj), &pj) in idx.iter().zip(&*g).zip(&*picked) {
            dl[j] += pj * gj;
        }
    })
}

/// The gating backward's driver: `grad(tok, dl, scratch)` fills token `tok`'s row `dl` of `dlogits`
/// (`e` floats, zeroed; `scratch`: `2k` floats, reused), tokens in parallel tasks.
fn per_token_backward(
    len: usize,
    (e, k): (usize, usize),
    grad: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    let mut dlogits_te = vec![0f32; len];
    dlogits_te.par_chunks_mut((TOKENS_PER_TASK * e).max(1)).enumerate().for_each(|(c, out)| {
        let mut scratch = vec![0f32; 2 * k];
        for (i, dl) in out.chunks_mut(e.max(1)).enumerate() {
            grad(c * TOKENS_PER_TASK + i, dl, &mut scratch);
        }
    });
    dlogits_te
}

multiversion! {
    /// `s = sigmoid(row)` into `s`, with the crate's vectorised `exp`.
    fn sigmoid_row(row: &[f32], s: &mut [f32]) {
        for (q, &x) in s.iter_mut().zip(row) {
            *q = 1.0 / (1.0 + simd::exp(-x));
        }
    }
}

/// Forward of sigmoid top-k gating (DeepSeek-V3): `(w_tk, idx_tk)`, the `k` experts of each row with
/// the largest `sigmoid(logit) + bias_e`, descending, weighted by their sigmoid scores (divided by
/// `Σ + 1e-20` when `renormalize`).
pub(super) fn topk_sigmoid(logits_te: &[f32], bias_e: &[f32], k: usize, renormalize: bool) -> (Vec<f32>, Vec<usize>) {
    let e = bias_e.len();
    per_token(logits_te, e, k, |row, scratch, idx, w| {
        let (s, select) = scratch.split_at_mut(e);
        sigmoid_row(row, s);
        select.iter_mut().zip(&*s).zip(bias_e).for_each(|((x, &s), &b)| *x = s + b);
        top_k(select, idx);
        for (wj, &ej) in w.iter_mut().zip(idx.iter()) {
            *wj = s[ej];
        }
        if renormalize {
            let sum = w.iter().sum::<f32>() + 1e-20;
            w.iter_mut().for_each(|wj| *wj /= sum);
        }
    })
}

/// Backward of [`topk_sigmoid`] from `dw_tk`: with `s` the picked scores and `D = Σ s + 1e-20`,
/// `∂L/∂s = (dw − ⟨dw, s / D⟩) / D` when renormalised (else `dw`), times `s · (1 − s)`, at the picked
/// experts; zero elsewhere.
pub(super) fn topk_sigmoid_backward(
    logits_te: &[f32],
    idx_tk: &[usize],
    dw_tk: &[f32],
    (e, k): (usize, usize),
    renormalize: bool,
) -> Vec<f32> {
    per_token_backward(logits_te.len(), (e, k), |tok, dl, scratch| {
        let s = &mut scratch[..k];
        let (idx, dw) = (&idx_tk[tok * k..(tok + 1) * k], &dw_tk[tok * k..(tok + 1) * k]);
        let logits = &logits_te[tok * e..(tok + 1) * e];
        s.iter_mut().zip(idx).for_each(|(s, &j)| *s = 1.0 / (1.0 + simd::exp(-logits[j])));
        let (d, dot) = if renormalize {
            let d = s.iter().sum::<f32>() + 1e-20;
            (d, dw.iter().zip(&*s).map(|(g, s)| g * (s / d)).sum::<f32>())
        } else {
            (1.0, 0.0)
        };
        for ((&j, &g), &s) in idx.iter().zip(dw).zip(&*s) {
            dl[j] += (g - dot) / d * s * (1.0 - s);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_matches_a_full_sort() {
        let p = [0.1f32, 0.7, 0.3, 0.7, f32::NAN, 0.0, 0.2];
        for k in 1..=p.len() {
            let mut idx = vec![0; k];
            top_k(&p, &mut idx);
            let mut order: Vec<usize> = (0..p.len()).collect();
            // Stable descending sort: the independent reference.
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            assert_eq!(idx, order[..k], "k = {k}");
        }
    }
}
