//! Weight initialisation: normal(0, 0.02) as Hugging Face's `initializer_range` default.

use burn::module::Param;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;

/// Standard deviation of initial weights.
pub const INIT_STD: f64 = 0.02;

pub fn initializer() -> Initializer {
    Initializer::Normal { mean: 0.0, std: INIT_STD }
}

/// A bias-free linear layer with normal(0, 0.02) weights.
pub fn normal_linear(config: LinearConfig, device: &Device) -> Linear {
    config.with_bias(false).with_initializer(initializer()).init(device)
}

/// A linear layer with normal(0, 0.02) weights and, if `bias`, a zero bias (Hugging Face's init).
pub fn normal_linear_with_bias(config: LinearConfig, bias: bool, device: &Device) -> Linear {
    let d_output = config.d_output;
    let mut linear = normal_linear(config, device);
    if bias {
        linear.bias = Some(Param::from_tensor(Tensor::zeros([d_output], device)));
    }
    linear
}

/// A parameter tensor of `shape` with normal(0, 0.02) values.
pub fn normal_param<const D: usize>(shape: [usize; D], device: &Device) -> Param<Tensor<D>> {
    initializer().init(shape, device)
}
