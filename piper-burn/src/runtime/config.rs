//! The run configuration: what to optimise and for how long. The layout (PP × EP × DP, micro-batches,
//! schedule, split, all-to-all) lives in the plan ([`piper_planner::run_plan::RunPlan`]); together
//! they are everything a run needs. Validated once, here, before any allocation; every message names
//! the field (the command line, its flag).

use burn::prelude::*;
use piper_planner::limits::show;
use serde::{Deserialize, Serialize};

use super::error::{self, RuntimeError};

/// Where the load-balancing loss takes its token counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuxLossScope {
    /// Counts summed over every rank that shares the layer, per micro-batch (Megatron's
    /// `global_aux_loss`): a layout equals one process on the same batch.
    Global,
    /// Each rank's own micro-batch (the loss differs from one process by design).
    MicroBatch,
}

/// How expert migration decides to move (see `piper_planner::migration_payoff`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationDecision {
    /// When the imbalance has held at two checks in a row (in the window and in the smoothed load) and
    /// the step time saved within four windows exceeds the move's cost.
    Payoff,
    /// At any check whose window exceeds the threshold (the paper's rule: no persistence, no payoff).
    Threshold,
}

/// Optimisation settings of a run.
#[derive(Config, Debug)]
pub struct RunConfig {
    /// Optimizer steps in the whole run.
    #[config(default = 200)]
    pub steps: usize,
    /// Sequences per optimizer step over all ranks (the global batch).
    #[config(default = 16)]
    pub global_batch: usize,
    /// Tokens each sequence trains on — the planner's sequence length (the data draws `seq_len + 1` ids
    /// per sequence: inputs and their next-token targets).
    #[config(default = 63)]
    pub seq_len: usize,
    #[config(default = 3e-3)]
    pub lr: f64,
    /// Final learning rate as a fraction of `lr` (cosine decay).
    #[config(default = 0.1)]
    pub min_lr_ratio: f64,
    /// Linear warm-up steps (at most `steps`).
    #[config(default = 20)]
    pub warmup_steps: usize,
    #[config(default = 0.1)]
    pub weight_decay: f64,
    /// AdamW's decay rates of the first and second moments and its ε (β₂ 0.95 as Megatron and DeepSeek
    /// train MoE models).
    #[config(default = 0.9)]
    pub adam_beta1: f64,
    #[config(default = 0.95)]
    pub adam_beta2: f64,
    #[config(default = 1e-8)]
    pub adam_epsilon: f64,
    /// Clip the global gradient norm (over every parameter of the model, on all ranks) to this; 0: off.
    #[config(default = 1.0)]
    pub grad_clip: f64,
    /// Weight of the load-balancing loss; `None`: the model's own (`router_aux_loss_coef`), else
    /// [`DEFAULT_AUX_LOSS_COEF`](super::job::DEFAULT_AUX_LOSS_COEF).
    #[config(default = "None")]
    pub aux_loss_coef: Option<f64>,
    #[config(default = "AuxLossScope::Global")]
    pub aux_loss_scope: AuxLossScope,
    /// Step of DeepSeek's selection-bias update (routers with a selection bias only).
    #[config(default = 1e-3)]
    pub bias_update_rate: f64,
    #[config(default = 0)]
    pub seed: u64,
    /// Expert migration with the plan's policy (`--migration plan`); `false`: off.
    #[config(default = true)]
    pub migration: bool,
    /// Overrides the plan's migration threshold (max/mean tokens per rank of an expert group).
    #[config(default = "None")]
    pub migration_threshold: Option<f64>,
    /// Overrides the plan's steps between migration checks.
    #[config(default = "None")]
    pub migration_every: Option<usize>,
    #[config(default = "MigrationDecision::Payoff")]
    pub migration_decision: MigrationDecision,
    /// Shared experts compute while the expert dispatch's rows travel (expert parallelism with the flat
    /// or pairwise all-to-all); `false`: before a blocking dispatch.
    #[config(default = true)]
    pub overlap: bool,
    /// A skewed workload: experts `0..hot_experts` of every MoE layer draw about `hot_factor` times
    /// their balanced share of tokens (a fixed router bias; 0: off).
    #[config(default = 0)]
    pub hot_experts: usize,
    #[config(default = 1.0)]
    pub hot_factor: f64,
    /// Evaluate on the held-out split every N steps and after the last one (0: off).
    #[config(default = 0)]
    pub eval_every: usize,
    /// Tokens of the held-out split, rounded up to whole global batches of `seq_len`-token sequences.
    #[config(default = 8192)]
    pub eval_tokens: usize,
    /// Debug: all-zero router weights (degenerate routing, for testing experts that get no tokens).
    #[config(default = false)]
    pub zero_router: bool,
}

/// The largest held-out split (tokens).
pub const MAX_EVAL_TOKENS: usize = 1 << 30;

/// Beyond these no run on any machine goes; larger values are typos, refused before they allocate.
pub const MAX_STEPS: usize = 100_000_000;
pub const MAX_SEQ_LEN: usize = 1 << 20;
pub const MAX_GLOBAL_BATCH: usize = 1 << 24;

/// The command-line flag of each field [`RunConfig::validate`] names: the command line reports a field
/// by its flag.
pub const FLAGS: [(&str, &str); 14] = [
    ("steps", "--steps"),
    ("global_batch", "--batch-size"),
    ("seq_len", "--seq-len"),
    ("lr", "--lr"),
    ("min_lr_ratio", "--min-lr-ratio"),
    ("weight_decay", "--weight-decay"),
    ("grad_clip", "--grad-clip"),
    ("aux_loss_coef", "--aux-loss-coef"),
    ("bias_update_rate", "--bias-update-rate"),
    ("migration_threshold", "--migration-threshold"),
    ("migration_every", "--migration-every"),
    ("hot_factor", "--hot-experts factor"),
    ("eval_every", "--eval-every"),
    ("eval_tokens", "--eval-tokens"),
];

fn finite_at_least(field: &str, v: f64, min: f64, what: &str) -> error::Result<()> {
    if v.is_finite() && v >= min { Ok(()) } else { Err(refuse(field, format!("is {}; it must be {what}", show(v)))) }
}

fn refuse(field: &str, why: String) -> RuntimeError {
    RuntimeError::invalid(field, why)
}

impl RunConfig {
    /// Checks every field; the error names the field and what it must be (the command line names its
    /// flag instead: [`FLAGS`]).
    pub fn validate(&self) -> error::Result<()> {
        if !(1..=MAX_STEPS).contains(&self.steps) {
            return Err(refuse("steps", format!("is {}; it must be in 1..={MAX_STEPS}", self.steps)));
        }
        if !(1..=MAX_GLOBAL_BATCH).contains(&self.global_batch) {
            return Err(refuse(
                "global_batch",
                format!("is {}; it must be in 1..={MAX_GLOBAL_BATCH} sequences", self.global_batch),
            ));
        }
        if !(2..=MAX_SEQ_LEN).contains(&self.seq_len) {
            return Err(refuse("seq_len", format!("is {}; it must be in 2..={MAX_SEQ_LEN} tokens", self.seq_len)));
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= 10.0) {
            return Err(refuse("lr", format!("is {}; it must be a finite number in (0, 10]", show(self.lr))));
        }
        if !(self.min_lr_ratio.is_finite() && (0.0..=1.0).contains(&self.min_lr_ratio)) {
            return Err(refuse("min_lr_ratio", format!("is {}; it must be in [0, 1]", self.min_lr_ratio)));
        }
        finite_at_least("weight_decay", self.weight_decay, 0.0, "a finite number ≥ 0")?;
        for (field, beta) in [("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)] {
            if !(beta.is_finite() && (0.0..1.0).contains(&beta)) {
                return Err(refuse(field, format!("is {}; it must be in [0, 1)", show(beta))));
            }
        }
        if !(self.adam_epsilon.is_finite() && self.adam_epsilon > 0.0 && self.adam_epsilon <= 1.0) {
            return Err(refuse("adam_epsilon", format!("is {}; it must be in (0, 1]", show(self.adam_epsilon))));
        }
        finite_at_least("grad_clip", self.grad_clip, 0.0, "a finite norm ≥ 0 (0: no clipping)")?;
        if let Some(coef) = self.aux_loss_coef {
            finite_at_least("aux_loss_coef", coef, 0.0, "a finite weight ≥ 0")?;
        }
        finite_at_least("bias_update_rate", self.bias_update_rate, 0.0, "a finite rate ≥ 0")?;
        if let Some(t) = self.migration_threshold {
            finite_at_least("migration_threshold", t, 1.0, "a finite max/mean ratio ≥ 1")?;
        }
        if let Some(n) = self.migration_every
            && !(1..=MAX_STEPS).contains(&n)
        {
            return Err(refuse("migration_every", format!("is {n}; it must be in 1..={MAX_STEPS} steps")));
        }
        if !(self.hot_factor.is_finite() && (1.0..=1e6).contains(&self.hot_factor)) {
            return Err(refuse("hot_factor", format!("is {}; it must be in [1, 1e6]", show(self.hot_factor))));
        }
        if self.eval_every > MAX_STEPS {
            return Err(refuse("eval_every", format!("is {}; it must be in 0..={MAX_STEPS} steps", self.eval_every)));
        }
        if self.eval_every > 0 && !(1..=MAX_EVAL_TOKENS).contains(&self.eval_tokens) {
            return Err(refuse("eval_tokens", format!("is {}; it must be in 1..={MAX_EVAL_TOKENS}", self.eval_tokens)));
        }
        Ok(())
    }

    /// Sequences of the held-out split: `eval_tokens` in sequences, rounded up to whole global batches
    /// (an evaluation runs the plan's layout on global batches).
    pub fn eval_sequences(&self) -> usize {
        let sequences = self.eval_tokens.div_ceil(self.seq_len.max(1)).max(1);
        sequences.div_ceil(self.global_batch.max(1)) * self.global_batch
    }

    /// Whether an evaluation follows step `step` (0-based): every `eval_every` steps and after the last.
    pub fn eval_due(&self, step: usize) -> bool {
        self.eval_every > 0 && ((step + 1).is_multiple_of(self.eval_every) || step + 1 == self.steps)
    }

    /// Learning rate at `step` (0-based): linear warm-up to `lr`, then cosine to `lr · min_lr_ratio`.
    pub fn learning_rate(&self, step: usize) -> f64 {
        let warmup = self.warmup_steps.min(self.steps);
        if step < warmup {
            return self.lr * (step + 1) as f64 / warmup as f64;
        }
        let decay = self.steps.saturating_sub(warmup).max(1);
        let progress = ((step - warmup) as f64 / decay as f64).min(1.0);
        let min = self.lr * self.min_lr_ratio;
        min + 0.5 * (self.lr - min) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let c = RunConfig::new().with_steps(100).with_warmup_steps(10).with_lr(1.0).with_min_lr_ratio(0.1);
        assert!((c.learning_rate(0) - 0.1).abs() < 1e-12);
        assert!((c.learning_rate(9) - 1.0).abs() < 1e-12);
        assert!((c.learning_rate(10) - 1.0).abs() < 1e-12);
        assert!((c.learning_rate(55) - 0.55).abs() < 1e-12); // halfway: (1 + 0.1) / 2
        assert!((c.learning_rate(100) - 0.1).abs() < 1e-12);
        // Warm-up longer than the run: it ends with the run.
        let short = RunConfig::new().with_steps(4).with_warmup_steps(20).with_lr(1.0);
        assert!((short.learning_rate(3) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn evaluations_cover_whole_global_batches_and_the_last_step() {
        let c = RunConfig::new().with_steps(10).with_global_batch(4).with_seq_len(10).with_eval_every(4);
        assert_eq!(c.clone().with_eval_tokens(1).eval_sequences(), 4);
        assert_eq!(c.clone().with_eval_tokens(41).eval_sequences(), 8); // 5 sequences → 2 batches
        let due: Vec<usize> = (0..10).filter(|s| c.eval_due(*s)).collect();
        assert_eq!(due, vec![3, 7, 9]);
        assert!((0..10).all(|s| !c.clone().with_eval_every(0).eval_due(s)));
    }

    #[test]
    fn every_bad_field_is_named() {
        let ok = RunConfig::new();
        ok.validate().unwrap();
        let cases: Vec<(RunConfig, &str)> = vec![
            (RunConfig::new().with_steps(0), "steps is 0"),
            (RunConfig::new().with_steps(1_000_000_000), "steps is 1000000000"),
            (RunConfig::new().with_global_batch(0), "global_batch is 0"),
            (RunConfig::new().with_seq_len(0), "seq_len is 0"),
            (RunConfig::new().with_seq_len(1), "seq_len is 1"),
            (RunConfig::new().with_seq_len(MAX_SEQ_LEN + 1), "seq_len is 1048577"),
            (RunConfig::new().with_lr(f64::NAN), "lr is NaN"),
            (RunConfig::new().with_lr(-1e-3), "lr is -0.001"),
            (RunConfig::new().with_grad_clip(f64::NAN), "grad_clip is NaN"),
            (RunConfig::new().with_grad_clip(-1.0), "grad_clip is -1"),
            (RunConfig::new().with_aux_loss_coef(Some(f64::INFINITY)), "aux_loss_coef is inf"),
            (RunConfig::new().with_weight_decay(-0.1), "weight_decay is -0.1"),
            (RunConfig::new().with_adam_beta1(1.0), "adam_beta1 is 1"),
            (RunConfig::new().with_adam_beta2(f64::NAN), "adam_beta2 is NaN"),
            (RunConfig::new().with_adam_epsilon(0.0), "adam_epsilon is 0"),
            (RunConfig::new().with_min_lr_ratio(2.0), "min_lr_ratio is 2"),
            (RunConfig::new().with_migration_threshold(Some(0.5)), "migration_threshold is 0.5"),
            (RunConfig::new().with_migration_threshold(Some(f64::NAN)), "migration_threshold is NaN"),
            (RunConfig::new().with_migration_every(Some(0)), "migration_every is 0"),
            (RunConfig::new().with_hot_factor(f64::INFINITY), "hot_factor is inf"),
            (RunConfig::new().with_eval_every(1).with_eval_tokens(0), "eval_tokens is 0"),
            (RunConfig::new().with_eval_every(MAX_STEPS + 1), "eval_every is 100000001"),
        ];
        for (c, want) in cases {
            let err = c.validate().unwrap_err().to_string();
            assert!(err.starts_with(want), "want `{want}`: {err}");
        }
    }
}
