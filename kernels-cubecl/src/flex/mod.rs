//! The MoE operations on Flex (CPU): the grouped expert GEMMs call the `gemm` crate directly on each
//! expert's rows and weights in place, as independent single-threaded tasks per block of rows
//! ([`grouped_tasks`]) — transposes are strides (or, for long weight rows, a copy: [`transpose`]),
//! `dX = dG·Wgᵀ + dU·Wuᵀ` accumulates into one buffer, every output is written once into its final
//! tensor (no slices, concatenations or zero-filled gradients) — and SwiGLU with its backward is one
//! fused, multi-threaded pass over the rows instead of the ~4 (forward) and ~11 (backward) element-wise
//! tensor ops of the generic definition; dispatch, combine and their backwards are one pass over rows
//! each ([`rows`]). When every expert is local, the routed experts run as one operation with dispatch
//! and combine folded in: the tasks gather their token rows themselves ([`row_source`]) and the combine
//! weights enter the backward after `dout·Wdᵀ`, so neither the dispatched rows nor `dY` is ever
//! materialised. The fused dense operations (attention, rotary embedding, cross-entropy) are in
//! [`fused`]. Other dtypes than f32 (and index tensors other than i64/i32) take the generic path of
//! [`crate::backend`].
//!
//! Legend: p = rows (sorted by expert), d = model width, f = expert width, e = experts.

use burn::backend::TensorMetadata;
use burn::backend::ops::{ActivationOps, FloatTensorOps};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Flex, get_or_init_device_settings};
use burn::tensor::{DType, Shape, TensorData};
use burn_flex::FlexTensor;

mod attention;
mod buffers;
mod experts;
mod fused;
mod gating;
mod gemm;
mod grouped_tasks;
mod heads;
mod linear;
mod norm;
mod row_source;
mod rows;
pub(crate) mod simd;
mod transpose;

use crate::backend::{MoeBackend, generic};
use crate::fused::FusedBackend;
use crate::grouped::{grouped_backward, grouped_forward};
use crate::profile;
use experts::{swiglu_backward_rows, swiglu_rows};
use grouped_tasks::Upstream;
use row_source::RowSource;

impl MoeBackend for Flex {
    fn grouped_swiglu_forward(
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        if ![&x_pd, &w_gate_edf, &w_up_edf, &w_down_efd].iter().all(|t| t.dtype() == DType::F32) {
            return grouped_forward::<Self>(x_pd, w_gate_edf, w_up_edf, w_down_efd, &counts_e);
        }
        let (p, d, f) = (x_pd.shape()[0], x_pd.shape()[1], w_gate_edf.shape()[2]);
        // Three [rows, d] × [d, f]-sized products.
        let _p = profile::op("grouped experts", 6.0 * (p * d * f) as f64);
        let (x, wg, wu, wd) = (f32s(&x_pd), f32s(&w_gate_edf), f32s(&w_up_edf), f32s(&w_down_efd));
        let (y, g, u) = grouped_tasks::forward(RowSource::Sorted(&x), (&wg, &wu, &wd), &counts_e, d, f);
        (tensor(y, [p, d]), tensor(g, [p, f]), tensor(u, [p, f]))
    }

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
        let all = [&dy_pd, &x_pd, &w_gate_edf, &w_up_edf, &w_down_efd, &g_pf, &u_pf];
        if !all.iter().all(|t| t.dtype() == DType::F32) {
            return grouped_backward::<Self>(dy_pd, x_pd, w_gate_edf, w_up_edf, w_down_efd, g_pf, u_pf, &counts_e);
        }
        let (p, d, f, ne) = (x_pd.shape()[0], x_pd.shape()[1], w_gate_edf.shape()[2], w_gate_edf.shape()[0]);
        // Three input-gradient and three weight-gradient products.
        let _p = profile::op("grouped experts", 12.0 * (p * d * f) as f64);
        let (dy, x, g, u) = (f32s(&dy_pd), f32s(&x_pd), f32s(&g_pf), f32s(&u_pf));
        let (wg, wu, wd) = (f32s(&w_gate_edf), f32s(&w_up_edf), f32s(&w_down_efd));
        let (dy, x) = (Upstream::Rows(RowSource::Sorted(&dy)), RowSource::Sorted(&x));
        let gr = grouped_tasks::backward(dy, x, (&wg, &wu, &wd), (&g, &u), &counts_e, d, f);
        (tensor(gr.dx, [p, d]), tensor(gr.dwg, [ne, d, f]), tensor(gr.dwu, [ne, d, f]), tensor(gr.dwd, [ne, f, d]))
    }

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
        let all_f32 = [&x_td, &w_tk, &w_gate_edf, &w_up_edf, &w_down_efd].iter().all(|t| t.dtype() == DType::F32);
        let maps = all_f32.then(|| indices(&token_p).zip(indices(&row_tk))).flatten();
        let Some((tokens, rows)) = maps else {
            return generic::routed_experts_forward::<Self>(
                x_td, w_tk, token_p, row_tk, slot_p, w_gate_edf, w_up_edf, w_down_efd, counts_e,
            );
        };
        let (t, k, d, f) = (row_tk.shape()[0], row_tk.shape()[1], x_td.shape()[1], w_gate_edf.shape()[2]);
        let p = tokens.len();
        let _p = profile::op("routed experts", 6.0 * (p * d * f) as f64);
        let (x, w) = (f32s(&x_td), f32s(&w_tk));
        let (wg, wu, wd) = (f32s(&w_gate_edf), f32s(&w_up_edf), f32s(&w_down_efd));
        let x = RowSource::Gathered { rows_td: &x, token_p: &tokens };
        let (y, g, u) = grouped_tasks::forward(x, (&wg, &wu, &wd), &counts_e, d, f);
        let mut out = vec![0f32; t * d];
        rows::combine(&y, &w, &rows, k, d, &mut out);
        // The backward needs neither the dispatched rows nor the experts' outputs (see `Upstream`).
        (tensor(out, [t, d]), tensor(g, [p, f]), tensor(u, [p, f]), tensor(Vec::new(), [0, d]))
    }

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
        let floats = [&dout_td, &x_td, &w_tk, &w_gate_edf, &w_up_edf, &w_down_efd, &g_pf, &u_pf];
        let all_f32 = floats.iter().all(|t| t.dtype() == DType::F32);
        // The fused forward returns no output rows; the generic one (other dtypes) does.
        let fused = all_f32 && y_pd.shape()[0] == 0;
        let maps = fused.then(|| indices(&token_p).zip(indices(&row_tk)).zip(indices(&slot_p))).flatten();
        let Some(((tokens, rows), slots)) = maps else {
            return generic::routed_experts_backward::<Self>(
                dout_td, x_td, w_tk, token_p, row_tk, slot_p, w_gate_edf, w_up_edf, w_down_efd, g_pf, u_pf, y_pd,
                counts_e,
            );
        };
        let (t, k, d, f, ne) =
            (row_tk.shape()[0], row_tk.shape()[1], x_td.shape()[1], w_gate_edf.shape()[2], w_gate_edf.shape()[0]);
        let p = tokens.len();
        let _p = profile::op("routed experts", 12.0 * (p * d * f) as f64);
        let (dout, x, w, g, u) = (f32s(&dout_td), f32s(&x_td), f32s(&w_tk), f32s(&g_pf), f32s(&u_pf));
        let (wg, wu, wd) = (f32s(&w_gate_edf), f32s(&w_up_edf), f32s(&w_down_efd));
        // The combine weight of each row, in expert order.
        let w_p: Vec<f32> = slots.iter().map(|&s| w[s]).collect();
        let dout = Upstream::Combined { dout: RowSource::Gathered { rows_td: &dout, token_p: &tokens }, w_p: &w_p };
        let x = RowSource::Gathered { rows_td: &x, token_p: &tokens };
        let gr = grouped_tasks::backward(dout, x, (&wg, &wu, &wd), (&g, &u), &counts_e, d, f);
        let mut dx = vec![0f32; t * d];
        rows::permute_backward(&gr.dx, &rows, k, d, &mut dx);
        let mut dw = vec![0f32; t * k];
        for (&s, &v) in slots.iter().zip(&gr.dw_p) {
            dw[s] = v;
        }
        let shape_w = [ne, d, f];
        (
            tensor(dx, [t, d]),
            tensor(dw, [t, k]),
            tensor(gr.dwg, shape_w),
            tensor(gr.dwu, shape_w),
            tensor(gr.dwd, [ne, f, d]),
        )
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        if gate.dtype() != DType::F32 || up.dtype() != DType::F32 || gate.shape() != up.shape() {
            let sig = Self::sigmoid(gate.clone());
            return Self::float_mul(Self::float_mul(gate, sig), up);
        }
        let shape = gate.shape();
        let _p = profile::op("swiglu", 0.0);
        let (g, u) = (f32s(&gate), f32s(&up));
        let mut h = vec![0f32; g.len()];
        swiglu_rows(&g, &u, &mut h, last_dim(&shape));
        FlexTensor::from_data(TensorData::new(h, shape))
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad_h: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let same = gate.shape() == up.shape() && gate.shape() == grad_h.shape();
        if !same || [&gate, &up, &grad_h].iter().any(|t| t.dtype() != DType::F32) {
            return generic_swiglu_backward(gate, up, grad_h);
        }
        let shape = gate.shape();
        let _p = profile::op("swiglu", 0.0);
        let (g, u) = (f32s(&gate), f32s(&up));
        let mut dg = f32s(&grad_h).into_owned();
        let mut du = vec![0f32; g.len()];
        swiglu_backward_rows(&g, &u, &mut dg, &mut du, None, last_dim(&shape));
        (FlexTensor::from_data(TensorData::new(dg, shape.clone())), FlexTensor::from_data(TensorData::new(du, shape)))
    }

    fn swiglu_down(g_rf: FloatTensor<Self>, u_rf: FloatTensor<Self>, w_fn: FloatTensor<Self>) -> FloatTensor<Self> {
        <Self as FusedBackend>::dense_linear(Self::swiglu(g_rf, u_rf), w_fn)
    }

    fn swiglu_down_backward(
        dy_rn: FloatTensor<Self>,
        g_rf: FloatTensor<Self>,
        u_rf: FloatTensor<Self>,
        w_fn: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let h_rf = Self::swiglu(g_rf.clone(), u_rf.clone());
        let dw_fn = <Self as FusedBackend>::dense_linear_backward_w(dy_rn.clone(), h_rf);
        let dh_rf = <Self as FusedBackend>::dense_linear_backward_x(dy_rn, w_fn);
        let (dg_rf, du_rf) = Self::swiglu_backward(g_rf, u_rf, dh_rf);
        (dg_rf, du_rf, dw_fn)
    }

    fn permute_rows(x_td: FloatTensor<Self>, token_p: IntTensor<Self>, row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        let (p, d) = (token_p.shape()[0], x_td.shape()[1]);
        let Some(tokens) = (x_td.dtype() == DType::F32).then(|| indices(&token_p)).flatten() else {
            return generic::permute_rows::<Self>(x_td, token_p, row_tk);
        };
        let _p = profile::op("dispatch", 0.0);
        let mut x_pd = buffers::unwritten(p * d);
        rows::permute(&f32s(&x_td), &tokens, d, &mut x_pd);
        // SAFETY: `permute` writes every row of `x_pd` whole.
        tensor(unsafe { buffers::written(x_pd) }, [p, d])
    }

    fn permute_rows_backward(dy_pd: FloatTensor<Self>, row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        let (t, k, d) = (row_tk.shape()[0], row_tk.shape()[1], dy_pd.shape()[1]);
        let Some(rows) = (dy_pd.dtype() == DType::F32).then(|| indices(&row_tk)).flatten() else {
            return generic::permute_rows_backward::<Self>(dy_pd, row_tk);
        };
        let _p = profile::op("dispatch", 0.0);
        let mut dx = vec![0f32; t * d];
        rows::permute_backward(&f32s(&dy_pd), &rows, k, d, &mut dx);
        tensor(dx, [t, d])
    }

    fn combine_rows(
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let (t, k, d) = (row_tk.shape()[0], row_tk.shape()[1], y_pd.shape()[1]);
        let f32_data = y_pd.dtype() == DType::F32 && w_tk.dtype() == DType::F32;
        let Some(rows) = f32_data.then(|| indices(&row_tk)).flatten() else {
            return generic::combine_rows::<Self>(y_pd, w_tk, row_tk, slot_p);
        };
        let _p = profile::op("combine", 0.0);
        let mut out = vec![0f32; t * d];
        rows::combine(&f32s(&y_pd), &f32s(&w_tk), &rows, k, d, &mut out);
        tensor(out, [t, d])
    }

    fn combine_rows_backward(
        dout_td: FloatTensor<Self>,
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (t, k, d, p) = (row_tk.shape()[0], row_tk.shape()[1], y_pd.shape()[1], slot_p.shape()[0]);
        let f32_data = [&dout_td, &y_pd, &w_tk].iter().all(|x| x.dtype() == DType::F32);
        let maps = f32_data.then(|| indices(&row_tk).zip(indices(&slot_p))).flatten();
        let Some((rows, slots)) = maps else {
            return generic::combine_rows_backward::<Self>(dout_td, y_pd, w_tk, row_tk, slot_p);
        };
        let _p = profile::op("combine", 0.0);
        let (mut dy, mut dw) = (buffers::unwritten(p * d), vec![0f32; t * k]);
        rows::combine_backward(&f32s(&dout_td), &f32s(&y_pd), &f32s(&w_tk), &rows, &slots, k, d, &mut dy, &mut dw);
        // SAFETY: `combine_backward` writes every row of `dy` whole.
        (tensor(unsafe { buffers::written(dy) }, [p, d]), tensor(dw, [t, k]))
    }

    fn topk_softmax(logits_te: FloatTensor<Self>, k: usize, renormalize: bool) -> (FloatTensor<Self>, IntTensor<Self>) {
        let [t, e] = logits_te.shape().dims::<2>();
        if logits_te.dtype() != DType::F32 || k > e {
            return generic::topk_softmax::<Self>(logits_te, k, renormalize);
        }
        let _p = profile::op("router top-k", 0.0);
        let (w, idx) = gating::topk_softmax(&f32s(&logits_te), e, k, renormalize);
        let int_dtype = get_or_init_device_settings::<Self>(&logits_te.device()).int_dtype;
        (tensor(w, [t, k]), index_tensor(idx, [t, k], int_dtype))
    }

    fn topk_softmax_backward(
        logits_te: FloatTensor<Self>,
        idx_tk: IntTensor<Self>,
        w_tk: FloatTensor<Self>,
        dw_tk: FloatTensor<Self>,
        renormalize: bool,
    ) -> FloatTensor<Self> {
        let [_, e] = logits_te.shape().dims::<2>();
        let k = w_tk.shape()[1];
        let f32_data = [&logits_te, &w_tk, &dw_tk].iter().all(|t| t.dtype() == DType::F32);
        let Some(idx) = f32_data.then(|| indices(&idx_tk)).flatten().filter(|idx| idx.iter().all(|&j| j < e)) else {
            return generic::topk_softmax_backward::<Self>(logits_te, idx_tk, w_tk, dw_tk, renormalize);
        };
        let _p = profile::op("router top-k", 0.0);
        let dl =
            gating::topk_softmax_backward(&f32s(&logits_te), &idx, &f32s(&w_tk), &f32s(&dw_tk), (e, k), renormalize);
        tensor(dl, logits_te.shape().dims::<2>())
    }

    fn topk_sigmoid(
        logits_te: FloatTensor<Self>,
        bias_e: FloatTensor<Self>,
        k: usize,
        renormalize: bool,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        let [t, e] = logits_te.shape().dims::<2>();
        let fits = logits_te.dtype() == DType::F32 && bias_e.dtype() == DType::F32 && bias_e.shape().dims::<1>() == [e];
        if !fits || k > e {
            return generic::topk_sigmoid::<Self>(logits_te, bias_e, k, renormalize);
        }
        let _p = profile::op("router top-k", 0.0);
        let (w, idx) = gating::topk_sigmoid(&f32s(&logits_te), &f32s(&bias_e), k, renormalize);
        let int_dtype = get_or_init_device_settings::<Self>(&logits_te.device()).int_dtype;
        (tensor(w, [t, k]), index_tensor(idx, [t, k], int_dtype))
    }

    fn topk_sigmoid_backward(
        logits_te: FloatTensor<Self>,
        idx_tk: IntTensor<Self>,
        dw_tk: FloatTensor<Self>,
        renormalize: bool,
    ) -> FloatTensor<Self> {
        let [_, e] = logits_te.shape().dims::<2>();
        let k = dw_tk.shape()[1];
        let f32_data = logits_te.dtype() == DType::F32 && dw_tk.dtype() == DType::F32;
        let Some(idx) = f32_data.then(|| indices(&idx_tk)).flatten().filter(|idx| idx.iter().all(|&j| j < e)) else {
            return generic::topk_sigmoid_backward::<Self>(logits_te, idx_tk, dw_tk, renormalize);
        };
        let _p = profile::op("router top-k", 0.0);
        let dl = gating::topk_sigmoid_backward(&f32s(&logits_te), &idx, &f32s(&dw_tk), (e, k), renormalize);
        tensor(dl, logits_te.shape().dims::<2>())
    }
}

/// The generic backward of [`MoeBackend::swiglu`] (Burn ops), for dtypes the fused pass does not cover.
fn generic_swiglu_backward(gate: FlexTensor, up: FlexTensor, grad_h: FlexTensor) -> (FlexTensor, FlexTensor) {
    type B = Flex;
    let sig = B::sigmoid(gate.clone());
    let silu = B::float_mul(gate.clone(), sig.clone());
    let one_minus = B::float_add_scalar(B::float_neg(sig.clone()), 1.0f32.into());
    let dsilu = B::float_mul(sig, B::float_add_scalar(B::float_mul(gate, one_minus), 1.0f32.into()));
    (B::float_mul(B::float_mul(grad_h.clone(), up), dsilu), B::float_mul(grad_h, silu))
}

fn last_dim(shape: &Shape) -> usize {
    match shape.num_dims() {
        0 => 1,
        n => shape[n - 1].max(1),
    }
}

/// A tensor's f32 elements in row-major order: borrowed when already contiguous, else one contiguous
/// copy (kept as the tensor Flex made, not copied again into a `Vec`).
enum F32s<'a> {
    Borrowed(&'a [f32]),
    Copied(FlexTensor),
}

impl std::ops::Deref for F32s<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            F32s::Borrowed(s) => s,
            F32s::Copied(t) => t.as_slice::<f32>().expect("to_contiguous gives a contiguous f32 tensor"),
        }
    }
}

impl F32s<'_> {
    fn into_owned(self) -> Vec<f32> {
        self.to_vec()
    }
}

/// The tensor's f32 elements in row-major order (borrowed when already contiguous).
fn f32s(t: &FlexTensor) -> F32s<'_> {
    match t.as_slice::<f32>() {
        Some(s) => F32s::Borrowed(s),
        None => F32s::Copied(t.to_contiguous()),
    }
}

/// An index tensor's values (i64 or i32, any layout) as `usize`; `None` for other dtypes or negative values.
fn indices(t: &FlexTensor) -> Option<Vec<usize>> {
    let t = if t.is_contiguous() { t.clone() } else { t.to_contiguous() };
    match t.dtype() {
        DType::I64 => t.as_slice::<i64>()?.iter().map(|&v| usize::try_from(v).ok()).collect(),
        DType::I32 => t.as_slice::<i32>()?.iter().map(|&v| usize::try_from(v).ok()).collect(),
        _ => None,
    }
}

/// Indices as an index tensor of `dtype` (i64 unless the device's settings ask for i32).
fn index_tensor<const N: usize>(idx: Vec<usize>, shape: [usize; N], dtype: burn::tensor::IntDType) -> FlexTensor {
    match dtype {
        burn::tensor::IntDType::I32 => {
            FlexTensor::from_data(TensorData::new(idx.into_iter().map(|i| i as i32).collect(), shape))
        }
        _ => FlexTensor::from_data(TensorData::new(idx.into_iter().map(|i| i as i64).collect(), shape)),
    }
}

fn tensor<const N: usize>(data: Vec<f32>, shape: [usize; N]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}
