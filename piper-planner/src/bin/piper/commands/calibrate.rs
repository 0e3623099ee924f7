//! `piper calibrate`.

use std::path::PathBuf;
use std::time::Instant;

use piper_planner::atomic::write_atomic;
use piper_planner::calibrate::refine::{Errors, describe};
use piper_planner::calibrate::{CalibrateError, Settings, calibrate};
use piper_planner::history::{HistoryTarget, read};
use piper_planner::platform::{calibrated_local_path, load, to_toml};

/// Measure this machine through the runtime's own binaries (`mixtral_train`, `calibrate_runtime`, built
/// with MPI: the command is in `--help`) and write the platform the planner prices with.
#[derive(clap::Args)]
pub struct Args {
    /// Platform file to write (default: the `local` preset's calibrated file, $PIPER_LOCAL_PLATFORM or
    /// ~/.config/piper/local.toml, which `--platform local` then reads).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Folder holding the workers or their `examples/` (default: this program's folder).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Most ranks the platform places on one node (default: 2 × cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    ranks_per_node: Option<u64>,
    /// Ranks of the link measurement (default: one per core).
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1 << 20))]
    link_ranks: Option<u64>,
    /// Folder for the workers' files (default: a fresh one under the temporary folder, removed after a
    /// calibration that succeeds).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Keep the measurements already in --work: only what is missing runs (resume an interrupted
    /// calibration, or refit after a change of the resource model without measuring again).
    #[arg(long, requires = "work")]
    reuse: bool,
    /// Measure nothing: refit the calibrated platform (--out, read and rewritten) from the history of
    /// its training runs — measured ÷ predicted step time and peak memory of the recent runs — and
    /// print how well the older runs' refit predicts the newer ones.
    #[arg(long, conflicts_with_all = ["reuse", "work", "bin_dir", "link_ranks", "ranks_per_node"])]
    refine: bool,
    /// The history to refine from (default: $PIPER_HISTORY, else ~/.local/share/piper/history.jsonl).
    #[arg(long, requires = "refine")]
    history: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<String, CalibrateError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let out = a
        .out
        .or_else(calibrated_local_path)
        .ok_or_else(|| CalibrateError::file("--out", "no home folder for the default path; pass --out FILE"))?;
    if a.refine {
        return refine(&out, a.history.as_deref());
    }
    let here = std::env::current_exe().map_err(|e| CalibrateError::file("piper", e))?;
    let bin_dir = a.bin_dir.or_else(|| here.parent().map(PathBuf::from)).unwrap_or_default();
    let temporary = a.work.is_none();
    let work = a.work.unwrap_or_else(|| std::env::temp_dir().join(format!("piper-calibrate-{}", std::process::id())));
    let s = Settings {
        out,
        bin_dir,
        work,
        cores,
        link_ranks: a.link_ranks.unwrap_or(cores.max(2)),
        ranks_per_node: a.ranks_per_node.unwrap_or(2 * cores),
        reuse: a.reuse,
    };
    let start = Instant::now();
    let platform = calibrate(&s, &mut |step| eprintln!("[{:>5.1} s] {step}", start.elapsed().as_secs_f64())).map_err(
        |e| match e {
            CalibrateError::Worker { what, why } => {
                CalibrateError::Worker { what, why: format!("{why} (the workers' files are in {})", s.work.display()) }
            }
            other => other,
        },
    )?;
    if temporary {
        let _ = std::fs::remove_dir_all(&s.work);
    }
    let rc = platform.runtime.expect("calibration fits the runtime");
    Ok(format!(
        "{}: {cores} cores, up to {} ranks per node, in {:.0} s; one thread: op {:.2} µs, AdamW {:.2} ns per parameter; memory {:.1} B per parameter, activations ×{:.2} per micro-batch held + ×{:.2} while one runs backward, logits ×{:.2} + ×{:.2}, fixed {:.3} GiB; time sharing γ {:.2}\n",
        s.out.display(),
        s.ranks_per_node,
        start.elapsed().as_secs_f64(),
        rc.op_overhead_us,
        rc.optimizer_ns_per_param,
        rc.bytes_per_param,
        rc.activation_factor,
        rc.activation_working_factor,
        rc.logits_factor,
        rc.logits_working_factor,
        platform.framework_overhead_gib,
        platform.time_share_exponent.unwrap_or(f64::NAN),
    ) + &per_thread_count(&platform))
}

/// A line per thread count the calibration measured: its op overhead, what its routed experts cost
/// (measured ÷ table seconds, ÷ seconds at the peak rate), the memory it holds beyond the model (its
/// own fit, or the every-core fit standing in) and the expert-exchange term.
fn per_thread_count(platform: &piper_planner::platform::Platform) -> String {
    let every_core = platform.framework_overhead_gib;
    platform
        .threads
        .iter()
        .map(|t| {
            let (fixed, whose) = match t.framework_overhead_gib {
                Some(gib) => (gib, "its own runs"),
                None => (every_core, "the every-core fit"),
            };
            let experts = t.step.map_or_else(
                || "not measured".to_string(),
                |s| format!("×{:.2} of the table + ×{:.2} at the peak rate", s.experts, s.experts_peak),
            );
            format!(
                "  {} thread(s) per rank: op {:.2} µs; routed experts {experts}; fixed memory {:.3} GiB ({whose}); expert exchange {:.1} MiB\n",
                t.threads,
                t.runtime.op_overhead_us,
                fixed,
                t.runtime.expert_exchange_bytes / (1u64 << 20) as f64,
            )
        })
        .collect()
}

/// `--refine`: the platform at `out` refitted from the history, written atomically.
fn refine(out: &std::path::Path, history: Option<&std::path::Path>) -> Result<String, CalibrateError> {
    let path = match HistoryTarget::resolve(history) {
        HistoryTarget::File(p) => p,
        HistoryTarget::Off => {
            return Err(CalibrateError::file("--history", "is off (or there is no home folder); pass --history FILE"));
        }
    };
    if !out.is_file() {
        return Err(CalibrateError::file(out, "is not a calibrated platform; run `piper calibrate` first"));
    }
    let platform = load(out)?;
    let (refined, report) = piper_planner::calibrate::refine::refine(&platform, &read(&path)?)?;
    write_atomic(out, to_toml(&refined).as_bytes()).map_err(|e| CalibrateError::file(out, e))?;
    let r = report.refinement;
    let pct = |e: &Errors| format!("step time {:.1}%, peak memory {:.1}%", 100.0 * e.step, 100.0 * e.memory);
    let mut text = format!(
        "{}: refined from {} run(s) of {}: time ×{:.3}, memory ×{:.3}\n  median |error| on those runs: before {}; after {}\n",
        out.display(),
        report.used,
        path.display(),
        r.time_scale,
        r.memory_scale,
        pct(&report.before),
        pct(&report.after),
    );
    match report.held_out {
        Some(h) => text.push_str(&format!(
            "  held out (refitted on the older {} run(s), tried on the newer {}): before {}; after {}\n",
            h.fitted_on,
            h.tried_on,
            pct(&h.before),
            pct(&h.after)
        )),
        None => text.push_str("  held out: fewer than 4 runs, nothing to try the refit on yet\n"),
    }
    if !report.skipped.is_empty() {
        text.push_str(&format!("  not counted: {}\n", describe(&report.skipped)));
    }
    Ok(text)
}
