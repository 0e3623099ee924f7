//! The measured tables of a platform: GEMM-like efficiency by shape, and a CPU rank's compute costs
//! per thread count (see `threads.rs`).

use serde::{Deserialize, Serialize};

use super::runtime::RuntimeCosts;
use super::step_costs::StepCosts;

/// GEMM efficiency for `[m × k] · [k × n]` as a function of `m` (tokens, e.g. tokens per expert).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmTable {
    pub n: u64,
    pub k: u64,
    /// `[[m, efficiency], ...]`, increasing `m`.
    pub points: Vec<[f64; 2]>,
}

/// The compute costs of a rank whose thread pool has `threads` threads, measured with every core of the
/// node busy. Efficiencies are against `threads` × the platform's per-core `peak_tflops`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadCosts {
    pub threads: u64,
    /// `[[seq_len, efficiency], ...]`.
    pub attention_efficiency: Vec<[f64; 2]>,
    pub gemm_efficiency: Vec<GemmTable>,
    /// The runtime's routed experts (see `Platform::experts_efficiency`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub experts_efficiency: Vec<GemmTable>,
    /// Time fields; the memory fields too where `framework_overhead_gib` is set (else the platform's
    /// `[runtime]` ones stand for them).
    pub runtime: RuntimeCosts,
    /// What a rank of this many threads holds beyond what the model counts (GiB), fitted with
    /// `runtime`'s memory fields from memory runs at this thread count: a rank's allocator keeps pools
    /// per thread, so a rank of fewer threads holds less (56–64 MiB less at one thread than at two for
    /// a 128-wide Mixtral-style model on an AMD EPYC Zen 4, 8 MiB for a 256-wide Qwen3-style one).
    /// `None`: the platform's top-level memory, fitted on every core, stands for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_overhead_gib: Option<f64>,
    /// The runtime's measured costs per class of work at this thread count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepCosts>,
}
