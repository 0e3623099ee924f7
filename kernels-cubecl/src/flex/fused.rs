//! [`FusedBackend`] on Flex: causal attention ([`super::attention`]), rotary embedding and softmax
//! cross-entropy as one pass each, f32 only (other dtypes take the generic definitions).
//!
//! Legend: see [`crate::fused`].

use std::borrow::Cow;
use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::backend::TensorMetadata;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::DType;
use rayon::prelude::*;

use super::attention::{self, Dims, View};
use super::buffers::{unwritten, written};
use super::heads::{self, Heads};
use super::simd::{self, multiversion};
use super::{f32s, indices, tensor};
use super::{linear, norm};
use crate::fused::{AdamWStep, FusedBackend, generic};
use crate::profile;

/// Rows per parallel task of the row-wise passes.
const ROWS_PER_TASK: usize = 16;

fn all_f32(ts: &[&FloatTensor<Flex>]) -> bool {
    ts.iter().all(|t| t.dtype() == DType::F32)
}

fn dims4(t: &FloatTensor<Flex>) -> [usize; 4] {
    let s = t.shape();
    [s[0], s[1], s[2], s[3]]
}

/// The attention shape, when the three inputs agree (`None` sends the call to the generic path, which
/// reports the mismatch as Burn does).
fn attention_dims(q: &FloatTensor<Flex>, k: &FloatTensor<Flex>, v: &FloatTensor<Flex>) -> Option<Dims> {
    if q.shape().num_dims() != 4 || k.shape().num_dims() != 4 || v.shape().num_dims() != 4 {
        return None;
    }
    let ([b, s, h, c], [kb, ks, g, kc], [vb, vs, vg, e]) = (dims4(q), dims4(k), dims4(v));
    let agree = (kb, ks, kc, vb, vs, vg) == (b, s, c, b, s, g) && g > 0 && h.is_multiple_of(g);
    agree.then_some(Dims { b, s, h, g, c, e })
}

/// A `[b, s, heads, width]` f32 tensor for [`View`]: itself when its width is contiguous and its strides
/// non-negative (a narrowed or broadcast projection is read in place), else one contiguous copy.
fn strided4(t: &FloatTensor<Flex>) -> Cow<'_, FloatTensor<Flex>> {
    let layout = t.layout();
    let (st, [b, s, h, w]) = (layout.strides(), dims4(t));
    let fits = st.len() == 4 && st.iter().all(|&x| x >= 0) && (st[3] == 1 || w <= 1) && {
        // One past the last element the view reads, within the storage.
        let reach = [(b, st[0]), (s, st[1]), (h, st[2])]
            .iter()
            .try_fold(layout.start_offset().checked_add(w), |end, &(n, x)| {
                Some(end?.checked_add(n.checked_sub(1)?.checked_mul(x as usize)?))
            })
            .flatten();
        reach.is_some_and(|end| end <= t.storage::<f32>().len())
    };
    if fits { Cow::Borrowed(t) } else { Cow::Owned(t.to_contiguous()) }
}

/// The [`View`] of a tensor [`strided4`] accepted.
fn view4(t: &FloatTensor<Flex>) -> View<'_> {
    let layout = t.layout();
    let st = layout.strides();
    View {
        data: t.storage::<f32>(),
        off: layout.start_offset(),
        bs: st[0] as usize,
        ss: st[1] as usize,
        hs: st[2] as usize,
    }
}

/// Whether `x_rk · w_kn (+ b_n)` fits the host kernel: 2-D, f32, agreeing widths (`false` sends the
/// call to the generic path, which reports a mismatch as Burn does).
fn linear_fits(x_rk: &FloatTensor<Flex>, w_kn: &FloatTensor<Flex>, b_n: Option<&FloatTensor<Flex>>) -> bool {
    x_rk.shape().num_dims() == 2
        && w_kn.shape().num_dims() == 2
        && x_rk.shape()[1] == w_kn.shape()[0]
        && all_f32(&[x_rk, w_kn])
        && b_n.is_none_or(|b| b.shape().dims::<1>() == [w_kn.shape()[1]] && b.dtype() == DType::F32)
}

/// `2·r·k·n` of `x_rk · w_kn`.
fn linear_flops(x_rk: &FloatTensor<Flex>, w_kn: &FloatTensor<Flex>) -> f64 {
    2.0 * (x_rk.shape().num_elements() * w_kn.shape()[1]) as f64
}

impl FusedBackend for Flex {
    fn dense_linear(x_rk: FloatTensor<Self>, w_kn: FloatTensor<Self>) -> FloatTensor<Self> {
        if !linear_fits(&x_rk, &w_kn, None) {
            return generic::linear::<Self>(x_rk, w_kn);
        }
        let _p = profile::op("linear", linear_flops(&x_rk, &w_kn));
        linear::forward(&x_rk, &w_kn, None)
    }

    fn dense_linear_bias(
        x_rk: FloatTensor<Self>,
        w_kn: FloatTensor<Self>,
        b_n: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if !linear_fits(&x_rk, &w_kn, Some(&b_n)) {
            return generic::linear_bias::<Self>(x_rk, w_kn, b_n);
        }
        let _p = profile::op("linear", linear_flops(&x_rk, &w_kn));
        linear::forward(&x_rk, &w_kn, Some(&b_n))
    }

    fn dense_linear_backward_x(dy_rn: FloatTensor<Self>, w_kn: FloatTensor<Self>) -> FloatTensor<Self> {
        let fits = dy_rn.shape().num_dims() == 2 && w_kn.shape().num_dims() == 2 && dy_rn.shape()[1] == w_kn.shape()[1];
        if !fits || !all_f32(&[&dy_rn, &w_kn]) {
            return generic::linear_backward_x::<Self>(dy_rn, w_kn);
        }
        let (r, [k, n]) = (dy_rn.shape()[0], w_kn.shape().dims::<2>());
        let _p = profile::op("linear", 2.0 * (r * k * n) as f64);
        linear::backward_x(&dy_rn, &w_kn)
    }

    fn dense_linear_backward_w(dy_rn: FloatTensor<Self>, x_rk: FloatTensor<Self>) -> FloatTensor<Self> {
        let fits = dy_rn.shape().num_dims() == 2 && x_rk.shape().num_dims() == 2 && dy_rn.shape()[0] == x_rk.shape()[0];
        if !fits || !all_f32(&[&dy_rn, &x_rk]) {
            return generic::linear_backward_w::<Self>(dy_rn, x_rk);
        }
        let _p = profile::op("linear", 2.0 * (x_rk.shape().num_elements() * dy_rn.shape()[1]) as f64);
        linear::backward_w(&dy_rn, &x_rk)
    }

    fn dense_linear_backward_b(dy_rn: FloatTensor<Self>) -> FloatTensor<Self> {
        if dy_rn.shape().num_dims() != 2 || !all_f32(&[&dy_rn]) {
            return generic::linear_backward_b::<Self>(dy_rn);
        }
        let _p = profile::op("linear", 0.0);
        linear::backward_b(&dy_rn)
    }

    fn rms_norm(
        x_rd: FloatTensor<Self>,
        gamma_d: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let fits = x_rd.shape().num_dims() == 2 && gamma_d.shape().dims::<1>() == [x_rd.shape()[1]];
        if !fits || !all_f32(&[&x_rd, &gamma_d]) {
            return generic::rms_norm::<Self>(x_rd, gamma_d, eps);
        }
        let [r, d] = x_rd.shape().dims::<2>();
        let _p = profile::op("rms norm", 0.0);
        let (y, rstd) = norm::forward(&f32s(&x_rd), &f32s(&gamma_d), eps, d);
        (tensor(y, [r, d]), tensor(rstd, [r]))
    }

    fn rms_norm_backward(
        dy_rd: FloatTensor<Self>,
        x_rd: FloatTensor<Self>,
        gamma_d: FloatTensor<Self>,
        rstd_r: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let fits = x_rd.shape().num_dims() == 2
            && dy_rd.shape() == x_rd.shape()
            && gamma_d.shape().dims::<1>() == [x_rd.shape()[1]]
            && rstd_r.shape().dims::<1>() == [x_rd.shape()[0]];
        if !fits || !all_f32(&[&dy_rd, &x_rd, &gamma_d, &rstd_r]) {
            return generic::rms_norm_backward::<Self>(dy_rd, x_rd, gamma_d, rstd_r);
        }
        let [r, d] = x_rd.shape().dims::<2>();
        let _p = profile::op("rms norm", 0.0);
        let (dx, dgamma) = norm::backward(&f32s(&dy_rd), &f32s(&x_rd), &f32s(&gamma_d), &f32s(&rstd_r), d);
        (tensor(dx, [r, d]), tensor(dgamma, [d]))
    }

    fn causal_attention(
        q_bshc: FloatTensor<Self>,
        k_bsgc: FloatTensor<Self>,
        v_bsge: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let Some(d) = attention_dims(&q_bshc, &k_bsgc, &v_bsge).filter(|_| all_f32(&[&q_bshc, &k_bsgc, &v_bsge]))
        else {
            return generic::attention_forward::<Self>(q_bshc, k_bsgc, v_bsge, scale);
        };
        let _p = profile::op("attention", d.causal_pairs() * 2.0 * (d.c + d.e) as f64);
        let (q, k, v) = (strided4(&q_bshc), strided4(&k_bsgc), strided4(&v_bsge));
        let (o, lse) = attention::forward(view4(&q), view4(&k), view4(&v), d, scale);
        (tensor(o, [d.b, d.s, d.h, d.e]), tensor(lse, [d.b, d.h, d.s]))
    }

    fn causal_attention_backward(
        do_bshe: FloatTensor<Self>,
        q_bshc: FloatTensor<Self>,
        k_bsgc: FloatTensor<Self>,
        v_bsge: FloatTensor<Self>,
        o_bshe: FloatTensor<Self>,
        lse_bhs: FloatTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let dims = attention_dims(&q_bshc, &k_bsgc, &v_bsge)
            .filter(|d| do_bshe.shape() == o_bshe.shape() && o_bshe.shape().dims::<4>() == [d.b, d.s, d.h, d.e])
            .filter(|_| all_f32(&[&do_bshe, &q_bshc, &k_bsgc, &v_bsge, &o_bshe, &lse_bhs]));
        let Some(d) = dims else {
            return generic::attention_backward::<Self>(do_bshe, q_bshc, k_bsgc, v_bsge, o_bshe, lse_bhs, scale);
        };
        // Scores recomputed, then dV, dP, dQ, dK.
        let _p = profile::op("attention", d.causal_pairs() * 2.0 * (3 * d.c + 2 * d.e) as f64);
        let (d_o, q, k) = (strided4(&do_bshe), strided4(&q_bshc), strided4(&k_bsgc));
        let (v, o) = (strided4(&v_bsge), strided4(&o_bshe));
        let (dq, dk, dv) =
            attention::backward(view4(&d_o), view4(&q), view4(&k), view4(&v), view4(&o), &f32s(&lse_bhs), d, scale);
        (tensor(dq, [d.b, d.s, d.h, d.c]), tensor(dk, [d.b, d.s, d.g, d.c]), tensor(dv, [d.b, d.s, d.g, d.e]))
    }

    fn concat_heads(a_bshn: FloatTensor<Self>, r_bsgr: FloatTensor<Self>) -> FloatTensor<Self> {
        let fits = a_bshn.shape().num_dims() == 4 && r_bsgr.shape().num_dims() == 4;
        if !fits || !all_f32(&[&a_bshn, &r_bsgr]) {
            return generic::concat_heads::<Self>(a_bshn, r_bsgr);
        }
        let ([b, s, h, n], [_, _, g, w]) = (dims4(&a_bshn), dims4(&r_bsgr));
        let _p = profile::op("concat heads", 0.0);
        let out = heads::concat(&f32s(&a_bshn), &f32s(&r_bsgr), Heads { rows: b * s, h, n, g, w });
        tensor(out, [b, s, h, n + w])
    }

    fn concat_heads_backward(
        dout_bshx: FloatTensor<Self>,
        n: usize,
        g: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [b, s, h, x] = dims4(&dout_bshx);
        if !all_f32(&[&dout_bshx]) || n > x {
            return generic::concat_heads_backward::<Self>(dout_bshx, n, g);
        }
        let _p = profile::op("concat heads", 0.0);
        let d = Heads { rows: b * s, h, n, g, w: x - n };
        let (da, dr) = heads::concat_backward(&f32s(&dout_bshx), d);
        (tensor(da, [b, s, h, n]), tensor(dr, [b, s, g, x - n]))
    }

    fn rotary(x_bshk: FloatTensor<Self>, cos_sk: FloatTensor<Self>, sin_sk: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x_bshk.shape();
        let fits = shape.num_dims() == 4
            && shape[3].is_multiple_of(2)
            && cos_sk.shape().dims::<2>() == [shape[1], shape[3]]
            && sin_sk.shape() == cos_sk.shape();
        if !fits || !all_f32(&[&x_bshk, &cos_sk, &sin_sk]) {
            return generic::rotary::<Self>(x_bshk, cos_sk, sin_sk);
        }
        let [_, s, h, k] = dims4(&x_bshk);
        let _p = profile::op("rotary", 0.0);
        let (x, cos, sin) = (f32s(&x_bshk), f32s(&cos_sk), f32s(&sin_sk));
        let mut y = vec![0f32; x.len()];
        // One task per (batch, position): its h heads share the position's table row.
        y.par_chunks_mut((h * k).max(1)).zip(x.par_chunks((h * k).max(1))).enumerate().for_each(|(row, (y, x))| {
            let pos = row % s;
            rotate(x, y, &cos[pos * k..(pos + 1) * k], &sin[pos * k..(pos + 1) * k]);
        });
        tensor(y, shape.dims::<4>())
    }

    fn cross_entropy(
        logits_nv: FloatTensor<Self>,
        targets_n: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shape = logits_nv.shape();
        let targets =
            (shape.num_dims() == 2 && logits_nv.dtype() == DType::F32 && targets_n.shape().dims::<1>()[0] == shape[0])
                .then(|| indices(&targets_n))
                .flatten();
        let Some(targets) = targets else {
            return generic::cross_entropy::<Self>(logits_nv, targets_n);
        };
        let (n, v) = (shape[0], shape[1]);
        let _p = profile::op("cross-entropy", 0.0);
        let logits = f32s(&logits_nv);
        let (mut loss, mut lse) = (vec![0f32; n], vec![0f32; n]);
        loss.par_chunks_mut(ROWS_PER_TASK).zip(lse.par_chunks_mut(ROWS_PER_TASK)).enumerate().for_each(
            |(task, (loss, lse))| {
                for (i, (loss, lse)) in loss.iter_mut().zip(lse.iter_mut()).enumerate() {
                    let r = task * ROWS_PER_TASK + i;
                    let row = &logits[r * v..(r + 1) * v];
                    *lse = log_sum_exp(row);
                    *loss = row.get(targets[r]).map_or(f32::NAN, |&x| *lse - x);
                }
            },
        );
        (tensor(loss, [n]), tensor(lse, [n]))
    }

    fn cross_entropy_backward(
        logits_nv: FloatTensor<Self>,
        targets_n: IntTensor<Self>,
        lse_n: FloatTensor<Self>,
        dloss_n: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let shape = logits_nv.shape();
        let fits = shape.num_dims() == 2 && all_f32(&[&logits_nv, &lse_n, &dloss_n]);
        let targets = fits.then(|| indices(&targets_n)).flatten().filter(|t| t.len() == shape[0]);
        let Some(targets) = targets else {
            return generic::cross_entropy_backward::<Self>(logits_nv, targets_n, lse_n, dloss_n);
        };
        let v = shape[1];
        let _p = profile::op("cross-entropy", 0.0);
        if logits_nv.is_unique() && logits_nv.is_contiguous() {
            return cross_entropy_backward_in_place(logits_nv, &targets, &f32s(&lse_n), &f32s(&dloss_n));
        }
        let (logits, lse, dloss) = (f32s(&logits_nv), f32s(&lse_n), f32s(&dloss_n));
        // Not zero-filled first: each row is written whole (see `buffers`).
        let mut dlogits = unwritten(logits.len());
        dlogits.par_chunks_mut((ROWS_PER_TASK * v).max(1)).enumerate().for_each(|(task, out)| {
            for (i, out) in out.chunks_mut(v.max(1)).enumerate() {
                let r = task * ROWS_PER_TASK + i;
                softmax_times(&logits[r * v..(r + 1) * v], lse[r], dloss[r], out);
                if let Some(x) = out.get_mut(targets[r]) {
                    // SAFETY: just written by `softmax_times`.
                    *x = MaybeUninit::new(unsafe { x.assume_init() } - dloss[r]);
                }
            }
        });
        // SAFETY: the chunks cover every row, and `softmax_times` wrote each whole.
        tensor(unsafe { written(dlogits) }, [shape[0], v])
    }

    fn adamw_step(
        param_n: FloatTensor<Self>,
        grad_n: FloatTensor<Self>,
        m_n: FloatTensor<Self>,
        v_n: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let n = param_n.shape().num_elements();
        let same = [&grad_n, &m_n, &v_n].iter().all(|t| t.shape().num_elements() == n);
        if !same || !all_f32(&[&param_n, &grad_n, &m_n, &v_n]) {
            return generic::adamw_step::<Self>(param_n, grad_n, m_n, v_n, step);
        }
        let _p = profile::op("adamw", 0.0);
        let (g, p) = (f32s(&grad_n), f32s(&param_n));
        let (mut m_t, mut v_t) = (m_n, v_n);
        // The parameter is still held by the model, so it goes to a new buffer (an in-place update would
        // first copy it, copy-on-write); the moments belong to the optimiser and update in place.
        let mut p_new = unwritten(n);
        const CHUNK: usize = 1 << 14;
        p_new
            .par_chunks_mut(CHUNK)
            .zip(p.par_chunks(CHUNK))
            .zip(f32s_mut(&mut m_t).par_chunks_mut(CHUNK))
            .zip(f32s_mut(&mut v_t).par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|((((out, p), m), v), g)| adamw_chunk(p, out, m, v, g, &step));
        // SAFETY: the chunks cover all n elements and `adamw_chunk` writes each chunk whole.
        (tensor(unsafe { written(p_new) }, [n]), m_t, v_t)
    }

    fn square_sum(x_n: FloatTensor<Self>) -> FloatTensor<Self> {
        if !all_f32(&[&x_n]) {
            return generic::square_sum::<Self>(x_n);
        }
        let _p = profile::op("square sum", 0.0);
        const CHUNK: usize = 1 << 14;
        let sum: f64 = f32s(&x_n).par_chunks(CHUNK).map(square_sum_chunk).sum();
        tensor(vec![sum as f32], [1])
    }
}

/// The cross-entropy gradient written over the logits the backward alone holds: one stream through
/// memory, where a separate output buffer is a read and a write stream. On an Intel Xeon (family 6
/// model 167) with transparent huge pages, that separate buffer (a multiple of 64 KiB from the logits)
/// made the op 2–3× slower in the launches where both got huge pages.
fn cross_entropy_backward_in_place(
    mut logits_nv: FloatTensor<Flex>,
    targets: &[usize],
    lse: &[f32],
    dloss: &[f32],
) -> FloatTensor<Flex> {
    let v = logits_nv.shape()[1];
    f32s_mut(&mut logits_nv).par_chunks_mut((ROWS_PER_TASK * v).max(1)).enumerate().for_each(|(task, rows)| {
        for (i, row) in rows.chunks_mut(v.max(1)).enumerate() {
            let r = task * ROWS_PER_TASK + i;
            softmax_times_in_place(row, lse[r], dloss[r]);
            if let Some(x) = row.get_mut(targets[r]) {
                *x -= dloss[r];
            }
        }
    });
    logits_nv
}

/// A contiguous f32 tensor's elements to update in place: its own storage when nothing else holds it
/// (the moments, step after step), a copy made once otherwise (Burn's copy-on-write).
fn f32s_mut(t: &mut FloatTensor<Flex>) -> &mut [f32] {
    if !t.is_contiguous() {
        *t = t.to_contiguous();
    }
    let (start, end) = t.layout().contiguous_offsets().expect("contiguous after to_contiguous");
    &mut t.storage_mut::<f32>()[start..end]
}

multiversion! {
    /// `Σ x²` of one chunk: f32 lanes of eight, added up in f64.
    fn square_sum_chunk(x: &[f32]) -> f64 {
        let mut lanes = [0f32; 8];
        let chunks = x.chunks_exact(8);
        let rest: f64 = chunks.remainder().iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for c in chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l = v.mul_add(v, *l);
            }
        }
        lanes.iter().map(|&l| f64::from(l)).sum::<f64>() + rest
    }
}

multiversion! {
    /// [`crate::adamw_step`] on one chunk, in f32 (as PyTorch's f32 AdamW; the scalars rounded once).
    fn adamw_chunk(p: &[f32], out: &mut [MaybeUninit<f32>], m: &mut [f32], v: &mut [f32], g: &[f32], st: &AdamWStep) {
        let (scale, b1, b2) = (st.grad_scale as f32, st.beta_1 as f32, st.beta_2 as f32);
        let (inv_bias_1, inv_bias_2) = ((1.0 / st.bias_1) as f32, (1.0 / st.bias_2) as f32);
        let (lr, eps, decay) = (st.lr as f32, st.epsilon as f32, (1.0 - st.lr * st.weight_decay) as f32);
        let n = out.len();
        assert!(p.len() == n && m.len() == n && v.len() == n && g.len() == n, "adamw: chunks of one length");
        for i in 0..n {
            let gi = g[i] * scale;
            let mi = b1 * m[i] + (1.0 - b1) * gi;
            let vi = b2 * v[i] + (1.0 - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            out[i] = MaybeUninit::new(p[i] * decay - lr * (mi * inv_bias_1) / ((vi * inv_bias_2).sqrt() + eps));
        }
    }
}

multiversion! {
    /// `y = x · cos + [−x2, x1] · sin` for each head of one position (`x`, `y`: h heads of width k).
    fn rotate(x: &[f32], y: &mut [f32], cos: &[f32], sin: &[f32]) {
        let k = cos.len();
        let half = k / 2;
        for (x, y) in x.chunks_exact(k).zip(y.chunks_exact_mut(k)) {
            let (x1, x2) = x.split_at(half);
            let (y1, y2) = y.split_at_mut(half);
            for j in 0..half {
                y1[j] = x1[j] * cos[j] - x2[j] * sin[j];
                y2[j] = x2[j] * cos[half + j] + x1[j] * sin[half + j];
            }
        }
    }
}

multiversion! {
    /// `log Σ_j e^row[j]`, max-subtracted; NaN if any element is NaN.
    fn log_sum_exp(row: &[f32]) -> f32 {
        let max = simd::max(row);
        if max == f32::NEG_INFINITY || max.is_nan() {
            return max;
        }
        // e^(x − max) into a small buffer (a plain map, which vectorises), then an eight-lane sum.
        let mut buf = [0f32; 256];
        let mut sum = 0f32;
        for chunk in row.chunks(buf.len()) {
            let buf = &mut buf[..chunk.len()];
            for (e, &x) in buf.iter_mut().zip(chunk) {
                *e = simd::exp(x - max);
            }
            sum += simd::sum(buf);
        }
        max + sum.ln()
    }
}

multiversion! {
    /// `x[j] = e^(x[j] − lse) · scale`.
    fn softmax_times_in_place(x: &mut [f32], lse: f32, scale: f32) {
        for x in x.iter_mut() {
            *x = simd::exp(*x - lse) * scale;
        }
    }
}

multiversion! {
    /// `out[j] = e^(x[j] − lse) · scale`, writing every element of `out` (as long as `x`).
    fn softmax_times(x: &[f32], lse: f32, scale: f32, out: &mut [MaybeUninit<f32>]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = MaybeUninit::new(simd::exp(x - lse) * scale);
        }
    }
}
