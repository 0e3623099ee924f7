//! Burn's `Linear` and `RmsNorm` layers run through the fused operations of kernels-cubecl — same
//! parameters, same result, fewer passes:
//! - [`linear`]: one product over all rows of the input (every leading dim) with hand-written
//!   gradients, instead of `Linear::forward`'s batched matmul (on Flex one GEMM written straight into
//!   its output, where Burn's runs one per batch entry, each repacking the weight into a zero-filled
//!   output);
//! - [`rms_norm`]: one pass forward and one backward instead of ~5 and ~10 element-wise tensor ops.

use burn::nn::{Linear, RmsNorm};
use burn::prelude::*;

/// `layer`'s output for `x` `[..., d_input]` → `[..., d_output]`, as `layer.forward(x)` computes it.
pub fn linear<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    kernels_cubecl::linear(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

/// `norm`'s output for `x` `[..., d]` → `[..., d]`, as `norm.forward(x)` computes it.
pub fn rms_norm<const D: usize>(norm: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    kernels_cubecl::rms_norm(x, norm.gamma.val(), norm.epsilon)
}
