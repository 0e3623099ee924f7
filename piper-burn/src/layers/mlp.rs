//! Dense gated MLP (SwiGLU): `down(silu(gate(x)) ⊙ up(x))`, used for dense layers and shared experts.
//!
//! Legend: d = model width, f = inner width.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use crate::layers::fused::linear;
use crate::layers::init::normal_linear;

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
    /// # Shapes
    /// - `x`: `[..., d]` → `[..., d]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let hidden = kernels_cubecl::swiglu(linear(&self.gate_proj, x.clone()), linear(&self.up_proj, x));
        linear(&self.down_proj, hidden)
    }
}
