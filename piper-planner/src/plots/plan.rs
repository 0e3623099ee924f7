//! The planner's ranked layouts as a picture: predicted step time (left) and peak memory per GPU against
//! the GPU's memory (right), one bar per plan in rank order.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Chart, FONT, render, text};
use crate::error::{Error, Result};
use crate::limits::max_or_zero;
use crate::planner::PlanCandidate;

/// Plans drawn at most (the best ones).
pub const MAX_PLANS: usize = 30;

/// One plan's bar: its label, predicted step (s) and peak memory (GiB).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanBar {
    pub label: String,
    pub step_s: f64,
    pub memory_gib: f64,
}

impl PlanBar {
    /// `PP×EP×DP mbs·M schedule recompute a2a`.
    pub fn of(c: &PlanCandidate) -> Self {
        PlanBar {
            label: format!(
                "{}×{}×{} {}·{} {} {} {}",
                c.pp,
                c.ep,
                c.dp,
                c.micro_batch_size,
                c.num_micro_batches,
                c.schedule.name(),
                c.recompute.name(),
                c.all_to_all.name()
            ),
            step_s: c.step_time_s,
            memory_gib: c.peak_memory_bytes / (1u64 << 30) as f64,
        }
    }
}

/// The ranked plans of one request.
pub struct PlanChart {
    pub title: String,
    pub bars: Vec<PlanBar>,
    pub gpu_memory_gib: f64,
}

/// Writes `plan.png` and `plan.svg` into `dir` (created) for the best [`MAX_PLANS`] of `plans`.
pub fn plot_plans(plans: &[PlanCandidate], gpu_memory_gib: f64, title: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    if plans.is_empty() {
        return Err(Error::invalid("piper plan", "--plot", "there is no feasible plan to draw"));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::file(dir.display().to_string().escape_debug().to_string(), e.to_string()))?;
    let bars: Vec<PlanBar> = plans.iter().take(MAX_PLANS).map(PlanBar::of).collect();
    if let Some(b) = bars.iter().find(|b| !(b.step_s.is_finite() && b.memory_gib.is_finite())) {
        return Err(Error::invalid("piper plan", "--plot", format!("plan `{}` has no finite prediction", b.label)));
    }
    render(&PlanChart { title: title.to_string(), bars, gpu_memory_gib }, dir)
}

impl Chart for PlanChart {
    fn stem(&self) -> &str {
        "plan"
    }
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        area.fill(&WHITE).map_err(text)?;
        let area = area.titled(&self.title, (FONT, 18)).map_err(text)?;
        let (w, _) = area.dim_in_pixel();
        let (left, right) = area.split_horizontally(w * 3 / 5);
        let n = self.bars.len();
        let step_max = max_or_zero(self.bars.iter().map(|b| b.step_s)) * 1.1;
        let memory_max = max_or_zero(self.bars.iter().map(|b| b.memory_gib).chain([self.gpu_memory_gib])) * 1.1;
        let label = |y: &SegmentValue<usize>| match y {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => n
                .checked_sub(i + 1)
                .and_then(|rank| Some((rank, self.bars.get(rank)?)))
                .map_or(String::new(), |(rank, b)| format!("{} {}", rank + 1, b.label)),
            SegmentValue::Last => String::new(),
        };
        // Left: the step, best plan on top, with each plan's label.
        let mut chart = ChartBuilder::on(&left)
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(360)
            .build_cartesian_2d(0.0..step_max.max(1e-9), (0..n.saturating_sub(1)).into_segmented())
            .map_err(text)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&label)
            .x_desc("predicted step (s)")
            .label_style((FONT, 16))
            .draw()
            .map_err(text)?;
        let row = |i: usize| SegmentValue::Exact(n - 1 - i);
        let next = |i: usize| SegmentValue::Exact(n - i);
        let bars = self.bars.iter().enumerate().map(|(i, b)| {
            let color = if i == 0 { GREEN.filled() } else { BLUE.mix(0.6).filled() };
            let mut bar = Rectangle::new([(0.0, row(i)), (b.step_s, next(i))], color);
            bar.set_margin(3, 3, 0, 0);
            bar
        });
        chart.draw_series(bars).map_err(text)?;
        // Right: peak memory against the GPU's.
        let mut chart = ChartBuilder::on(&right)
            .margin(8)
            .margin_right(30)
            .x_label_area_size(36)
            .y_label_area_size(10)
            .build_cartesian_2d(0.0..memory_max.max(1e-9), (0..n.saturating_sub(1)).into_segmented())
            .map_err(text)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|_| String::new())
            .x_desc(format!("peak memory per GPU (GiB; dashed: the GPU's {:.0})", self.gpu_memory_gib))
            .label_style((FONT, 16))
            .draw()
            .map_err(text)?;
        let bars = self.bars.iter().enumerate().map(|(i, b)| {
            let mut bar =
                Rectangle::new([(0.0, row(i)), (b.memory_gib, next(i))], RGBColor(230, 140, 40).mix(0.8).filled());
            bar.set_margin(3, 3, 0, 0);
            bar
        });
        chart.draw_series(bars).map_err(text)?;
        let capacity = [(self.gpu_memory_gib, SegmentValue::Exact(0)), (self.gpu_memory_gib, SegmentValue::Last)];
        chart.draw_series(DashedLineSeries::new(capacity, 6, 4, BLACK.into())).map_err(text)?;
        Ok(())
    }
}
