//! What `piper calibrate` runs: the calibration models and the training runs it profiles. None of them
//! is a configuration `benchmarks/accuracy.sh` checks the model on.

use std::path::Path;

use crate::error::{Error, Result};

/// A calibration model: a preset name, or a config embedded here and written to the work folder for the
/// trainer.
#[derive(Clone, Copy, Debug)]
pub struct CalibrationModel {
    pub name: &'static str,
    pub config: Option<&'static str>,
}

const MIXTRAL_S: CalibrationModel = CalibrationModel {
    name: "train-mixtral-s",
    config: Some(include_str!("../../presets/calibration/train-mixtral-s.json")),
};
const QWEN3_S: CalibrationModel = CalibrationModel {
    name: "train-qwen3-s",
    config: Some(include_str!("../../presets/calibration/train-qwen3-s.json")),
};
const QWEN3_M: CalibrationModel = CalibrationModel {
    name: "train-qwen3-m",
    config: Some(include_str!("../../presets/calibration/train-qwen3-m.json")),
};
const DEEPSEEK_M: CalibrationModel = CalibrationModel {
    name: "train-deepseek-m",
    config: Some(include_str!("../../presets/calibration/train-deepseek-m.json")),
};
/// Experts eight times as wide as the model: beside the others' (a half to twice the width), it tells
/// the expert-parallel path's cost per routed token apart from its cost per expert GEMM second.
const MIXTRAL_WIDE: CalibrationModel = CalibrationModel {
    name: "train-mixtral-wide",
    config: Some(include_str!("../../presets/calibration/train-mixtral-wide.json")),
};
const TINY_QWEN3: CalibrationModel = CalibrationModel { name: "tiny-qwen3", config: None };
const TINY_DEEPSEEK: CalibrationModel = CalibrationModel { name: "tiny-deepseek", config: None };

impl CalibrationModel {
    /// What the trainer's `--preset` and the planner's `resolve_model` take: the preset name, or the
    /// config written into `work`.
    pub fn arg(&self, work: &Path) -> Result<String> {
        let Some(text) = self.config else { return Ok(self.name.to_string()) };
        let path = work.join(format!("{}.json", self.name));
        if !path.exists() {
            std::fs::write(&path, text)
                .map_err(|e| Error::file(path.display().to_string(), format!("cannot write: {e}")))?;
        }
        Ok(path.display().to_string())
    }
}

/// One profiled training run: a model, the sequences of a step, tokens per sequence.
#[derive(Clone, Copy, Debug)]
pub struct ProfileRun {
    pub model: CalibrationModel,
    pub batch: u64,
    pub seq: u64,
    /// Whether its peak RSS is a point of the memory fit.
    pub memory: bool,
    /// Micro-batches of a step (more than one: GPipe, every micro-batch's activations held at once).
    pub micro_batches: u64,
}

/// A near-empty step, which pins the fixed costs of the step's ops but is no memory point: its ops are
/// too small to wake the thread pool, so its RSS lacks the per-thread pools every real step fills (66
/// MiB against 138 MiB for the main job's 2-layer model, whose activations are ~16 MiB larger).
const fn fixed_costs(model: CalibrationModel, batch: u64, seq: u64) -> ProfileRun {
    ProfileRun { memory: false, ..run(model, batch, seq) }
}

const fn run(model: CalibrationModel, batch: u64, seq: u64) -> ProfileRun {
    ProfileRun { model, batch, seq, memory: true, micro_batches: 1 }
}

/// One-rank runs at every thread count: parameters (2.7M–16M), layer activations (longer sequences grow
/// the s² attention scores) and logits (vocabularies of 256 and 4096) varied independently, and one of
/// almost no work (62 tokens through a 64-wide model), whose step is the layers' fixed costs. Their
/// profiles fit the step costs; the others' runs also fit the memory of their thread count.
pub const STEP_RUNS: [ProfileRun; 9] = [
    run(MIXTRAL_S, 8, 63),
    run(MIXTRAL_S, 32, 127),
    run(MIXTRAL_S, 8, 255),
    run(QWEN3_S, 8, 63),
    run(QWEN3_M, 4, 127),
    run(DEEPSEEK_M, 8, 63),
    run(TINY_QWEN3, 32, 127),
    run(TINY_DEEPSEEK, 32, 255),
    fixed_costs(TINY_QWEN3, 2, 31),
];

/// Expert-parallel runs (one expert group filling the node) for every thread count below the cores:
/// the permute → all-to-all → grouped experts → combine path, each paired with the same tokens per rank
/// through the fused path (one-rank copies on the same cores, just before it). Their experts are half
/// to eight times as wide as the model, so the fit can tell what the path costs per routed token from
/// what it costs per expert GEMM second.
pub const EP_RUNS: [ProfileRun; 4] =
    [run(MIXTRAL_S, 32, 127), run(QWEN3_M, 4, 127), run(DEEPSEEK_M, 8, 63), run(MIXTRAL_WIDE, 16, 63)];

/// Memory runs on every core that hold several micro-batches at once (GPipe on one rank): the step run
/// at the index, its sequences split into that many micro-batches. Beside the runs above (one
/// micro-batch at a time) they tell what a backward holds only while it runs from what every held
/// micro-batch keeps: with both a logits-heavy and an activation-heavy model.
pub const HELD_RUNS: [(usize, u64); 3] = [(1, 4), (6, 4), (7, 2)];

/// The data-parallel run timed on `cores` and on `2 × cores` ranks (time sharing), in two rounds.
pub const TIME_SHARE_RUN: ProfileRun = run(MIXTRAL_S, 32, 127);
pub const TIME_SHARE_ROUNDS: usize = 2;

/// Optimizer steps of each profiled one-rank run (the profile skips the first three).
pub const PROFILE_STEPS: u64 = 8;
/// Optimizer steps of each run of several ranks (expert-parallel runs and their fused pairs,
/// time-sharing runs). Ranks sharing a node take longer to settle than one rank: on an AMD EPYC Zen 4
/// with 2 threads, `train-mixtral-s` with EP = 2 took 228, 212 and 207 ms per step over the steps after
/// the third of 8-, 16- and 30-step runs (its fused pair 162 and 170 ms at 8 and 30), and with DP = 2
/// 224 and 171 ms at 10 and 30 steps (the gradient reduction 30 and 9 ms) — 8 steps booked the settling
/// to the exchange and to the replicas' synchronisation; 16 are within 2.5% of 30.
pub const MULTI_RANK_STEPS: u64 = 16;
/// Interleaved rounds of the profiled runs (each round a row of the fit).
pub const PROFILE_ROUNDS: usize = 2;
/// Seconds and most steps of a memory run (the last round on every core). The runtime's peak RSS grows
/// over the first ~100 steps (mimalloc's per-thread pools, which keep freed pages, fill) and varies by
/// up to 30% between short runs: the main job's model measured 94–122 MiB after 8 steps and 134–136 MiB
/// after 200, on an AMD EPYC Zen 4 with 2 threads; 2 s take it past 100 steps.
pub const MEMORY_SECONDS: f64 = 2.0;
pub const MEMORY_STEPS: u64 = 200;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::resolve_model;

    #[test]
    fn every_calibration_run_is_a_model_the_planner_reads() {
        let work = std::env::temp_dir().join(format!("piper-calibration-runs-{}", std::process::id()));
        std::fs::create_dir_all(&work).unwrap();
        for r in STEP_RUNS.iter().chain(&EP_RUNS).chain([&TIME_SHARE_RUN]) {
            let spec = resolve_model(&r.model.arg(&work).unwrap()).unwrap();
            assert!(spec.num_layers > 0 && r.batch > 0 && r.seq > 0, "{}", r.model.name);
        }
        for (i, m) in HELD_RUNS {
            assert!(STEP_RUNS[i].memory && m > 1 && STEP_RUNS[i].batch.is_multiple_of(m), "{i}");
        }
        std::fs::remove_dir_all(&work).unwrap();
    }
}
