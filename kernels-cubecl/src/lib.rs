//! # kernels-cubecl
//!
//! The MoE kernels — SwiGLU, token permute (dispatch) and unpermute (combine), softmax top-k gating
//! and the grouped expert GEMM — each forward and backward, with a plain-tensor `*_reference` twin in
//! [`reference`].
//!
//! They are Burn backend-extension operations ([`backend::MoeBackend`]): on the CPU (Flex) the grouped
//! GEMMs and SwiGLU run fused host code over the `gemm` crate ([`flex`]) and the rest Burn's own
//! primitive ops; with the `wgpu` feature the Cube backend runs the CubeCL kernels of
//! [`cube::kernels`]; with `hip-codegen` the same kernels are emitted as HIP C++ and compiled for AMD
//! GPUs ([`hip`], [`hiprtc`]), and with `cuda-codegen` as CUDA C++ compiled to PTX and CUBIN for NVIDIA
//! GPUs ([`cuda`], [`nvrtc`], [`cubin`]). Under `Autodiff` every op has a hand-written backward that calls the
//! backend's backward op.
//!
//! Legend: t = tokens, k = experts per token, p = permuted rows (t · k), d = row width, e = experts,
//! f = expert width.

pub mod autodiff;
pub mod backend;
#[cfg(any(feature = "hip-codegen", feature = "cuda-codegen"))]
pub mod codegen;
#[cfg(feature = "kernels")]
pub mod cube;
#[cfg(feature = "cuda-codegen")]
pub mod cubin;
#[cfg(feature = "cuda-codegen")]
pub mod cuda;
pub mod flex;
pub mod fused;
pub mod fused_autodiff;
pub mod grouped;
#[cfg(feature = "hip-codegen")]
pub mod hip;
#[cfg(feature = "hip-codegen")]
pub mod hiprtc;
#[cfg(feature = "cuda-codegen")]
pub mod nvrtc;
pub mod profile;
pub mod reference;
pub mod routed;
#[cfg(any(feature = "hip-codegen", feature = "cuda-codegen"))]
mod rtc;

use burn::backend::Dispatch;
use burn::prelude::*;

pub use backend::MoeBackend;
pub use fused::{
    AdamWStep, FusedBackend, adamw_step, causal_attention, concat_heads, cross_entropy, linear, rms_norm, rotary,
    square_sum,
};
pub use reference::{
    adamw_step_reference, causal_attention_reference, combine_rows_reference, concat_heads_reference,
    cross_entropy_reference, grouped_swiglu_reference, linear_reference, permute_rows_reference, rms_norm_reference,
    rotary_reference, routed_experts_reference, square_sum_reference, swiglu_down_reference, swiglu_reference,
    topk_sigmoid_reference, topk_softmax_reference,
};

/// Where each permuted row comes from and goes back to: the `t · k` (token, slot) pairs in the
/// order the experts read them.
#[derive(Debug, Clone)]
pub struct RowMap {
    /// Token of each permuted row `[p]`.
    pub token_p: Tensor<1, Int>,
    /// Flat slot (`token · k + j`) of each permuted row `[p]`.
    pub slot_p: Tensor<1, Int>,
    /// Permuted row of each (token, slot) `[t, k]` — the inverse of `slot_p`.
    pub row_tk: Tensor<2, Int>,
}

impl RowMap {
    /// From the slot of each permuted row, which must be a permutation of `0..t·k`.
    pub fn from_slots(slot_p: &[usize], num_tokens: usize, k: usize, device: &Device) -> Result<Self, String> {
        let p = num_tokens * k;
        if slot_p.len() != p {
            return Err(format!("slot_p has {} rows, expected tokens · k = {p}", slot_p.len()));
        }
        let mut row = vec![-1i64; p];
        for (i, &s) in slot_p.iter().enumerate() {
            if s >= p || row[s] >= 0 {
                return Err(format!("slot_p is not a permutation of 0..{p}: slot {s} at row {i}"));
            }
            row[s] = i as i64;
        }
        let ints = |v: Vec<i64>| TensorData::new(v, [p]);
        Ok(RowMap {
            token_p: Tensor::from_data(ints(slot_p.iter().map(|&s| (s / k) as i64).collect()), device),
            slot_p: Tensor::from_data(ints(slot_p.iter().map(|&s| s as i64).collect()), device),
            row_tk: Tensor::from_data(TensorData::new(row, [num_tokens, k]), device),
        })
    }
}

/// `silu(gate) ⊙ up`.
///
/// # Panics
/// If the shapes differ.
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    assert_eq!(gate.dims(), up.dims(), "swiglu: gate and up must have the same shape");
    Tensor::from_dispatch(Dispatch::swiglu(gate.into_dispatch(), up.into_dispatch()))
}

/// A SwiGLU MLP's down projection from its gate and up projections, `(silu(gate) ⊙ up) · w_down_fn`: the
/// values of `linear(swiglu(gate, up), w_down_fn, None)`, but under autodiff it holds `gate` and `up` and
/// not their product, which the backward recomputes (selective activation recompute: one element-wise
/// pass for `f` fewer values per row).
///
/// # Shapes
/// - `gate`, `up`: `[..., f]`, `w_down_fn`: `[f, n]` → `[..., n]`
///
/// # Panics
/// If `gate` and `up` differ in shape or do not end in the weight's `f`.
pub fn swiglu_down<const D: usize>(gate: Tensor<D>, up: Tensor<D>, w_down_fn: Tensor<2>) -> Tensor<D> {
    let dims = gate.dims();
    let [f, n] = w_down_fn.dims();
    assert!(
        dims == up.dims() && D >= 1 && dims[D - 1] == f,
        "swiglu_down: gate {dims:?} and up {:?} must have the same shape, ending in the weight's input width {f}",
        up.dims()
    );
    let rows = dims[..D - 1].iter().product();
    let y_rn = Dispatch::swiglu_down(
        gate.reshape([rows, f]).into_dispatch(),
        up.reshape([rows, f]).into_dispatch(),
        w_down_fn.into_dispatch(),
    );
    let mut out = dims;
    out[D - 1] = n;
    Tensor::<2>::from_dispatch(y_rn).reshape(out)
}

/// Dispatch permute: `out_pd[i] = x_td[map.token_p[i]]`.
///
/// # Panics
/// If `x_td` does not have the map's `t` rows.
pub fn permute_rows(x_td: Tensor<2>, map: &RowMap) -> Tensor<2> {
    let [t, k] = map.row_tk.dims();
    assert_eq!(
        x_td.dims()[0],
        t,
        "permute_rows: x_td has {} rows, the row map {t} tokens (× {k} slots)",
        x_td.dims()[0]
    );
    Tensor::from_dispatch(Dispatch::permute_rows(
        x_td.into_dispatch(),
        map.token_p.clone().into_dispatch(),
        map.row_tk.clone().into_dispatch(),
    ))
}

/// Combine: `out_td[t] = Σ_j w_tk[t, j] · y_pd[map.row_tk[t, j]]`.
///
/// # Panics
/// If `y_pd` does not have the map's `t · k` rows or `w_tk` is not `[t, k]`.
pub fn combine_rows(y_pd: Tensor<2>, w_tk: Tensor<2>, map: &RowMap) -> Tensor<2> {
    let [t, k] = map.row_tk.dims();
    assert_eq!(y_pd.dims()[0], t * k, "combine_rows: y_pd has {} rows, the row map {t} × {k}", y_pd.dims()[0]);
    assert_eq!(w_tk.dims(), [t, k], "combine_rows: w_tk must be [tokens, k] = [{t}, {k}]");
    Tensor::from_dispatch(Dispatch::combine_rows(
        y_pd.into_dispatch(),
        w_tk.into_dispatch(),
        map.row_tk.clone().into_dispatch(),
        map.slot_p.clone().into_dispatch(),
    ))
}

/// Softmax top-k gating: `(w_tk, idx_tk)`, the k largest softmax probabilities per token in
/// descending order, divided by their sum when `renormalize`.
///
/// # Panics
/// Unless `1 ≤ k ≤ e`.
pub fn topk_softmax(logits_te: Tensor<2>, k: usize, renormalize: bool) -> (Tensor<2>, Tensor<2, Int>) {
    let e = logits_te.dims()[1];
    assert!((1..=e).contains(&k), "topk_softmax: k = {k} must be in 1..={e} (the number of experts)");
    let (w, idx) = Dispatch::topk_softmax(logits_te.into_dispatch(), k, renormalize);
    (Tensor::from_dispatch(w), Tensor::from_dispatch(idx))
}

/// Sigmoid top-k gating (DeepSeek-V3): `(w_tk, idx_tk)`, per token the `k` experts with the largest
/// `sigmoid(logits_te) + bias_e` in descending order (the bias, a constant, only steers the choice),
/// weighted by their sigmoid scores, divided by `Σ w + 1e-20` when `renormalize`.
///
/// # Panics
/// Unless `1 ≤ k ≤ e` and `bias_e` is `[e]`.
pub fn topk_sigmoid(
    logits_te: Tensor<2>,
    bias_e: Tensor<1>,
    k: usize,
    renormalize: bool,
) -> (Tensor<2>, Tensor<2, Int>) {
    let e = logits_te.dims()[1];
    assert!((1..=e).contains(&k), "topk_sigmoid: k = {k} must be in 1..={e} (the number of experts)");
    assert_eq!(bias_e.dims(), [e], "topk_sigmoid: bias_e must be [experts] = [{e}]");
    let (w, idx) = Dispatch::topk_sigmoid(logits_te.into_dispatch(), bias_e.into_dispatch(), k, renormalize);
    (Tensor::from_dispatch(w), Tensor::from_dispatch(idx))
}

/// Grouped SwiGLU experts over rows sorted by expert (`counts_e[i]` rows for expert i).
///
/// # Panics
/// If `counts_e` does not cover the rows of `x_pd` or the weight shapes do not match.
pub fn grouped_swiglu(
    x_pd: Tensor<2>,
    w_gate_edf: Tensor<3>,
    w_up_edf: Tensor<3>,
    w_down_efd: Tensor<3>,
    counts_e: &[usize],
) -> Tensor<2> {
    let ([p, d], [e, _, f]) = (x_pd.dims(), w_gate_edf.dims());
    assert_eq!(counts_e.len(), e, "grouped_swiglu: counts_e has {} entries for {e} experts", counts_e.len());
    assert_eq!(counts_e.iter().sum::<usize>(), p, "grouped_swiglu: counts_e must sum to the {p} rows of x_pd");
    assert!(
        w_gate_edf.dims() == [e, d, f] && w_up_edf.dims() == [e, d, f] && w_down_efd.dims() == [e, f, d],
        "grouped_swiglu: for x_pd [p, {d}] the weights must be [e, {d}, f], [e, {d}, f], [e, f, {d}]; got {:?}, {:?}, {:?}",
        w_gate_edf.dims(),
        w_up_edf.dims(),
        w_down_efd.dims()
    );
    Tensor::from_dispatch(Dispatch::grouped_swiglu(
        x_pd.into_dispatch(),
        w_gate_edf.into_dispatch(),
        w_up_edf.into_dispatch(),
        w_down_efd.into_dispatch(),
        counts_e.to_vec(),
    ))
}

/// Routed experts: dispatch (`x_td` rows to the experts in `map`'s order, `counts_e[i]` rows for expert
/// i), the grouped SwiGLU experts and the weighted combine back to tokens, as one operation —
/// `combine_rows(grouped_swiglu(permute_rows(x_td, map), …), w_tk, map)`, which a backend may fuse.
///
/// # Shapes
/// - `x_td` `[t, d]`, `w_tk` `[t, k]`, `w_gate_edf`/`w_up_edf` `[e, d, f]`, `w_down_efd` `[e, f, d]` → `[t, d]`
///
/// # Panics
/// If the shapes disagree with the map or with each other, or `counts_e` does not cover the `t · k` rows.
pub fn routed_experts(
    x_td: Tensor<2>,
    w_tk: Tensor<2>,
    map: &RowMap,
    w_gate_edf: Tensor<3>,
    w_up_edf: Tensor<3>,
    w_down_efd: Tensor<3>,
    counts_e: &[usize],
) -> Tensor<2> {
    let ([t, k], [_, d], [e, _, f]) = (map.row_tk.dims(), x_td.dims(), w_gate_edf.dims());
    assert_eq!(x_td.dims()[0], t, "routed_experts: x_td has {} rows, the row map {t} tokens", x_td.dims()[0]);
    assert_eq!(w_tk.dims(), [t, k], "routed_experts: w_tk must be [tokens, k] = [{t}, {k}]");
    assert_eq!(counts_e.len(), e, "routed_experts: counts_e has {} entries for {e} experts", counts_e.len());
    assert_eq!(counts_e.iter().sum::<usize>(), t * k, "routed_experts: counts_e must sum to tokens · k = {}", t * k);
    assert!(
        w_gate_edf.dims() == [e, d, f] && w_up_edf.dims() == [e, d, f] && w_down_efd.dims() == [e, f, d],
        "routed_experts: for x_td [t, {d}] the weights must be [e, {d}, f], [e, {d}, f], [e, f, {d}]; got {:?}, {:?}, {:?}",
        w_gate_edf.dims(),
        w_up_edf.dims(),
        w_down_efd.dims()
    );
    Tensor::from_dispatch(Dispatch::routed_experts(
        x_td.into_dispatch(),
        w_tk.into_dispatch(),
        map.token_p.clone().into_dispatch(),
        map.row_tk.clone().into_dispatch(),
        map.slot_p.clone().into_dispatch(),
        w_gate_edf.into_dispatch(),
        w_up_edf.into_dispatch(),
        w_down_efd.into_dispatch(),
        counts_e.to_vec(),
    ))
}
