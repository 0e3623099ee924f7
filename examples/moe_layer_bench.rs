//! Forward + backward of one MoE block (router, dropless dispatch, grouped SwiGLU experts, combine),
//! side by side with one dense GEMM measured in the same run.
//!
//! `cargo run --release --example moe_layer_bench -- --tokens 2048 --hidden 512 --ffn 1024 --experts 8
//! --top-k 2 --json moe.json` writes `{"median_s", "gflops", "dense_gemm_gflops", "ratio_to_dense", ...}`.
//! FLOPs counted: 3 × forward GEMMs of the experts (2·t·k·3·h·f) and the router (2·t·h·e).

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::Distribution;
use clap::{Parser, ValueEnum};
use piper::modules::moe::MoeBlockConfig;
use piper::modules::moe::router::RouterConfig;
use piper::modules::runtime::profile;

/// mimalloc, never purging freed pages (see `piper::alloc`).
#[global_allocator]
static ALLOCATOR: piper::alloc::Allocator = piper::alloc::Allocator;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 2048)]
    tokens: usize,
    #[arg(long, default_value_t = 512)]
    hidden: usize,
    #[arg(long, default_value_t = 1024)]
    ffn: usize,
    #[arg(long, default_value_t = 8)]
    experts: usize,
    #[arg(long, default_value_t = 2)]
    top_k: usize,
    #[arg(long, default_value_t = 10)]
    iters: usize,
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Device: the CPU (Flex) or a GPU through wgpu (build with `--features wgpu`; a software
    /// Vulkan such as lavapipe runs it, but its numbers mean nothing).
    #[arg(long, value_enum, default_value_t = Backend::Flex)]
    backend: Backend,
    /// Print where the timed iterations' time goes: forward and backward, per fused operation with its
    /// GFLOP/s, and "other" (Burn's own ops and the autodiff graph).
    #[arg(long)]
    profile: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Flex,
    Wgpu,
}

fn plain_device(backend: Backend) -> Result<Device, String> {
    match backend {
        Backend::Flex => Ok(Device::flex()),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => Ok(Device::wgpu(Default::default())),
        #[allow(unreachable_patterns)]
        other => Err(format!("--backend {other:?} is not compiled in: rebuild with `--features wgpu`")),
    }
}

/// Reads one element back, so the time covers the queued work on asynchronous devices (wgpu), whose
/// `into_data` returns before the data is there.
fn wait(t: Tensor<2>) {
    let _ = t.slice([0..1, 0..1]).into_data().try_to_vec::<f32>();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    piper::alloc::keep_freed_pages();
    let a = Args::parse();
    if a.top_k == 0 || a.top_k > a.experts || a.tokens == 0 || a.hidden == 0 || a.ffn == 0 || a.iters == 0 {
        eprintln!("error: need tokens, hidden, ffn, iters ≥ 1 and 1 ≤ top-k ≤ experts");
        std::process::exit(2);
    }
    let plain = plain_device(a.backend).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let device = plain.clone().autodiff();
    device.seed(0);
    let block = MoeBlockConfig::new(RouterConfig::new(a.hidden, a.experts, a.top_k), a.ffn).init(&device);
    let x = Tensor::<3>::random([1, a.tokens, a.hidden], Distribution::Normal(0.0, 1.0), &device).require_grad();
    // Dense reference: [t·k, h] × [h, f] on the plain (non-autodiff) device, timed between the MoE
    // iterations so both see the same machine state (clock, other load).
    let lhs = Tensor::<2>::random([a.tokens * a.top_k, a.hidden], Distribution::Default, &plain);
    let rhs = Tensor::<2>::random([a.hidden, a.ffn], Distribution::Default, &plain);
    let (mut times, mut dense) = (Vec::new(), Vec::new());
    if a.profile {
        profile::enable();
    }
    for it in 0..a.iters + 2 {
        if it == 2 {
            profile::start_window();
        }
        let t = Instant::now();
        let (y, stats) = {
            let _phase = profile::phase("forward");
            let (y, stats) = block.forward(x.clone());
            wait(y.clone().reshape([a.tokens, a.hidden]));
            (y, stats)
        };
        {
            let _phase = profile::phase("backward");
            let grads = (y.sum() + stats.aux_loss * 0.01).backward();
            wait(x.grad(&grads).expect("input gradient").reshape([a.tokens, a.hidden]));
        }
        let moe = t.elapsed().as_secs_f64();
        let t0 = Instant::now();
        wait(lhs.clone().matmul(rhs.clone()));
        if it >= 2 {
            times.push(moe);
            dense.push(t0.elapsed().as_secs_f64());
        }
    }
    if a.profile {
        let table = profile::StepProfile::collect(times.len(), times.iter().sum()).table();
        eprintln!("{}", table.join("\n"));
    }
    let moe_s = median(times);
    let (t, h, f, e, k) = (a.tokens as f64, a.hidden as f64, a.ffn as f64, a.experts as f64, a.top_k as f64);
    let flops = 3.0 * (2.0 * t * k * 3.0 * h * f + 2.0 * t * h * e);
    let dense_s = median(dense);
    let dense_gflops = 2.0 * t * k * h * f / dense_s / 1e9;
    let gflops = flops / moe_s / 1e9;
    let doc = serde_json::json!({
        "tokens": a.tokens, "hidden": a.hidden, "ffn": a.ffn, "experts": a.experts, "top_k": a.top_k,
        "backend": format!("{:?}", a.backend).to_lowercase(), "median_s": moe_s, "gflops": gflops, "dense_gemm_gflops": dense_gflops,
        "ratio_to_dense": gflops / dense_gflops, "flops_per_iteration": flops,
    });
    println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
    if let Some(path) = a.json {
        piper::planner::atomic::write_atomic(&path, serde_json::to_string_pretty(&doc).expect("json").as_bytes())
            .unwrap_or_else(|e| {
                eprintln!("error: --json {}: {e}", path.display());
                std::process::exit(2);
            });
    }
}
