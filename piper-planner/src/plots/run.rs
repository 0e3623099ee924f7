//! A training run's pictures, from its metrics (the `--metrics` JSON lines): the loss (training, held
//! out, and the best possible where known), throughput (tokens/s and MFU), the expert load of every MoE
//! layer over the steps (a heat map), and the expert-parallel ranks' imbalance with the migrations.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use super::{Chart, FONT, padded, render, text};
use crate::error::{Error, Result};

/// Columns of the heat map at most (longer runs are averaged into this many bins).
const MAX_BINS: usize = 400;

/// What the pictures of a run show, one entry per step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunSeries {
    pub steps: Vec<f64>,
    pub loss: Vec<f64>,
    /// (step, held-out loss) where an evaluation ran.
    pub eval: Vec<(f64, f64)>,
    pub best_loss: Option<f64>,
    pub tokens_per_s: Vec<f64>,
    pub mfu: Vec<f64>,
    /// Max / mean tokens per expert, per step and MoE layer.
    pub expert_load: Vec<Vec<f64>>,
    /// Max / mean tokens per expert-parallel rank, per step and MoE layer.
    pub rank_imbalance: Vec<Vec<f64>>,
    /// Steps after which experts migrated.
    pub migrations: Vec<f64>,
}

impl RunSeries {
    /// The series of metrics lines (what `--metrics` writes); `source` names them in errors.
    pub fn from_metrics(lines: &[Value], best_loss: Option<f64>, source: &str) -> Result<Self> {
        let mut s = RunSeries { best_loss, ..Default::default() };
        for (i, line) in lines.iter().enumerate() {
            let field = |key: &str| -> Result<f64> {
                line[key].as_f64().ok_or_else(|| {
                    Error::invalid(
                        source,
                        format!("line {} `{key}`", i + 1),
                        "is missing or not a number (a --metrics file?)",
                    )
                })
            };
            let list = |key: &str| -> Vec<f64> {
                line[key].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
            };
            let step = field("step")?;
            s.steps.push(step);
            s.loss.push(field("loss")?);
            s.tokens_per_s.push(field("tokens_per_s")?);
            s.mfu.push(field("mfu")?);
            s.expert_load.push(list("expert_load"));
            s.rank_imbalance.push(list("rank_load_max_mean"));
            if let Some(e) = line["eval_loss"].as_f64() {
                s.eval.push((step, e));
            }
            if line["migration"].as_array().is_some_and(|m| !m.is_empty()) {
                s.migrations.push(step);
            }
        }
        if s.steps.is_empty() {
            return Err(Error::invalid(source, "lines", "there are no steps to draw"));
        }
        Ok(s)
    }

    /// Reads a `--metrics` JSON-lines file.
    pub fn read(path: &Path, best_loss: Option<f64>) -> Result<Self> {
        let shown = path.display().to_string().escape_debug().to_string();
        let body = std::fs::read_to_string(path).map_err(|e| Error::file(shown.clone(), e.to_string()))?;
        let lines = body
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| Error::file(shown.clone(), format!("line {}: not JSON ({e})", i + 1)))
            })
            .collect::<Result<Vec<Value>>>()?;
        Self::from_metrics(&lines, best_loss, &shown)
    }

    fn step_range(&self) -> std::ops::Range<f64> {
        let first = self.steps.first().copied().unwrap_or(0.0);
        let last = self.steps.last().copied().unwrap_or(0.0);
        first..(last + 1.0).max(first + 1.0)
    }

    fn layers(&self) -> usize {
        self.expert_load.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// Writes `loss`, `throughput`, `expert_load` and `imbalance` as PNG and SVG into `dir` (created);
/// returns the files.
pub fn plot_run(series: &RunSeries, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::file(dir.display().to_string().escape_debug().to_string(), e.to_string()))?;
    let mut out = render(&LossChart(series), dir)?;
    out.extend(render(&ThroughputChart(series), dir)?);
    out.extend(render(&LoadHeatMap(series), dir)?);
    out.extend(render(&ImbalanceChart(series), dir)?);
    Ok(out)
}

/// Training and held-out loss over the steps, and the best possible loss.
pub struct LossChart<'a>(pub &'a RunSeries);

impl Chart for LossChart<'_> {
    fn stem(&self) -> &str {
        "loss"
    }
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let s = self.0;
        area.fill(&WHITE).map_err(text)?;
        let y = padded(s.loss.iter().copied().chain(s.eval.iter().map(|e| e.1)).chain(s.best_loss));
        let mut chart = ChartBuilder::on(area)
            .caption("loss", (FONT, 22))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(s.step_range(), y)
            .map_err(text)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("cross-entropy (nats)")
            .label_style((FONT, 16))
            .draw()
            .map_err(text)?;
        let train = s.steps.iter().copied().zip(s.loss.iter().copied());
        chart
            .draw_series(LineSeries::new(train, BLUE.stroke_width(2)))
            .map_err(text)?
            .label("training")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        if !s.eval.is_empty() {
            chart
                .draw_series(LineSeries::new(s.eval.iter().copied(), RED.stroke_width(2)).point_size(4))
                .map_err(text)?
                .label("held out")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
        }
        if let Some(best) = s.best_loss {
            let r = s.step_range();
            chart
                .draw_series(DashedLineSeries::new([(r.start, best), (r.end, best)], 8, 5, BLACK.into()))
                .map_err(text)?
                .label("best possible")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(text)
    }
}

/// Tokens per second (top) and MFU (bottom) over the steps.
pub struct ThroughputChart<'a>(pub &'a RunSeries);

impl Chart for ThroughputChart<'_> {
    fn stem(&self) -> &str {
        "throughput"
    }
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let s = self.0;
        area.fill(&WHITE).map_err(text)?;
        let (top, bottom) = area.split_vertically(area.dim_in_pixel().1 / 2);
        let mfu_pct: Vec<f64> = s.mfu.iter().map(|m| 100.0 * m).collect();
        for (panel, values, caption, color) in
            [(&top, &s.tokens_per_s, "tokens/s", BLUE), (&bottom, &mfu_pct, "MFU (%)", GREEN)]
        {
            let mut chart = ChartBuilder::on(panel)
                .caption(caption, (FONT, 18))
                .margin(10)
                .x_label_area_size(46)
                .y_label_area_size(70)
                .build_cartesian_2d(s.step_range(), padded(values.iter().copied()))
                .map_err(text)?;
            chart
                .configure_mesh()
                .x_desc("step")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| if y.abs() >= 100.0 { format!("{y:.0}") } else { format!("{y:.2}") })
                .label_style((FONT, 16))
                .draw()
                .map_err(text)?;
            let points = s.steps.iter().copied().zip(values.iter().copied());
            chart.draw_series(LineSeries::new(points, color.stroke_width(2))).map_err(text)?;
        }
        Ok(())
    }
}

/// Expert load (max / mean tokens per expert) of every MoE layer over the steps: white is balanced,
/// dark red the run's most loaded; long runs are averaged into at most [`MAX_BINS`] columns.
pub struct LoadHeatMap<'a>(pub &'a RunSeries);

impl LoadHeatMap<'_> {
    /// (first step, last step + 1, mean load per layer) of each column.
    fn columns(&self) -> Vec<(f64, f64, Vec<f64>)> {
        let s = self.0;
        let n = s.steps.len();
        let per = n.div_ceil(MAX_BINS).max(1);
        (0..n)
            .step_by(per)
            .map(|start| {
                let end = (start + per).min(n);
                let loads = (0..s.layers())
                    .map(|l| {
                        let v: Vec<f64> = (start..end).filter_map(|i| s.expert_load[i].get(l).copied()).collect();
                        if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 }
                    })
                    .collect();
                (s.steps[start], s.steps[end - 1] + 1.0, loads)
            })
            .collect()
    }
}

/// White at `1` (balanced) to dark red at `max`.
fn heat(v: f64, max: f64) -> RGBColor {
    if !v.is_finite() {
        return RGBColor(200, 200, 200);
    }
    let t = if max > 1.0 { ((v - 1.0) / (max - 1.0)).clamp(0.0, 1.0) } else { 0.0 };
    let fade = |from: f64, to: f64| (from + (to - from) * t).round() as u8;
    RGBColor(fade(255.0, 150.0), fade(255.0, 0.0), fade(255.0, 0.0))
}

impl Chart for LoadHeatMap<'_> {
    fn stem(&self) -> &str {
        "expert_load"
    }
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let s = self.0;
        area.fill(&WHITE).map_err(text)?;
        let layers = s.layers().max(1);
        let max = s.expert_load.iter().flatten().copied().filter(|v| v.is_finite()).fold(1.0, f64::max);
        let caption = format!("expert load per MoE layer (max/mean tokens per expert: white 1.00, dark red {max:.2})");
        let mut chart = ChartBuilder::on(area)
            .caption(caption, (FONT, 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(s.step_range(), (0..layers - 1).into_segmented())
            .map_err(text)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("MoE layer")
            .y_labels(layers.min(16))
            .y_label_formatter(&|y| match y {
                SegmentValue::CenterOf(l) => l.to_string(),
                _ => String::new(),
            })
            .label_style((FONT, 16))
            .draw()
            .map_err(text)?;
        let cells = self.columns().into_iter().flat_map(|(x0, x1, loads)| {
            loads.into_iter().enumerate().map(move |(l, v)| {
                Rectangle::new([(x0, SegmentValue::Exact(l)), (x1, SegmentValue::Exact(l + 1))], heat(v, max).filled())
            })
        });
        chart.draw_series(cells).map_err(text)?;
        Ok(())
    }
}

/// Max / mean tokens per expert-parallel rank of every MoE layer over the steps, with a dashed line at
/// each migration.
pub struct ImbalanceChart<'a>(pub &'a RunSeries);

impl Chart for ImbalanceChart<'_> {
    fn stem(&self) -> &str {
        "imbalance"
    }
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let s = self.0;
        area.fill(&WHITE).map_err(text)?;
        let y = padded(s.rank_imbalance.iter().flatten().copied().chain([1.0]));
        let mut chart = ChartBuilder::on(area)
            .caption("expert-parallel rank imbalance (max/mean tokens per rank) and migrations", (FONT, 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(s.step_range(), y.clone())
            .map_err(text)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("max / mean")
            .label_style((FONT, 16))
            .draw()
            .map_err(text)?;
        let layers = s.rank_imbalance.iter().map(Vec::len).max().unwrap_or(0);
        for l in 0..layers {
            let color = Palette99::pick(l).to_rgba();
            let points = s.steps.iter().zip(&s.rank_imbalance).filter_map(|(x, v)| v.get(l).map(|v| (*x, *v)));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(text)?
                .label(format!("layer {l}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        for step in &s.migrations {
            let line = [(*step + 1.0, y.start), (*step + 1.0, y.end)];
            chart.draw_series(DashedLineSeries::new(line, 6, 4, BLACK.into())).map_err(text)?;
        }
        if layers > 0 {
            chart
                .configure_series_labels()
                .label_font((FONT, 16))
                .background_style(WHITE.mix(0.85))
                .draw()
                .map_err(text)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(step: usize, loads: [f64; 2]) -> Value {
        json!({"step": step, "loss": 5.0 - step as f64 * 0.01, "tokens_per_s": 1000.0, "mfu": 0.05,
               "expert_load": loads, "rank_load_max_mean": [1.1, 1.3]})
    }

    /// The PNG's pixels: width, height, RGB rows.
    fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        (info.width, info.height, buf)
    }

    /// Layer 1 hot (3× the mean on its busiest expert), layer 0 balanced: in the heat map the upper row
    /// (layer 1) is dark red across the steps and the lower row (layer 0) white.
    #[test]
    fn the_heat_map_puts_each_layers_load_in_its_row() {
        let lines: Vec<Value> = (0..50).map(|s| line(s, [1.0, 3.0])).collect();
        let series = RunSeries::from_metrics(&lines, Some(0.9), "test").unwrap();
        let dir = std::env::temp_dir().join(format!("piper-plots-{}", std::process::id()));
        let files = plot_run(&series, &dir).unwrap();
        assert_eq!(files.len(), 8);
        let (w, h, rgb) = decode(&dir.join("expert_load.png"));
        assert_eq!((w, h), super::super::SIZE);
        let px = |x: u32, y: u32| {
            let i = ((y * w + x) * 3) as usize;
            (rgb[i], rgb[i + 1], rgb[i + 2])
        };
        let red = |(r, g, b): (u8, u8, u8)| r > 120 && g < 40 && b < 40;
        let x = w / 2;
        let red_rows: Vec<u32> = (0..h).filter(|y| red(px(x, *y))).collect();
        assert!(!red_rows.is_empty(), "no dark red in the middle column");
        let (top, bottom) = (red_rows[0], *red_rows.last().unwrap());
        assert!(bottom < h / 2 + 10 && bottom - top > h / 4, "layer 1's row is the upper half: {top}..{bottom}");
        let below = px(x, bottom + (h - bottom) / 2);
        assert!(below.0 > 240 && below.1 > 240 && below.2 > 240, "layer 0 balanced is white: {below:?}");
        let svg = std::fs::read_to_string(dir.join("loss.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("training") && svg.contains("best possible"), "{svg:.200}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file that is not a metrics file is refused naming the line and the field; no steps, no pictures.
    #[test]
    fn metrics_without_the_fields_are_refused_by_line() {
        let e = RunSeries::from_metrics(&[line(0, [1.0, 1.0]), json!({"step": 1})], None, "m.jsonl").unwrap_err();
        assert!(e.to_string().contains("line 2 `loss`"), "{e}");
        assert!(RunSeries::from_metrics(&[], None, "m.jsonl").is_err());
        let series = RunSeries::from_metrics(
            &[json!({"step": 0, "loss": 3.0, "tokens_per_s": 1.0, "mfu": 0.1, "eval_loss": 3.2, "migration": [{"layer": 0}]})],
            None,
            "m.jsonl",
        )
        .unwrap();
        assert_eq!((series.eval, series.migrations), (vec![(0.0, 3.2)], vec![0.0]));
    }
}
