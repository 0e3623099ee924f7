//! `piper validate`.

use std::path::PathBuf;

use piper_planner::calibrate::CalibrateError;
use piper_planner::calibrate::validate::{ValidateSettings, validate};
use piper_planner::platform::resolve_platform;

use super::TrainArgs;
use crate::table::{pct, secs, table};

/// Run the planner's best runnable plans for a model on this machine (short runs under mpirun, rounds
/// interleaved) and set each against its prediction: the model checking itself. Needs the workers of
/// `piper calibrate`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: preset name or file (HF config.json or native spec), as the trainer's --preset takes it.
    #[arg(long)]
    model: String,
    /// Platform the plans are priced on (default: local, the calibrated file when there is one).
    #[arg(long, default_value = "local")]
    platform: String,
    /// Ranks to run on.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    gpus: u64,
    /// Sequences per optimizer step.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    global_batch: u64,
    #[command(flatten)]
    train: TrainArgs,
    /// Plans to run, best predicted first.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=100))]
    top: u64,
    /// Interleaved rounds (every plan once per round).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
    /// Optimizer steps per run (the median skips the first three).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(6..=100_000))]
    steps: u64,
    /// Folder holding the workers or their `examples/` (default: this program's folder).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Write the whole check as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<String, CalibrateError> {
    let platform = resolve_platform(&a.platform)?;
    let here = std::env::current_exe().map_err(|e| CalibrateError::file("piper", e))?;
    let s = ValidateSettings {
        model: a.model.clone(),
        gpus: a.gpus,
        global_batch: a.global_batch,
        base: a.train.config(&platform),
        top: a.top as usize,
        rounds: a.rounds as usize,
        steps: a.steps,
        bin_dir: a.bin_dir.or_else(|| here.parent().map(PathBuf::from)).unwrap_or_default(),
        work: std::env::temp_dir().join(format!("piper-validate-{}", std::process::id())),
    };
    let v = validate(&s, &platform, &mut |step| eprintln!("{step}"))?;
    let _ = std::fs::remove_dir_all(&s.work);
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&v).expect("json");
        piper_planner::atomic::write_atomic(path, text.as_bytes()).map_err(|e| CalibrateError::file(path, e))?;
    }
    let mut t = table(&[
        "#",
        "PP",
        "EP",
        "DP",
        "mbs",
        "M",
        "schedule",
        "predicted",
        "measured",
        "spread",
        "error",
        "peak GiB pred / meas",
    ]);
    for (i, p) in v.plans.iter().enumerate() {
        t.add_row(vec![
            (i + 1).to_string(),
            p.pp.to_string(),
            p.ep.to_string(),
            p.dp.to_string(),
            p.micro_batch_size.to_string(),
            p.num_micro_batches.to_string(),
            p.schedule.name().to_string(),
            secs(p.predicted_step_s),
            secs(p.measured_step_s),
            pct(p.spread),
            format!("{:+.1}%", 100.0 * (p.predicted_step_s / p.measured_step_s - 1.0)),
            format!(
                "{:.3} / {:.3}",
                p.predicted_peak_bytes / (1u64 << 30) as f64,
                p.measured_peak_bytes / (1u64 << 30) as f64
            ),
        ]);
    }
    Ok(format!(
        "{} on {} rank(s), {} platform, {} round(s):\n{t}\nfirst choice's regret (its measured time ÷ the fastest measured − 1): {:.1}%; rank correlation (Spearman) {:.2}\n{}",
        v.model,
        v.gpus,
        v.platform,
        v.rounds,
        100.0 * v.regret,
        v.rank_correlation,
        classes(&v.classes),
    ))
}

/// Where a profiled one-rank step goes, class by class, a line per thread count: predicted / measured
/// ms per step and the error.
fn classes(checks: &[piper_planner::calibrate::validate::ClassCheck]) -> String {
    let mut counts: Vec<Option<u64>> = checks.iter().map(|c| c.threads).collect();
    counts.dedup();
    counts
        .into_iter()
        .map(|threads| {
            let cells: Vec<String> = checks.iter().filter(|c| c.threads == threads).map(class_cell).collect();
            let rank = threads.map_or("one rank".to_string(), |t| format!("one rank of {t} thread(s)"));
            format!(
                "{rank}: step by class, predicted / measured (profiled, the first choice's micro-batch): {}\n",
                cells.join(", ")
            )
        })
        .collect()
}

fn class_cell(c: &piper_planner::calibrate::validate::ClassCheck) -> String {
    let error = 100.0 * (c.predicted_s / c.measured_s - 1.0);
    let error = if error.is_finite() { format!("{error:+.0}%") } else { "n/a".into() };
    let name = serde_json::to_value(c.class).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    format!("{name} {:.1} / {:.1} ms ({error})", 1e3 * c.predicted_s, 1e3 * c.measured_s)
}
