//! Routed experts as one grouped SwiGLU MLP: expert e's rows of the permuted buffer (contiguous, `counts`
//! given) go through `down_e(silu(x · gate_e) ⊙ (x · up_e))`. Experts with no rows are skipped.
//!
//! Legend: p = permuted rows, d = model width, f = expert width, e = experts.

use burn::module::Param;
use burn::prelude::*;

use super::permute::PermutePlan;
use crate::layers::init::normal_param;

#[derive(Config, Debug)]
pub struct GroupedExpertsConfig {
    pub num_experts: usize,
    pub d_model: usize,
    pub ffn: usize,
}

#[derive(Module, Debug)]
pub struct GroupedExperts {
    /// `[e, d, f]`
    pub w_gate_edf: Param<Tensor<3>>,
    /// `[e, d, f]`
    pub w_up_edf: Param<Tensor<3>>,
    /// `[e, f, d]`
    pub w_down_efd: Param<Tensor<3>>,
}

impl GroupedExpertsConfig {
    pub fn init(&self, device: &Device) -> GroupedExperts {
        let (e, d, f) = (self.num_experts, self.d_model, self.ffn);
        GroupedExperts {
            w_gate_edf: normal_param([e, d, f], device),
            w_up_edf: normal_param([e, d, f], device),
            w_down_efd: normal_param([e, f, d], device),
        }
    }
}

impl GroupedExperts {
    pub fn num_experts(&self) -> usize {
        self.w_gate_edf.dims()[0]
    }

    /// # Shapes
    /// - `x_pd`: `[p, d]` sorted by expert, `counts_e[i]` rows for expert i → `[p, d]`
    pub fn forward(&self, x_pd: Tensor<2>, counts_e: &[usize]) -> Tensor<2> {
        kernels_cubecl::grouped_swiglu(
            x_pd,
            self.w_gate_edf.val(),
            self.w_up_edf.val(),
            self.w_down_efd.val(),
            counts_e,
        )
    }

    /// Permute, these experts and the weighted unpermute in one operation, when every expert is local:
    /// `out_td[t] = Σ_j topk_w_tk[t, j] · expert_j(x_td[t])` over the token's experts in `plan`.
    ///
    /// # Shapes
    /// - `x_td`: `[t, d]`, `topk_w_tk`: `[t, k]` → `[t, d]`
    pub fn forward_routed(&self, x_td: Tensor<2>, topk_w_tk: Tensor<2>, plan: &PermutePlan) -> Tensor<2> {
        kernels_cubecl::routed_experts(
            x_td,
            topk_w_tk,
            &plan.map,
            self.w_gate_edf.val(),
            self.w_up_edf.val(),
            self.w_down_efd.val(),
            &plan.counts_e,
        )
    }
}
