//! Dense gated MLP (SwiGLU): `down(silu(gate(x)) ⊙ up(x))`, used for dense layers and shared experts.
//!
//! Legend: d = model width, f = inner width.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use crate::layers::fused::linear;
use crate::layers::init::normal_linear;
use crate::layers::recompute;

#[derive(Config, Debug)]
pub struct MlpConfig {
    pub d_model: usize,
    pub ffn: usize,
}

#[derive(Module, Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl MlpConfig {
    pub fn init(&self, device: &Device) -> Mlp {
        Mlp {
            gate_proj: normal_linear(LinearConfig::new(self.d_model, self.ffn), device),
            up_proj: normal_linear(LinearConfig::new(self.d_model, self.ffn), device),
            down_proj: normal_linear(LinearConfig::new(self.ffn, self.d_model), device),
        }
    }
}

impl Mlp {
    /// Under a [`SelectiveRecompute`](crate::layers::recompute::SelectiveRecompute) scope the backward
    /// recomputes `silu(gate) ⊙ up` instead of holding it (same values).
    ///
    /// # Shapes
    /// - `x`: `[..., d]` → `[..., d]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let (gate, up) = (linear(&self.gate_proj, x.clone()), linear(&self.up_proj, x));
        match &self.down_proj.bias {
            None if recompute::selective() => kernels_cubecl::swiglu_down(gate, up, self.down_proj.weight.val()),
            _ => linear(&self.down_proj, kernels_cubecl::swiglu(gate, up)),
        }
    }
}
