//! Grouped SwiGLU experts composed of Burn's primitive ops: the generic forward and backward bodies of
//! the backend-extension operation (its autodiff node, with the hand-written backward, is in
//! [`crate::autodiff`]).
//!
//! Rows of `x_pd` are sorted by expert (`counts_e` rows each). Forward, per expert e with rows X:
//! `G = X·Wg_e`, `U = X·Wu_e`, `H = silu(G) ⊙ U`, `Y = H·Wd_e`. Backward, from `dY`:
//! `dH = dY·Wd_eᵀ`, `dWd_e = Hᵀ·dY`, `dG = dH ⊙ U ⊙ silu'(G)`, `dU = dH ⊙ silu(G)`,
//! `dX = dG·Wg_eᵀ + dU·Wu_eᵀ`, `dWg_e = Xᵀ·dG`, `dWu_e = Xᵀ·dU` — each expert's gradient written
//! once, with no zero-filled slices (what generic autodiff of per-expert slicing would allocate).
//!
//! Legend: p = rows, d = model width, f = expert width, e = experts.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata};
use burn::tensor::{Shape, Slice};

fn rows<B: Backend>(t: FloatTensor<B>, start: usize, n: usize) -> FloatTensor<B> {
    let cols = t.shape()[1];
    B::float_slice(
        t,
        &[
            Slice { start: start as isize, end: Some((start + n) as isize), step: 1 },
            Slice { start: 0, end: Some(cols as isize), step: 1 },
        ],
    )
}

fn expert<B: Backend>(w: FloatTensor<B>, e: usize) -> FloatTensor<B> {
    let dims = w.shape();
    let (r, c) = (dims[1], dims[2]);
    let full = |n: usize| Slice { start: 0, end: Some(n as isize), step: 1 };
    let one = B::float_slice(w, &[Slice { start: e as isize, end: Some(e as isize + 1), step: 1 }, full(r), full(c)]);
    B::float_reshape(one, Shape::new([r, c]))
}

fn silu<B: Backend>(g: FloatTensor<B>) -> FloatTensor<B> {
    B::float_mul(g.clone(), sigmoid::<B>(g))
}

fn sigmoid<B: Backend>(g: FloatTensor<B>) -> FloatTensor<B> {
    B::sigmoid(g)
}

/// Forward; also returns the gate and up projections `[p, f]` for the backward.
pub(crate) fn grouped_forward<B: Backend>(
    x_pd: FloatTensor<B>,
    w_gate_edf: FloatTensor<B>,
    w_up_edf: FloatTensor<B>,
    w_down_efd: FloatTensor<B>,
    counts_e: &[usize],
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let dims = x_pd.shape();
    let f = w_gate_edf.shape()[2];
    let (mut ys, mut gs, mut us) = (Vec::new(), Vec::new(), Vec::new());
    let mut offset = 0;
    for (e, &n) in counts_e.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let x = rows::<B>(x_pd.clone(), offset, n);
        let g = B::float_matmul(x.clone(), expert::<B>(w_gate_edf.clone(), e));
        let u = B::float_matmul(x, expert::<B>(w_up_edf.clone(), e));
        let h = B::float_mul(silu::<B>(g.clone()), u.clone());
        ys.push(B::float_matmul(h, expert::<B>(w_down_efd.clone(), e)));
        gs.push(g);
        us.push(u);
        offset += n;
    }
    if ys.is_empty() {
        let device = x_pd.device();
        let dtype = x_pd.dtype().into();
        return (
            B::float_zeros(Shape::new([0, dims[1]]), &device, dtype),
            B::float_zeros(Shape::new([0, f]), &device, dtype),
            B::float_zeros(Shape::new([0, f]), &device, dtype),
        );
    }
    (B::float_cat(ys, 0), B::float_cat(gs, 0), B::float_cat(us, 0))
}

/// Backward from `dy_pd`, per expert on slices: `(dx_pd, dw_gate_edf, dw_up_edf, dw_down_efd)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn grouped_backward<B: Backend>(
    dy_pd: FloatTensor<B>,
    x_pd: FloatTensor<B>,
    w_gate_edf: FloatTensor<B>,
    w_up_edf: FloatTensor<B>,
    w_down_efd: FloatTensor<B>,
    g_pf: FloatTensor<B>,
    u_pf: FloatTensor<B>,
    counts_e: &[usize],
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (mut dx, mut dwg, mut dwu, mut dwd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let wshape = w_gate_edf.shape();
    let (d, f) = (wshape[1], wshape[2]);
    let device = dy_pd.device();
    let dtype = dy_pd.dtype().into();
    let mut offset = 0;
    for (e, &n) in counts_e.iter().enumerate() {
        if n == 0 {
            dwg.push(B::float_zeros(Shape::new([1, d, f]), &device, dtype));
            dwu.push(B::float_zeros(Shape::new([1, d, f]), &device, dtype));
            dwd.push(B::float_zeros(Shape::new([1, f, d]), &device, dtype));
            continue;
        }
        let x = rows::<B>(x_pd.clone(), offset, n);
        let g = rows::<B>(g_pf.clone(), offset, n);
        let u = rows::<B>(u_pf.clone(), offset, n);
        let dy = rows::<B>(dy_pd.clone(), offset, n);
        let (wg, wu, wd) =
            (expert::<B>(w_gate_edf.clone(), e), expert::<B>(w_up_edf.clone(), e), expert::<B>(w_down_efd.clone(), e));
        let sig = sigmoid::<B>(g.clone());
        let silu_g = B::float_mul(g.clone(), sig.clone());
        let h = B::float_mul(silu_g.clone(), u.clone());
        let dh = B::float_matmul(dy.clone(), B::float_transpose(wd));
        // silu'(g) = σ(g) · (1 + g · (1 − σ(g)))
        let one_minus = B::float_add_scalar(B::float_neg(sig.clone()), 1.0f32.into());
        let dsilu = B::float_mul(sig, B::float_add_scalar(B::float_mul(g, one_minus), 1.0f32.into()));
        let dg = B::float_mul(B::float_mul(dh.clone(), u), dsilu);
        let du = B::float_mul(dh, silu_g);
        let xt = B::float_transpose(x);
        dx.push(B::float_add(
            B::float_matmul(dg.clone(), B::float_transpose(wg)),
            B::float_matmul(du.clone(), B::float_transpose(wu)),
        ));
        let lift = |t: FloatTensor<B>, r: usize, c: usize| B::float_reshape(t, Shape::new([1, r, c]));
        dwg.push(lift(B::float_matmul(xt.clone(), dg), d, f));
        dwu.push(lift(B::float_matmul(xt, du), d, f));
        dwd.push(lift(B::float_matmul(B::float_transpose(h), dy), f, d));
        offset += n;
    }
    let dx = if dx.is_empty() { B::float_zeros(Shape::new([0, d]), &device, dtype) } else { B::float_cat(dx, 0) };
    (dx, B::float_cat(dwg, 0), B::float_cat(dwu, 0), B::float_cat(dwd, 0))
}
