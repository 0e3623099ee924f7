//! The MoE operations on Flex (CPU): the grouped expert GEMMs call the `gemm` crate directly on each
//! expert's rows and weights in place — transposes are strides, `dX = dG·Wgᵀ + dU·Wuᵀ` accumulates into
//! one buffer, every output is written once into its final tensor (no slices, concatenations or
//! zero-filled gradients) — and SwiGLU with its backward is one fused, multi-threaded pass over the rows
//! instead of the ~4 (forward) and ~11 (backward) element-wise tensor ops of the generic definition.
//! Other dtypes than f32 take the generic path of [`crate::backend`].
//!
//! Legend: p = rows (sorted by expert), d = model width, f = expert width, e = experts.

use std::borrow::Cow;

use burn::backend::Flex;
use burn::backend::TensorMetadata;
use burn::backend::ops::{ActivationOps, FloatTensorOps};
use burn::backend::tensor::FloatTensor;
use burn::tensor::{DType, Shape, TensorData};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use crate::backend::MoeBackend;
use crate::grouped::{grouped_backward, grouped_forward};

/// Rows per parallel chunk of the element-wise passes.
const ROWS_PER_TASK: usize = 64;
/// Below this many multiply-adds a GEMM runs on one thread (as Flex's own matmul decides).
const PARALLEL_GEMM_OPS: usize = 192 * 192 * 192;

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
        let (x, wg, wu, wd) = (f32s(&x_pd), f32s(&w_gate_edf), f32s(&w_up_edf), f32s(&w_down_efd));
        let (mut g, mut u, mut h, mut y) = (vec![0f32; p * f], vec![0f32; p * f], vec![0f32; p * f], vec![0f32; p * d]);
        for (e, r0, n) in experts(&counts_e) {
            let xe = &x[r0 * d..(r0 + n) * d];
            // G = X·Wg, U = X·Wu: [n, d] × [d, f].
            gemm_rm(n, f, d, &mut g[r0 * f..(r0 + n) * f], false, xe, (d, 1), &wg[e * d * f..], (f, 1));
            gemm_rm(n, f, d, &mut u[r0 * f..(r0 + n) * f], false, xe, (d, 1), &wu[e * d * f..], (f, 1));
        }
        swiglu_rows(&g, &u, &mut h, f);
        for (e, r0, n) in experts(&counts_e) {
            // Y = H·Wd: [n, f] × [f, d].
            let he = &h[r0 * f..(r0 + n) * f];
            gemm_rm(n, d, f, &mut y[r0 * d..(r0 + n) * d], false, he, (f, 1), &wd[e * f * d..], (d, 1));
        }
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
        let (dy, x, g, u) = (f32s(&dy_pd), f32s(&x_pd), f32s(&g_pf), f32s(&u_pf));
        let (wg, wu, wd) = (f32s(&w_gate_edf), f32s(&w_up_edf), f32s(&w_down_efd));
        let mut dh = vec![0f32; p * f];
        for (e, r0, n) in experts(&counts_e) {
            // dH = dY·Wdᵀ: [n, d] × [d, f]; Wd_e is [f, d] row-major, so its transpose has strides (1, d).
            let dye = &dy[r0 * d..(r0 + n) * d];
            gemm_rm(n, f, d, &mut dh[r0 * f..(r0 + n) * f], false, dye, (d, 1), &wd[e * f * d..], (1, d));
        }
        // dH becomes dG in place; dU and H are written beside it.
        let (mut du, mut h) = (vec![0f32; p * f], vec![0f32; p * f]);
        swiglu_backward_rows(&g, &u, &mut dh, &mut du, Some(&mut h), f);
        let dg = dh;
        let (mut dx, mut dwg, mut dwu, mut dwd) =
            (vec![0f32; p * d], vec![0f32; ne * d * f], vec![0f32; ne * d * f], vec![0f32; ne * f * d]);
        for (e, r0, n) in experts(&counts_e) {
            let (xe, dye) = (&x[r0 * d..(r0 + n) * d], &dy[r0 * d..(r0 + n) * d]);
            let (dge, due, he) = (&dg[r0 * f..(r0 + n) * f], &du[r0 * f..(r0 + n) * f], &h[r0 * f..(r0 + n) * f]);
            // dX = dG·Wgᵀ + dU·Wuᵀ: [n, f] × [f, d], accumulated in one buffer.
            let dxe = &mut dx[r0 * d..(r0 + n) * d];
            gemm_rm(n, d, f, dxe, false, dge, (f, 1), &wg[e * d * f..], (1, f));
            gemm_rm(n, d, f, dxe, true, due, (f, 1), &wu[e * d * f..], (1, f));
            // dWg = Xᵀ·dG, dWu = Xᵀ·dU: [d, n] × [n, f]; dWd = Hᵀ·dY: [f, n] × [n, d].
            gemm_rm(d, f, n, &mut dwg[e * d * f..(e + 1) * d * f], false, xe, (1, d), dge, (f, 1));
            gemm_rm(d, f, n, &mut dwu[e * d * f..(e + 1) * d * f], false, xe, (1, d), due, (f, 1));
            gemm_rm(f, d, n, &mut dwd[e * f * d..(e + 1) * f * d], false, he, (1, f), dye, (d, 1));
        }
        (tensor(dx, [p, d]), tensor(dwg, [ne, d, f]), tensor(dwu, [ne, d, f]), tensor(dwd, [ne, f, d]))
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        if gate.dtype() != DType::F32 || up.dtype() != DType::F32 || gate.shape() != up.shape() {
            let sig = Self::sigmoid(gate.clone());
            return Self::float_mul(Self::float_mul(gate, sig), up);
        }
        let shape = gate.shape();
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
        let (g, u) = (f32s(&gate), f32s(&up));
        let mut dg = f32s(&grad_h).into_owned();
        let mut du = vec![0f32; g.len()];
        swiglu_backward_rows(&g, &u, &mut dg, &mut du, None, last_dim(&shape));
        (FlexTensor::from_data(TensorData::new(dg, shape.clone())), FlexTensor::from_data(TensorData::new(du, shape)))
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

/// `(expert, first row, rows)` of each expert that has rows.
fn experts(counts_e: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    counts_e
        .iter()
        .enumerate()
        .scan(0usize, |r0, (e, &n)| {
            let start = *r0;
            *r0 += n;
            Some((e, start, n))
        })
        .filter(|&(_, _, n)| n > 0)
}

/// The tensor's f32 elements in row-major order (borrowed when already contiguous).
fn f32s(t: &FlexTensor) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(t.to_contiguous().as_slice::<f32>().expect("contiguous f32").to_vec()),
    }
}

fn tensor<const N: usize>(data: Vec<f32>, shape: [usize; N]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}

/// `dst[m, n] (+)= lhs[m, k] · rhs[k, n]`, `dst` row-major; `lhs`/`rhs` given with their
/// `(row stride, column stride)` so that a transpose is just swapped strides.
#[allow(clippy::too_many_arguments)]
fn gemm_rm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: &[f32],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[f32],
    (rhs_rs, rhs_cs): (usize, usize),
) {
    assert!(dst.len() >= m * n, "gemm: destination too small");
    assert!(m == 0 || k == 0 || lhs.len() > (m - 1) * lhs_rs + (k - 1) * lhs_cs, "gemm: lhs out of bounds");
    assert!(k == 0 || n == 0 || rhs.len() > (k - 1) * rhs_rs + (n - 1) * rhs_cs, "gemm: rhs out of bounds");
    let parallelism =
        if m * n * k >= PARALLEL_GEMM_OPS { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    // SAFETY: the bounds of every element the strides reach were checked above; `dst` is exclusively
    // borrowed and does not alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[inline(always)]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

/// `h = silu(g) ⊙ u`, in parallel chunks of rows of width `f`.
fn swiglu_rows(g: &[f32], u: &[f32], h: &mut [f32], f: usize) {
    let chunk = (ROWS_PER_TASK * f).max(1);
    h.par_chunks_mut(chunk).zip(g.par_chunks(chunk)).zip(u.par_chunks(chunk)).for_each(|((h, g), u)| {
        for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
            *h = g * sigmoid(g) * u;
        }
    });
}

/// From `dh` (overwritten with `dg`): `dg = dh ⊙ u ⊙ silu'(g)`, `du = dh ⊙ silu(g)` and, when asked,
/// `h = silu(g) ⊙ u`, with `silu'(g) = σ(g) · (1 + g · (1 − σ(g)))`.
fn swiglu_backward_rows(g: &[f32], u: &[f32], dh: &mut [f32], du: &mut [f32], h: Option<&mut [f32]>, f: usize) {
    let chunk = (ROWS_PER_TASK * f).max(1);
    let one = |g: f32, u: f32, dh: f32| {
        let s = sigmoid(g);
        let silu = g * s;
        (dh * u * s * (1.0 + g * (1.0 - s)), dh * silu, silu * u)
    };
    match h {
        Some(h) => dh
            .par_chunks_mut(chunk)
            .zip(du.par_chunks_mut(chunk))
            .zip(h.par_chunks_mut(chunk))
            .zip(g.par_chunks(chunk).zip(u.par_chunks(chunk)))
            .for_each(|(((dh, du), h), (g, u))| {
                for i in 0..dh.len() {
                    (dh[i], du[i], h[i]) = one(g[i], u[i], dh[i]);
                }
            }),
        None => dh
            .par_chunks_mut(chunk)
            .zip(du.par_chunks_mut(chunk))
            .zip(g.par_chunks(chunk).zip(u.par_chunks(chunk)))
            .for_each(|((dh, du), (g, u))| {
                for i in 0..dh.len() {
                    (dh[i], du[i], _) = one(g[i], u[i], dh[i]);
                }
            }),
    }
}
