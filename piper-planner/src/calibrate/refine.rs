//! `piper calibrate --refine`: refit a calibrated platform from the history of its training runs. Each
//! recent run of the platform is priced again on it (without any earlier refinement), and the geometric
//! median of measured ÷ predicted — step time and peak memory apart — becomes the platform's
//! [`Refinement`]. Runs on another machine (cores), of another platform, or measured while the host
//! gave much of its CPU to other guests do not count.
//!
//! Measured on what it was not fitted on: with four runs or more, the older half fits a refinement and
//! the newer half is predicted before and after it — the figure that says whether refining helps.

use crate::error::{Error, Result};
use crate::history::HistoryRecord;
use crate::planner::price;
use crate::platform::{Platform, Refinement};
use crate::stats::median_or_nan;

use super::steal::STEAL_WARN;

/// Most recent runs a refinement is fitted on: the machine as it is now, not as it was months ago.
pub const REFINE_WINDOW: usize = 32;

/// A run's prediction on the unrefined platform beside its measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priced {
    pub predicted_step_s: f64,
    pub measured_step_s: f64,
    pub predicted_peak_bytes: f64,
    pub measured_peak_bytes: f64,
}

/// Median |predicted − measured| ÷ measured of step time and peak memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Errors {
    pub step: f64,
    pub memory: f64,
}

/// The older half's refinement tried on the newer half.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeldOut {
    pub fitted_on: usize,
    pub tried_on: usize,
    pub before: Errors,
    pub after: Errors,
}

/// What refining did.
#[derive(Clone, Debug, PartialEq)]
pub struct RefineReport {
    pub refinement: Refinement,
    /// Runs of the history that count, and why the others do not (one line per reason, with a count).
    pub used: usize,
    pub skipped: Vec<(String, usize)>,
    /// On the runs it was fitted on.
    pub before: Errors,
    pub after: Errors,
    pub held_out: Option<HeldOut>,
}

/// The platform refitted from `history` (oldest first), and the report.
pub fn refine(platform: &Platform, history: &[HistoryRecord]) -> Result<(Platform, RefineReport)> {
    let base = Platform { refinement: None, ..platform.clone() };
    let mut skipped: Vec<(String, usize)> = Vec::new();
    let mut priced = Vec::new();
    for record in history {
        match price_again(&base, record) {
            Ok(p) => priced.push(p),
            Err(why) => match skipped.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => skipped.push((why, 1)),
            },
        }
    }
    let recent = &priced[priced.len().saturating_sub(REFINE_WINDOW)..];
    if recent.is_empty() {
        return Err(Error::invalid(
            "history",
            "runs",
            format!(
                "has no run of platform `{}` to refine it with ({}); train on it first (every run appends to the history)",
                base.name,
                if skipped.is_empty() { "it is empty".into() } else { describe(&skipped) }
            ),
        ));
    }
    let refinement = fit(recent);
    let held_out = (recent.len() >= 4).then(|| {
        let (older, newer) = recent.split_at(recent.len() / 2);
        HeldOut {
            fitted_on: older.len(),
            tried_on: newer.len(),
            before: errors(newer, &Refinement::NONE),
            after: errors(newer, &fit(older)),
        }
    });
    let report = RefineReport {
        refinement,
        used: recent.len(),
        skipped,
        before: errors(recent, &Refinement::NONE),
        after: errors(recent, &refinement),
        held_out,
    };
    let refined = Platform { refinement: Some(refinement), ..base };
    refined.validate()?;
    Ok((refined, report))
}

/// `reasons` as one phrase: "3 of another platform, 1 with 12% steal".
pub fn describe(reasons: &[(String, usize)]) -> String {
    reasons.iter().map(|(why, n)| format!("{n} {why}")).collect::<Vec<_>>().join(", ")
}

/// A run priced again on `base`, or why it does not count.
fn price_again(base: &Platform, r: &HistoryRecord) -> std::result::Result<Priced, String> {
    if r.plan.platform != base.name {
        return Err(format!("of platform `{}`", r.plan.platform.escape_debug()));
    }
    if let Some(cores) = base.cores_per_node.filter(|c| *c != r.cores) {
        return Err(format!("on {} cores (the platform has {cores})", r.cores));
    }
    if r.steal_share.is_some_and(|s| s > STEAL_WARN) {
        return Err(format!("measured with over {:.0}% steal", 100.0 * STEAL_WARN));
    }
    if r.steps <= 3 || !(r.step_time_median_s > 0.0 && r.peak_rss_bytes > 0.0) {
        return Err("without a steady step (4 steps or more) or a peak".into());
    }
    let c = price(&r.model, base, &r.plan.layout(), &r.config, r.plan.all_to_all, &r.plan.split())
        .map_err(|e| format!("the planner no longer prices ({e})"))?;
    Ok(Priced {
        predicted_step_s: c.step_time_s,
        measured_step_s: r.step_time_median_s,
        predicted_peak_bytes: c.peak_memory_bytes,
        measured_peak_bytes: r.peak_rss_bytes,
    })
}

/// The geometric median of measured ÷ predicted, step time and memory apart (robust to one slow run).
fn fit(runs: &[Priced]) -> Refinement {
    // Only runs with positive steps and peaks are priced; a NaN that got through fails the refined
    // platform's validation.
    let scale =
        |ratio: fn(&Priced) -> f64| median_or_nan(&runs.iter().map(|p| ratio(p).ln()).collect::<Vec<_>>()).exp();
    Refinement {
        time_scale: scale(|p| p.measured_step_s / p.predicted_step_s),
        memory_scale: scale(|p| p.measured_peak_bytes / p.predicted_peak_bytes),
        runs: runs.len() as u64,
    }
}

/// Median relative errors of `runs` predicted with `r`.
fn errors(runs: &[Priced], r: &Refinement) -> Errors {
    let err = |predicted: f64, measured: f64| ((predicted - measured) / measured).abs();
    Errors {
        step: median_or_nan(
            &runs.iter().map(|p| err(r.time_scale * p.predicted_step_s, p.measured_step_s)).collect::<Vec<_>>(),
        ),
        memory: median_or_nan(
            &runs
                .iter()
                .map(|p| err(r.memory_scale * p.predicted_peak_bytes, p.measured_peak_bytes))
                .collect::<Vec<_>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{HISTORY_VERSION, HistoryRecord};
    use crate::layout::{Layout, StageSplit, TrainConfig};
    use crate::model::resolve_model;
    use crate::platform::preset;
    use crate::run_plan::RunPlan;

    /// A run of `model` on `platform` whose measurement is `time` × and `memory` × the prediction.
    fn run(platform: &Platform, model: &str, mbs: u64, time: f64, memory: f64) -> HistoryRecord {
        let spec = resolve_model(model).unwrap();
        let cfg = TrainConfig { micro_batch_size: mbs, ..TrainConfig::new(64) };
        let split = StageSplit::even(spec.num_layers, 1);
        let c =
            price(&spec, platform, &Layout { pp: 1, ep: 1, dp: 1 }, &cfg, crate::comm::A2aAlgo::Flat, &split).unwrap();
        HistoryRecord {
            version: HISTORY_VERSION,
            unix_time_s: 1,
            step_time_median_s: time * c.step_time_s,
            peak_rss_bytes: memory * c.peak_memory_bytes,
            plan: RunPlan::from_candidate(&spec, &platform.name, 64, "bf16", &c),
            model: spec,
            config: cfg,
            cores: 2,
            node_ranks: 1,
            steps: 20,
            steal_share: None,
        }
    }

    #[test]
    fn recovers_a_known_slowdown_and_predicts_the_runs_after_it() {
        let p = preset("frontier").unwrap();
        let history: Vec<HistoryRecord> = [("tiny", 1), ("tiny", 4), ("tiny-qwen3", 2), ("tiny-deepseek", 3)]
            .iter()
            .map(|(m, mbs)| run(&p, m, *mbs, 1.3, 0.8))
            .collect();
        let (refined, report) = refine(&p, &history).unwrap();
        let r = refined.refinement.unwrap();
        assert!((r.time_scale - 1.3).abs() < 1e-9 && (r.memory_scale - 0.8).abs() < 1e-9, "{r:?}");
        assert_eq!((report.used, r.runs), (4, 4));
        assert!((report.before.step - 0.3 / 1.3).abs() < 1e-9 && (report.before.memory - 0.25).abs() < 1e-9);
        assert!(report.after.step < 1e-9 && report.after.memory < 1e-9, "{report:?}");
        let h = report.held_out.unwrap();
        assert_eq!((h.fitted_on, h.tried_on), (2, 2));
        assert!(h.after.step < 1e-9 && h.before.step > 0.2, "{h:?}");
        // The refined platform predicts the runs: priced afresh, the refined prediction is the measurement.
        let again = run(&refined, "tiny", 4, 1.0, 1.0);
        assert!((again.step_time_median_s / history[1].step_time_median_s - 1.0).abs() < 1e-9);
        assert!((again.peak_rss_bytes / history[1].peak_rss_bytes - 1.0).abs() < 1e-9);
        // Refining again is idempotent: the history is priced on the unrefined platform.
        let (twice, _) = refine(&refined, &history).unwrap();
        assert_eq!(twice.refinement, refined.refinement);
    }

    #[test]
    fn one_slow_run_does_not_move_the_median_and_other_runs_do_not_count() {
        let p = preset("frontier").unwrap();
        let mut history: Vec<HistoryRecord> = (1..=5).map(|mbs| run(&p, "tiny", mbs, 1.1, 1.0)).collect();
        history.push(run(&p, "tiny", 2, 3.0, 1.0));
        let mut other = run(&p, "tiny", 1, 9.0, 9.0);
        other.plan.platform = "nvlink-8".into();
        history.push(other);
        let mut stolen = run(&p, "tiny", 1, 9.0, 9.0);
        stolen.steal_share = Some(0.3);
        history.push(stolen);
        let (refined, report) = refine(&p, &history).unwrap();
        assert!((refined.refinement.unwrap().time_scale - 1.1).abs() < 1e-9);
        assert_eq!(report.used, 6);
        let reasons = describe(&report.skipped);
        assert!(reasons.contains("1 of platform `nvlink-8`") && reasons.contains("1 measured with over 5% steal"));
    }

    #[test]
    fn a_history_without_the_platform_says_so() {
        let p = preset("frontier").unwrap();
        let mut other = run(&p, "tiny", 1, 1.0, 1.0);
        other.plan.platform = "nvlink-8".into();
        let e = refine(&p, &[other]).unwrap_err().to_string();
        assert!(e.contains("no run of platform `frontier`") && e.contains("1 of platform `nvlink-8`"), "{e}");
        assert!(refine(&p, &[]).unwrap_err().to_string().contains("it is empty"));
    }

    #[test]
    fn only_the_recent_window_counts() {
        let p = preset("frontier").unwrap();
        let mut history: Vec<HistoryRecord> = (0..REFINE_WINDOW).map(|_| run(&p, "tiny", 1, 2.0, 1.0)).collect();
        history.splice(0..0, (0..REFINE_WINDOW).map(|_| run(&p, "tiny", 1, 1.0, 1.0)));
        let (refined, report) = refine(&p, &history).unwrap();
        assert_eq!(report.used, REFINE_WINDOW);
        assert!((refined.refinement.unwrap().time_scale - 2.0).abs() < 1e-9);
    }
}
