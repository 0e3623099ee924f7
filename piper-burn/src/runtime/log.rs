//! `--log FILTER` (else `$RUST_LOG`): the runtime's `tracing` events and spans that pass the filter,
//! printed to stderr as they happen — the report's lines (target `piper::report`), and with span events
//! each instruction of the schedule, exchange, evaluation, migration and checkpoint as it closes, with
//! its time. The filter takes `tracing`'s directives: `info`, `piper::report=info`,
//! `piper_burn::runtime=debug,warn`. Without either, nothing extra is printed.

use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use super::error::{Result, RuntimeError};

/// A checked log filter and where it came from (`--log` or `RUST_LOG`), for its errors.
pub struct LogFilter {
    filter: EnvFilter,
}

impl LogFilter {
    /// The filter of `flag` (`--log`), else of `$RUST_LOG`; `None` without either (or with an empty one).
    /// A filter `tracing` cannot read is an error naming where it came from, before any work starts.
    pub fn resolve(flag: Option<&str>) -> Result<Option<Self>> {
        let env = std::env::var("RUST_LOG").ok();
        let (source, text) = match (flag, env.as_deref()) {
            (Some(f), _) => ("--log", f),
            (None, Some(e)) => ("RUST_LOG", e),
            (None, None) => return Ok(None),
        };
        if text.trim().is_empty() {
            return Ok(None);
        }
        let filter = EnvFilter::builder().parse(text).map_err(|e| {
            RuntimeError::invalid(
                source,
                format!(
                    "`{}` is not a tracing filter ({e}); give directives such as `info` or `piper::report=info,piper_burn=debug`",
                    text.escape_debug()
                ),
            )
        })?;
        Ok(Some(LogFilter { filter }))
    }

    /// The layer that prints what passes the filter to stderr, spans as they close with their times.
    pub fn layer<S>(self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_span_events(FmtSpan::CLOSE)
            .with_filter(self.filter)
    }

    /// Prints what passes the filter for the rest of the process (without `--trace`, which installs
    /// both). Refused if the process already has a global subscriber.
    pub fn install(self) -> Result<()> {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(self.layer()))
            .map_err(|e| RuntimeError::invalid("--log", format!("this process already has a tracing subscriber ({e})")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_tracing_cannot_read_is_refused_naming_the_flag() {
        let err = LogFilter::resolve(Some("piper=[[")).err().expect("refused").to_string();
        assert!(err.contains("--log") && err.contains("piper=[[") && err.contains("not a tracing filter"), "{err}");
        assert!(LogFilter::resolve(Some("piper::report=info,warn")).unwrap().is_some());
        assert!(LogFilter::resolve(Some("  ")).unwrap().is_none(), "an empty filter is none");
    }
}
