//! A CPU rank is the threads it gets. On a CPU platform the ranks a launcher places on one node share its
//! cores: the runtime gives each rank's thread pool `cores ÷ local ranks` threads (at least one), so a
//! rank's speed depends on how many ranks share the node, not on the platform. A CPU platform therefore
//! carries one set of compute costs per thread count ([`ThreadCosts`]), each measured with every core
//! busy — `cores ÷ threads` copies of the measurement at once, as that many ranks would run — and
//! [`Platform::for_node_ranks`] resolves the set a layout's ranks get. One calibration serves every rank
//! count. More ranks than cores time-share the cores (the time model's `time_share`).

use std::borrow::Cow;

use super::runtime::RuntimeCosts;
use super::spec::{GemmTable, Platform, check_curve, check_experts_grid};
pub use super::tables::ThreadCosts;
use crate::error::{Error, Result};
use crate::limits;

/// Threads the runtime gives each of `ranks` ranks on a node of `cores` cores (as
/// `piper_comm::launch::threads_per_rank`).
pub fn threads_per_rank(cores: u64, ranks: u64) -> u64 {
    (cores / ranks.max(1)).max(1)
}

impl Platform {
    /// This platform as one of `ranks` ranks on a node sees it: on a CPU platform (one with `threads`
    /// tables) the peak and the compute costs of the thread count each rank gets; otherwise itself.
    pub fn for_node_ranks(&self, ranks: u64) -> Cow<'_, Platform> {
        let Some(cores) = self.cores_per_node.filter(|_| !self.threads.is_empty()) else {
            return Cow::Borrowed(self);
        };
        let want = threads_per_rank(cores, ranks);
        let costs =
            self.threads.iter().filter(|t| t.threads <= want).max_by_key(|t| t.threads).unwrap_or(&self.threads[0]);
        let mut p = self.clone();
        for peak in p.peak_tflops.values_mut() {
            *peak *= costs.threads as f64;
        }
        p.attention_efficiency = costs.attention_efficiency.clone();
        p.gemm_efficiency = costs.gemm_efficiency.clone();
        p.experts_efficiency = costs.experts_efficiency.clone();
        p.step_costs = costs.step.or(self.step_costs);
        // The memory measured at this thread count, else the platform's (measured on every core).
        p.runtime = Some(match (costs.framework_overhead_gib, self.runtime) {
            (None, Some(memory)) => RuntimeCosts {
                bytes_per_param: memory.bytes_per_param,
                activation_factor: memory.activation_factor,
                logits_factor: memory.logits_factor,
                activation_working_factor: memory.activation_working_factor,
                logits_working_factor: memory.logits_working_factor,
                ..costs.runtime
            },
            _ => costs.runtime,
        });
        if let Some(overhead) = costs.framework_overhead_gib {
            p.framework_overhead_gib = overhead;
        }
        // Resolved: the tables above are this rank's (`cores_per_node` stays, for `time_share`).
        p.threads.clear();
        Cow::Owned(p)
    }

    /// How much longer a rank's compute takes when `ranks` ranks share the node's cores and a fraction
    /// `idle` of them waits (a pipeline bubble; MPI ranks oversubscribing a node yield while they wait):
    /// with more busy ranks `b = ranks · (1 − idle)` than cores, `(b ÷ cores)^γ` (γ =
    /// `time_share_exponent`, measured by calibration; 1 = a fair share and nothing lost). 1 where every
    /// rank has its threads.
    pub fn time_share(&self, ranks: u64, idle: f64) -> f64 {
        match self.cores_per_node {
            Some(cores) if ranks > cores => self.time_share_busy(ranks as f64 * (1.0 - idle.clamp(0.0, 1.0))),
            _ => 1.0,
        }
    }

    /// How much longer a rank's compute takes while `busy` ranks of a node compute at once: `(busy ÷
    /// cores)^γ`, at least 1 (1 on a platform without a core count).
    pub fn time_share_busy(&self, busy: f64) -> f64 {
        match self.cores_per_node {
            Some(cores) => (busy / cores as f64).max(1.0).powf(self.time_share_exponent.unwrap_or(1.0)),
            None => 1.0,
        }
    }

    /// Checks the `threads` tables: one per thread count, 1 among them, none above the cores.
    pub(super) fn validate_threads(&self, src: &str) -> Result<()> {
        if self.threads.is_empty() {
            return Ok(());
        }
        let Some(cores) = self.cores_per_node else {
            return Err(Error::invalid(src, "cores_per_node", "is needed with [[threads]] tables (the node's cores)"));
        };
        let counts: Vec<u64> = self.threads.iter().map(|t| t.threads).collect();
        if counts[0] != 1 || counts.windows(2).any(|w| w[0] >= w[1]) || counts.iter().any(|t| *t > cores) {
            return Err(Error::invalid(
                src,
                "threads",
                format!("thread counts must start at 1, increase and stay ≤ cores_per_node = {cores}; got {counts:?}"),
            ));
        }
        for (i, t) in self.threads.iter().enumerate() {
            limits::count(src, &format!("threads[{i}].threads"), t.threads, 1, 1 << 20)?;
            check_curve(src, &format!("threads[{i}].attention_efficiency"), &t.attention_efficiency)?;
            if t.gemm_efficiency.is_empty() {
                return Err(Error::invalid(src, format!("threads[{i}].gemm_efficiency"), "needs at least one table"));
            }
            for (j, g) in t.gemm_efficiency.iter().enumerate() {
                check_curve(src, &format!("threads[{i}].gemm_efficiency[{j}].points"), &g.points)?;
            }
            check_experts_grid(src, &format!("threads[{i}].experts_efficiency"), &t.experts_efficiency)?;
            t.runtime.validate(src)?;
            if let Some(f) = t.framework_overhead_gib
                && !(f.is_finite() && f >= 0.0 && f < self.gpu_memory_gib)
            {
                return Err(Error::invalid(
                    src,
                    format!("threads[{i}].framework_overhead_gib"),
                    format!("is {f}; it must be in [0, gpu_memory_gib = {})", self.gpu_memory_gib),
                ));
            }
            if let Some(sc) = &t.step {
                sc.validate(src, &format!("threads[{i}].step"))?;
            }
        }
        Ok(())
    }
}

/// Thread counts a rank on a node of `cores` cores can get: the powers of two below `cores`, and
/// `cores`.
pub fn thread_counts(cores: u64) -> Vec<u64> {
    let mut counts: Vec<u64> = std::iter::successors(Some(1u64), |t| Some(t * 2)).take_while(|t| *t < cores).collect();
    counts.push(cores.max(1));
    counts
}

/// The mean of measurements of the same thread count and shapes (the ranks measured at once); `None`
/// when they differ or there are none.
pub fn mean_of(runs: &[ThreadCosts]) -> Option<ThreadCosts> {
    let first = runs.first()?;
    let shapes = |tables: &[GemmTable]| -> Vec<(u64, u64, Vec<f64>)> {
        tables.iter().map(|g| (g.n, g.k, g.points.iter().map(|p| p[0]).collect())).collect()
    };
    let grid = |t: &ThreadCosts| {
        let attention: Vec<f64> = t.attention_efficiency.iter().map(|p| p[0]).collect();
        (t.threads, shapes(&t.gemm_efficiency), shapes(&t.experts_efficiency), attention)
    };
    if runs.iter().any(|r| grid(r) != grid(first)) {
        return None;
    }
    let n = runs.len() as f64;
    let mean = |f: &dyn Fn(&ThreadCosts) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let gemm_efficiency = first
        .gemm_efficiency
        .iter()
        .enumerate()
        .map(|(t, table)| GemmTable {
            points: (0..table.points.len())
                .map(|i| [table.points[i][0], mean(&|m| m.gemm_efficiency[t].points[i][1])])
                .collect(),
            ..table.clone()
        })
        .collect();
    let experts_efficiency = first
        .experts_efficiency
        .iter()
        .enumerate()
        .map(|(t, table)| GemmTable {
            points: (0..table.points.len())
                .map(|i| [table.points[i][0], mean(&|m| m.experts_efficiency[t].points[i][1])])
                .collect(),
            ..table.clone()
        })
        .collect();
    let attention_efficiency = (0..first.attention_efficiency.len())
        .map(|i| [first.attention_efficiency[i][0], mean(&|m| m.attention_efficiency[i][1])])
        .collect();
    let r = |f: fn(&RuntimeCosts) -> f64| mean(&|m| f(&m.runtime));
    Some(ThreadCosts {
        threads: first.threads,
        attention_efficiency,
        gemm_efficiency,
        experts_efficiency,
        runtime: RuntimeCosts {
            op_overhead_us: r(|c| c.op_overhead_us),
            norm_ns: r(|c| c.norm_ns),
            rope_ns: r(|c| c.rope_ns),
            softmax_ns: r(|c| c.softmax_ns),
            swiglu_ns: r(|c| c.swiglu_ns),
            elementwise_ns: r(|c| c.elementwise_ns),
            optimizer_ns_per_param: r(|c| c.optimizer_ns_per_param),
            ..first.runtime
        },
        step: None,
        framework_overhead_gib: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::A2aAlgo::Flat;
    use crate::layout::{Layout, Schedule, StageSplit, TrainConfig};
    use crate::model::{LayerKind, ModelSpec, preset};
    use crate::platform::GemmTable;
    use crate::time::CostModel;

    /// `local` as a 2-core CPU platform whose 2-thread ranks run their GEMMs at `two` of the doubled
    /// peak and their other work at half the one-thread cost.
    fn two_cores(two: f64) -> Platform {
        let mut p = crate::platform::preset("local").unwrap();
        p.gpus_per_node = 4;
        p.topology.gpu_to_nic = vec![0; 4];
        p.cores_per_node = Some(2);
        let rc = RuntimeCosts::distinct_for_tests();
        let one = ThreadCosts {
            threads: 1,
            attention_efficiency: p.attention_efficiency.clone(),
            gemm_efficiency: p.gemm_efficiency.clone(),
            experts_efficiency: vec![],
            runtime: rc,
            step: None,
            framework_overhead_gib: None,
        };
        let flat = |e: f64| vec![GemmTable { n: 1024, k: 1024, points: vec![[1.0, e], [4096.0, e]] }];
        let halve = |x: f64| x / 2.0;
        let twice = ThreadCosts {
            threads: 2,
            attention_efficiency: vec![[64.0, two]],
            gemm_efficiency: flat(two),
            experts_efficiency: vec![],
            runtime: RuntimeCosts {
                op_overhead_us: halve(rc.op_overhead_us),
                norm_ns: halve(rc.norm_ns),
                rope_ns: halve(rc.rope_ns),
                softmax_ns: halve(rc.softmax_ns),
                swiglu_ns: halve(rc.swiglu_ns),
                elementwise_ns: halve(rc.elementwise_ns),
                optimizer_ns_per_param: halve(rc.optimizer_ns_per_param),
                bytes_per_param: 99.0,
                ..rc
            },
            step: None,
            framework_overhead_gib: None,
        };
        p.runtime = Some(RuntimeCosts { bytes_per_param: 20.0, ..rc });
        p.threads = vec![one, twice];
        p.validate().unwrap();
        p
    }

    #[test]
    fn a_rank_gets_the_costs_of_its_threads() {
        let p = two_cores(0.5);
        let alone = p.for_node_ranks(1);
        assert_eq!(alone.peak_tflops["fp32"], 2.0 * p.peak_tflops["fp32"]);
        assert_eq!(alone.gemm_efficiency(100.0, 1024, 1024), 0.5);
        let rc = alone.runtime.unwrap();
        assert_eq!((rc.norm_ns, rc.bytes_per_param), (1.5, 20.0), "time from the table, memory from [runtime]");
        for ranks in [2, 3, 4, 8] {
            let shared = p.for_node_ranks(ranks);
            assert_eq!(shared.peak_tflops, p.peak_tflops, "{ranks}");
            assert_eq!(shared.runtime.unwrap().norm_ns, 3.0, "{ranks}");
        }
        let gpu = crate::platform::preset("frontier").unwrap();
        assert!(matches!(gpu.for_node_ranks(8), Cow::Borrowed(_)));
    }

    /// A thread count with its own memory fit: its ranks get that fit's overhead and factors, the
    /// others keep the platform's.
    #[test]
    fn a_rank_gets_the_memory_of_its_threads_where_it_was_measured() {
        let mut p = two_cores(0.5);
        p.framework_overhead_gib = 0.1;
        let measured = RuntimeCosts { bytes_per_param: 17.0, activation_factor: 0.3, ..p.threads[0].runtime };
        p.threads[0] = ThreadCosts { runtime: measured, framework_overhead_gib: Some(0.04), ..p.threads[0].clone() };
        p.validate().unwrap();
        let one_thread = p.for_node_ranks(2);
        assert_eq!(one_thread.framework_overhead_gib, 0.04);
        assert_eq!(
            (one_thread.runtime.unwrap().bytes_per_param, one_thread.runtime.unwrap().activation_factor),
            (17.0, 0.3)
        );
        let two_threads = p.for_node_ranks(1);
        assert_eq!((two_threads.framework_overhead_gib, two_threads.runtime.unwrap().bytes_per_param), (0.1, 20.0));
        p.threads[0].framework_overhead_gib = Some(f64::NAN);
        assert!(p.validate().unwrap_err().to_string().contains("threads[0].framework_overhead_gib"));
    }

    #[test]
    fn more_ranks_than_cores_share_them_unless_idle() {
        let mut p = two_cores(0.5);
        assert_eq!(p.time_share(2, 0.0), 1.0);
        assert_eq!(p.time_share(4, 0.0), 2.0);
        assert_eq!(p.time_share(4, 0.25), 1.5);
        assert_eq!(p.time_share(4, 0.75), 1.0, "busy ranks fewer than cores");
        p.time_share_exponent = Some(1.5);
        assert!((p.time_share(8, 0.0) - 8.0).abs() < 1e-12, "(8/2)^1.5");
        assert_eq!(crate::platform::preset("frontier").unwrap().time_share(64, 0.0), 1.0);
    }

    /// One rank with both cores runs its GEMMs at the measured two-thread efficiency of twice the peak:
    /// a model of GEMMs only (no runtime costs) takes 1 / (2 · 0.5) = the one-thread time at efficiency 1.
    /// Four pipeline ranks on two cores: no faster than the cores allow (all the stages' work over two
    /// cores), no faster than with a core each, and at most twice as slow (γ = 1: four ranks computing
    /// at once get half a core each).
    #[test]
    fn step_time_follows_the_threads_and_the_sharing() {
        let spec = ModelSpec { num_layers: 4, layers: vec![LayerKind::Moe; 4], ..preset("tiny").unwrap() };
        let cfg = |m| TrainConfig {
            num_micro_batches: m,
            schedule: Schedule::OneFOneB,
            dtype: "fp32".into(),
            ..TrainConfig::new(32)
        };
        let p = two_cores(0.5);
        let one = Layout { pp: 1, ep: 1, dp: 1 };
        let whole = StageSplit(vec![4]);
        let alone = CostModel::new(&spec, &p, &one, &cfg(1), Flat).unwrap().predict(&whole);
        let resolved = p.for_node_ranks(1).into_owned();
        let same = CostModel::new(&spec, &resolved, &one, &cfg(1), Flat).unwrap().predict(&whole);
        assert_eq!(alone.step_time_s, same.step_time_s);
        let four = Layout { pp: 4, ep: 1, dp: 1 };
        let split = StageSplit(vec![1, 1, 1, 1]);
        let shared = CostModel::new(&spec, &p, &four, &cfg(4), Flat).unwrap().predict(&split);
        let own_cores = Platform { cores_per_node: None, threads: vec![], ..p.for_node_ranks(4).into_owned() };
        let unshared = CostModel::new(&spec, &own_cores, &four, &cfg(4), Flat).unwrap().predict(&split);
        let work: f64 = unshared.pipeline.busy_s.iter().sum();
        let (with_cores, alone) = (shared.pipeline.makespan_s, unshared.pipeline.makespan_s);
        assert!(with_cores >= work / 2.0 - 1e-12 && with_cores > alone, "{with_cores} {alone} {work}");
        assert!(with_cores <= 2.0 * alone + 1e-12, "{with_cores} {alone}");
        for (a, b) in unshared.stages.iter().zip(&shared.stages) {
            let stretch = b.forward_s / a.forward_s;
            assert!((1.0..=2.0 + 1e-12).contains(&stretch), "{stretch}");
        }
        assert!(shared.step_time_s > unshared.step_time_s);
    }

    #[test]
    fn thread_counts_double_up_to_the_cores() {
        assert_eq!(thread_counts(1), [1]);
        assert_eq!(thread_counts(2), [1, 2]);
        assert_eq!(thread_counts(6), [1, 2, 4, 6]);
        assert_eq!(thread_counts(8), [1, 2, 4, 8]);
    }
}
