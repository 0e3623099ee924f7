//! Calibrating a CPU platform: the runtime's compute costs per thread count of a rank and its memory,
//! fitted by least squares over whole runs (`piper calibrate` drives it, [`crate::calibrate`]).

use serde::{Deserialize, Serialize};

use super::nnls::{Row, least_squares, nnls};
use super::runtime::RuntimeCosts;
use super::spec::{GIB, Platform};
use super::step_costs::{StepCosts, StepRun, WorkClass, fit_step_costs};
use super::threads::{ThreadCosts, threads_per_rank};
use crate::class_work::class_work;
use crate::error::{Error, Result};
use crate::layout::{
    RUNTIME_DTYPE, RUNTIME_EXPERT_ACTIVATION_RECOMPUTED, RUNTIME_FLASH_ATTENTION, RUNTIME_SHARED_EXPERT_OVERLAP,
    TrainConfig,
};
use crate::limits;
use crate::model::ModelSpec;

/// One whole run for the memory fit: what the planner's model counts for one micro-batch (at 16
/// configured bytes per parameter and factors 1), how many micro-batches the schedule holds at the peak,
/// and the peak resident memory measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPoint {
    /// Parameters the rank holds.
    pub params: f64,
    /// The model's activation bytes of the decoder layers for one micro-batch.
    pub activation_bytes: f64,
    /// The model's bytes of the logits and cross-entropy for one micro-batch.
    pub logits_bytes: f64,
    /// Micro-batches whose activations are held at the peak (GPipe: all of the step's).
    #[serde(default = "one")]
    pub in_flight: f64,
    pub peak_rss_bytes: f64,
}

fn one() -> f64 {
    1.0
}

/// The fitted memory of a runtime: `peak = base + bytes_per_param · params + in_flight ·
/// (activation_factor · activations + logits_factor · logits) + activation_working_factor ·
/// activations + logits_working_factor · logits`, activations and logits those of one micro-batch. The
/// working terms are what a backward holds only while it runs (the gradients of one micro-batch's
/// activations, the cross-entropy's `T × V` temporaries), beside the micro-batches the schedule keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryFit {
    pub base_bytes: f64,
    pub bytes_per_param: f64,
    pub activation_factor: f64,
    pub logits_factor: f64,
    pub activation_working_factor: f64,
    pub logits_working_factor: f64,
}

impl MemoryFit {
    /// The peak this fit prices for the run `p`, bytes.
    pub fn peak_bytes(&self, p: &MemoryPoint) -> f64 {
        let (a, l) = (p.activation_bytes, p.logits_bytes);
        self.base_bytes
            + self.bytes_per_param * p.params
            + p.in_flight * (self.activation_factor * a + self.logits_factor * l)
            + self.activation_working_factor * a
            + self.logits_working_factor * l
    }

    /// This fit with its activation and logits factors split into a held and a working part in
    /// `like`'s proportions: for a fit whose runs all held one micro-batch at a time, so that each of its
    /// factors lumps the two. What autodiff keeps per micro-batch and what a backward holds while it
    /// runs are the same tensors whatever threads compute them, so a thread count measured one
    /// micro-batch at a time borrows the split from the runs that held several. Where `like` did not
    /// tell them apart either, its factors are unchanged.
    pub fn split_like(self, like: &MemoryFit) -> MemoryFit {
        let split = |lumped: f64, held: f64, working: f64| {
            if held + working > 0.0 {
                (lumped * held / (held + working), lumped * working / (held + working))
            } else {
                (lumped, 0.0)
            }
        };
        let (a, aw) = split(
            self.activation_factor + self.activation_working_factor,
            like.activation_factor,
            like.activation_working_factor,
        );
        let (l, lw) =
            split(self.logits_factor + self.logits_working_factor, like.logits_factor, like.logits_working_factor);
        MemoryFit {
            activation_factor: a,
            activation_working_factor: aw,
            logits_factor: l,
            logits_working_factor: lw,
            ..self
        }
    }
}

/// Whether some of the runs held several micro-batches at once (so that a fit over them tells what
/// each held micro-batch keeps from what a backward holds only while it runs).
fn held_several(points: &[MemoryPoint]) -> bool {
    points.iter().any(|p| p.in_flight > 1.0)
}

/// What the expert-parallel ranks of `runs` held beyond what `fit` prices for them (each point the
/// model's count of its largest rank, as an expert-parallel rank): the median excess, 0 when they held
/// less or none ran. A constant: across the calibration's expert-parallel runs the excess does not
/// follow the tokens exchanged (19–50 MiB for 0.5–6 MB of dispatch per step and layer, AMD EPYC Zen 4).
/// A NaN among the excesses gives NaN, which the platform's validation refuses.
pub fn expert_exchange_bytes(fit: &MemoryFit, runs: &[MemoryPoint]) -> f64 {
    let excess: Vec<f64> = runs.iter().map(|p| p.peak_rss_bytes - fit.peak_bytes(p)).collect();
    if excess.is_empty() {
        return 0.0;
    }
    crate::stats::median(&excess).map_or(f64::NAN, |m| m.max(0.0))
}

/// Non-negative least squares of the [`MemoryFit`] over the runs, on relative errors. Needs six runs,
/// whose parameters, activations and logits vary independently; the working terms are told apart
/// from the kept ones only by runs holding more than one micro-batch (without them they stay 0).
pub fn fit_memory(points: &[MemoryPoint]) -> Result<MemoryFit> {
    const N: usize = 6;
    let src = "memory calibration";
    if points.len() < N {
        return Err(Error::invalid(src, "runs", format!("needs at least {N} runs, got {}", points.len())));
    }
    // In GiB for conditioning.
    let g = GIB;
    let rows: Vec<Row> = points
        .iter()
        .map(|p| {
            let (a, l, n) = (p.activation_bytes / g, p.logits_bytes / g, p.in_flight);
            let units = vec![1.0, p.params / g, n * a, n * l, a, l];
            Row { units, y: p.peak_rss_bytes / g, weight: 1.0 / (p.peak_rss_bytes / g) }
        })
        .collect();
    let kept: Vec<Row> = rows.iter().map(|r| Row { units: r.units[..4].to_vec(), ..r.clone() }).collect();
    if least_squares(&kept).is_none() {
        return Err(Error::invalid(
            src,
            "runs",
            "do not vary parameters, activations and logits independently; add runs that change one of them",
        ));
    }
    let x = nnls(&rows).ok_or_else(|| Error::invalid(src, "runs", "are not finite; measure them again"))?;
    let kept_only = rows.iter().all(|r| r.units[2] == r.units[4]);
    // One micro-batch in flight everywhere: the kept and the working terms are one column each.
    let (a, l, aw, lw) = if kept_only { (x[2] + x[4], x[3] + x[5], 0.0, 0.0) } else { (x[2], x[3], x[4], x[5]) };
    Ok(MemoryFit {
        base_bytes: x[0] * g,
        bytes_per_param: x[1],
        activation_factor: a,
        logits_factor: l,
        activation_working_factor: aw,
        logits_working_factor: lw,
    })
}

/// A CPU platform from `base` (piper-comm's measurement of the links and memory, with `base.gpus_per_node`
/// ranks sharing `cores` cores), the runtime's compute costs per thread count (`threads`, from
/// `piper_burn::calibrate::measure_threads`) and the memory fitted from `runs` (each with the threads
/// of the rank that measured it): the top-level memory from the runs on every core, each other thread
/// count's from its own runs where it has them (split into held and working parts as the top level's
/// where its runs held one micro-batch at a time, [`MemoryFit::split_like`]), and each thread count's
/// expert-exchange overhead from
/// its expert-parallel runs (`exchange`, [`expert_exchange_bytes`]). The peak becomes per core; the
/// top-level tables are those of one thread; `ranks_per_node` ranks share the node's memory; the
/// runtime trains in fp32. Errors name what is missing or off.
pub fn with_runtime(
    base: Platform,
    cores: u64,
    ranks_per_node: u64,
    mut threads: Vec<ThreadCosts>,
    runs: &[(u64, MemoryPoint)],
    exchange: &[(u64, MemoryPoint)],
) -> Result<Platform> {
    let src = "runtime calibration";
    if threads.first().is_none_or(|t| t.threads != 1) {
        return Err(Error::invalid(src, "threads", "needs the one-thread measurement first"));
    }
    let of = |all: &[(u64, MemoryPoint)], t: u64| {
        all.iter().filter(|(threads, _)| *threads == t).map(|(_, p)| *p).collect::<Vec<_>>()
    };
    let fit = fit_memory(&of(runs, cores))?;
    for costs in threads.iter_mut().filter(|c| c.threads < cores) {
        let points = of(runs, costs.threads);
        let own = match points.is_empty() {
            true => None,
            false if held_several(&points) => Some(fit_memory(&points)?),
            false => Some(fit_memory(&points)?.split_like(&fit)),
        };
        if let Some(own) = own {
            costs.runtime = RuntimeCosts {
                bytes_per_param: own.bytes_per_param,
                activation_factor: own.activation_factor,
                logits_factor: own.logits_factor,
                activation_working_factor: own.activation_working_factor,
                logits_working_factor: own.logits_working_factor,
                ..costs.runtime
            };
            costs.framework_overhead_gib = Some(own.base_bytes / GIB);
        }
        costs.runtime.expert_exchange_bytes =
            expert_exchange_bytes(own.as_ref().unwrap_or(&fit), &of(exchange, costs.threads));
    }
    let one = &threads[0];
    let base_threads = threads_per_rank(cores, base.gpus_per_node) as f64;
    let node_memory_gib = base.gpu_memory_gib * base.gpus_per_node as f64;
    let mut platform = Platform {
        gpus_per_node: ranks_per_node,
        cores_per_node: Some(cores),
        gpu_memory_gib: node_memory_gib / ranks_per_node as f64,
        framework_overhead_gib: fit.base_bytes / GIB,
        peak_tflops: base.peak_tflops.iter().map(|(d, v)| (d.clone(), v / base_threads)).collect(),
        attention_efficiency: one.attention_efficiency.clone(),
        gemm_efficiency: one.gemm_efficiency.clone(),
        experts_efficiency: one.experts_efficiency.clone(),
        runtime: Some(RuntimeCosts {
            bytes_per_param: fit.bytes_per_param,
            activation_factor: fit.activation_factor,
            logits_factor: fit.logits_factor,
            activation_working_factor: fit.activation_working_factor,
            logits_working_factor: fit.logits_working_factor,
            ..one.runtime
        }),
        train_dtype: Some(RUNTIME_DTYPE.into()),
        flash_attention: Some(RUNTIME_FLASH_ATTENTION),
        expert_activation_recomputed: Some(RUNTIME_EXPERT_ACTIVATION_RECOMPUTED),
        shared_expert_overlap: Some(RUNTIME_SHARED_EXPERT_OVERLAP),
        refinement: None,
        ..base
    };
    platform.topology.gpu_to_nic = vec![0; ranks_per_node as usize];
    platform.threads = threads;
    platform.validate()?;
    Ok(platform)
}

/// What data-parallel runs on as many ranks as cores and on twice as many measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DataParallelRuns {
    /// Step time on twice as many ranks as cores ÷ the same run on as many (each rank then has half the
    /// work and half a core: 1 is a fair share, above 1 is what sharing loses).
    pub step_ratio: f64,
    /// The gradient reduction on as many ranks as cores ÷ a rank's forward + backward seconds.
    pub replica_sync: f64,
}

/// `platform` with the [`Platform::time_share`] exponent and the replicas' reduction share (for every
/// thread count) from data-parallel runs.
pub fn with_data_parallel(mut platform: Platform, runs: DataParallelRuns) -> Result<Platform> {
    let src = "data-parallel calibration";
    limits::number(src, "step_ratio", runs.step_ratio, 0.25, 8.0)?;
    limits::number(src, "replica_sync", runs.replica_sync, 0.0, 10.0)?;
    platform.time_share_exponent = Some((2.0 * runs.step_ratio).log2().clamp(0.5, 4.0));
    for t in &mut platform.threads {
        if let Some(step) = &mut t.step {
            step.replica_sync = runs.replica_sync;
        }
    }
    platform.step_costs = platform.threads.first().and_then(|t| t.step).or(platform.step_costs);
    platform.validate()?;
    Ok(platform)
}

/// One profiled calibration run of one rank holding the whole model: its thread count, model, training
/// settings and the seconds per step it booked per profile row (`phase`, `op`).
#[derive(Clone, Debug)]
pub struct ProfiledRun {
    pub threads: u64,
    /// Ranks of its expert group (1: one rank holds every expert).
    pub ep: u64,
    pub spec: ModelSpec,
    pub cfg: TrainConfig,
    pub rows: Vec<(String, String, f64)>,
    /// An expert-parallel run's paired fused run: forward + backward seconds per step (see
    /// [`StepRun::baseline_s`]).
    pub baseline_s: Option<f64>,
}

/// `platform` (a CPU platform with `threads` tables) with the step costs of each thread count fitted
/// from its profiled runs; the top-level ones are those of one thread. Every thread count needs runs.
///
/// A thread count above one is priced with its own efficiency tables or with the one-thread tables
/// (their shape dependence; the fitted factors then carry the threads' speed-up), whichever prices
/// its own profiled one-rank steps better ([`fit_error`]). Micro-benchmarks of single GEMMs on two
/// threads misjudge how the runtime's steps scale from shape to shape: on an AMD EPYC Zen 4 (2 vCPUs)
/// the fit on them priced the two-thread calibration runs' GEMM seconds 0.68–1.43× of what they took,
/// the fit on the one-thread tables 0.93–1.26×.
pub fn with_step_costs(mut platform: Platform, runs: &[ProfiledRun]) -> Result<Platform> {
    for i in 0..platform.threads.len() {
        let (own, own_error) = fit_thread_count(&platform, i, runs)?;
        platform.threads[i].step = Some(own);
        if i == 0 {
            continue;
        }
        let mut borrowed = platform.clone();
        let one = platform.threads[0].clone();
        let t = &mut borrowed.threads[i];
        (t.gemm_efficiency, t.experts_efficiency, t.attention_efficiency) =
            (one.gemm_efficiency, one.experts_efficiency, one.attention_efficiency);
        let (step, error) = fit_thread_count(&borrowed, i, runs)?;
        if error < own_error {
            borrowed.threads[i].step = Some(step);
            platform = borrowed;
        }
    }
    platform.step_costs = platform.threads.first().and_then(|t| t.step);
    platform.validate()?;
    Ok(platform)
}

/// The step costs of thread count `platform.threads[i]` fitted from its profiled runs on its tables,
/// and how well they price its one-rank runs ([`fit_error`]).
fn fit_thread_count(platform: &Platform, i: usize, runs: &[ProfiledRun]) -> Result<(StepCosts, f64)> {
    let cores = platform.cores_per_node.unwrap_or(1);
    let threads = platform.threads[i].threads;
    // The platform as a rank of `threads` threads sees it.
    let seen = platform.for_node_ranks(cores / threads).into_owned();
    let profiled = |ep_runs: bool| -> Result<Vec<StepRun>> {
        runs.iter()
            .filter(|r| r.threads == threads && (r.ep > 1) == ep_runs)
            .map(|r| {
                let measured =
                    r.rows.iter().filter_map(|(phase, op, s)| WorkClass::of(phase, op).map(|c| (c, *s))).collect();
                Ok(StepRun { work: class_work(&r.spec, &seen, &r.cfg, r.ep)?, measured, baseline_s: r.baseline_s })
            })
            .collect()
    };
    let (mine, exchange) = (profiled(false)?, profiled(true)?);
    if mine.is_empty() {
        return Err(Error::invalid(
            "step-cost calibration",
            "runs",
            format!("has no profiled one-rank run with {threads} threads; profile runs at every thread count"),
        ));
    }
    let costs = fit_step_costs(&mine, &exchange)?;
    Ok((costs, fit_error(&costs, &mine)))
}

/// Root mean square over `runs` and their GEMM-like classes (non-expert GEMMs, routed experts,
/// attention core) of log(priced ÷ booked) forward + backward seconds: how well `costs` price the
/// runs' shapes one by one. A class a run books nothing for is left out.
pub fn fit_error(costs: &StepCosts, runs: &[StepRun]) -> f64 {
    let gemm_like = [WorkClass::Linear, WorkClass::Experts, WorkClass::Attention];
    let mut logs = Vec::new();
    for r in runs {
        for (class, p) in costs.class_seconds(&r.work).into_iter().filter(|(c, _)| gemm_like.contains(c)) {
            let booked: f64 = r.measured.iter().filter(|(c, _)| *c == class).map(|(_, s)| s).sum();
            if booked > 0.0 && p > 0.0 {
                logs.push((p / booked).ln().powi(2));
            }
        }
    }
    if logs.is_empty() { f64::INFINITY } else { (logs.iter().sum::<f64>() / logs.len() as f64).sqrt() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::runtime_train_config;

    /// `local` as a 2-core CPU platform with one- and two-thread tables: the two-thread ones are the
    /// one-thread ones with GEMM table `i`'s efficiency scaled by `scale(i)` and attention point `j`'s by
    /// `scale(100 + j)`.
    fn two_thread_tables(scale: impl Fn(usize) -> f64) -> Platform {
        let mut p = crate::platform::preset("local").unwrap();
        p.gpus_per_node = 2;
        p.topology.gpu_to_nic = vec![0; 2];
        p.cores_per_node = Some(2);
        let rc = RuntimeCosts::distinct_for_tests();
        p.runtime = Some(rc);
        let one = ThreadCosts {
            threads: 1,
            attention_efficiency: p.attention_efficiency.clone(),
            gemm_efficiency: p.gemm_efficiency.clone(),
            experts_efficiency: vec![],
            runtime: rc,
            step: None,
            framework_overhead_gib: None,
        };
        let scaled = |tables: &[crate::platform::GemmTable], from: usize| {
            let mut t = tables.to_vec();
            for (i, table) in t.iter_mut().enumerate() {
                table.points.iter_mut().for_each(|p| p[1] = (p[1] * scale(from + i)).min(1.0));
            }
            t
        };
        let attention =
            one.attention_efficiency.iter().enumerate().map(|(i, p)| [p[0], p[1] * scale(100 + i)]).collect();
        let two = ThreadCosts {
            threads: 2,
            attention_efficiency: attention,
            gemm_efficiency: scaled(&one.gemm_efficiency, 0),
            ..one.clone()
        };
        p.threads = vec![one, two];
        p.validate().unwrap();
        p
    }

    /// Profiled one-rank runs of several models and shapes at each thread count of `truth`, booking per
    /// class what known step costs give on `truth`'s tables.
    fn runs_on(truth: &Platform) -> Vec<ProfiledRun> {
        let mut runs = Vec::new();
        for t in &truth.threads {
            let seen = truth.for_node_ranks(2 / t.threads).into_owned();
            for (model, batch, seq) in [
                ("tiny", 8, 63),
                ("tiny", 32, 127),
                ("tiny-qwen3", 8, 255),
                ("tiny-deepseek", 16, 127),
                ("tiny-qwen3", 4, 31),
            ] {
                let spec = crate::model::resolve_model(model).unwrap();
                let cfg = runtime_train_config(
                    seq,
                    batch,
                    1,
                    crate::layout::Schedule::OneFOneB,
                    crate::layout::Recompute::None,
                );
                let w = class_work(&spec, &seen, &cfg, 1).unwrap();
                let row = |phase: &str, op: &str, s: f64| (phase.to_string(), op.to_string(), s);
                let rows = vec![
                    row("forward", "linear", 1.3 * w.linear_table_s + 4e-5 * w.layers),
                    row("forward", "routed experts", 0.8 * w.experts_table_s + 2e-5 * w.layers),
                    row("forward", "attention", 1.1 * w.attention_table_s),
                    row(
                        "forward",
                        "rms norm",
                        1e-9 * (4.0 * w.layer_token_dims + 6.0 * w.routed_token_experts) + 9e-5 * w.layers,
                    ),
                    row("forward", "cross-entropy", 9e-9 * w.vocab_tokens),
                    row("optimizer", "adamw", 3e-9 * w.params + 2e-5 * w.layers),
                ];
                runs.push(ProfiledRun { threads: t.threads, ep: 1, spec, cfg, rows, baseline_s: None });
            }
        }
        runs
    }

    /// Two-thread tables that misjudge shape against shape give way to the one-thread tables when
    /// those price the two-thread runs; two-thread tables that price them are kept.
    #[test]
    fn a_thread_count_keeps_the_tables_that_price_its_runs() {
        let wrong = |i: usize| [0.6, 1.5, 0.8, 1.3, 0.7, 1.4][i % 6];
        let measured = two_thread_tables(wrong);
        let shaped_like_one = two_thread_tables(|_| 1.0);
        let fitted = with_step_costs(measured.clone(), &runs_on(&shaped_like_one)).unwrap();
        assert_eq!(fitted.threads[1].gemm_efficiency, fitted.threads[0].gemm_efficiency);
        assert_eq!(fitted.threads[1].attention_efficiency, fitted.threads[0].attention_efficiency);
        let kept = with_step_costs(measured.clone(), &runs_on(&measured)).unwrap();
        assert_eq!(kept.threads[1].gemm_efficiency, measured.threads[1].gemm_efficiency);
        let step = kept.threads[1].step.unwrap();
        assert!((step.linear / 1.3 - 1.0).abs() < 1e-6, "its own tables price its runs: {step:?}");
    }

    /// Parameters, activations and logits of one micro-batch, and micro-batches held, varied apart.
    const SHAPES: [(f64, f64, f64, f64); 8] = [
        (1e6, 1e7, 2e7, 1.0),
        (1e6, 4e7, 2e7, 1.0),
        (5e6, 1e7, 2e7, 1.0),
        (3e6, 2.5e7, 6e7, 1.0),
        (2e6, 3e7, 1e7, 1.0),
        (4e6, 2e7, 5e7, 1.0),
        (1e6, 1e7, 2e7, 4.0),
        (2e6, 3e7, 1e7, 2.0),
    ];

    fn point(&(p, a, l, n): &(f64, f64, f64, f64), peak: impl Fn(f64, f64, f64, f64) -> f64) -> MemoryPoint {
        MemoryPoint { params: p, activation_bytes: a, logits_bytes: l, in_flight: n, peak_rss_bytes: peak(p, a, l, n) }
    }

    #[test]
    fn fit_recovers_known_coefficients() {
        let truth = |p: f64, a: f64, l: f64, n: f64| 5e7 + 28.0 * p + n * (0.7 * a + 3.2 * l) + 0.2 * a + 1.1 * l;
        let points: Vec<MemoryPoint> = SHAPES.iter().map(|s| point(s, truth)).collect();
        let f = fit_memory(&points).unwrap();
        let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-9;
        assert!(close(f.base_bytes, 5e7) && close(f.bytes_per_param, 28.0), "{f:?}");
        assert!(close(f.activation_factor, 0.7) && close(f.logits_factor, 3.2), "{f:?}");
        assert!(close(f.activation_working_factor, 0.2) && close(f.logits_working_factor, 1.1), "{f:?}");
        // One micro-batch at a time everywhere: held and working cannot be told apart, and add up.
        let one_at_a_time: Vec<MemoryPoint> = points.iter().map(|p| MemoryPoint { in_flight: 1.0, ..*p }).collect();
        let single = |p: f64, a: f64, l: f64, _: f64| 5e7 + 28.0 * p + 0.9 * a + 4.3 * l;
        let one_at_a_time: Vec<MemoryPoint> = one_at_a_time
            .iter()
            .map(|q| MemoryPoint { peak_rss_bytes: single(q.params, q.activation_bytes, q.logits_bytes, 1.0), ..*q })
            .collect();
        let f = fit_memory(&one_at_a_time).unwrap();
        assert!(close(f.activation_factor, 0.9) && close(f.logits_factor, 4.3), "{f:?}");
        assert_eq!((f.activation_working_factor, f.logits_working_factor), (0.0, 0.0));
        let same = vec![points[0]; 6];
        assert!(fit_memory(&same).unwrap_err().to_string().contains("independently"));
        assert!(fit_memory(&points[..5]).is_err());
    }

    /// A thread count's costs with `local`'s tables and distinct runtime costs, nothing fitted yet.
    fn thread_costs(local: &Platform, threads: u64) -> ThreadCosts {
        ThreadCosts {
            threads,
            attention_efficiency: local.attention_efficiency.clone(),
            gemm_efficiency: local.gemm_efficiency.clone(),
            experts_efficiency: vec![],
            runtime: RuntimeCosts::distinct_for_tests(),
            step: None,
            framework_overhead_gib: None,
        }
    }

    /// A thread count whose runs held one micro-batch at a time keeps what its runs measured (the sum
    /// of the held and the working part) and takes the split from the runs on every core, which held
    /// several: without it, a schedule holding four micro-batches is priced as four whole backwards.
    #[test]
    fn a_thread_count_measured_one_micro_batch_at_a_time_borrows_the_split() {
        let local = crate::platform::preset("local").unwrap();
        let costs = |threads: u64| thread_costs(&local, threads);
        // Every core: held 0.5 and working 0.5 of the activations, 1.5 and 0.5 of the logits.
        let every_core =
            |p: f64, a: f64, l: f64, n: f64| 1.2e8 + 21.0 * p + n * (0.5 * a + 1.5 * l) + 0.5 * a + 0.5 * l;
        // One thread: the same tensors, 20% more of each, measured one micro-batch at a time only.
        let one_thread =
            |p: f64, a: f64, l: f64, n: f64| 6e7 + 17.0 * p + 1.2 * (n * (0.5 * a + 1.5 * l) + 0.5 * a + 0.5 * l);
        let runs: Vec<(u64, MemoryPoint)> = SHAPES
            .iter()
            .map(|s| (2, point(s, every_core)))
            .chain(SHAPES.iter().map(|s| (1, point(&(s.0, s.1, s.2, 1.0), one_thread))))
            .collect();
        let p = with_runtime(local.clone(), 2, 4, vec![costs(1), costs(2)], &runs, &[]).unwrap();
        let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-9;
        let r = p.threads[0].runtime;
        assert!(close(r.bytes_per_param, 17.0), "{r:?}");
        assert!(close(r.activation_factor, 0.6) && close(r.activation_working_factor, 0.6), "{r:?}");
        assert!(close(r.logits_factor, 1.8) && close(r.logits_working_factor, 0.6), "{r:?}");
        // Four micro-batches held on one thread: the truth, not four lumped factors.
        let held4 = point(&(2e6, 3e7, 1e7, 4.0), one_thread);
        let fit = MemoryFit {
            base_bytes: p.threads[0].framework_overhead_gib.unwrap() * GIB,
            bytes_per_param: r.bytes_per_param,
            activation_factor: r.activation_factor,
            logits_factor: r.logits_factor,
            activation_working_factor: r.activation_working_factor,
            logits_working_factor: r.logits_working_factor,
        };
        assert!(close(fit.peak_bytes(&held4), held4.peak_rss_bytes), "{fit:?}");
    }

    /// A measurement below what the rest implies cannot drive a coefficient negative: the fit keeps
    /// every coefficient ≥ 0.
    #[test]
    fn fit_coefficients_are_never_negative() {
        let truth = |p: f64, a: f64, l: f64, n: f64| 5e7 + 28.0 * p + n * (0.7 * a + 3.2 * l);
        let mut points: Vec<MemoryPoint> = SHAPES.iter().map(|s| point(s, truth)).collect();
        points[6].peak_rss_bytes *= 0.8;
        let f = fit_memory(&points).unwrap();
        let all = [f.base_bytes, f.bytes_per_param, f.activation_factor, f.logits_factor];
        assert!(all.iter().chain(&[f.activation_working_factor, f.logits_working_factor]).all(|c| *c >= 0.0), "{f:?}");
    }

    /// Memory runs at each thread count give that count its own fit: the top level from the runs on
    /// every core, one thread's from its runs, and a rank of one thread is priced with it.
    #[test]
    fn each_thread_count_gets_the_memory_of_its_runs() {
        let local = crate::platform::preset("local").unwrap();
        let costs = |threads: u64| thread_costs(&local, threads);
        let runs_of = |threads: u64, base: f64, per_param: f64, act: f64| {
            SHAPES.iter().map(move |s| (threads, point(s, |p, a, l, n| base + per_param * p + n * (act * a + 1.5 * l))))
        };
        let runs: Vec<(u64, MemoryPoint)> = runs_of(2, 1.2e8, 21.0, 0.45).chain(runs_of(1, 6e7, 17.0, 0.4)).collect();
        let threads = vec![costs(1), costs(2)];
        let p = with_runtime(local.clone(), 2, 4, threads, &runs, &[]).unwrap();
        let close = |x: f64, y: f64| (x / y - 1.0).abs() < 1e-9;
        assert!(close(p.overhead_bytes(), 1.2e8) && close(p.runtime.unwrap().bytes_per_param, 21.0));
        assert!(close(p.threads[0].framework_overhead_gib.unwrap() * GIB, 6e7), "{:?}", p.threads[0]);
        assert!(
            close(p.threads[0].runtime.bytes_per_param, 17.0) && close(p.threads[0].runtime.activation_factor, 0.4)
        );
        assert_eq!(p.threads[1].framework_overhead_gib, None, "every core: the top level");
        let one_thread = p.for_node_ranks(4);
        assert!(close(one_thread.overhead_bytes(), 6e7) && close(one_thread.runtime.unwrap().bytes_per_param, 17.0));
        let two_threads = p.for_node_ranks(1);
        assert!(close(two_threads.overhead_bytes(), 1.2e8));

        // Expert-parallel ranks of one thread that hold 30 MB more than that thread count's fit prices
        // (one 5 MB less, one 40 MB more: the median, not the mean): 30 MB, for one thread only.
        let excess = [3e7, 3e7, -5e6, 3e7, 4e7];
        let exchange: Vec<(u64, MemoryPoint)> = SHAPES
            .iter()
            .zip(excess)
            .map(|(s, extra)| (1, point(s, |p, a, l, n| 6e7 + 17.0 * p + n * (0.4 * a + 1.5 * l) + extra)))
            .collect();
        let threads = vec![costs(1), costs(2)];
        let p = with_runtime(local.clone(), 2, 4, threads, &runs, &exchange).unwrap();
        assert!(close(p.threads[0].runtime.expert_exchange_bytes, 3e7), "{:?}", p.threads[0].runtime);
        assert_eq!(p.threads[1].runtime.expert_exchange_bytes, 0.0, "no expert-parallel runs on every core");
        assert!(close(p.for_node_ranks(4).runtime.unwrap().expert_exchange_bytes, 3e7));
    }
}
