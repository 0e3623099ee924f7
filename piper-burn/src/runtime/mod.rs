//! The runtime: a run is a [`RunConfig`] (what to optimise) and a plan
//! ([`RunPlan`](piper_planner::run_plan::RunPlan): the layout the planner wrote or priced), executed by one
//! executor that runs the planner's instruction stream. Data flows one way: plan → run config →
//! executor → instructions → metrics → report.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod executor;
pub mod fingerprint;
pub mod grads;
pub mod migration;
pub mod optim;
pub mod plan;
pub mod profile;
pub mod reductions;
pub mod report;
mod stage;
pub mod threads;

use std::time::Instant;

use burn::prelude::*;

pub use config::{AuxLossScope, RunConfig};
pub use executor::{Job, Trained, execute};
pub use plan::{LayoutFlags, check_plan, plan_auto, plan_from_flags};
pub use report::{ReportOptions, Reporter, RunSummary, StepMetrics};

/// Dense f32 GEMM rate of `device` (FLOP/s), the best of a few runs of 8 back-to-back 1024³ products:
/// the peak MFU refers to. Each run ends by reading one element of the last product back to the host,
/// so on asynchronous backends (wgpu) the time covers the work, not only its launch.
pub fn measure_peak_flops(device: &Device) -> f64 {
    let (n, reps) = (1024usize, 8usize);
    let a = Tensor::<2>::random([n, n], burn::tensor::Distribution::Default, device);
    let b = Tensor::<2>::random([n, n], burn::tensor::Distribution::Default, device);
    let wait = |c: Tensor<2>| -> f32 { c.slice([0..1, 0..1]).into_data().try_to_vec::<f32>().map_or(0.0, |v| v[0]) };
    wait(a.clone().matmul(b.clone()));
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let mut last = a.clone().matmul(b.clone());
            for _ in 1..reps {
                last = a.clone().matmul(b.clone());
            }
            wait(last);
            2.0 * (reps * n * n * n) as f64 / t.elapsed().as_secs_f64()
        })
        .max_by(f64::total_cmp)
        .unwrap_or(f64::NAN)
}
