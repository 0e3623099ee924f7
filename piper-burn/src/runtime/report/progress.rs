//! The progress of a run on rank 0: a progress bar (loss, tokens/s, GFLOP/s, MFU) with the run's lines
//! in its scroll-back when stderr is a terminal, else the same lines plainly on stdout (a batch job's
//! log keeps every one); step lines every `--log-every` steps; and the `--metrics` file.

use std::io::IsTerminal as _;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

use super::metrics::{MetricsFile, StepMetrics};
use crate::runtime::error::Result;

/// Where the per-step output goes.
#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    /// One JSON line per step (rank 0).
    pub metrics: Option<PathBuf>,
    /// A log line every N steps (0: none).
    pub log_every: usize,
    /// A progress bar where stderr is a terminal (else plain lines).
    pub progress: bool,
    /// Steps trained before this run (a resumed run's checkpoint number; 0 for a fresh run): an existing
    /// metrics file keeps its lines of those steps and continues after them.
    pub steps_done: usize,
}

/// Shows each step on rank 0 and records it in the metrics file; other ranks' reporters are silent.
pub struct Reporter {
    lead: bool,
    steps: usize,
    bar: ProgressBar,
    metrics: Option<MetricsFile>,
    options: ReportOptions,
}

impl Reporter {
    /// Checks where the metrics file goes (rank 0; the error names `--metrics`); it is written from the
    /// first step on.
    pub fn new(options: ReportOptions, rank: usize, steps: usize) -> Result<Self> {
        let lead = rank == 0;
        let metrics = options.metrics.clone().filter(|_| lead).map(|p| MetricsFile::new(p, options.steps_done));
        let metrics = metrics.transpose()?;
        // Without a terminal indicatif hides the bar and drops the lines printed through it.
        let show_bar = options.progress && lead && std::io::stderr().is_terminal();
        let bar = if show_bar { ProgressBar::new(steps as u64) } else { ProgressBar::hidden() };
        bar.set_position(options.steps_done as u64);
        bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"));
        Ok(Reporter { lead, steps, bar, metrics, options })
    }

    /// Rank 0: a line in the bar's scroll-back (or on stdout without a bar), also a `tracing` event (an
    /// instant in a `--trace` timeline).
    pub fn println(&self, line: &str) {
        if self.lead {
            tracing::info!(target: "piper::report", "{line}");
            if self.bar.is_hidden() { println!("{line}") } else { self.bar.println(line) }
        }
    }

    /// One step: the bar, the metrics line, and the lines of its checkpoint, migrations and log.
    pub fn observe(&mut self, m: &StepMetrics) {
        if !self.lead {
            return;
        }
        self.bar.inc(1);
        self.bar.set_message(format!(
            "loss {:.4} | {:.0} tok/s | {:.2} GFLOP/s | MFU {:.1}%",
            m.loss,
            m.tokens_per_s,
            m.flops_per_s / 1e9,
            100.0 * m.mfu
        ));
        if let Some(f) = self.metrics.as_mut() {
            f.write(m);
        }
        for line in event_lines(m) {
            self.println(&line);
        }
        let every = self.options.log_every;
        if every > 0 && (m.step == 1 || m.step.is_multiple_of(every) || m.step == self.steps) {
            self.println(&step_line(m));
        }
    }

    /// Clears the bar and flushes the metrics file.
    pub fn finish(self) -> Result<()> {
        self.bar.finish_and_clear();
        self.metrics.map_or(Ok(()), MetricsFile::finish)
    }
}

/// The lines of a step's checkpoint, evaluation and expert migrations.
fn event_lines(m: &StepMetrics) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(c) = &m.checkpoint {
        lines.push(format!(
            "step {:>5}  checkpoint: {} ({:.1} MiB) in {:.2} s",
            m.step,
            c.folder.display(),
            c.bytes as f64 / (1u64 << 20) as f64,
            c.seconds
        ));
    }
    if let Some(signal) = &m.stopped_by {
        lines.push(match &m.checkpoint {
            Some(c) => format!(
                "step {:>5}  stopped by {signal}: saved {}; continue with --resume {}",
                m.step,
                c.folder.display(),
                c.folder.display()
            ),
            None => format!("step {:>5}  stopped by {signal}: nothing saved (no --checkpoint-dir)", m.step),
        });
    }
    if let Some(loss) = m.eval_loss {
        let own: String = m.eval_metrics.iter().map(|(name, v)| format!("  {} {v:.4}", name.escape_debug())).collect();
        lines.push(format!("step {:>5}  held-out loss {loss:.4}  perplexity {:.2}{own}", m.step, loss.exp()));
    }
    for e in &m.migration {
        lines.push(format!(
            "step {:>5}  migration: MoE layer {} moved {} experts ({} swaps, {:.1} KiB) in {:.2} ms ({:.2} ms predicted); rank load max/mean {:.2} → {:.2}",
            m.step,
            e.layer,
            e.experts_moved,
            e.swaps,
            e.bytes / 1024.0,
            e.seconds * 1e3,
            e.predicted_seconds * 1e3,
            e.imbalance_before,
            e.imbalance_after
        ));
    }
    if let Some(o) = &m.migration_outcome {
        lines.push(format!(
            "step {:>5}  migration after step {} (MoE layers {:?}): step {:.2} → {:.2} ms (medians of {} and {} steps), {:.2} ms/step saved, {:.2} predicted",
            m.step,
            o.moved_after_step,
            o.layers,
            o.step_time_before_s * 1e3,
            o.step_time_after_s * 1e3,
            o.steps_before,
            o.steps_after,
            o.realised_gain_per_step_s * 1e3,
            o.predicted_gain_per_step_s * 1e3
        ));
    }
    lines
}

/// The periodic log line: loss, learning rate, tokens/s, expert load per layer and per rank.
fn step_line(m: &StepMetrics) -> String {
    let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
    format!(
        "step {:>5}  loss {:.4}  lr {:.2e}  {:.0} tok/s  expert load max/mean per layer [{}]  per rank [{}]",
        m.step,
        m.loss,
        m.lr,
        m.tokens_per_s,
        fmt(&m.expert_load),
        fmt(&m.rank_load_max_mean)
    )
}
