//! One training step of a rank: its stage's instructions, one all-reduce over the world of the losses,
//! the bubble and every layer's tokens per expert (so every rank reports the same numbers), the router
//! biases' update from that load, the expert migrations the window calls for, and the checkpoint the
//! step ends with.

use std::time::Instant;

use piper_planner::checkpoint::MigrationWindow;
use piper_planner::migration::imbalance;

use super::checkpoint::{RunState, save};
use super::error::{Result, RuntimeError};
use super::job::Job;
use super::migration::{Progress, migrate};
use super::report::{MigrationEvent, SavedCheckpoint, StepMetrics};
use super::setup::RankRun;
use super::stage::StepState;
use crate::corpus::Corpus;
use crate::model::StageModel;

/// What a step's all-reduce brings back, the same on every rank.
struct StepTotals {
    /// Mean cross-entropy over the replicas, the router-loss terms, the bubble summed over ranks.
    loss: f64,
    router: f64,
    bubble: f64,
    /// Tokens per expert of every MoE layer of the model.
    counts: Vec<Vec<usize>>,
    /// Ranks that received a stop signal.
    stopping: f32,
}

impl<M: StageModel> RankRun<'_, M> {
    /// Trains step `step` and returns its metrics (the migration and checkpoint not yet filled in) and
    /// every MoE layer's tokens per expert.
    pub fn train_step(
        &mut self,
        job: &Job,
        corpus: &mut dyn Corpus,
        step: usize,
    ) -> Result<(StepMetrics, Vec<Vec<usize>>)> {
        let run = &job.run;
        let _span = tracing::info_span!("step", step).entered();
        let start = Instant::now();
        let shape = &self.stage.shape;
        let ids = corpus.batch_rows(run.global_batch, run.seq_len + 1, &|row| shape.needs_row(row));
        if let Some(why) = corpus.fault() {
            return Err(RuntimeError::invalid("data", why));
        }
        let lr = job.learning_rate(step)?;
        let mut state = self.stage.begin_step(ids, self.micro_batches);
        for instr in &self.stream {
            self.stage.run(*instr, &mut state, lr)?;
        }
        let totals = self.all_reduce(job, &state)?;
        if !totals.loss.is_finite() {
            return Err(RuntimeError::Diverged { step: step + 1, loss: totals.loss });
        }
        let s = &self.stage.shape;
        let blocks = self.stage.model.moe_blocks_mut();
        // DeepSeek-V3's bias update of every router with a selection bias, from its layer's load.
        for (block, c) in blocks.into_iter().zip(&totals.counts[s.first_moe..]) {
            if block.router.selection_bias {
                block.router = block.router.clone().update_selection_bias(c, run.bias_update_rate);
            }
        }
        let metrics = self.metrics(job, step, lr, start.elapsed().as_secs_f64(), &totals, state.grad_norm);
        Ok((metrics, totals.counts))
    }

    /// One all-reduce over the world: losses, busy fraction, and every layer's tokens per expert.
    fn all_reduce(&self, job: &Job, state: &StepState<M>) -> Result<StepTotals> {
        let (m, s) = (self.micro_batches, &self.stage.shape);
        let idle = 1.0 - state.busy / state.makespan.max(1e-12);
        let stopping = if super::preempt::received().is_some() { 1.0 } else { 0.0 };
        let mut sums = vec![state.ce_sum / m as f32, state.router_sum, idle as f32, stopping];
        sums.extend_from_slice(&state.load);
        job.world.all_reduce_sum_f32(&mut sums, "loss and load all-reduce")?;
        let counts =
            sums[4..].chunks(s.experts.max(1)).map(|c| c.iter().map(|x| x.round() as usize).collect()).collect();
        Ok(StepTotals {
            loss: sums[0] as f64 / s.replicas as f64,
            router: sums[1] as f64,
            bubble: sums[2] as f64,
            stopping: sums[3],
            counts,
        })
    }

    fn metrics(&self, job: &Job, step: usize, lr: f64, dt: f64, totals: &StepTotals, grad_norm: f64) -> StepMetrics {
        let tokens_per_step = (job.run.global_batch * job.run.seq_len) as f64;
        let flops_per_s = job.flops_per_token * tokens_per_step / dt;
        let ranks = job.world.size() as f64;
        // Max / mean (the planner's measure of imbalance, 1 for an idle group).
        let max_mean = |v: &[usize]| imbalance(&v.iter().map(|x| *x as f64).collect::<Vec<_>>());
        StepMetrics {
            step: step + 1,
            loss: totals.loss,
            total_loss: totals.loss + totals.router,
            lr,
            grad_norm,
            tokens_per_s: tokens_per_step / dt,
            flops_per_s,
            mfu: flops_per_s / (job.peak_flops * ranks),
            expert_load: totals.counts.iter().map(|c| max_mean(c)).collect(),
            rank_load_max_mean: totals
                .counts
                .iter()
                .zip(&self.placements)
                .map(|(c, p)| max_mean(&p.rank_load(c)))
                .collect(),
            step_time_s: dt,
            bubble: (job.plan.pp > 1).then(|| totals.bubble / ranks),
            migration: Vec::new(),
            migration_outcome: None,
            checkpoint: None,
            eval_loss: None,
            eval_metrics: Default::default(),
            stopped_by: (totals.stopping > 0.0)
                .then(|| super::preempt::received().unwrap_or("a stop signal on another rank").to_string()),
        }
    }

    /// Adds the step's load to the migration window and, at its end, moves the experts it calls for.
    pub fn migrate(&mut self, job: &Job, step: usize, counts: &[Vec<usize>]) -> Result<Vec<MigrationEvent>> {
        let Some(migrator) = self.migrator.as_mut() else { return Ok(Vec::new()) };
        migrator.observe(counts);
        let model = self.stage.model.clone();
        let (s, optim) = (&self.stage.shape, &mut self.stage.optim);
        let at = Progress { first_moe: s.first_moe, stage_ranks: s.replicas, steps_left: job.run.steps - step - 1 };
        let (moved, events) = migrate(migrator, model, &mut self.placements, optim, job.world, &self.coords, at)?;
        self.stage.model = moved;
        Ok(events)
    }

    /// Saves a checkpoint after step `step` when the settings call for one (every N steps and after the
    /// last): the model, the optimizer, the data position, the placements and the migration window.
    pub fn save_if_due(&self, job: &Job, corpus: &dyn Corpus, step: usize) -> Result<Option<SavedCheckpoint>> {
        if !job.checkpoint.saves_after(step, job.run.steps) {
            return Ok(None);
        }
        self.save_now(job, corpus, step)
    }

    /// Saves a checkpoint after `step` into `--checkpoint-dir` (none without one).
    pub fn save_now(&self, job: &Job, corpus: &dyn Corpus, step: usize) -> Result<Option<SavedCheckpoint>> {
        let Some(dir) = job.checkpoint.dir.as_deref() else { return Ok(None) };
        let window = self.migrator.as_ref().map(|m| {
            let (steps, counts) = m.window();
            MigrationWindow { steps: steps as u64, counts: counts.to_vec(), evidence: m.evidence().to_vec() }
        });
        let state = RunState {
            step: step as u64 + 1,
            model_config: &self.model_json,
            seed: job.run.seed,
            plan: &job.plan,
            data: corpus.position(),
            placements: &self.placements,
            window,
            hf_config: job.checkpoint.hf_config.as_ref(),
            tokenizer_files: &job.checkpoint.tokenizer_files,
        };
        let started = Instant::now();
        let folder =
            save(job.world, &self.stage.model, &self.stage.optim, &self.share, &state, dir, job.checkpoint.keep)?;
        let bytes = std::fs::read_dir(&folder)
            .map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        Ok(Some(SavedCheckpoint { folder, bytes, seconds: started.elapsed().as_secs_f64() }))
    }
}
