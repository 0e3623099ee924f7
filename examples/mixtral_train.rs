//! Train a small Mixtral-style MoE language model and watch it learn.
//!
//! `cargo run --release --example mixtral_train` trains the `tiny` preset on a seeded synthetic grammar
//! whose entropy rate is known, so the best possible loss is printed beside the achieved one. `--data
//! FILE` trains on any UTF-8 text instead (byte-level tokens). `--metrics FILE.jsonl` writes one JSON
//! line per step. Same seed → same losses.
//!
//! Multi-rank (built with `--features mpi`): `mpirun -np 4 target/release/examples/mixtral_train --ep 2
//! --dp 2` shards the experts over expert groups of 2 and splits the batch over 4 ranks; the loss curve
//! equals the one-process run's.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use piper::comm::Topology;
use piper::comm::alltoall::Algo;
use piper::comm::launch::init_world;
use piper::models::{lm_config, resolve_model};
use piper::modules::corpus::{Corpus, Grammar, TextBytes};
use piper::modules::parallel::pipeline::{PipelineLayout, train_pipelined};
use piper::modules::parallel::train::{Layout, train_parallel};
use piper::modules::train::{TrainConfig, measure_peak_flops};
use piper::planner::layout::Schedule;
use piper::planner::model::{active_params, param_breakdown, training_flops_per_token};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Flex,
    Ndarray,
    Wgpu,
    Rocm,
}

/// mimalloc keeps freed pages for reuse; glibc's malloc hands the large activation buffers back to the
/// kernel and faults them in again every step (measured: ~15% of an MoE layer's time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Train an MoE language model on one process.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Model: tiny (Mixtral-style), tiny-qwen3, tiny-deepseek, or any planner preset / config.json
    /// with GQA attention and SwiGLU experts.
    #[arg(long, default_value = "tiny")]
    preset: String,
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Weight of the load-balancing loss.
    #[arg(long, default_value_t = 0.01)]
    aux_loss_coef: f64,
    /// Train on this UTF-8 text file (byte-level) instead of the synthetic grammar.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Symbols and branching of the synthetic grammar.
    #[arg(long, default_value_t = 48)]
    grammar_alphabet: usize,
    #[arg(long, default_value_t = 3)]
    grammar_branching: usize,
    /// Write one JSON line per step here.
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Print expert load (max/mean per MoE layer) every N steps.
    #[arg(long, default_value_t = 50)]
    log_every: usize,
    #[arg(long, value_enum, default_value_t = Backend::Flex)]
    backend: Backend,
    /// No progress bar (plain lines).
    #[arg(long)]
    no_progress: bool,
    /// Expert-parallel ranks per expert group (multi-rank runs).
    #[arg(long, default_value_t = 1)]
    ep: usize,
    /// Data-parallel replicas (multi-rank runs; EP·DP must equal the ranks).
    #[arg(long, default_value_t = 1)]
    dp: usize,
    /// Pipeline stages (PP·EP·DP must equal the ranks).
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Micro-batches per step (pipelined runs).
    #[arg(long, default_value_t = 1)]
    micro_batches: usize,
    /// Pipeline schedule.
    #[arg(long, value_enum, default_value_t = ScheduleArg::OneFOneB)]
    schedule: ScheduleArg,
    /// `auto`: ask the planner for the layout of the ranks this job has (overrides --ep/--dp).
    #[arg(long)]
    plan: Option<String>,
    /// Platform the planner uses with --plan auto: `local` (this machine; calibrated if
    /// `piper-comm calibrate` ran) or a TOML file.
    #[arg(long, default_value = "local")]
    platform: String,
    /// Expert all-to-all algorithm.
    #[arg(long = "all-to-all", value_enum, default_value_t = AlgoArg::Flat)]
    all_to_all: AlgoArg,
    /// Clip each parameter's gradient to this norm (0: off).
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f64,
    /// Debug: start every router at zero, so all tokens tie and pick the lowest-numbered experts (the
    /// other experts, and in expert-parallel runs whole ranks, get no tokens at first).
    #[arg(long)]
    zero_router: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ScheduleArg {
    Gpipe,
    #[value(name = "1f1b")]
    OneFOneB,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AlgoArg {
    Flat,
    Pairwise,
    Halo,
}

fn device(backend: Backend) -> Result<burn::tensor::Device, String> {
    match backend {
        Backend::Flex => Ok(burn::tensor::Device::flex()),
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        Backend::Ndarray => Ok(burn::tensor::Device::ndarray()),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => Ok(burn::tensor::Device::wgpu(Default::default())),
        #[cfg(feature = "rocm")]
        Backend::Rocm => Ok(burn::tensor::Device::rocm(0usize)),
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "--backend {other:?} is not compiled in: rebuild with `--features {}`",
            format!("{other:?}").to_lowercase()
        )),
    }
}

fn run(mut a: Args, world: &piper::comm::launch::World) -> Result<(), String> {
    let planned = match a.plan.as_deref() {
        None => None,
        Some("auto") => Some(plan_layout(&a, world.comm.size())?),
        Some(other) => return Err(format!("--plan `{other}`: only `auto` is supported")),
    };
    if let Some(p) = &planned {
        a.pp = p.pp as usize;
        a.ep = p.ep as usize;
        a.dp = p.dp as usize;
        a.micro_batches = p.num_micro_batches as usize;
        a.schedule = match p.schedule {
            Schedule::GPipe => ScheduleArg::Gpipe,
            Schedule::OneFOneB => ScheduleArg::OneFOneB,
        };
        a.all_to_all = match p.all_to_all {
            piper::planner::comm::A2aAlgo::Flat => AlgoArg::Flat,
            piper::planner::comm::A2aAlgo::Halo => AlgoArg::Halo,
        };
    }
    if a.pp == 0 || a.ep == 0 || a.dp == 0 || a.micro_batches == 0 {
        return Err("--pp, --ep, --dp and --micro-batches must be ≥ 1".into());
    }
    let comm = world.comm.as_ref();
    let ranks = a.pp * a.ep * a.dp;
    if comm.size() != ranks {
        return Err(format!(
            "--pp {} × --ep {} × --dp {} = {ranks} ranks, but the job has {}; launch with mpirun -np {ranks}",
            a.pp,
            a.ep,
            a.dp,
            comm.size()
        ));
    }
    let lead = comm.rank() == 0;
    let topo = Topology::detect(comm).map_err(|e| e.to_string())?;
    let spec = resolve_model(&a.preset).map_err(|e| e.to_string())?;
    let mut model_config = lm_config(&spec).map_err(|e| e.to_string())?;
    model_config.aux_loss_coef = a.aux_loss_coef;
    model_config.zero_router = a.zero_router;
    if a.grammar_alphabet < 2 || a.grammar_alphabet > spec.vocab_size as usize {
        return Err(format!("--grammar-alphabet must be in 2..={} (the model's vocabulary)", spec.vocab_size));
    }
    if a.grammar_branching == 0 || a.grammar_branching > a.grammar_alphabet {
        return Err(format!("--grammar-branching must be in 1..={}", a.grammar_alphabet));
    }
    let mut corpus: Box<dyn Corpus> = match &a.data {
        Some(path) => Box::new(TextBytes::from_file(path, a.seed)?),
        None => Box::new(Grammar::new(a.grammar_alphabet, a.grammar_branching, a.seed)),
    };
    let dev = device(a.backend)?;
    let c = TrainConfig::new()
        .with_steps(a.steps)
        .with_batch_size(a.batch_size)
        .with_seq_len(a.seq_len)
        .with_lr(a.lr)
        .with_warmup_steps(a.warmup.min(a.steps))
        .with_grad_clip(a.grad_clip)
        .with_seed(a.seed);
    let flops_per_token = training_flops_per_token(&spec, (a.seq_len - 1) as u64).total();
    let peak = measure_peak_flops(&dev);
    let total = param_breakdown(&spec).total();
    macro_rules! say { ($($t:tt)*) => { if lead { println!($($t)*) } } }
    say!(
        "model {}: {} layers, d={}, {} params ({} active per token), {:.2} MFLOP/token (train, Megatron convention)",
        spec.name,
        spec.num_layers,
        spec.hidden_size,
        total,
        active_params(&spec),
        flops_per_token / 1e6
    );
    say!("data: {}", corpus.describe());
    say!("backend {:?}; measured peak (f32 GEMM 1024³) {:.1} GFLOP/s — MFU is relative to it", a.backend, peak / 1e9);
    if comm.size() > 1 {
        say!(
            "{} ranks on {} node(s): PP={} × EP={} × DP={}, {:?} all-to-all, {} micro-batches ({:?}); global batch {}",
            comm.size(),
            topo.num_nodes(),
            a.pp,
            a.ep,
            a.dp,
            a.all_to_all,
            a.micro_batches,
            a.schedule,
            a.batch_size
        );
    }
    let fault = Fault::from_env(comm.rank());
    let mut metrics_file = match a.metrics.as_ref().filter(|_| lead) {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| format!("--metrics {}: {e}", p.display()))?),
        None => None,
    };
    let bar = if a.no_progress || !lead { ProgressBar::hidden() } else { ProgressBar::new(a.steps as u64) };
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("template"));
    let mut write_error = None;
    let algo = match a.all_to_all {
        AlgoArg::Flat => Algo::Flat,
        AlgoArg::Pairwise => Algo::Pairwise,
        AlgoArg::Halo => Algo::Halo,
    };
    let mut on_step = |m: &piper::modules::train::StepMetrics| {
        fault.maybe_trigger(m.step);
        bar.inc(1);
        bar.set_message(format!(
            "loss {:.4} | {:.0} tok/s | {:.2} GFLOP/s | MFU {:.1}%",
            m.loss,
            m.tokens_per_s,
            m.flops_per_s / 1e9,
            100.0 * m.mfu
        ));
        if let Some(f) = metrics_file.as_mut()
            && let Err(e) = writeln!(f, "{}", serde_json::to_string(m).expect("metrics serialise"))
        {
            write_error.get_or_insert(e.to_string());
        }
        if lead && a.log_every > 0 && (m.step.is_multiple_of(a.log_every) || m.step + 1 == a.steps) {
            let load: Vec<String> = m.expert_load.iter().map(|x| format!("{x:.2}")).collect();
            let line = format!(
                "step {:>5}  loss {:.4}  lr {:.2e}  {:.0} tok/s  expert load max/mean per layer [{}]",
                m.step,
                m.loss,
                m.lr,
                m.tokens_per_s,
                load.join(", ")
            );
            if a.no_progress { println!("{line}") } else { bar.println(line) }
        }
    };
    let all = if a.pp == 1 && a.micro_batches == 1 {
        train_parallel(
            &model_config,
            corpus.as_mut(),
            &c,
            comm,
            &topo,
            Layout { ep: a.ep, dp: a.dp },
            algo,
            &dev,
            flops_per_token,
            peak,
            &mut on_step,
        )?
        .1
    } else {
        let layout = PipelineLayout {
            pp: a.pp,
            ep: a.ep,
            dp: a.dp,
            micro_batches: a.micro_batches,
            schedule: match a.schedule {
                ScheduleArg::Gpipe => Schedule::GPipe,
                ScheduleArg::OneFOneB => Schedule::OneFOneB,
            },
            split: planned.as_ref().map(|p| p.split.iter().map(|x| *x as usize).collect()),
        };
        train_pipelined(
            &model_config,
            corpus.as_mut(),
            &c,
            comm,
            &topo,
            &layout,
            algo,
            &dev,
            flops_per_token,
            peak,
            &mut on_step,
        )?
    };
    bar.finish_and_clear();
    if let Some(e) = write_error {
        return Err(format!("--metrics: {e}"));
    }
    if let Some(p) = &planned {
        // Skip the first steps (allocation, warm-up) when measuring.
        let steady = &all[all.len().min(3).min(all.len() - 1)..];
        let step_s = steady.iter().map(|m| m.step_time_s).sum::<f64>() / steady.len() as f64;
        let tps = steady.iter().map(|m| m.tokens_per_s).sum::<f64>() / steady.len() as f64;
        let err = |measured: f64, predicted: f64| 100.0 * (predicted - measured) / measured;
        let rss_gib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| t.lines().find(|l| l.starts_with("VmHWM"))?.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map(|kib| kib / (1024.0 * 1024.0));
        if let Some(rss) = rss_gib {
            say!(
                "memory per rank: {:.3} GiB predicted (incl. the platform's framework overhead), {:.3} GiB peak RSS measured on rank 0 ({:+.0}%)",
                p.peak_memory_bytes / (1u64 << 30) as f64,
                rss,
                err(rss, p.peak_memory_bytes / (1u64 << 30) as f64)
            );
        }
        let platform_mfu = |tps: f64| tps * flops_per_token / (comm.size() as f64 * p.tflops_per_gpu * 1e12 / p.mfu);
        say!(
            "MFU against the platform's peak: {:.1}% predicted, {:.1}% measured",
            100.0 * p.mfu,
            100.0 * platform_mfu(tps)
        );
        if let Some(b) = steady.iter().map(|m| m.bubble).sum::<Option<f64>>() {
            say!(
                "pipeline bubble: {:.1}% predicted, {:.1}% measured",
                100.0 * p.bubble_fraction,
                100.0 * b / steady.len() as f64
            );
        }
        say!(
            "plan vs measured: step {:.2} ms predicted, {:.2} ms measured ({:+.0}%); {:.0} tokens/s predicted, {:.0} measured ({:+.0}%)",
            p.step_time_s * 1e3,
            step_s * 1e3,
            err(step_s, p.step_time_s),
            p.tokens_per_s,
            tps,
            err(tps, p.tokens_per_s)
        );
    }
    let tail = &all[all.len().saturating_sub(10)..];
    let final_loss = tail.iter().map(|m| m.loss).sum::<f64>() / tail.len() as f64;
    let mean_tps = all.iter().map(|m| m.tokens_per_s).sum::<f64>() / all.len() as f64;
    let mean_mfu = all.iter().map(|m| m.mfu).sum::<f64>() / all.len() as f64;
    let best =
        corpus.best_loss().map_or(String::new(), |b| format!(", best possible {b:.4} (gap {:.4})", final_loss - b));
    say!("first loss {:.4}, final loss (mean of last {}) {:.4}{best}", all[0].loss, tail.len(), final_loss);
    say!("mean {:.0} tokens/s, MFU {:.1}% of the measured peak × ranks", mean_tps, 100.0 * mean_mfu);
    Ok(())
}

/// The planner's best layout for `ranks` ranks that the runtime executes: any PP × EP × DP, micro-batch
/// count and schedule, the plan's stage split, f32, no recomputation (not implemented in the runtime).
fn plan_layout(a: &Args, ranks: usize) -> Result<piper::planner::planner::PlanCandidate, String> {
    use piper::planner::layout::{Recompute, Schedule};
    use piper::planner::planner::{EpDomain, PlanRequest, plan};
    let spec = resolve_model(&a.preset).map_err(|e| e.to_string())?;
    let platform = piper::planner::platform::resolve_platform(&a.platform).map_err(|e| e.to_string())?;
    let mut req = PlanRequest::new(ranks as u64, a.batch_size as u64, (a.seq_len - 1) as u64);
    req.base.dtype = "fp32".into();
    req.schedules = vec![Schedule::OneFOneB, Schedule::GPipe];
    req.recomputes = vec![Recompute::None];
    req.ep_domain = EpDomain::Any;
    req.micro_batch_sizes = (1..=a.batch_size as u64).collect();
    req.top = usize::MAX;
    let report = plan(&spec, &platform, &req).map_err(|e| e.to_string())?;
    let best = report.plans.into_iter().next().ok_or_else(|| {
        let reasons: Vec<String> = report.rejected.iter().map(|r| r.reason.clone()).collect();
        format!("--plan auto: no executable layout for {ranks} ranks ({})", reasons.join("; "))
    })?;
    if ranks == 1 || std::env::var("OMPI_COMM_WORLD_RANK").map_or(true, |r| r == "0") {
        println!(
            "plan ({} platform): PP={} × EP={} × DP={}, {} micro-batches ({}), split {:?}, {} all-to-all; predicted step {:.2} ms, {:.0} tokens/s, bubble {:.1}%, peak memory {:.2} GiB, MFU {:.1}%",
            platform.name,
            best.pp,
            best.ep,
            best.dp,
            best.num_micro_batches,
            best.schedule.name(),
            best.split,
            best.all_to_all.name(),
            best.step_time_s * 1e3,
            best.tokens_per_s,
            100.0 * best.bubble_fraction,
            best.peak_memory_bytes / (1u64 << 30) as f64,
            100.0 * best.mfu
        );
    }
    Ok(best)
}

/// Fault injection for the failure tests: `PIPER_FAULT_RANK=r PIPER_FAULT_STEP=s PIPER_FAULT=exit|hang`
/// makes rank r exit (or stop answering) after step s.
struct Fault {
    step: Option<usize>,
    hang: bool,
}

impl Fault {
    fn from_env(rank: usize) -> Self {
        let mine = std::env::var("PIPER_FAULT_RANK").ok().and_then(|r| r.parse::<usize>().ok()) == Some(rank);
        let step = std::env::var("PIPER_FAULT_STEP").ok().and_then(|s| s.parse::<usize>().ok()).filter(|_| mine);
        Fault { step, hang: std::env::var("PIPER_FAULT").is_ok_and(|v| v == "hang") }
    }

    fn maybe_trigger(&self, step: usize) {
        if self.step == Some(step) {
            if self.hang {
                eprintln!("fault injection: this rank stops answering after step {step}");
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
            eprintln!("fault injection: this rank exits after step {step}");
            std::process::exit(17);
        }
    }
}

fn main() {
    let args = Args::parse();
    // A failed collective panics inside the autodiff graph with a message naming the operation, group
    // and missing ranks: print it and leave at once — unwinding would reach MPI_Finalize, which waits
    // for the missing rank.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        eprintln!("error: {}", msg.unwrap_or_else(|| info.to_string()));
        std::process::exit(3);
    }));
    let world = match init_world() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args, &world) {
        eprintln!("error: {e}");
        // Leave without finalising MPI: the other ranks may be gone or stuck.
        std::process::exit(2);
    }
}
