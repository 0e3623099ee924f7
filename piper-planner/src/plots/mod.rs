//! Pictures of runs and plans, as PNG and SVG, drawn with `plotters` and a font bundled with the binary
//! (no system fonts needed): [`run`] draws a training run from its metrics, [`plan`] the layouts the
//! planner ranked, [`timeline`] a trace's spans.

pub mod plan;
pub mod run;
pub mod timeline;

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

/// The picture size, pixels.
pub const SIZE: (u32, u32) = (1200, 675);

/// The family every chart's text uses, registered once from the bundled font (Hack, from
/// `epaint_default_fonts`). Text is drawn at 15 px or more: plotters' glyph placement rounds each glyph's
/// offset, which shows at smaller sizes.
pub const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A valid TrueType font shipped with the crate: registration cannot fail for it.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR);
    });
}

/// A chart drawable on any backend.
pub trait Chart {
    /// The file name without extension.
    fn stem(&self) -> &str;
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> std::result::Result<(), String>;
}

/// Draws `chart` into `dir/STEM.png` and `dir/STEM.svg` (atomic writes); returns both paths.
pub fn render<C: Chart>(chart: &C, dir: &Path) -> Result<Vec<PathBuf>> {
    register_font();
    let (w, h) = SIZE;
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let area = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
        chart.draw(&area).map_err(|e| drawing_error(chart, e))?;
        area.present().map_err(|e| drawing_error(chart, e.to_string()))?;
    }
    let mut svg = String::new();
    {
        let area = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        chart.draw(&area).map_err(|e| drawing_error(chart, e))?;
        area.present().map_err(|e| drawing_error(chart, e.to_string()))?;
    }
    let png_path = dir.join(format!("{}.png", chart.stem()));
    let svg_path = dir.join(format!("{}.svg", chart.stem()));
    write(&png_path, &encode_png(&rgb, SIZE))?;
    write(&svg_path, svg.as_bytes())?;
    Ok(vec![png_path, svg_path])
}

fn drawing_error<C: Chart>(chart: &C, why: String) -> Error {
    Error::invalid("plots", chart.stem(), format!("could not be drawn: {why}"))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::atomic::write_atomic(path, bytes)
        .map_err(|e| Error::file(path.display().to_string().escape_debug().to_string(), e.to_string()))
}

/// An 8-bit RGB buffer as PNG bytes.
fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Best);
    encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    // Writing into memory cannot fail for a buffer of the right size.
    let mut writer = encoder.write_header().expect("PNG header into memory");
    writer.write_image_data(rgb).expect("PNG data into memory");
    writer.finish().expect("PNG end into memory");
    out
}

/// The range `lo..hi` padded by 5% (a flat series gets ±1 or ±5%), so lines do not sit on the frame.
pub fn padded(values: impl IntoIterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = if hi > lo { 0.05 * (hi - lo) } else { (0.05 * lo.abs()).max(1e-9) };
    (lo - pad)..(hi + pad)
}

/// Errors of a drawing backend as text.
pub(crate) fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}
