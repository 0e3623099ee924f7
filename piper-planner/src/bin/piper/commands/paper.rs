//! `piper paper`: the planner's predictions next to the paper's reported figures, row by row.

use piper_planner::Result;
use piper_planner::paper::compare;
use piper_planner::platform::resolve_platform;

use crate::table::table;

#[derive(clap::Args)]
pub struct Args {
    /// Platform the paper ran on (its constants are assumptions; see the preset's TOML).
    #[arg(long, default_value = "frontier")]
    platform: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<String> {
    let platform = resolve_platform(&a.platform)?;
    platform.validate()?;
    let rows = compare(&platform)?;
    let mut out = String::new();
    if a.json {
        outln!(out, "{}", serde_json::to_string_pretty(&rows).expect("json"));
        return Ok(out);
    }
    outln!(out, "Piper (arXiv 2605.05049) reported vs predicted on `{}`; ratio = predicted ÷ paper.", platform.name);
    let mut section = "";
    let mut t = table(&["", "paper", "predicted", "ratio", "unit"]);
    let mut notes = Vec::new();
    for r in &rows {
        if r.section != section {
            if !section.is_empty() {
                outln!(out, "\n{section}\n{t}");
                for n in notes.drain(..) {
                    outln!(out, "  {n}");
                }
            }
            section = r.section;
            t = table(&["", "paper", "predicted", "ratio", "unit"]);
        }
        let ratio = r.ratio.map_or(String::new(), |x| format!("{x:.2}"));
        t.add_row(vec![r.item.clone(), r.paper.clone(), r.predicted.clone(), ratio, r.unit.to_string()]);
        notes.push(format!("{}: {}", r.item, r.note));
    }
    outln!(out, "\n{section}\n{t}");
    for n in notes {
        outln!(out, "  {n}");
    }
    Ok(out)
}
