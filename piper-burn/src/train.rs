//! Single-process training loop: AdamW with linear warm-up and cosine decay, gradient clipping, the
//! router losses, DeepSeek-style bias updates, and per-step metrics (loss, tokens/s, achieved FLOP/s,
//! MFU against a measured peak, expert load per MoE layer).

use std::time::Instant;

use burn::prelude::*;
use serde::Serialize;

use crate::corpus::Corpus;
use crate::lm::{CausalLm, CausalLmConfig};

/// Optimisation settings.
#[derive(Config, Debug)]
pub struct TrainConfig {
    #[config(default = 200)]
    pub steps: usize,
    #[config(default = 8)]
    pub batch_size: usize,
    #[config(default = 64)]
    pub seq_len: usize,
    #[config(default = 3e-3)]
    pub lr: f64,
    /// Final learning rate as a fraction of `lr`.
    #[config(default = 0.1)]
    pub min_lr_ratio: f64,
    #[config(default = 20)]
    pub warmup_steps: usize,
    #[config(default = 0.1)]
    pub weight_decay: f64,
    /// Clip each parameter's gradient to this norm (0: no clipping).
    #[config(default = 1.0)]
    pub grad_clip: f64,
    /// Step of DeepSeek's selection-bias update (routers with a selection bias only).
    #[config(default = 1e-3)]
    pub bias_update_rate: f64,
    #[config(default = 0)]
    pub seed: u64,
}

/// What one step did.
#[derive(Clone, Debug, Serialize)]
pub struct StepMetrics {
    pub step: usize,
    /// Next-token cross-entropy, nats.
    pub loss: f64,
    /// Cross-entropy + router losses (what was differentiated).
    pub total_loss: f64,
    pub lr: f64,
    pub tokens_per_s: f64,
    /// Model FLOPs (Megatron convention) per second.
    pub flops_per_s: f64,
    /// `flops_per_s` over the measured peak.
    pub mfu: f64,
    /// Max / mean tokens per expert, per MoE layer.
    pub expert_load: Vec<f64>,
    pub step_time_s: f64,
    /// Pipelined runs: idle fraction of the stages over the step (1 − mean busy time / step time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bubble: Option<f64>,
}

/// Learning rate at `step` (0-based): linear warm-up to `lr`, then cosine to `lr · min_lr_ratio`.
pub fn learning_rate(c: &TrainConfig, step: usize) -> f64 {
    if step < c.warmup_steps {
        return c.lr * (step + 1) as f64 / c.warmup_steps as f64;
    }
    let decay = c.steps.saturating_sub(c.warmup_steps).max(1);
    let progress = ((step - c.warmup_steps) as f64 / decay as f64).min(1.0);
    let min = c.lr * c.min_lr_ratio;
    min + 0.5 * (c.lr - min) * (1.0 + (std::f64::consts::PI * progress).cos())
}

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
        .fold(0.0, f64::max)
}

/// Trains a fresh model on this process alone (the one-rank case of
/// [`train_parallel`](crate::parallel::train::train_parallel)). `flops_per_token` is the model's
/// training FLOPs per token (the planner's count); `on_step` sees every step's metrics. Returns the
/// trained model and all metrics.
pub fn train(
    model_config: &CausalLmConfig,
    corpus: &mut dyn Corpus,
    c: &TrainConfig,
    device: &Device,
    flops_per_token: f64,
    peak_flops: f64,
    on_step: impl FnMut(&StepMetrics),
) -> Result<(CausalLm, Vec<StepMetrics>), String> {
    let single = piper_comm::LocalComm::single();
    let topo = piper_comm::Topology::uniform(1, 1).map_err(|e| e.to_string())?;
    let layout = crate::parallel::train::Layout { ep: 1, dp: 1 };
    crate::parallel::train::train_parallel(
        model_config,
        corpus,
        c,
        &single,
        &topo,
        layout,
        piper_comm::Algo::Flat,
        device,
        flops_per_token,
        peak_flops,
        on_step,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let c = TrainConfig::new().with_steps(100).with_warmup_steps(10).with_lr(1.0).with_min_lr_ratio(0.1);
        assert!((learning_rate(&c, 0) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&c, 9) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&c, 10) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&c, 55) - 0.55).abs() < 1e-12); // halfway: (1 + 0.1) / 2
        assert!((learning_rate(&c, 100) - 0.1).abs() < 1e-12);
    }
}
