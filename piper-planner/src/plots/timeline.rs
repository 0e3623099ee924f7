//! A timeline as a picture: the spans of a Chrome/Perfetto trace (a run's `--trace`, `piper predict
//! --trace`, or both merged) as bars, one row per process, coloured by what they are (forward, backward,
//! pipeline transfers, expert exchanges, gradient reduction, optimizer), nested spans drawn thinner
//! inside their parents.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use super::{Chart, FONT, render, text};
use crate::error::{Error, Result};

/// One span of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub process: u64,
    pub name: String,
    /// Milliseconds from the trace's start.
    pub start_ms: f64,
    pub end_ms: f64,
    /// Nesting depth inside the process's thread (0: outermost).
    pub depth: usize,
}

/// The spans of trace events: complete events (`X`) and begin/end pairs (`B`/`E`) per process and
/// thread; an end without its begin is refused, a begin without an end (a run that stopped) dropped.
pub fn spans(events: &[Value]) -> Result<Vec<Span>> {
    let mut open: BTreeMap<(u64, u64), Vec<(String, f64)>> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        let (Some(ph), Some(ts)) = (e["ph"].as_str(), e["ts"].as_f64()) else { continue };
        let key = (e["pid"].as_u64().unwrap_or(0), e["tid"].as_u64().unwrap_or(0));
        let name = e["name"].as_str().unwrap_or("").to_string();
        match ph {
            "X" => {
                let depth = open.get(&key).map_or(0, Vec::len);
                let end = ts + e["dur"].as_f64().unwrap_or(0.0);
                out.push(Span { process: key.0, name, start_ms: ts / 1e3, end_ms: end / 1e3, depth });
            }
            "B" => open.entry(key).or_default().push((name, ts)),
            "E" => {
                let stack = open.entry(key).or_default();
                let (name, begin) = stack.pop().ok_or_else(|| {
                    Error::invalid("trace", "events", format!("an end of `{}` without its begin", name.escape_debug()))
                })?;
                let depth = stack.len();
                out.push(Span { process: key.0, name, start_ms: begin / 1e3, end_ms: ts / 1e3, depth });
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A process name short enough for the row labels: the grid's words abbreviated (`rank 1: stage 0,
/// expert rank 1, data replica 0` → `rank 1: PP 0, EP 1, DP 0`), at most 34 characters.
fn short(name: &str) -> String {
    let name = name.replace("stage ", "PP ").replace("expert rank ", "EP ").replace("data replica ", "DP ");
    name.chars().take(34).collect()
}

/// The colour of a span by its name.
fn colour(name: &str) -> RGBColor {
    match name {
        "forward" => RGBColor(66, 133, 244),
        "backward" => RGBColor(244, 160, 0),
        "recv_activation" | "send_activation" | "recv_grad" | "send_grad" => RGBColor(160, 160, 160),
        "expert_exchange" => RGBColor(219, 68, 55),
        "reduce_grads" => RGBColor(15, 157, 88),
        "optimizer_step" => RGBColor(142, 36, 170),
        "step" => RGBColor(230, 230, 230),
        _ => RGBColor(120, 144, 156),
    }
}

/// The named timeline of a trace's processes.
pub struct TimelineChart {
    pub title: String,
    pub spans: Vec<Span>,
    /// Row labels, by process.
    pub processes: BTreeMap<u64, String>,
    /// The time axis, milliseconds (default: the spans').
    pub window_ms: Option<(f64, f64)>,
}

/// Draws `timeline.png` and `timeline.svg` into `dir` from trace events, between `window_ms` (default:
/// the whole trace).
pub fn plot_timeline(events: &[Value], window_ms: Option<(f64, f64)>, title: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut all = spans(events)?;
    if let Some((from, to)) = window_ms {
        all.retain(|s| s.end_ms > from && s.start_ms < to);
    }
    if all.is_empty() {
        return Err(Error::invalid("piper trace plot", "--window", "no span falls in it (or the trace has none)"));
    }
    let mut processes: BTreeMap<u64, String> =
        all.iter().map(|s| (s.process, format!("process {}", s.process))).collect();
    for e in events.iter().filter(|e| e["ph"] == "M" && e["name"] == "process_name") {
        if let (Some(pid), Some(name)) = (e["pid"].as_u64(), e["args"]["name"].as_str()) {
            processes.entry(pid).and_modify(|n| *n = name.to_string());
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::file(dir.display().to_string().escape_debug().to_string(), e.to_string()))?;
    render(&TimelineChart { title: title.to_string(), spans: all, processes, window_ms }, dir)
}

impl Chart for TimelineChart {
    fn stem(&self) -> &str {
        "timeline"
    }
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        area.fill(&WHITE).map_err(text)?;
        let rows: Vec<u64> = self.processes.keys().copied().collect();
        let n = rows.len();
        let (from, to) = self.window_ms.unwrap_or_else(|| {
            let from = self.spans.iter().map(|s| s.start_ms).fold(f64::INFINITY, f64::min);
            (from, self.spans.iter().map(|s| s.end_ms).fold(f64::NEG_INFINITY, f64::max).max(from + 1e-6))
        });
        let label = |y: &SegmentValue<usize>| match y {
            SegmentValue::CenterOf(i) => n
                .checked_sub(i + 1)
                .and_then(|r| self.processes.get(&rows[r]))
                .map_or(String::new(), |name| short(name)),
            _ => String::new(),
        };
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FONT, 18))
            .margin(12)
            .margin_right(200)
            .x_label_area_size(44)
            .y_label_area_size(330)
            .build_cartesian_2d(from..to, (0..n.saturating_sub(1)).into_segmented())
            .map_err(text)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&label)
            .x_desc("time (ms)")
            .label_style((FONT, 16))
            .draw()
            .map_err(text)?;
        let row_of = |pid: u64| rows.iter().position(|p| *p == pid).map_or(0, |r| n - 1 - r);
        let mut ordered: Vec<&Span> = self.spans.iter().collect();
        ordered.sort_by_key(|s| s.depth);
        let bars = ordered.into_iter().map(|s| {
            let r = row_of(s.process);
            let (start, end) = (s.start_ms.max(from), s.end_ms.min(to));
            let mut bar = Rectangle::new(
                [(start, SegmentValue::Exact(r)), (end, SegmentValue::Exact(r + 1))],
                colour(&s.name).filled(),
            );
            let inset = (4 + 6 * s.depth).min(40) as u32;
            bar.set_margin(inset, inset, 0, 0);
            bar
        });
        chart.draw_series(bars).map_err(text)?;
        // The legend, in the right margin.
        let x = area.dim_in_pixel().0 as i32 - 190;
        let names = ["forward", "backward", "send_activation", "expert_exchange", "reduce_grads", "optimizer_step"];
        for (i, name) in names.into_iter().enumerate() {
            let y = 50 + 24 * i as i32;
            area.draw(&Rectangle::new([(x, y), (x + 14, y + 12)], colour(name).filled())).map_err(text)?;
            let label = if name == "send_activation" { "pipeline transfers" } else { name };
            area.draw(&Text::new(label, (x + 20, y - 2), (FONT, 15))).map_err(text)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(ph: &str, pid: u64, name: &str, ts: f64) -> Value {
        json!({"ph": ph, "pid": pid, "tid": 0, "name": name, "ts": ts})
    }

    /// Begin/end pairs nest; complete events take their duration; an end without a begin is refused.
    #[test]
    fn spans_pair_begins_and_ends_per_thread() {
        let events = vec![
            event("B", 0, "step", 0.0),
            event("B", 0, "forward", 1000.0),
            event("B", 1, "forward", 1500.0),
            event("E", 0, "forward", 3000.0),
            event("E", 1, "forward", 2500.0),
            event("E", 0, "step", 4000.0),
            json!({"ph": "X", "pid": 2, "tid": 0, "name": "backward", "ts": 500.0, "dur": 250.0}),
        ];
        let got = spans(&events).unwrap();
        let find = |p: u64, n: &str| got.iter().find(|s| s.process == p && s.name == n).unwrap().clone();
        assert_eq!((find(0, "forward").start_ms, find(0, "forward").end_ms, find(0, "forward").depth), (1.0, 3.0, 1));
        assert_eq!((find(0, "step").depth, find(1, "forward").end_ms), (0, 2.5));
        assert_eq!((find(2, "backward").start_ms, find(2, "backward").end_ms), (0.5, 0.75));
        assert!(spans(&[event("E", 0, "x", 1.0)]).is_err());
    }

    /// Drawn: process 0's forward (blue) is where its time says, in the upper row; process 1's
    /// backward (orange) in the lower row, later.
    #[test]
    fn the_timeline_puts_each_span_in_its_row_at_its_time() {
        let events = vec![
            json!({"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "rank 0"}}),
            json!({"ph": "X", "pid": 0, "tid": 0, "name": "forward", "ts": 0.0, "dur": 40_000.0}),
            json!({"ph": "X", "pid": 1, "tid": 0, "name": "backward", "ts": 60_000.0, "dur": 40_000.0}),
        ];
        let dir = std::env::temp_dir().join(format!("piper-timeline-{}", std::process::id()));
        plot_timeline(&events, None, "test", &dir).unwrap();
        let decoder = png::Decoder::new(std::fs::File::open(dir.join("timeline.png")).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut rgb = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut rgb).unwrap();
        let where_is = |c: RGBColor| -> (Vec<u32>, Vec<u32>) {
            let hits: Vec<(u32, u32)> = (0..info.height)
                .flat_map(|y| (0..info.width).map(move |x| (x, y)))
                .filter(|(x, y)| {
                    let i = ((y * info.width + x) * 3) as usize;
                    (rgb[i], rgb[i + 1], rgb[i + 2]) == (c.0, c.1, c.2)
                })
                .collect();
            (hits.iter().map(|h| h.0).collect(), hits.iter().map(|h| h.1).collect())
        };
        let (fx, fy) = where_is(colour("forward"));
        let (bx, by) = where_is(colour("backward"));
        // The legend's swatches are small; the bars are most of the pixels.
        let median = |v: &[u32]| {
            let mut v = v.to_vec();
            v.sort();
            v[v.len() / 2]
        };
        assert!(fx.len() > 1000 && bx.len() > 1000);
        assert!(median(&fx) < median(&bx), "forward before backward in time");
        assert!(median(&fy) < median(&by), "process 0 above process 1");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
