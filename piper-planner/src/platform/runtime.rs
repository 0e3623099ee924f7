//! What a software runtime pays beyond GEMMs and communication — measured on the machine by
//! `piper calibrate` through the runtime itself (Burn's CPU backend here). GPU presets leave it out:
//! there the kernels' own efficiency tables stand for it.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::limits;

/// Per-element and per-op costs of the runtime's non-GEMM work, and its real memory per parameter and
/// per activation byte. Costs are forward + backward per element unless named otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeCosts {
    /// Fixed cost of one tensor operation (dispatch, allocation, thread wake-up), forward + backward, µs.
    pub op_overhead_us: f64,
    /// RMSNorm, ns per normalised element.
    pub norm_ns: f64,
    /// Rotary embedding, ns per rotated element (queries and keys).
    pub rope_ns: f64,
    /// Softmax (attention probabilities, router, cross-entropy over the vocabulary), ns per element.
    pub softmax_ns: f64,
    /// SwiGLU (gate · silu(up)), ns per output element.
    pub swiglu_ns: f64,
    /// Plain element-wise work (residual adds, masks, scales, copies, gathers), ns per element.
    pub elementwise_ns: f64,
    /// AdamW step with global-norm clipping, ns per parameter.
    pub optimizer_ns_per_param: f64,
    /// Bytes the runtime holds per parameter at the peak (weights, gradients, optimizer states and the
    /// transient copies of an update), measured.
    pub bytes_per_param: f64,
    /// Measured activation memory of the decoder layers ÷ the model's count (what autodiff keeps).
    pub activation_factor: f64,
    /// The same for the logits and the cross-entropy over the vocabulary (several `T × V` copies).
    pub logits_factor: f64,
    /// What a backward holds only while it runs, once per stage whatever the micro-batches in flight, ÷
    /// the model's count of one micro-batch's layer activations (0 where the calibration held one
    /// micro-batch at a time: the factor above then includes it).
    #[serde(default)]
    pub activation_working_factor: f64,
    /// The same for the logits: the cross-entropy's backward temporaries over the vocabulary.
    #[serde(default)]
    pub logits_working_factor: f64,
    /// What an expert-parallel rank holds beyond the model's count, bytes: the exchange path's buffers
    /// (the MPI library's per-peer pools, the host staging of dispatch and combine). Fitted on the
    /// calibration's expert-parallel runs; 0 where none ran.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expert_exchange_bytes: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl RuntimeCosts {
    pub fn validate(&self, src: &str) -> Result<()> {
        let fields = [
            ("runtime.op_overhead_us", self.op_overhead_us, 1e6),
            ("runtime.norm_ns", self.norm_ns, 1e6),
            ("runtime.rope_ns", self.rope_ns, 1e6),
            ("runtime.softmax_ns", self.softmax_ns, 1e6),
            ("runtime.swiglu_ns", self.swiglu_ns, 1e6),
            ("runtime.elementwise_ns", self.elementwise_ns, 1e6),
            ("runtime.optimizer_ns_per_param", self.optimizer_ns_per_param, 1e6),
            ("runtime.bytes_per_param", self.bytes_per_param, 1e4),
            ("runtime.activation_factor", self.activation_factor, 1e3),
            ("runtime.logits_factor", self.logits_factor, 1e3),
            ("runtime.activation_working_factor", self.activation_working_factor, 1e3),
            ("runtime.logits_working_factor", self.logits_working_factor, 1e3),
            ("runtime.expert_exchange_bytes", self.expert_exchange_bytes, 1e15),
        ];
        for (field, v, hi) in fields {
            limits::number(src, field, v, 0.0, hi)?;
        }
        Ok(())
    }

    /// Costs with distinct values per term, so a test sees which term a figure used.
    #[cfg(test)]
    pub(crate) fn distinct_for_tests() -> Self {
        RuntimeCosts {
            op_overhead_us: 2.0,
            norm_ns: 3.0,
            rope_ns: 5.0,
            softmax_ns: 7.0,
            swiglu_ns: 11.0,
            elementwise_ns: 13.0,
            optimizer_ns_per_param: 17.0,
            bytes_per_param: 16.0,
            activation_factor: 1.0,
            logits_factor: 1.0,
            activation_working_factor: 0.0,
            logits_working_factor: 0.0,
            expert_exchange_bytes: 0.0,
        }
    }
}
