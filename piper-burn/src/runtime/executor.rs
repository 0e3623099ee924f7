//! The one trainer: every rank runs its stage's instruction stream — the planner's
//! [`instructions`](piper_planner::schedule::instructions), the same list the simulator prices — with one
//! handler per instruction ([`super::stage`]). One process is the stream of PP = EP = DP = 1; expert- and
//! data-parallel runs are PP = 1; pipelined runs add the receives and sends between stages.
//!
//! A run reads as its plan: check the job and that every rank agrees on it, set the rank up
//! ([`super::setup`]), resume, run the steps ([`super::step`]), finish. Each replica (EP·DP of them per
//! stage) takes an equal slice of the global batch, in micro-batches; losses are scaled by 1 / (EP·DP·M),
//! so gradients summed over the replicas equal the one-process gradients of the whole batch.

use piper_comm::collectives::all_gather;

use super::error::{Result, RuntimeError};
use super::fault::StepFault;
use super::fingerprint::check_ranks_agree;
use super::heap;
use super::host::peak_rss_bytes;
use super::job::{Job, Trained};
use super::profile::{self, StepProfile};
use super::report::{OutcomeTracker, StepMetrics};
use super::setup::RankRun;
use crate::corpus::Corpus;
use crate::model::{StageModel, StageModelConfig};
use piper_planner::calibrate::steal::StealClock;

/// Runs the plan: `job.run.steps` optimizer steps on this rank's part of the library's model built from
/// the job's spec ([`Job::model_config`]). Every rank gets the same metrics; `on_step` sees each step's.
pub fn execute(job: &Job, corpus: &mut dyn Corpus, on_step: impl FnMut(&StepMetrics)) -> Result<Trained> {
    execute_model(job, &job.model_config()?, corpus, on_step)
}

/// Runs the plan on the model `config` describes — the library's or an author's own
/// ([`StageModelConfig`]); the job's spec must describe the same model (the planner priced it), which
/// the set-up checks. Every rank gets the same metrics; `on_step` sees each step's.
pub fn execute_model<C: StageModelConfig>(
    job: &Job,
    config: &C,
    corpus: &mut dyn Corpus,
    on_step: impl FnMut(&StepMetrics),
) -> Result<Trained<C::Model>> {
    if job.run.eval_every > 0 && corpus.held_out().is_empty() {
        corpus.hold_out(job.run.eval_sequences(), job.run.seq_len + 1)?;
    }
    let model_json = job.model_json(config)?;
    job.check_with(corpus, &model_json)?;
    super::preempt::install()?;
    agree_on_the_job(job, &model_json, corpus)?;
    let mut rank = RankRun::new(job, config)?;
    let (first_step, resume_seconds) = rank.resume(job, corpus)?;
    let steal = StealClock::start();
    let steps = run_steps(job, &mut rank, corpus, first_step, on_step)?;
    let mut trained = finish(job, rank, steps, resume_seconds)?;
    trained.steal_share = steal.share();
    Ok(trained)
}

/// Every rank runs the same model, run configuration, seed, plan, data, checkpoints and starting
/// weights; the job stops naming the first part that differs.
fn agree_on_the_job(job: &Job, model_json: &str, corpus: &dyn Corpus) -> Result<()> {
    let run_no_seed = super::RunConfig { seed: 0, ..job.run.clone() };
    check_ranks_agree(
        job.world,
        &[
            ("model", model_json.to_string()),
            ("run configuration", serde_json::to_string(&run_no_seed).map_err(RuntimeError::json("fingerprint"))?),
            ("seed", job.run.seed.to_string()),
            ("plan", serde_json::to_string(&job.plan).map_err(RuntimeError::json("fingerprint"))?),
            ("data", corpus.describe()),
            ("checkpoints", format!("{:?}", job.checkpoint)),
            ("resume", format!("{:?}", job.resume.as_ref().map(|r| (&r.folder, r.manifest.step)))),
            ("init-hf", format!("{:?}", job.init_hf)),
        ],
    )
}

/// What the step loop leaves: every step's metrics, and the seconds of the profiled steps.
struct Steps {
    metrics: Vec<StepMetrics>,
    profiled_steps: usize,
    profiled_seconds: f64,
}

/// Steps `first_step..job.run.steps`: train, migrate, save, report. The profile covers the steps the
/// summary's medians do: all but the first three (warm-up).
fn run_steps<M: StageModel>(
    job: &Job,
    rank: &mut RankRun<M>,
    corpus: &mut dyn Corpus,
    first_step: usize,
    mut on_step: impl FnMut(&StepMetrics),
) -> Result<Steps> {
    let steps = job.run.steps;
    let fault = StepFault::from_env(job.world.rank());
    let profile_from = first_step + 3.min(steps.saturating_sub(first_step + 1));
    let mut out =
        Steps { metrics: Vec::new(), profiled_steps: steps.saturating_sub(profile_from), profiled_seconds: 0.0 };
    let mut outcomes = rank.migrator.as_ref().map(|m| OutcomeTracker::new(m.settings.check_every_steps));
    for step in first_step..steps {
        if step == profile_from && profile::enabled() {
            profile::start_window();
        }
        let (mut metrics, counts) = rank.train_step(job, corpus, step)?;
        metrics.migration = tracing::info_span!("migration", step).in_scope(|| rank.migrate(job, step, &counts))?;
        metrics.migration_outcome = outcomes.as_mut().and_then(|t| t.observe(&metrics));
        if job.run.eval_due(step) {
            let _span = tracing::info_span!("evaluate", step).entered();
            let held_out = rank.evaluate(job, corpus.held_out())?;
            metrics.eval_loss = Some(held_out.loss);
            metrics.eval_metrics = held_out.metrics;
        }
        metrics.checkpoint =
            tracing::info_span!("checkpoint", step).in_scope(|| rank.save_if_due(job, corpus, step))?;
        let stopping = metrics.stopped_by.is_some();
        if stopping && metrics.checkpoint.is_none() {
            // Preempted: every rank saves the step it finished, then the run ends normally.
            metrics.checkpoint =
                tracing::info_span!("checkpoint", step).in_scope(|| rank.save_now(job, corpus, step))?;
        }
        if step >= profile_from {
            out.profiled_seconds += metrics.step_time_s;
        }
        on_step(&metrics);
        fault.after_step(step);
        out.metrics.push(metrics);
        if stopping {
            break;
        }
    }
    Ok(out)
}

/// Every rank's peak memory, this rank's profile, and what the run leaves.
fn finish<M: StageModel>(job: &Job, rank: RankRun<M>, steps: Steps, resume_seconds: Option<f64>) -> Result<Trained<M>> {
    let peaks = all_gather(job.world, &[peak_rss_bytes(), heap::peak_heap_bytes().unwrap_or(0)], "peak memory gather")?;
    let rss = peaks.iter().map(|v| v[0]).collect();
    // Every rank runs the same binary: its allocator counts on all of them or on none.
    let heap = if heap::peak_heap_bytes().is_some() { peaks.iter().map(|v| v[1]).collect() } else { Vec::new() };
    let profile = profile::enabled().then(|| StepProfile::collect(steps.profiled_steps, steps.profiled_seconds));
    Ok(Trained {
        model: rank.stage.model,
        metrics: steps.metrics,
        peak_rss_bytes: rss,
        peak_heap_bytes: heap,
        placements: rank.placements,
        resume_seconds,
        profile,
        steal_share: None,
    })
}
