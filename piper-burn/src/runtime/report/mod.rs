//! What a run tells its user. Data flows one way: the executor produces [`StepMetrics`] for every step
//! and a [`Trained`](super::Trained) at the end; the reporters only read them.
//! - [`metrics`]: the per-step record and the events inside it (migrations, checkpoints), and the
//!   JSON-lines file (`--metrics`); [`migration_outcome`]: follows what each check's migrations saved;
//! - [`progress`]: the progress bar or log lines on rank 0;
//! - [`summary`]: the run's opening description, the summary (`--summary FILE.json`) and the
//!   plan-versus-measured report;
//! - [`history`]: the run's line in the history of training runs (`--history`).

pub mod history;
pub mod metrics;
pub mod migration_outcome;
pub mod plots;
pub mod progress;
pub mod summary;

pub use history::{append_history, history_record};
pub use metrics::{MetricsFile, MigrationEvent, MigrationOutcome, SavedCheckpoint, StepMetrics};
pub use migration_outcome::OutcomeTracker;
pub use progress::{ReportOptions, Reporter};
pub use summary::{RunSummary, SummaryLayout, describe_run};
