//! A job — everything a run needs besides its data — and what a run leaves. [`Job::check`] refuses a job
//! that cannot run before anything is allocated.

use std::path::PathBuf;
use std::sync::Arc;

use burn::prelude::*;
use piper_comm::{Communicator, Topology};
use piper_planner::model::ModelSpec;
use piper_planner::platform::Platform;
use piper_planner::run_plan::RunPlan;

use super::checkpoint::{CheckpointSettings, Resume};
use super::config::RunConfig;
use super::error::{Result, RuntimeError};
use super::plan::{check_fits_machine, check_plan};
use super::profile::StepProfile;
use super::reductions::check_token_reductions;
use super::report::{RunSummary, StepMetrics};
use super::schedule::LrSchedule;
use crate::corpus::Corpus;
use crate::model::{CausalLm, CausalLmConfig};
use crate::moe::dispatcher::ExpertPlacement;

/// The load-balancing weight of a run whose model and run configuration give none.
pub const DEFAULT_AUX_LOSS_COEF: f64 = 0.01;

/// Everything a run needs besides its data. Built by [`Job::builder`], which fills what is left out; the
/// Burn model is derived from `spec` ([`Job::model_config`]), never given beside it.
pub struct Job<'a> {
    /// The model: its architecture, which the planner prices and the runtime builds.
    pub spec: ModelSpec,
    pub run: RunConfig,
    pub plan: RunPlan,
    pub world: &'a dyn Communicator,
    pub topo: Topology,
    /// The platform the plan was priced on (migration's cost prediction uses its intra-node bandwidth).
    pub platform: Platform,
    pub device: Device,
    /// Model FLOPs per token (the planner's count) and the measured peak FLOP/s of one rank: the basis
    /// of the MFU the metrics report.
    pub flops_per_token: f64,
    pub peak_flops: f64,
    /// Where and when to save checkpoints.
    pub checkpoint: CheckpointSettings,
    /// The checkpoint the run continues from.
    pub resume: Option<Resume>,
    /// A Hugging Face model folder whose weights the run starts from.
    pub init_hf: Option<PathBuf>,
    /// The learning rate of each step; `None`: the run configuration's warm-up and cosine decay.
    pub schedule: Option<Arc<dyn LrSchedule>>,
}

/// What a run leaves: this rank's part of the model, the metrics of every step, each rank's peak RSS.
pub struct Trained<M = CausalLm> {
    pub model: M,
    pub metrics: Vec<StepMetrics>,
    pub peak_rss_bytes: Vec<u64>,
    /// Each rank's heap peak, where the allocator counts it ([`super::heap`]); empty otherwise.
    pub peak_heap_bytes: Vec<u64>,
    /// Expert placement per MoE layer of the whole model.
    pub placements: Vec<ExpertPlacement>,
    /// Seconds this rank took to load its part of the resumed checkpoint.
    pub resume_seconds: Option<f64>,
    /// Where the steady steps' time went on this rank, when the run profiles ([`super::profile`]).
    pub profile: Option<StepProfile>,
    /// CPU time other guests of this host took while the steps ran (rank 0's host; `None` off Linux).
    pub steal_share: Option<f64>,
}

impl<M> Trained<M> {
    /// The run's summary against `plan` (`flops_per_token` converts tokens/s into the platform MFU).
    pub fn summary(&self, plan: &RunPlan, flops_per_token: f64) -> RunSummary {
        let placements = self.placements.iter().map(ExpertPlacement::ranks_of).collect();
        let mut summary = RunSummary::new(plan, &self.metrics, &self.peak_rss_bytes, placements, flops_per_token);
        summary.profile = self.profile.as_ref().map(StepProfile::per_step).unwrap_or_default();
        summary.steal_share = self.steal_share;
        summary.peak_heap_bytes.clone_from(&self.peak_heap_bytes);
        summary
    }
}

impl Job<'_> {
    /// A line for a run priced on a platform whose costs were not measured through this runtime (the
    /// built-in `local` defaults before `piper calibrate`, or a GPU preset): its predictions are the
    /// preset's guesses, not this machine's.
    pub fn uncalibrated_note(&self) -> Option<String> {
        let p = &self.platform;
        let measured = p.step_costs.is_some() || !p.threads.is_empty();
        (!measured).then(|| {
            format!(
                "the {} platform's costs were not measured on this machine: its predictions are defaults (`piper calibrate` measures this machine in about 4 minutes; then `--platform local` uses it)",
                p.name.escape_debug()
            )
        })
    }

    /// The Burn configuration of the job's model: [`CausalLmConfig::from_spec`] with the run's debug
    /// options. This is the configuration checkpoints record; the run's load-balancing weight is
    /// [`Job::aux_loss_coef`].
    pub fn model_config(&self) -> Result<CausalLmConfig> {
        let mut model = CausalLmConfig::from_spec(&self.spec)?;
        model.zero_router = self.run.zero_router;
        Ok(model)
    }

    /// The learning rate of step `step` (0-based): the job's schedule, else the run's. The error names
    /// the step whose rate is not a finite number ≥ 0.
    pub fn learning_rate(&self, step: usize) -> Result<f64> {
        let lr = match &self.schedule {
            Some(s) => s.learning_rate(step),
            None => self.run.learning_rate(step),
        };
        if !(lr.is_finite() && lr >= 0.0) {
            let why = format!("gives {lr} at step {}; a learning rate is a finite number ≥ 0", step + 1);
            return Err(RuntimeError::invalid("the learning-rate schedule", why));
        }
        Ok(lr)
    }

    /// The load-balancing loss's weight: the run's, else the model's (`router_aux_loss_coef` of its
    /// config), else [`DEFAULT_AUX_LOSS_COEF`].
    pub fn aux_loss_coef(&self) -> f64 {
        let model = self.spec.moe.as_ref().and_then(|m| m.router_aux_loss_coef);
        self.run.aux_loss_coef.or(model).unwrap_or(DEFAULT_AUX_LOSS_COEF)
    }

    /// Checks the job before any allocation: the plan against the run, model and ranks; the model
    /// against what piper-burn builds; the data against the vocabulary; the checkpoint to resume against
    /// the model and seed; the memory the plan needs against this machine. [`execute`](super::execute)
    /// calls it first; callers may call it earlier (before printing anything).
    pub fn check(&self, corpus: &dyn Corpus) -> Result<()> {
        self.check_with(corpus, &self.model_json(&self.model_config()?)?)
    }

    /// [`Job::check`] for the model whose configuration is `model_json` (see [`Job::model_json`]).
    pub(crate) fn check_with(&self, corpus: &dyn Corpus, model_json: &str) -> Result<()> {
        check_plan(&self.plan, &self.spec, &self.run, self.world.size())?;
        check_token_reductions(&self.device, self.micro_batch_tokens()?)?;
        self.check_model_and_data(corpus)?;
        self.checkpoint.validate()?;
        if self.resume.is_some() && self.init_hf.is_some() {
            return Err(RuntimeError::invalid("init_hf and resume", "both give the weights; give one"));
        }
        if let Some(r) = &self.resume {
            self.check_resume(r, model_json)?;
        }
        let me = self.world.rank();
        let on_node = self.topo.node_of.iter().filter(|n| **n == self.topo.node_of[me]).count();
        check_fits_machine(&self.plan, on_node)
    }

    /// Tokens of one micro-batch on one rank.
    fn micro_batch_tokens(&self) -> Result<usize> {
        let layout = self.plan.layout();
        let sequences =
            (self.plan.global_batch / (layout.ep * layout.dp * self.plan.num_micro_batches).max(1)) as usize;
        sequences.checked_mul(self.run.seq_len).ok_or_else(|| {
            RuntimeError::invalid(
                "global_batch",
                format!("× `seq_len` overflows: {sequences} sequences of {}", self.run.seq_len),
            )
        })
    }

    /// The configuration a checkpoint records and every rank must agree on.
    pub fn model_json<C: serde::Serialize>(&self, config: &C) -> Result<String> {
        serde_json::to_string(config).map_err(RuntimeError::json("model config"))
    }

    /// The data fits the model's vocabulary, the topology is the job's.
    fn check_model_and_data(&self, corpus: &dyn Corpus) -> Result<()> {
        if corpus.vocab_size() as u64 > self.spec.vocab_size {
            return Err(RuntimeError::invalid(
                "the data",
                format!(
                    "uses {} token ids but the model's vocabulary has {}",
                    corpus.vocab_size(),
                    self.spec.vocab_size
                ),
            ));
        }
        let experts = self.spec.num_experts();
        if self.run.hot_experts as u64 > experts {
            return Err(RuntimeError::invalid(
                "hot_experts",
                format!("{}: the model has {experts} routed experts", self.run.hot_experts),
            ));
        }
        if self.topo.world_size() != self.world.size() {
            return Err(RuntimeError::invalid(
                "the topology",
                format!("describes {} ranks but the job has {}", self.topo.world_size(), self.world.size()),
            ));
        }
        Ok(())
    }

    /// The checkpoint holds this model, was drawn with this seed, and has steps left to train.
    fn check_resume(&self, r: &Resume, config: &str) -> Result<()> {
        r.manifest.check_model(&r.folder, &self.spec, config).map_err(|e| RuntimeError::from(e).under("resume"))?;
        if r.manifest.seed != self.run.seed {
            let why = format!(
                "the checkpoint was trained with `seed` {}, this run has `seed` {} (the seed draws the data); train with `seed` {}",
                r.manifest.seed, self.run.seed, r.manifest.seed
            );
            return Err(RuntimeError::file("resume", &r.folder, why));
        }
        if r.manifest.step as usize >= self.run.steps {
            let why = format!(
                "the checkpoint is at step {}, and `steps` {} is the run's total: nothing to train (raise `steps`)",
                r.manifest.step, self.run.steps
            );
            return Err(RuntimeError::file("resume", &r.folder, why));
        }
        Ok(())
    }
}
