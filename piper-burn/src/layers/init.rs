//! Weight initialisation: normal(0, 0.02) as Hugging Face's `initializer_range` default.

use burn::module::{Module, ModuleVisitor, Param};
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

/// Draws every lazily initialised parameter of `module` now, in module order. A stage drawn from the
/// run's seed must draw each part of the whole model in one fixed order whatever it keeps: Burn draws a
/// parameter when it is first read, which would otherwise depend on the layout.
pub fn draw_now<M: Module>(module: &M) {
    module.visit(&mut DrawNow);
}

struct DrawNow;

impl ModuleVisitor for DrawNow {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}
