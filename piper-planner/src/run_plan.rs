//! The plan file the runtime executes (`piper plan --out plan.json`): layout, rank order, stage split with
//! each stage's ranks, expert groups and the initial expert placement, schedule, and migration policy,
//! with the planner's predictions kept beside them so the runtime can report its prediction error.

use serde::{Deserialize, Serialize};

use crate::comm::A2aAlgo;
use crate::error::{Error, Result};
use crate::layout::{Layout, RUNTIME_DTYPE, Recompute, Schedule, StageSplit};
use crate::model::ModelSpec;
use crate::planner::PlanCandidate;

/// Format version of the plan file.
pub const RUN_PLAN_VERSION: u32 = 1;

/// Why the runtime (piper-burn) cannot execute a plan that trains in `dtype` with `recompute`, as the
/// plan field and a message naming the fix; `None` when it can. The runtime trains in fp32, with every
/// recompute mode; the planner still prices the other dtypes (what they would buy), and `piper plan --out`
/// writes only plans this accepts.
pub fn runtime_refusal(dtype: &str) -> Option<(&'static str, String)> {
    if dtype != RUNTIME_DTYPE {
        return Some((
            "dtype",
            format!("is `{dtype}`; the runtime trains in {RUNTIME_DTYPE} — re-plan with --dtype {RUNTIME_DTYPE}"),
        ));
    }
    None
}

/// One pipeline stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunStage {
    pub stage: u64,
    pub first_layer: u64,
    pub num_layers: u64,
    /// Global ranks of the stage, `ep + EP·dp` order: each run of EP consecutive ranks is an expert group.
    pub ranks: Vec<u64>,
}

/// When and how far the runtime rebalances experts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
pub struct Predicted {
    pub step_time_s: f64,
    pub mfu: f64,
    pub tflops_per_gpu: f64,
    pub tokens_per_s: f64,
    pub bubble_fraction: f64,
    pub stage_memory_bytes: Vec<f64>,
}

impl Predicted {
    /// Memory of the fullest stage (0 for a plan without per-stage predictions).
    pub fn peak_memory_bytes(&self) -> f64 {
        self.stage_memory_bytes.iter().copied().max_by(f64::total_cmp).unwrap_or(0.0)
    }
}

/// Everything the runtime needs to lay out and run a training job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
            // The paper gives no values; these are Piper's defaults (docs/parallel.md#expert-migration): a
            // threshold of 1.1, since a move also needs the imbalance to persist and to pay.
            migration: MigrationPolicy { threshold: 1.1, check_every_steps: 100, max_swaps: per_rank.max(1) * 2 },
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

/// Largest degree of any parallelism a plan may name (no machine has more ranks).
const MAX_RANKS: u64 = 1 << 40;

impl RunPlan {
    /// Reads and checks a plan file (`piper plan --out`); errors name the file and the field.
    pub fn load(path: &std::path::Path) -> Result<RunPlan> {
        let file = |why: String| Error::File { path: path.display().to_string(), why };
        let text = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks the text of a plan file; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<RunPlan> {
        let plan: RunPlan = serde_json::from_str(text)
            .map_err(|e| Error::File { path: source.into(), why: format!("not a Piper plan file: {e}") })?;
        plan.validate(source)?;
        Ok(plan)
    }

    pub fn layout(&self) -> Layout {
        Layout { pp: self.pp, ep: self.ep, dp: self.dp }
    }

    /// Layers per stage.
    pub fn split(&self) -> StageSplit {
        StageSplit(self.stages.iter().map(|s| s.num_layers).collect())
    }

    /// Checks that the plan is self-consistent: degrees and rank count, rank order, stages (contiguous
    /// layers, each rank once, in the documented order), batch arithmetic, expert placement, migration
    /// policy, and finite non-negative predictions. `source` names the plan in errors.
    pub fn validate(&self, source: &str) -> Result<()> {
        let bad = |field: &str, why: String| Err(Error::invalid(source, field, why));
        crate::limits::printable(source, "model", &self.model)?;
        crate::limits::printable(source, "platform", &self.platform)?;
        if self.version != RUN_PLAN_VERSION {
            return bad(
                "version",
                format!(
                    "is {} but this piper reads version {RUN_PLAN_VERSION}; re-plan with this piper's `piper plan --out`",
                    self.version
                ),
            );
        }
        for (field, v) in [("pp", self.pp), ("ep", self.ep), ("dp", self.dp)] {
            if v == 0 || v > MAX_RANKS {
                return bad(field, format!("is {v}; it must be in 1..=2^40"));
            }
        }
        let ranks = self.pp.checked_mul(self.ep).and_then(|x| x.checked_mul(self.dp)).filter(|r| *r <= MAX_RANKS);
        if ranks != Some(self.gpus) {
            return bad("gpus", format!("is {} but pp·ep·dp = {}·{}·{}", self.gpus, self.pp, self.ep, self.dp));
        }
        if self.rank_order != "ep,dp,pp" {
            return bad("rank_order", format!("is `{}`; the runtime lays ranks out as `ep,dp,pp`", self.rank_order));
        }
        crate::limits::count(source, "seq_len", self.seq_len, 1, crate::limits::MAX_SEQ_LEN)?;
        crate::limits::count(source, "micro_batch_size", self.micro_batch_size, 1, crate::limits::MAX_BATCH)?;
        crate::limits::count(source, "num_micro_batches", self.num_micro_batches, 1, crate::limits::MAX_BATCH)?;
        if self.pp.saturating_mul(self.num_micro_batches) > crate::limits::MAX_PIPELINE_PAIRS {
            return bad(
                "num_micro_batches",
                format!(
                    "is {} on {} stages: more stage·micro-batch pairs than the schedule lists ({}); re-plan with larger micro-batches",
                    self.num_micro_batches,
                    self.pp,
                    crate::limits::MAX_PIPELINE_PAIRS
                ),
            );
        }
        let batch = self
            .micro_batch_size
            .checked_mul(self.num_micro_batches)
            .and_then(|x| x.checked_mul(self.ep))
            .and_then(|x| x.checked_mul(self.dp));
        if batch != Some(self.global_batch) {
            return bad(
                "global_batch",
                format!(
                    "is {} but micro_batch_size · num_micro_batches · ep · dp = {}·{}·{}·{}",
                    self.global_batch, self.micro_batch_size, self.num_micro_batches, self.ep, self.dp
                ),
            );
        }
        if self.stages.len() as u64 != self.pp {
            return bad("stages", format!("lists {} stages but pp = {}", self.stages.len(), self.pp));
        }
        let layout = self.layout();
        let mut next_layer = 0u64;
        for (s, stage) in self.stages.iter().enumerate() {
            let s = s as u64;
            if stage.stage != s || stage.first_layer != next_layer || stage.num_layers == 0 {
                return bad(
                    "stages",
                    format!(
                        "entry {s} must be stage {s} starting at layer {next_layer} with ≥ 1 layer (got stage {}, first_layer {}, num_layers {})",
                        stage.stage, stage.first_layer, stage.num_layers
                    ),
                );
            }
            crate::limits::count(source, "stages[].num_layers", stage.num_layers, 1, crate::limits::MAX_LAYERS)?;
            next_layer = next_layer.saturating_add(stage.num_layers);
            // Lengths first: the expected list is only built for a plan that lists that many ranks.
            if stage.ranks.len() as u64 != self.ep * self.dp {
                return bad(
                    "stages",
                    format!("stage {s} lists {} ranks but ep·dp = {}", stage.ranks.len(), self.ep * self.dp),
                );
            }
            let expect: Vec<u64> = (0..self.dp).flat_map(|d| (0..self.ep).map(move |e| layout.rank(s, d, e))).collect();
            if stage.ranks != expect {
                return bad(
                    "stages",
                    format!("stage {s} must hold ranks {expect:?} (ep,dp,pp order), not {:?}", stage.ranks),
                );
            }
        }
        if !self.expert_placement.is_empty() {
            let mut per_rank = vec![0u64; self.ep.min(self.expert_placement.len() as u64) as usize];
            for (e, r) in self.expert_placement.iter().enumerate() {
                match per_rank.get_mut(*r as usize) {
                    Some(n) => *n += 1,
                    None => {
                        return bad("expert_placement", format!("puts expert {e} on rank {r}, but ep = {}", self.ep));
                    }
                }
            }
            if per_rank.len() as u64 != self.ep || per_rank.iter().any(|n| *n != per_rank[0]) {
                return bad(
                    "expert_placement",
                    format!("gives the {} ranks {per_rank:?} experts; each must hold E / ep of them", self.ep),
                );
            }
        }
        let m = &self.migration;
        if !(m.threshold.is_finite() && m.threshold >= 1.0) {
            return bad("migration.threshold", format!("is {}; it is max/mean tokens per rank, ≥ 1", m.threshold));
        }
        if m.check_every_steps == 0 {
            return bad("migration.check_every_steps", "must be ≥ 1".into());
        }
        let p = &self.predicted;
        for (field, v) in [
            ("predicted.step_time_s", p.step_time_s),
            ("predicted.mfu", p.mfu),
            ("predicted.tflops_per_gpu", p.tflops_per_gpu),
            ("predicted.tokens_per_s", p.tokens_per_s),
            ("predicted.bubble_fraction", p.bubble_fraction),
        ]
        .into_iter()
        .chain(p.stage_memory_bytes.iter().map(|b| ("predicted.stage_memory_bytes", *b)))
        {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, format!("is {v}; predictions are finite and ≥ 0"));
            }
        }
        // The run sets its measurements against these: a zero would print NaN or ±inf as the error.
        let plan_again = "re-plan with `piper plan --out`";
        for (field, v) in [("predicted.step_time_s", p.step_time_s), ("predicted.tokens_per_s", p.tokens_per_s)] {
            if v <= 0.0 {
                return bad(field, format!("is {v}; a step takes time and trains tokens ({plan_again})"));
            }
        }
        if p.stage_memory_bytes.len() as u64 != self.pp || p.stage_memory_bytes.iter().any(|b| *b <= 0.0) {
            return bad(
                "predicted.stage_memory_bytes",
                format!("must hold one positive figure per stage ({} stages; {plan_again})", self.pp),
            );
        }
        Ok(())
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
        run.validate("plan.json").unwrap();
    }

    fn tiny_plan() -> RunPlan {
        let spec = preset("tiny").unwrap();
        let p = platform::preset("frontier").unwrap();
        let req = PlanRequest { pp: Some(2), ep: Some(2), ..PlanRequest::new(8, 64, 256) };
        RunPlan::from_candidate(&spec, "frontier", 256, "bf16", &plan(&spec, &p, &req).unwrap().plans[0])
    }

    #[test]
    fn inconsistent_plan_files_are_refused_naming_the_field() {
        let good = tiny_plan();
        good.validate("p").unwrap();
        type Mutation = Box<dyn Fn(&mut RunPlan)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("`version` is 2", Box::new(|p| p.version = 2)),
            ("`gpus` is 9", Box::new(|p| p.gpus = 9)),
            ("`pp` is 0", Box::new(|p| p.pp = 0)),
            ("`dp` is 1099511627777", Box::new(|p| p.dp = (1 << 40) + 1)),
            ("`global_batch`", Box::new(|p| p.global_batch += 1)),
            ("`micro_batch_size` is 0; it must be in 1..=", Box::new(|p| p.micro_batch_size = 0)),
            ("`stages` stage 1 must hold ranks [4, 5, 6, 7]", Box::new(|p| p.stages[1].ranks.swap(0, 1))),
            ("`stages` entry 1", Box::new(|p| p.stages[1].first_layer += 1)),
            ("`expert_placement` puts expert 3 on rank 7", Box::new(|p| p.expert_placement[3] = 7)),
            ("`expert_placement` gives", Box::new(|p| p.expert_placement[0] = 1)),
            ("`migration.threshold` is NaN", Box::new(|p| p.migration.threshold = f64::NAN)),
            ("`predicted.step_time_s` is -1", Box::new(|p| p.predicted.step_time_s = -1.0)),
            ("`predicted.mfu` is inf", Box::new(|p| p.predicted.mfu = f64::INFINITY)),
            // A zero prediction made the run print "NaN% measured".
            ("`predicted.step_time_s` is 0; a step takes time", Box::new(|p| p.predicted.step_time_s = 0.0)),
            ("`predicted.tokens_per_s` is 0", Box::new(|p| p.predicted.tokens_per_s = 0.0)),
            ("`predicted.stage_memory_bytes` must hold one", Box::new(|p| p.predicted.stage_memory_bytes.clear())),
            ("`predicted.stage_memory_bytes` must hold one", Box::new(|p| p.predicted.stage_memory_bytes[0] = 0.0)),
            ("`rank_order`", Box::new(|p| p.rank_order = "pp,dp,ep".into())),
        ];
        for (want, mutate) in cases {
            let mut p = good.clone();
            mutate(&mut p);
            let err = p.validate("p.json").unwrap_err().to_string();
            assert!(err.starts_with("p.json: ") && err.contains(want), "want `{want}` in: {err}");
        }
    }

    #[test]
    fn plan_files_load_and_refuse_unknown_fields() {
        let dir = std::env::temp_dir().join(format!("piper-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plan.json");
        // Through JSON once (serde_json may parse a float one ulp off), then the file is stable.
        let good: RunPlan = serde_json::from_str(&serde_json::to_string(&tiny_plan()).unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(&good).unwrap()).unwrap();
        assert_eq!(RunPlan::load(&path).unwrap(), good);
        let mut v: serde_json::Value = serde_json::to_value(&good).unwrap();
        v["pipeline_depth"] = 3.into();
        std::fs::write(&path, v.to_string()).unwrap();
        let err = RunPlan::load(&path).unwrap_err().to_string();
        assert!(err.contains("not a Piper plan file") && err.contains("pipeline_depth"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
