//! The CubeCL kernel definitions. One unit per output element unless a kernel says otherwise; all
//! tensors are contiguous and indexed flat; index tensors are read as `I` (i32 on wgpu and HIP).
//!
//! Legend: t = tokens, k = experts per token, p = permuted rows (t · k), d = row width,
//! e = experts, n = output columns, q = reduction length.

use cubecl::prelude::*;

/// `out = silu(gate) ⊙ up`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn swiglu_forward_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    out: &mut Tensor<F>,
    #[define(F)] _dtype: ElemType,
) {
    if ABSOLUTE_POS >= out.len() {
        terminate!();
    }
    let g = gate[ABSOLUTE_POS];
    let sig = F::new(1.0) / (F::new(1.0) + F::exp(-g));
    out[ABSOLUTE_POS] = g * sig * up[ABSOLUTE_POS];
}

/// From `dh` of `h = silu(g) ⊙ u`: `dg = dh ⊙ u ⊙ σ(g)(1 + g(1 − σ(g)))`, `du = dh ⊙ silu(g)`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn swiglu_backward_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    grad_h: &Tensor<F>,
    grad_gate: &mut Tensor<F>,
    grad_up: &mut Tensor<F>,
    #[define(F)] _dtype: ElemType,
) {
    if ABSOLUTE_POS >= grad_gate.len() {
        terminate!();
    }
    let g = gate[ABSOLUTE_POS];
    let dh = grad_h[ABSOLUTE_POS];
    let sig = F::new(1.0) / (F::new(1.0) + F::exp(-g));
    grad_gate[ABSOLUTE_POS] = dh * up[ABSOLUTE_POS] * sig * (F::new(1.0) + g * (F::new(1.0) - sig));
    grad_up[ABSOLUTE_POS] = dh * g * sig;
}

/// Dispatch permute, `out_pd[i] = x_td[token_p[i]]`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn permute_rows_kernel<F: Float, I: Numeric>(
    x_td: &Tensor<F>,
    token_p: &Tensor<I>,
    out_pd: &mut Tensor<F>,
    d: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    if ABSOLUTE_POS >= out_pd.len() {
        terminate!();
    }
    let row = ABSOLUTE_POS / d;
    let col = ABSOLUTE_POS % d;
    out_pd[ABSOLUTE_POS] = x_td[usize::cast_from(token_p[row]) * d + col];
}

/// Combine (unpermute) as a gather, without atomics: `out_td[t] = Σ_j w_tk[t, j] · y_pd[row_tk[t, j]]`,
/// where `row_tk` is the permuted row of each (token, slot). With `weighted = false` the weights are
/// all one — the backward of [`permute_rows_kernel`].
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn combine_rows_kernel<F: Float, I: Numeric>(
    y_pd: &Tensor<F>,
    w_tk: &Tensor<F>,
    row_tk: &Tensor<I>,
    out_td: &mut Tensor<F>,
    k: usize,
    d: usize,
    #[comptime] weighted: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    if ABSOLUTE_POS >= out_td.len() {
        terminate!();
    }
    let token = ABSOLUTE_POS / d;
    let col = ABSOLUTE_POS % d;
    let mut acc = F::new(0.0);
    for j in 0..k {
        let slot = token * k + j;
        let y = y_pd[usize::cast_from(row_tk[slot]) * d + col];
        if weighted {
            acc += w_tk[slot] * y;
        } else {
            acc += y;
        }
    }
    out_td[ABSOLUTE_POS] = acc;
}

/// Combine backward to the rows: `dy_pd[i] = w_tk[slot_p[i]] · dout_td[token_p[i]]` (slot_p indexes
/// the flattened `[t · k]` weights, token_p = slot_p / k).
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn combine_backward_rows_kernel<F: Float, I: Numeric>(
    dout_td: &Tensor<F>,
    w_tk: &Tensor<F>,
    slot_p: &Tensor<I>,
    dy_pd: &mut Tensor<F>,
    k: usize,
    d: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    if ABSOLUTE_POS >= dy_pd.len() {
        terminate!();
    }
    let row = ABSOLUTE_POS / d;
    let col = ABSOLUTE_POS % d;
    let slot = usize::cast_from(slot_p[row]);
    dy_pd[ABSOLUTE_POS] = w_tk[slot] * dout_td[(slot / k) * d + col];
}

/// Combine backward to the weights, one unit per (token, slot):
/// `dw_tk[t, j] = ⟨dout_td[t], y_pd[row_tk[t, j]]⟩`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn combine_backward_weights_kernel<F: Float, I: Numeric>(
    dout_td: &Tensor<F>,
    y_pd: &Tensor<F>,
    row_tk: &Tensor<I>,
    dw_tk: &mut Tensor<F>,
    k: usize,
    d: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    if ABSOLUTE_POS >= dw_tk.len() {
        terminate!();
    }
    let token = ABSOLUTE_POS / k;
    let row = usize::cast_from(row_tk[ABSOLUTE_POS]);
    let mut acc = F::new(0.0);
    for c in 0..d {
        acc += dout_td[token * d + c] * y_pd[row * d + c];
    }
    dw_tk[ABSOLUTE_POS] = acc;
}

/// Softmax top-k gating, one unit per token: `p = softmax(logits_te[t])`, the k largest `p` in
/// descending order (ties: lower expert first), `w_tk = p` at those experts, divided by their sum when
/// `renormalize`. Selection walks the order (value desc, index asc) k times, so it needs no scratch.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn topk_softmax_kernel<F: Float, I: Int>(
    logits_te: &Tensor<F>,
    w_tk: &mut Tensor<F>,
    idx_tk: &mut Tensor<I>,
    e: usize,
    #[comptime] k: usize,
    #[comptime] renormalize: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let num_tokens = logits_te.len() / e;
    if ABSOLUTE_POS >= num_tokens {
        terminate!();
    }
    let base = ABSOLUTE_POS * e;
    let max = row_max(logits_te, base, e);
    let sum = exp_sum(logits_te, base, e, max);
    let mut prev_v = max;
    let mut prev_i = 0usize;
    let mut picked = F::new(0.0);
    #[unroll]
    for j in 0..k {
        let mut best_v = max;
        let mut best_i = e;
        for x in 0..e {
            let v = logits_te[base + x];
            let after_prev = v < prev_v || (v == prev_v && x > prev_i) || j == 0;
            if after_prev && (best_i == e || v > best_v) {
                best_v = v;
                best_i = x;
            }
        }
        let p = F::exp(best_v - max) / sum;
        w_tk[ABSOLUTE_POS * k + j] = p;
        idx_tk[ABSOLUTE_POS * k + j] = I::cast_from(best_i);
        picked += p;
        prev_v = best_v;
        prev_i = best_i;
    }
    if renormalize {
        #[unroll]
        for j in 0..k {
            w_tk[ABSOLUTE_POS * k + j] /= picked;
        }
    }
}

/// Backward of [`topk_softmax_kernel`], one unit per token. With `g_x = ∂L/∂p_x` (non-zero only at
/// the picked experts; with renormalisation `g = (dw_j − Σ_m dw_m w_m) / S`, S the picked mass),
/// `dlogits_te[t, x] = p_x (g_x − Σ_y g_y p_y)`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn topk_softmax_backward_kernel<F: Float, I: Int>(
    logits_te: &Tensor<F>,
    idx_tk: &Tensor<I>,
    w_tk: &Tensor<F>,
    dw_tk: &Tensor<F>,
    dlogits_te: &mut Tensor<F>,
    e: usize,
    #[comptime] k: usize,
    #[comptime] renormalize: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let num_tokens = logits_te.len() / e;
    if ABSOLUTE_POS >= num_tokens {
        terminate!();
    }
    let base = ABSOLUTE_POS * e;
    let max = row_max(logits_te, base, e);
    let sum = exp_sum(logits_te, base, e, max);
    // Σ_m dw_m w_m and the picked mass S (for the renormalised case).
    let mut dot = F::new(0.0);
    let mut mass = F::new(0.0);
    #[unroll]
    for j in 0..k {
        let slot = ABSOLUTE_POS * k + j;
        dot += dw_tk[slot] * w_tk[slot];
        mass += F::exp(logits_te[base + usize::cast_from(idx_tk[slot])] - max) / sum;
    }
    // Σ_y g_y p_y over the picked experts.
    let mut gp = F::new(0.0);
    #[unroll]
    for j in 0..k {
        let slot = ABSOLUTE_POS * k + j;
        let p = F::exp(logits_te[base + usize::cast_from(idx_tk[slot])] - max) / sum;
        let mut g = dw_tk[slot];
        if renormalize {
            g = (g - dot) / mass;
        }
        gp += g * p;
    }
    for x in 0..e {
        let p = F::exp(logits_te[base + x] - max) / sum;
        let mut g = F::new(0.0);
        #[unroll]
        for j in 0..k {
            let slot = ABSOLUTE_POS * k + j;
            if usize::cast_from(idx_tk[slot]) == x {
                g = dw_tk[slot];
                if renormalize {
                    g = (g - dot) / mass;
                }
            }
        }
        dlogits_te[base + x] = p * (g - gp);
    }
}

/// The largest of `row[base..base + e]`.
#[cube]
fn row_max<F: Float>(row: &Tensor<F>, base: usize, e: usize) -> F {
    let mut max = row[base];
    for x in 1..e {
        max = F::max(max, row[base + x]);
    }
    max
}

/// `Σ_x exp(row[base + x] − max)`, the softmax denominator.
#[cube]
fn exp_sum<F: Float>(row: &Tensor<F>, base: usize, e: usize, max: F) -> F {
    let mut sum = F::new(0.0);
    for x in 0..e {
        sum += F::exp(row[base + x] - max);
    }
    sum
}
