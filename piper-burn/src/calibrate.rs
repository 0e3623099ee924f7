//! Calibration of the runtime's own costs on the device it runs on: each kind of element-wise pass the
//! planner's `runtime_work` inventory counts (RMSNorm, rotary embedding, softmax, SwiGLU, plain
//! element-wise), forward + backward through autodiff at a realistic size, the fixed cost of one tensor
//! op, and the AdamW step per parameter — the [`RuntimeCosts`] the planner prices a step with — and the
//! GEMM and attention efficiency tables as the runtime's own matmuls achieve them (forward + backward
//! through autodiff: transposed operands, copies and allocation included). [`measure_rank`] measures
//! them as a rank of a given thread count; run for every thread count a rank can get, each with every
//! core busy, the results serve any rank count (a CPU rank is the threads the runtime gives it: see the
//! planner's `platform::threads`). Memory (bytes per parameter, activation factors, the fixed process memory) is fitted from
//! whole runs by `piper calibrate`, not here.

use std::time::Instant;

use burn::module::{Module, Param};
use burn::nn::RmsNormConfig;
use burn::prelude::*;
use piper_planner::platform::{GemmTable, RuntimeCosts, ThreadCosts};
use serde::{Deserialize, Serialize};

use crate::layers::fused::rms_norm;
use crate::layers::rope::RotaryEmbeddingConfig;
use crate::runtime::optim::{AdamW, AdamWSettings};

/// Elements of the tensors each measurement runs on (1 Mi: large enough that the per-op cost is noise).
const ELEMENTS: usize = 1 << 20;

/// The median of `reps` timings of `f` after one warm-up, seconds.
fn median_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Timed repetitions (after the warm-up) of a GEMM-bound measurement of `flops`: about 2·10⁸ FLOPs of
/// them, at least 1 and at most 15. The largest shapes (tens of GFLOPs, seconds on one core) vary by a
/// few percent between calls, the small ones by much more, so the repetitions go where the noise is.
fn reps_for(flops: f64) -> usize {
    ((2e8 / flops) as usize).clamp(1, 15)
}

/// A leaf tensor that records gradients, `[rows, cols]` of normal values.
fn leaf(rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::random([rows, cols], burn::tensor::Distribution::Normal(0.0, 1.0), device).require_grad()
}

/// Forward + backward seconds per element of `op` on a `[rows, cols]` input (its output summed).
fn per_element(device: &Device, rows: usize, cols: usize, reps: usize, op: impl Fn(Tensor<2>) -> Tensor<2>) -> f64 {
    let x = leaf(rows, cols, device);
    let t = median_of(reps, || {
        let grads = op(x.clone()).sum().backward();
        std::hint::black_box(x.grad(&grads).map(|g| g.into_data()));
    });
    t / (rows * cols) as f64
}

/// Measures the runtime's non-GEMM costs on `device` (an autodiff device). Memory fields are left at
/// the configured 16 bytes per parameter and factor 1, for the caller to fit.
pub fn measure_runtime_costs(device: &Device) -> RuntimeCosts {
    let reps = 7;
    let (rows, d) = (ELEMENTS / 256, 256);
    // One op, forward + backward: a chain of 200 scalar adds on a 1×8 tensor, per add.
    let chain = 200;
    let tiny = leaf(1, 8, device);
    let op_overhead_s = median_of(reps, || {
        let mut y = tiny.clone();
        for _ in 0..chain {
            y = y.add_scalar(1.0);
        }
        let grads = y.sum().backward();
        std::hint::black_box(tiny.grad(&grads).map(|g| g.into_data()));
    }) / chain as f64;
    let norm = RmsNormConfig::new(d).init(device);
    let norm_s = per_element(device, rows, d, reps, |x| rms_norm(&norm, x));
    // Rotary embedding on [b, h, s, k] = [4, 8, 512, 64] (queries or keys of a layer).
    let rope = RotaryEmbeddingConfig::new(64).init();
    let rope_s = per_element(device, ELEMENTS / 64, 64, reps, |x| {
        rope.forward(x.reshape([4, 8, ELEMENTS / (4 * 8 * 64), 64])).reshape([ELEMENTS / 64, 64])
    });
    let softmax_s = per_element(device, ELEMENTS / 1024, 1024, reps, |x| burn::tensor::activation::softmax(x, 1));
    // SwiGLU reads two inputs per output element: measured per output.
    let up = leaf(rows, d, device);
    let swiglu_s = per_element(device, rows, d, reps, |gate| kernels_cubecl::swiglu(gate, up.clone()));
    // Plain element-wise: an add and a layout copy (transpose), averaged.
    let other = leaf(rows, d, device);
    let add_s = per_element(device, rows, d, reps, |x| x + other.clone());
    let copy_s = per_element(device, rows, d, reps, |x| x.swap_dims(0, 1).reshape([d, rows]).swap_dims(0, 1));
    // AdamW over one 1-Mi-parameter tensor (global-norm clipping is one more read of the gradients).
    #[derive(Module, Debug)]
    struct One {
        w: Param<Tensor<1>>,
    }
    let mut model = One { w: Param::from_tensor(Tensor::<1>::zeros([ELEMENTS], device)) };
    let mut optim = AdamW::new(AdamWSettings::default());
    let loss_s = median_of(reps, || {
        let loss = (model.w.val() * 0.5).sum();
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
        std::hint::black_box(grads);
    });
    let step_s = median_of(reps, || {
        let loss = (model.w.val() * 0.5).sum();
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model.clone(), &grads);
        std::hint::black_box(model.w.val().narrow(0, 0, 1).into_data());
    });
    // The step alone: the loss and its gradient timed the same way, taken off.
    let optimizer_s = (step_s - loss_s).max(0.0) / ELEMENTS as f64;
    RuntimeCosts {
        op_overhead_us: op_overhead_s * 1e6,
        norm_ns: norm_s * 1e9,
        rope_ns: rope_s * 1e9,
        softmax_ns: softmax_s * 1e9,
        swiglu_ns: swiglu_s * 1e9,
        elementwise_ns: 0.5 * (add_s + copy_s) * 1e9,
        optimizer_ns_per_param: optimizer_s * 1e9,
        bytes_per_param: 16.0,
        activation_factor: 1.0,
        logits_factor: 1.0,
        activation_working_factor: 0.0,
        logits_working_factor: 0.0,
        expert_exchange_bytes: 0.0,
    }
}

/// One rank's calibration: the runtime's costs and its GEMM and attention efficiency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub runtime: RuntimeCosts,
    pub gemm_efficiency: Vec<GemmTable>,
    /// The routed experts by (f, d), over tokens per expert.
    pub experts_efficiency: Vec<GemmTable>,
    /// `[[seq_len, efficiency], …]`.
    pub attention_efficiency: Vec<[f64; 2]>,
}

/// Efficiency (of `peak_flops`) of a linear layer `[m × k] · [k × n]`, forward + backward (6·m·n·k
/// FLOPs: the output, and the gradients of the input and the weight), through autodiff: the runtime's
/// own op ([`kernels_cubecl::linear`], what the projections and the LM head run), not Burn's matmul.
fn linear_efficiency(device: &Device, m: usize, n: usize, k: usize, peak_flops: f64) -> f64 {
    let x = leaf(m, k, device);
    let w = leaf(k, n, device);
    let reps = reps_for(6.0 * (m * n * k) as f64);
    let t = median_of(reps, || {
        let grads = kernels_cubecl::linear(x.clone(), w.clone(), None).sum().backward();
        std::hint::black_box((x.grad(&grads).map(|g| g.into_data()), w.grad(&grads).map(|g| g.into_data())));
    });
    (6.0 * (m * n * k) as f64 / t / peak_flops).clamp(1e-6, 1.0)
}

/// Efficiency of the runtime's routed experts (dispatch, grouped SwiGLU GEMMs, combine — the one op the
/// MoE block runs), forward + backward, at `m` tokens per expert of 8 experts, top-2, widths `d` and `f`:
/// 3 × 6·p·d·f FLOPs over the p = t·k rows, routing balanced.
fn experts_efficiency(device: &Device, m: usize, f: usize, d: usize, peak_flops: f64) -> f64 {
    let (e, k) = (8usize, 2usize);
    let t = m * e / k;
    let idx: Vec<i64> = (0..t * k).map(|i| ((i / k + (i % k) * (e / k)) % e) as i64).collect();
    let topk_idx_tk = Tensor::<2, Int>::from_data(TensorData::new(idx, [t, k]), device);
    let plan = crate::moe::permute::PermutePlan::new(&topk_idx_tk, e);
    let x = leaf(t, d, device);
    let w = Tensor::<2>::full([t, k], 0.5, device).require_grad();
    let weights =
        |a, b| Tensor::<3>::random([e, a, b], burn::tensor::Distribution::Normal(0.0, 0.05), device).require_grad();
    let (gate, up, down) = (weights(d, f), weights(d, f), weights(f, d));
    let flops = 3.0 * 6.0 * (t * k * d * f) as f64;
    let reps = reps_for(flops);
    let time = median_of(reps, || {
        let y = kernels_cubecl::routed_experts(
            x.clone(),
            w.clone(),
            &plan.map,
            gate.clone(),
            up.clone(),
            down.clone(),
            &plan.counts_e,
        );
        let grads = y.sum().backward();
        std::hint::black_box((x.grad(&grads).map(|g| g.into_data()), gate.grad(&grads).map(|g| g.into_data())));
    });
    (flops / time / peak_flops).clamp(1e-6, 1.0)
}

/// Efficiency of the attention core at sequence `s` (8 heads of 64, 4 sequences): scores `q·kᵀ` and the
/// context `p·v`, forward + backward, counted as the planner counts them (causal: half of 2·2·s²·h·64
/// per sequence, × 3).
fn attention_core_efficiency(device: &Device, s: usize, peak_flops: f64) -> f64 {
    let (b, h, k) = (4usize, 8usize, 64usize);
    let q = Tensor::<4>::random([b, h, s, k], burn::tensor::Distribution::Normal(0.0, 1.0), device).require_grad();
    let kv = Tensor::<4>::random([b, h, s, k], burn::tensor::Distribution::Normal(0.0, 1.0), device).require_grad();
    let t = median_of(5, || {
        let scores = q.clone().matmul(kv.clone().swap_dims(2, 3));
        let grads = scores.matmul(kv.clone()).sum().backward();
        std::hint::black_box(q.grad(&grads).map(|g| g.into_data()));
    });
    let counted = 3.0 * (b * h) as f64 * 2.0 * (s * s * k) as f64; // causal half of 2 GEMMs of 2·s²·k
    (counted / t / peak_flops).clamp(1e-6, 1.0)
}

/// Measures everything a rank can measure alone, against its `peak_flops` (the platform's per-rank peak).
pub fn measure(device: &Device, peak_flops: f64) -> Measured {
    let runtime = measure_runtime_costs(device);
    let ms = [16usize, 64, 256, 1024, 4096];
    // From the narrowest layers the planner prices (64 wide: there a GEMM is mostly its fixed cost) to
    // the widest that fit a calibration's time.
    let shapes = [(64usize, 64usize), (128, 128), (256, 256), (512, 256), (256, 512), (1024, 1024), (2048, 512)];
    let gemm_efficiency = shapes
        .iter()
        .map(|&(n, k)| GemmTable {
            n: n as u64,
            k: k as u64,
            points: ms.iter().map(|&m| [m as f64, linear_efficiency(device, m, n, k, peak_flops)]).collect(),
        })
        .collect();
    let tokens_per_expert = [16usize, 64, 256, 1024];
    // Expert widths from 32 (the fine-grained experts of small Qwen3- and DeepSeek-style models; below
    // the narrowest width the table clamps, and 32 wide runs 5-10% below 64 wide on an AMD EPYC Zen 4) up.
    let experts_efficiency = [32usize, 64, 128, 256, 512, 1024]
        .iter()
        .flat_map(|&f| [64usize, 128, 256, 512].map(|d| (f, d)))
        .map(|(f, d)| GemmTable {
            n: f as u64,
            k: d as u64,
            points: tokens_per_expert
                .iter()
                .map(|&m| [m as f64, experts_efficiency(device, m, f, d, peak_flops)])
                .collect(),
        })
        .collect();
    let attention_efficiency = [64usize, 128, 256, 512]
        .iter()
        .map(|&s| [s as f64, attention_core_efficiency(device, s, peak_flops)])
        .collect();
    Measured { runtime, gemm_efficiency, experts_efficiency, attention_efficiency }
}

/// [`measure`] as a rank with `threads` threads (this process's thread pool is sized to them, so call
/// it before anything else uses the pool), against `threads × core_peak_flops`. Run it as the ranks
/// would run, `cores ÷ threads` processes at once (`piper calibrate` does and takes their mean).
pub fn measure_rank(threads: u64, core_peak_flops: f64) -> Result<ThreadCosts, rayon::ThreadPoolBuildError> {
    crate::runtime::threads::rank_pool(threads as usize)?;
    let device = Device::flex().autodiff();
    let m = measure(&device, core_peak_flops * threads as f64);
    Ok(ThreadCosts {
        threads,
        attention_efficiency: m.attention_efficiency,
        gemm_efficiency: m.gemm_efficiency,
        experts_efficiency: m.experts_efficiency,
        runtime: m.runtime,
        step: None,
        framework_overhead_gib: None,
    })
}
