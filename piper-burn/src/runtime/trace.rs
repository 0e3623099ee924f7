//! `--trace FILE.json`: the run's timeline as one Chrome/Perfetto trace. Every rank records the
//! runtime's `tracing` spans (steps; each instruction of the stage's stream, with its micro-batch; expert
//! exchanges; evaluation, migration, checkpoints) with `tracing-chrome`; at the end rank 0 gathers the
//! ranks' records over the communicator (no shared file system needed) and writes one file with one
//! process per rank, named by its place in the layout, on one clock.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use piper_comm::Communicator;
use piper_comm::collectives::gather_bytes;
use piper_planner::trace::{merge, rank_part, write};
use tracing_chrome::{ChromeLayerBuilder, EventOrSpan, FlushGuard};
use tracing_subscriber::layer::SubscriberExt;

use super::error::{Result, RuntimeError};
use super::log::LogFilter;

/// A shared in-memory buffer the tracer writes into.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// This process's trace recording, from [`TraceRecorder::start`] to [`TraceRecorder::finish`].
pub struct TraceRecorder {
    out: PathBuf,
    buffer: Buffer,
    guard: FlushGuard,
    clock_start_us: f64,
}

impl TraceRecorder {
    /// Starts recording this process's spans for the trace `out`, beside the `--log` filter's lines
    /// when one is given (refused if the process already has a global `tracing` subscriber).
    pub fn start(out: &Path, log: Option<LogFilter>) -> Result<Self> {
        let buffer = Buffer::default();
        let (layer, guard) = ChromeLayerBuilder::new()
            .writer(buffer.clone())
            .include_args(true)
            .include_locations(false)
            // Spans by their name; events (the report's lines, the message in their args) by their target.
            .name_fn(Box::new(|e| match e {
                EventOrSpan::Event(event) => event.metadata().target().to_string(),
                EventOrSpan::Span(span) => span.name().to_string(),
            }))
            .build();
        let clock_start_us =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e6);
        let subscriber = tracing_subscriber::registry().with(layer).with(log.map(LogFilter::layer));
        tracing::subscriber::set_global_default(subscriber).map_err(|e| {
            RuntimeError::invalid(
                "--trace",
                format!("this process already records spans ({e}); trace one run per process"),
            )
        })?;
        Ok(TraceRecorder { out: out.to_path_buf(), buffer, guard, clock_start_us })
    }

    /// Ends the recording: every rank sends its events to rank 0, which writes the merged trace
    /// (`name` names this rank's process, e.g. `rank 1: stage 0, expert rank 1`). Returns the file on
    /// rank 0. Spans still open (none after a run) are not in it.
    pub fn finish(self, world: &dyn Communicator, name: &str) -> Result<Option<PathBuf>> {
        let TraceRecorder { out, buffer, guard, clock_start_us } = self;
        drop(guard);
        let bytes = std::mem::take(&mut *buffer.0.lock().unwrap_or_else(|e| e.into_inner()));
        let events: Vec<serde_json::Value> = serde_json::from_slice(&bytes)
            .map_err(|e| RuntimeError::invalid("--trace", format!("the tracer wrote no valid trace: {e}")))?;
        let part = rank_part(events, world.rank(), name, clock_start_us);
        let part = serde_json::to_vec(&part).map_err(RuntimeError::json("trace"))?;
        let Some(parts) = gather_bytes(world, &part, 0, "trace gather")? else { return Ok(None) };
        let parts = parts
            .iter()
            .map(|p| serde_json::from_slice::<Vec<serde_json::Value>>(p))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(RuntimeError::json("trace"))?;
        let merged = merge(parts).map_err(|e| RuntimeError::invalid("--trace", e.to_string()))?;
        write(&out, &merged).map_err(|e| RuntimeError::invalid("--trace", e.to_string()))?;
        Ok(Some(out))
    }
}

/// A rank's process name in the trace: its place in the plan's grid.
pub fn rank_name(plan: &piper_planner::run_plan::RunPlan, rank: usize) -> String {
    let layout = piper_planner::layout::Layout { pp: plan.pp, ep: plan.ep, dp: plan.dp };
    let (stage, replica, expert_rank) = layout.coords(rank as u64);
    format!("rank {rank}: stage {stage}, expert rank {expert_rank}, data replica {replica}")
}
