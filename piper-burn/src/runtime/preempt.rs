//! Preemption: SIGTERM (a job's time limit, `scancel`, a pod being evicted) and SIGUSR1 (Slurm's
//! `--signal=USR1@SECONDS`, ahead of the limit; `mpirun` forwards it to every rank) ask the run to stop.
//! The handler only records the signal; every rank finishes the step it is in, the step's all-reduce
//! tells every rank that one of them was signalled, the run saves a checkpoint (with
//! `--checkpoint-dir`) and returns normally, so the job exits 0 and `--resume` continues bit for bit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGTERM, SIGUSR1};

use super::error::{Result, RuntimeError};

/// The signal received (its number), 0 before any.
fn received_flag() -> &'static Arc<AtomicUsize> {
    static FLAG: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicUsize::new(0)))
}

/// Installs the handlers, once per process.
pub fn install() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            for signal in [SIGTERM, SIGUSR1] {
                signal_hook::flag::register_usize(signal, Arc::clone(received_flag()), signal as usize)
                    .map_err(|e| format!("cannot handle signal {signal}: {e}"))?;
            }
            Ok(())
        })
        .clone()
        .map_err(|why| RuntimeError::invalid("signals", why))
}

/// The name of the signal this process received, if any.
pub fn received() -> Option<&'static str> {
    match received_flag().load(Ordering::Relaxed) as i32 {
        0 => None,
        SIGTERM => Some("SIGTERM"),
        SIGUSR1 => Some("SIGUSR1"),
        _ => Some("a signal"),
    }
}
