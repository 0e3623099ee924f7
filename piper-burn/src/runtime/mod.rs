//! The runtime: a run is a [`RunConfig`] (what to optimise) and a plan
//! ([`RunPlan`](piper_planner::run_plan::RunPlan): the layout the planner wrote or priced), executed by one
//! executor that runs the planner's instruction stream. Data flows one way: plan → run config → job →
//! executor → instructions → metrics → reporters.
//!
//! - Inputs: [`cli`] (the flags), [`run_file`] (`--config run.toml`, the resolved run file),
//!   [`config`], [`plan`] (plan files, `--plan auto`, layout flags),
//!   [`checkpoint`] settings, [`job`] (everything a run needs, checked before anything is allocated) and
//!   [`job_builder`] (a job from a spec and a world, the rest defaulted).
//! - Execution: [`executor`] (set-up, resume, the step loop, finish) of any model that implements
//!   [`StageModel`](crate::model::StageModel) ([`execute_model`]; [`execute`] builds the library's from the
//!   spec) over [`setup`], [`step`] and
//!   [`stage`] (one handler per instruction, full activation recompute in [`recompute`]), [`eval`] (the
//!   held-out split, forward only), with [`grads`] (reduction and global-norm clipping),
//!   [`optim`] (AdamW) and its [`schedule`], [`migration`] and [`checkpoint`].
//! - Around it: [`report`] (progress, metrics, summary), [`profile`], [`trace`] (timelines), [`preempt`] (save and stop on SIGTERM/SIGUSR1), [`fingerprint`] (ranks agree),
//!   [`reductions`] (a device probe), [`threads`], [`host`], [`peak`], [`fault`] (fault injection for
//!   the failure tests), [`error`].

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod error;
mod eval;
pub mod executor;
pub mod fault;
pub mod fingerprint;
pub mod grads;
pub mod heap;
pub mod host;
pub mod job;
pub mod job_builder;
pub mod log;
pub mod migration;
pub mod optim;
pub mod peak;
pub mod plan;
pub mod preempt;
pub mod profile;
mod recompute;
pub mod reductions;
pub mod report;
pub mod run_file;
pub mod schedule;
mod setup;
mod stage;
mod step;
pub mod threads;
pub mod trace;

pub use config::{AuxLossScope, MigrationDecision, RunConfig};
pub use error::{Result, RuntimeError};
pub use executor::{execute, execute_model};
pub use job::{DEFAULT_AUX_LOSS_COEF, Job, Trained};
pub use job_builder::JobBuilder;
pub use peak::measure_peak_flops;
pub use plan::{LayoutFlags, check_plan, plan_auto, plan_from_flags};
pub use report::{ReportOptions, Reporter, RunSummary, StepMetrics};
pub use schedule::LrSchedule;
