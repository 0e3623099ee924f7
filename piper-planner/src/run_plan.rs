//! The plan file the runtime executes (`piper plan --out plan.json`): layout, rank order, stage split with
//! each stage's ranks, expert groups and the initial expert placement, schedule, and migration policy,
//! with the planner's predictions kept beside them so the runtime can report its prediction error.

use serde::{Deserialize, Serialize};

use crate::comm::A2aAlgo;
use crate::layout::{Layout, Recompute, Schedule, StageSplit};
use crate::model::ModelSpec;
use crate::planner::PlanCandidate;

/// Format version of the plan file.
pub const RUN_PLAN_VERSION: u32 = 1;

/// One pipeline stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunStage {
    pub stage: u64,
    pub first_layer: u64,
    pub num_layers: u64,
    /// Global ranks of the stage, `ep + EP·dp` order: each run of EP consecutive ranks is an expert group.
    pub ranks: Vec<u64>,
}

/// When and how far the runtime rebalances experts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigrationPolicy {
    /// Rebalance an expert group when its max/mean tokens per rank exceeds this.
    pub threshold: f64,
    /// Steps between checks (token counts are summed over the window).
    pub check_every_steps: u64,
    /// Hill-climbing iterations (swaps) per rebalancing.
    pub max_swaps: u64,
}

/// Predictions the runtime compares its measurements with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub step_time_s: f64,
    pub mfu: f64,
    pub tflops_per_gpu: f64,
    pub tokens_per_s: f64,
    pub bubble_fraction: f64,
    pub stage_memory_bytes: Vec<f64>,
}

/// Everything the runtime needs to lay out and run a training job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    pub version: u32,
    pub model: String,
    pub platform: String,
    pub gpus: u64,
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
    /// `rank = ep + EP·(dp + DP·stage)`.
    pub rank_order: String,
    pub seq_len: u64,
    pub micro_batch_size: u64,
    pub num_micro_batches: u64,
    pub global_batch: u64,
    pub schedule: Schedule,
    pub recompute: Recompute,
    pub all_to_all: A2aAlgo,
    pub dtype: String,
    pub stages: Vec<RunStage>,
    /// Routed expert id → expert-parallel rank, the same initially in every MoE layer (contiguous blocks
    /// of E / EP experts). Migration changes it per layer at run time.
    pub expert_placement: Vec<u64>,
    pub migration: MigrationPolicy,
    pub predicted: Predicted,
}

impl RunPlan {
    /// The plan file for a planner candidate.
    pub fn from_candidate(spec: &ModelSpec, platform_name: &str, seq_len: u64, dtype: &str, c: &PlanCandidate) -> Self {
        let layout: Layout = c.layout();
        let split = StageSplit(c.split.clone());
        let stages = split
            .starts()
            .iter()
            .zip(&split.0)
            .enumerate()
            .map(|(s, (first, n))| RunStage {
                stage: s as u64,
                first_layer: *first,
                num_layers: *n,
                ranks: (0..layout.dp).flat_map(|d| (0..layout.ep).map(move |e| layout.rank(s as u64, d, e))).collect(),
            })
            .collect();
        let experts = spec.num_experts();
        let per_rank = (experts / layout.ep).max(1);
        let prediction = c.prediction.as_ref();
        RunPlan {
            version: RUN_PLAN_VERSION,
            model: spec.name.clone(),
            platform: platform_name.to_string(),
            gpus: layout.gpus(),
            pp: layout.pp,
            ep: layout.ep,
            dp: layout.dp,
            rank_order: "ep,dp,pp".into(),
            seq_len,
            micro_batch_size: c.micro_batch_size,
            num_micro_batches: c.num_micro_batches,
            global_batch: c.micro_batch_size * c.num_micro_batches * layout.ep * layout.dp,
            schedule: c.schedule,
            recompute: c.recompute,
            all_to_all: c.all_to_all,
            dtype: dtype.to_string(),
            stages,
            expert_placement: (0..experts).map(|e| e / per_rank).collect(),
            // The paper gives no values; these are Piper-rs defaults (see the README).
            migration: MigrationPolicy { threshold: 1.2, check_every_steps: 100, max_swaps: per_rank.max(1) * 2 },
            predicted: Predicted {
                step_time_s: c.step_time_s,
                mfu: c.mfu,
                tflops_per_gpu: c.tflops_per_gpu,
                tokens_per_s: c.tokens_per_s,
                bubble_fraction: c.bubble_fraction,
                stage_memory_bytes: prediction
                    .map_or_else(Vec::new, |_| c.stages.iter().map(|s| s.total_bytes).collect()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;
    use crate::planner::{PlanRequest, plan};
    use crate::platform;

    #[test]
    fn plan_file_round_trips_and_covers_every_rank_once() {
        let spec = preset("mixtral-8x7b").unwrap();
        let p = platform::preset("frontier").unwrap();
        let report = plan(&spec, &p, &PlanRequest::new(64, 256, 4096)).unwrap();
        let run = RunPlan::from_candidate(&spec, "frontier", 4096, "bf16", &report.plans[0]);
        let back: RunPlan = serde_json::from_str(&serde_json::to_string(&run).unwrap()).unwrap();
        assert_eq!(back, run);
        let mut ranks: Vec<u64> = run.stages.iter().flat_map(|s| s.ranks.clone()).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (0..64).collect::<Vec<_>>());
        assert_eq!(run.expert_placement.len(), 8);
        assert!(run.expert_placement.iter().all(|r| *r < run.ep));
        assert_eq!(run.stages.iter().map(|s| s.num_layers).sum::<u64>(), 32);
    }
}
