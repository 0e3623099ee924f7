//! `--profile`: where the steady steps' time goes — per phase of the schedule (forward, backward,
//! gradient reduction and clipping, optimizer, pipeline transfers) and, inside each, per fused operation
//! the host kernels book ([`kernels_cubecl::profile`]: linear layers, grouped experts, attention, …)
//! with its achieved GFLOP/s. What a phase spends outside those operations — Burn's own tensor ops
//! (norms, residual adds, routing, gathers) and the autodiff graph — is its "other" row.

use kernels_cubecl::profile::{self, OpRecord};

/// The op name under which a phase books its own wall time.
const PHASE_TOTAL: &str = "(phase)";

/// Turns the booking on for this process (off by default: one atomic load per kernel call).
pub fn enable() {
    profile::enable(true);
}

/// Whether this run profiles.
pub fn enabled() -> bool {
    profile::enabled()
}

/// Books the wall time of one schedule phase until the guard drops, and the kernels called meanwhile
/// under that phase.
pub fn phase(name: &'static str) -> profile::OpGuard {
    profile::set_phase(name);
    profile::op(PHASE_TOTAL, 0.0)
}

/// Starts the profiled window (the steady steps): forgets what warm-up booked.
pub fn start_window() {
    profile::reset();
}

/// The profiled steps of one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct StepProfile {
    pub steps: usize,
    /// Wall seconds of those steps.
    pub step_seconds: f64,
    pub rows: Vec<OpRecord>,
}

impl StepProfile {
    /// What was booked since [`start_window`], over `steps` steps that took `step_seconds`.
    pub fn collect(steps: usize, step_seconds: f64) -> Self {
        StepProfile { steps, step_seconds, rows: profile::snapshot() }
    }

    /// The table: one block per phase (its total, then its operations by time, then "other"), and the
    /// part of the step outside every phase.
    pub fn table(&self) -> Vec<String> {
        let steps = self.steps.max(1) as f64;
        let step_ms = 1e3 * self.step_seconds / steps;
        let pct = |ms: f64| if step_ms > 0.0 { 100.0 * ms / step_ms } else { f64::NAN };
        let mut out = vec![
            format!("profile: {} steady steps, {step_ms:.1} ms per step (wall time on the calling thread)", self.steps),
            format!(
                "{:<10} {:<16} {:>10} {:>9} {:>7} {:>9}",
                "phase", "operation", "calls/step", "ms/step", "% step", "GFLOP/s"
            ),
        ];
        let mut phases: Vec<&str> = self.rows.iter().map(|r| r.phase).collect();
        phases.dedup();
        let mut in_phases = 0.0;
        for phase in phases {
            let rows: Vec<&OpRecord> = self.rows.iter().filter(|r| r.phase == phase).collect();
            let Some(total) = rows.iter().find(|r| r.op == PHASE_TOTAL) else { continue };
            let phase_ms = 1e3 * total.total.seconds / steps;
            in_phases += phase_ms;
            out.push(format!(
                "{phase:<10} {:<16} {:>10} {phase_ms:>9.1} {:>7.1} {:>9}",
                "(all)",
                "",
                pct(phase_ms),
                ""
            ));
            let mut ops: Vec<&&OpRecord> = rows.iter().filter(|r| r.op != PHASE_TOTAL).collect();
            ops.sort_by(|a, b| b.total.seconds.total_cmp(&a.total.seconds));
            let mut ops_ms = 0.0;
            for r in ops {
                let ms = 1e3 * r.total.seconds / steps;
                ops_ms += ms;
                let gflops = if r.total.flops > 0.0 && r.total.seconds > 0.0 {
                    format!("{:.1}", r.total.flops / r.total.seconds / 1e9)
                } else {
                    "-".into()
                };
                let calls = r.total.calls as f64 / steps;
                out.push(format!("{:<10} {:<16} {calls:>10.1} {ms:>9.1} {:>7.1} {gflops:>9}", "", r.op, pct(ms)));
            }
            let other = phase_ms - ops_ms;
            out.push(format!("{:<10} {:<16} {:>10} {other:>9.1} {:>7.1} {:>9}", "", "other", "", pct(other), ""));
        }
        let outside = step_ms - in_phases;
        out.push(format!("{:<10} {:<16} {:>10} {outside:>9.1} {:>7.1} {:>9}", "outside", "", "", pct(outside), ""));
        out
    }

    /// The table's rows as data, seconds per step: each phase's operations and its `other`, and the
    /// step's `outside` (what `piper calibrate` fits the step costs from).
    pub fn per_step(&self) -> Vec<ProfileRow> {
        let steps = self.steps.max(1) as f64;
        let mut out = Vec::new();
        let mut phases: Vec<&str> = self.rows.iter().map(|r| r.phase).collect();
        phases.dedup();
        let mut in_phases = 0.0;
        for phase in phases {
            let rows: Vec<&OpRecord> = self.rows.iter().filter(|r| r.phase == phase).collect();
            let Some(total) = rows.iter().find(|r| r.op == PHASE_TOTAL) else { continue };
            let phase_s = total.total.seconds / steps;
            in_phases += phase_s;
            let mut ops_s = 0.0;
            for r in rows.iter().filter(|r| r.op != PHASE_TOTAL) {
                ops_s += r.total.seconds / steps;
                out.push(ProfileRow { phase: phase.into(), op: r.op.into(), seconds: r.total.seconds / steps });
            }
            out.push(ProfileRow { phase: phase.into(), op: "other".into(), seconds: phase_s - ops_s });
        }
        out.push(ProfileRow {
            phase: "outside".into(),
            op: "other".into(),
            seconds: self.step_seconds / steps - in_phases,
        });
        out
    }
}

/// One row of a step's profile: seconds per step of an operation in a phase.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileRow {
    pub phase: String,
    pub op: String,
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_cubecl::profile::OpTotal;

    fn row(phase: &'static str, op: &'static str, calls: u64, seconds: f64, flops: f64) -> OpRecord {
        OpRecord { phase, op, total: OpTotal { calls, seconds, flops } }
    }

    #[test]
    fn the_table_splits_each_phase_into_its_operations_and_the_rest() {
        // Two steps of 100 ms: forward 60 ms a step (linear 20 ms at 2 GFLOP a step), optimizer 30 ms.
        let p = StepProfile {
            steps: 2,
            step_seconds: 0.2,
            rows: vec![
                row("forward", PHASE_TOTAL, 2, 0.12, 0.0),
                row("forward", "linear", 8, 0.04, 4e9),
                row("optimizer", PHASE_TOTAL, 2, 0.06, 0.0),
            ],
        };
        let t = p.table();
        let find = |needle: &str| t.iter().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {t:#?}"));
        let cols = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(cols(find("linear")), ["linear", "4.0", "20.0", "20.0", "100.0"]);
        // forward: 60 − 20; optimizer: 30 − 0; outside: 100 − 90.
        let others: Vec<_> = t.iter().filter(|l| l.contains("other")).map(|l| cols(l)).collect();
        assert_eq!(others, [["other", "40.0", "40.0"], ["other", "30.0", "30.0"]]);
        assert_eq!(cols(find("outside")), ["outside", "10.0", "10.0"]);
    }
}
