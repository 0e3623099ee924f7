//! # kernels-cubecl
//!
//! The MoE kernels — SwiGLU, token permute (row gather), weighted combine (row scatter-add) and the
//! grouped expert GEMM — each with a plain-tensor `*_reference` twin in [`reference`].
//!
//! Status: the public functions below run the reference definitions on every backend (on the CPU
//! backend, Flex, these are its own fast gather / matmul kernels). The CubeCL kernels behind a Burn
//! backend extension, their HIP compilation for MI250X and the wgpu parity tests are not written yet
//! (issue #3).

#[cfg(feature = "kernels")]
pub mod cube;
pub mod grouped;
#[cfg(feature = "hip-codegen")]
pub mod hip;
#[cfg(feature = "hip-codegen")]
pub mod hiprtc;
pub mod reference;

use burn::prelude::*;

pub use reference::{combine_rows_reference, grouped_swiglu_reference, permute_rows_reference, swiglu_reference};

/// `silu(gate) ⊙ up`.
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    swiglu_reference(gate, up)
}

/// `out_pd[i] = x_td[index_p[i]]`.
pub fn permute_rows(x_td: Tensor<2>, index_p: Tensor<1, Int>) -> Tensor<2> {
    permute_rows_reference(x_td, index_p)
}

/// `out_td[index_p[i]] += w_p[i] · y_pd[i]`.
pub fn combine_rows(y_pd: Tensor<2>, w_p: Tensor<1>, index_p: Tensor<1, Int>, num_tokens: usize) -> Tensor<2> {
    combine_rows_reference(y_pd, w_p, index_p, num_tokens)
}

/// Grouped SwiGLU experts over rows sorted by expert.
pub fn grouped_swiglu(
    x_pd: Tensor<2>,
    w_gate_edf: Tensor<3>,
    w_up_edf: Tensor<3>,
    w_down_efd: Tensor<3>,
    counts_e: &[usize],
) -> Tensor<2> {
    grouped_swiglu_reference(x_pd, w_gate_edf, w_up_edf, w_down_efd, counts_e)
}
