//! Calibrating a CPU platform: the runtime's compute costs per thread count of a rank and its memory,
//! fitted by least squares over whole runs (`piper calibrate` drives it, [`crate::calibrate`]).

use serde::{Deserialize, Serialize};

use super::nnls::{Row, least_squares, nnls};
use super::runtime::RuntimeCosts;
use super::spec::{GIB, Platform};
use super::step_costs::{StepRun, WorkClass, fit_step_costs};
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
/// count's from its own runs where it has them. The peak becomes per core; the top-level tables are
/// those of one thread; `ranks_per_node` ranks share the node's memory; the runtime trains in fp32.
/// Errors name what is missing or off.
pub fn with_runtime(
    base: Platform,
    cores: u64,
    ranks_per_node: u64,
    mut threads: Vec<ThreadCosts>,
    runs: &[(u64, MemoryPoint)],
) -> Result<Platform> {
    let src = "runtime calibration";
    if threads.first().is_none_or(|t| t.threads != 1) {
        return Err(Error::invalid(src, "threads", "needs the one-thread measurement first"));
    }
    let at = |t: u64| runs.iter().filter(|(threads, _)| *threads == t).map(|(_, p)| *p).collect::<Vec<_>>();
    let fit = fit_memory(&at(cores))?;
    for costs in threads.iter_mut().filter(|c| c.threads < cores) {
        let points = at(costs.threads);
        if points.is_empty() {
            continue;
        }
        let own = fit_memory(&points)?;
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
pub fn with_step_costs(mut platform: Platform, runs: &[ProfiledRun]) -> Result<Platform> {
    let cores = platform.cores_per_node.unwrap_or(1);
    for i in 0..platform.threads.len() {
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
        platform.threads[i].step = Some(fit_step_costs(&mine, &exchange)?);
    }
    platform.step_costs = platform.threads.first().and_then(|t| t.step);
    platform.validate()?;
    Ok(platform)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let costs = |threads: u64| ThreadCosts {
            threads,
            attention_efficiency: local.attention_efficiency.clone(),
            gemm_efficiency: local.gemm_efficiency.clone(),
            experts_efficiency: vec![],
            runtime: RuntimeCosts::distinct_for_tests(),
            step: None,
            framework_overhead_gib: None,
        };
        let runs_of = |threads: u64, base: f64, per_param: f64, act: f64| {
            SHAPES.iter().map(move |s| (threads, point(s, |p, a, l, n| base + per_param * p + n * (act * a + 1.5 * l))))
        };
        let runs: Vec<(u64, MemoryPoint)> = runs_of(2, 1.2e8, 21.0, 0.45).chain(runs_of(1, 6e7, 17.0, 0.4)).collect();
        let threads = vec![costs(1), costs(2)];
        let p = with_runtime(local.clone(), 2, 4, threads, &runs).unwrap();
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
    }
}
