//! Timelines as Chrome/Perfetto trace files (the JSON trace-event format, opened by ui.perfetto.dev or
//! chrome://tracing): a rank's trace made one process of the run's trace, the ranks' traces merged into
//! one file (one process per rank, clocks aligned), and the predicted timeline of a step's schedule in
//! the same format and with the same names, so the two lay side by side.

use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::schedule::{Op, Simulation};

/// The metadata event that carries a part's wall-clock start (microseconds since the Unix epoch), by
/// which [`merge`] aligns the ranks' clocks.
const CLOCK_EVENT: &str = "piper_clock";

/// A trace file's events: a JSON array (what a tracer writes) or an object with `traceEvents`.
pub fn read_events(path: &Path) -> Result<Vec<Value>> {
    let shown = || path.display().to_string().escape_debug().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(shown(), e.to_string()))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| Error::file(shown(), format!("not a trace (JSON trace events): {e}")))?;
    match doc {
        Value::Array(events) => Ok(events),
        Value::Object(mut o) => match o.remove("traceEvents") {
            Some(Value::Array(events)) => Ok(events),
            _ => Err(Error::file(shown(), "a trace object needs a `traceEvents` array")),
        },
        _ => Err(Error::file(shown(), "not a trace: expected an array of events or {\"traceEvents\": [...]}")),
    }
}

/// One rank's events as process `rank` named `name` (every event's `pid` set), led by the metadata
/// that names and orders the process and records its clock start.
pub fn rank_part(events: Vec<Value>, rank: usize, name: &str, clock_start_us: f64) -> Vec<Value> {
    let mut out = vec![
        json!({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": name}}),
        json!({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}}),
        json!({"ph": "M", "pid": rank, "name": CLOCK_EVENT, "args": {"start_us": clock_start_us}}),
    ];
    for mut e in events {
        if let Some(o) = e.as_object_mut() {
            o.insert("pid".into(), json!(rank));
        }
        out.push(e);
    }
    out
}

/// A part's wall-clock start, if it carries one (a run's rank does, a prediction does not).
fn clock(part: &[Value]) -> Option<f64> {
    part.iter().find(|e| e["ph"] == "M" && e["name"] == CLOCK_EVENT).and_then(|e| e["args"]["start_us"].as_f64())
}

/// Where the first training step of the clocked parts begins on the merged clock (a run's set-up comes
/// before it), if they hold a `step` span.
fn first_step_us(parts: &[Vec<Value>], earliest: f64) -> Option<f64> {
    let starts = parts.iter().filter_map(|p| clock(p).map(|c| (p, c - earliest))).flat_map(|(part, shift)| {
        part.iter()
            .filter(|e| e["name"] == "step" && (e["ph"] == "B" || e["ph"] == "X"))
            .filter_map(move |e| e["ts"].as_f64().map(|ts| ts + shift))
    });
    starts.fold(None, |min: Option<f64>, ts| Some(min.map_or(ts, |m| m.min(ts))))
}

/// Traces as one: parts that carry a clock start (a run's ranks) are shifted onto the earliest one's
/// clock; parts without one (a predicted step) start where the run's first step starts (at zero without
/// a run); a part whose processes are already taken (a second run, or a prediction beside a run) is
/// renumbered after the last.
pub fn merge(parts: Vec<Vec<Value>>) -> Result<Value> {
    let earliest = parts.iter().filter_map(|p| clock(p)).fold(f64::INFINITY, f64::min);
    let unclocked_start = first_step_us(&parts, earliest).unwrap_or(0.0);
    let mut taken = std::collections::BTreeSet::new();
    let mut all = Vec::new();
    for part in parts {
        let shift = clock(&part).map_or(unclocked_start, |c| c - earliest);
        let pids: std::collections::BTreeSet<u64> = part.iter().filter_map(|e| e["pid"].as_u64()).collect();
        let offset = if pids.iter().any(|p| taken.contains(p)) { taken.last().map_or(0, |l| l + 1) } else { 0 };
        taken.extend(pids.iter().map(|p| p + offset));
        for mut e in part {
            if let Some(ts) = e["ts"].as_f64() {
                e["ts"] = json!(ts + shift);
            }
            if let Some(pid) = e["pid"].as_u64() {
                e["pid"] = json!(pid + offset);
                if e["name"] == "process_sort_index" {
                    e["args"]["sort_index"] = json!(pid + offset);
                }
            }
            all.push(e);
        }
    }
    if all.is_empty() {
        return Err(Error::invalid("piper trace merge", "parts", "they hold no events"));
    }
    Ok(json!({"traceEvents": all, "displayTimeUnit": "ms"}))
}

/// The predicted timeline of one step: process `s` is stage `s`, with its forwards and backwards as the
/// schedule simulation placed them, then its gradient reduction and optimizer step (`tail_s[s]`).
/// Names are the runtime's span names (the schedule's instruction names).
pub fn predicted(sim: &Simulation, tail_s: &[(f64, f64)], label: &str) -> Value {
    let us = |s: f64| s * 1e6;
    let mut events = Vec::new();
    for (stage, ops) in sim.timeline.iter().enumerate() {
        let name = format!("stage {stage} ({label})");
        events.push(json!({"ph": "M", "pid": stage, "name": "process_name", "args": {"name": name}}));
        events.push(json!({"ph": "M", "pid": stage, "name": "process_sort_index", "args": {"sort_index": stage}}));
        for t in ops {
            let (name, i) = match t.op {
                Op::Forward(i) => ("forward", i),
                Op::Backward(i) => ("backward", i),
            };
            events.push(json!({"ph": "X", "pid": stage, "tid": 0, "name": name, "ts": us(t.start_s),
                "dur": us(t.end_s - t.start_s), "args": {"micro_batch": i}}));
        }
        let (reduce_s, optimizer_s) = tail_s.get(stage).copied().unwrap_or((0.0, 0.0));
        let start = sim.makespan_s;
        events.push(json!({"ph": "X", "pid": stage, "tid": 0, "name": "reduce_grads", "ts": us(start),
            "dur": us(reduce_s)}));
        events.push(json!({"ph": "X", "pid": stage, "tid": 0, "name": "optimizer_step", "ts": us(start + reduce_s),
            "dur": us(optimizer_s)}));
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// Writes a trace atomically.
pub fn write(path: &Path, trace: &Value) -> Result<()> {
    let text = serde_json::to_string(trace).expect("a trace serialises");
    crate::atomic::write_atomic(path, text.as_bytes())
        .map_err(|e| Error::file(path.display().to_string().escape_debug().to_string(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Schedule;
    use crate::schedule::{ops, simulate};

    /// Two ranks whose tracers started 1 ms apart: merged, each is its own process and the later one's
    /// events move 1 ms later; a prediction beside them keeps its times and takes the next processes.
    #[test]
    fn merged_parts_are_one_process_per_rank_on_one_clock() {
        let span = |ts: f64| json!({"ph": "X", "pid": 1, "tid": 1, "name": "forward", "ts": ts, "dur": 5.0});
        let a = rank_part(vec![span(10.0)], 0, "rank 0", 1_000_000.0);
        let b = rank_part(vec![span(10.0)], 1, "rank 1", 1_001_000.0);
        let merged = merge(vec![a.clone(), b.clone()]).unwrap();
        let events = merged["traceEvents"].as_array().unwrap();
        let xs: Vec<(u64, f64)> = events
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| (e["pid"].as_u64().unwrap(), e["ts"].as_f64().unwrap()))
            .collect();
        assert_eq!(xs, [(0, 10.0), (1, 1010.0)]);
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["rank 0", "rank 1"]);
        let predicted = vec![json!({"ph": "X", "pid": 0, "tid": 0, "name": "forward", "ts": 3.0, "dur": 1.0})];
        let side_by_side = merge(vec![a, b, predicted]).unwrap();
        let last = side_by_side["traceEvents"].as_array().unwrap().last().unwrap().clone();
        assert_eq!((last["pid"].as_u64(), last["ts"].as_f64()), (Some(2), Some(3.0)));
        assert!(merge(vec![vec![]]).is_err());
    }

    /// A predicted step beside a run starts where the run's first step starts (its set-up comes first),
    /// on the merged clock; the run's own events keep their times.
    #[test]
    fn a_prediction_starts_at_the_runs_first_step() {
        let step = |ts: f64| json!({"ph": "B", "pid": 1, "tid": 1, "name": "step", "ts": ts});
        let setup = json!({"ph": "X", "pid": 1, "tid": 1, "name": "setup", "ts": 0.0, "dur": 400.0});
        // Rank 1's tracer started 1 ms after rank 0's: its first step (200 µs on its clock) is at 1200 µs
        // on the merged clock, after rank 0's at 500 µs.
        let a = rank_part(vec![setup.clone(), step(500.0), step(900.0)], 0, "rank 0", 1_000_000.0);
        let b = rank_part(vec![setup, step(200.0)], 1, "rank 1", 1_001_000.0);
        let predicted = vec![
            json!({"ph": "X", "pid": 0, "tid": 0, "name": "forward", "ts": 0.0, "dur": 100.0}),
            json!({"ph": "X", "pid": 0, "tid": 0, "name": "backward", "ts": 100.0, "dur": 200.0}),
        ];
        let merged = merge(vec![a, b, predicted]).unwrap();
        let events = merged["traceEvents"].as_array().unwrap();
        let at = |name: &str| -> Vec<(u64, f64)> {
            events
                .iter()
                .filter(|e| e["name"] == name && e["ph"] != "M")
                .map(|e| (e["pid"].as_u64().unwrap(), e["ts"].as_f64().unwrap()))
                .collect()
        };
        assert_eq!(at("forward"), [(2, 500.0)]);
        assert_eq!(at("backward"), [(2, 600.0)]);
        assert_eq!(at("step"), [(0, 500.0), (0, 900.0), (1, 1200.0)]);
    }

    /// The predicted timeline holds every stage's ops in its schedule's order, none overlapping, and
    /// ends each stage with the reduction and the optimizer after the makespan.
    #[test]
    fn the_predicted_timeline_is_the_schedule_in_time() {
        let (pp, m) = (3usize, 4u64);
        let sim = simulate(Schedule::OneFOneB, m, &[1.0, 1.0, 1.5], &[2.0, 2.0, 3.0], &[0.1, 0.1]);
        let trace = predicted(&sim, &[(0.5, 0.25); 3], "predicted");
        let events = trace["traceEvents"].as_array().unwrap();
        for stage in 0..pp {
            let mine: Vec<&Value> = events.iter().filter(|e| e["pid"] == stage && e["ph"] == "X").collect();
            let order: Vec<Op> = mine
                .iter()
                .filter_map(|e| {
                    let i = e["args"]["micro_batch"].as_u64()?;
                    Some(if e["name"] == "forward" { Op::Forward(i) } else { Op::Backward(i) })
                })
                .collect();
            assert_eq!(order, ops(Schedule::OneFOneB, stage as u64, pp as u64, m), "stage {stage}");
            for w in mine.windows(2) {
                let end = w[0]["ts"].as_f64().unwrap() + w[0]["dur"].as_f64().unwrap();
                assert!(w[1]["ts"].as_f64().unwrap() >= end - 1e-6, "stage {stage}: {w:?}");
            }
            let last = mine.last().unwrap();
            assert_eq!(last["name"], "optimizer_step");
            let end = last["ts"].as_f64().unwrap() + last["dur"].as_f64().unwrap();
            assert!((end - (sim.makespan_s + 0.75) * 1e6).abs() < 1e-6);
        }
    }
}
