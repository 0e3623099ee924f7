//! Fault injection for the failure tests, from the environment: `PIPER_FAULT_RANK=r PIPER_FAULT_STEP=s
//! PIPER_FAULT=exit|hang` makes rank r exit (or stop answering) after step s; `PIPER_FAULT=hang-in-migration`
//! makes rank r stop answering when its first expert migration starts; `PIPER_FAULT=kill-in-save
//! PIPER_FAULT_STEP=s` makes a rank (`PIPER_FAULT_RANK`, default every rank) SIGKILL itself after writing
//! its shard of the checkpoint of step s, before the commit. Without these variables nothing happens.

use std::time::Duration;

fn fault() -> Option<String> {
    std::env::var("PIPER_FAULT").ok()
}

fn fault_rank() -> Option<usize> {
    std::env::var("PIPER_FAULT_RANK").ok().and_then(|r| r.parse::<usize>().ok())
}

fn fault_step() -> Option<u64> {
    std::env::var("PIPER_FAULT_STEP").ok().and_then(|s| s.parse::<u64>().ok())
}

/// A peer that stops answering: long enough for any timeout to name it.
fn hang() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// `PIPER_FAULT=exit|hang` for this rank, read once when the run starts.
pub struct StepFault {
    /// The step after which this rank exits or hangs, and whether it hangs.
    at: Option<(usize, bool)>,
}

impl StepFault {
    pub fn from_env(world_rank: usize) -> Self {
        let kind = fault().filter(|k| k == "exit" || k == "hang");
        let mine = fault_rank() == Some(world_rank);
        let at = kind.zip(fault_step()).filter(|_| mine).map(|(k, s)| (s as usize, k == "hang"));
        StepFault { at }
    }

    /// The fault point after each step.
    pub fn after_step(&self, step: usize) {
        match self.at {
            Some((s, true)) if s == step => {
                eprintln!("fault injection: this rank stops answering after step {step}");
                hang();
            }
            Some((s, false)) if s == step => {
                eprintln!("fault injection: this rank exits after step {step}");
                std::process::exit(17);
            }
            _ => {}
        }
    }
}

/// The fault point of `PIPER_FAULT=hang-in-migration` on `PIPER_FAULT_RANK` (a peer that dies while
/// experts move: the others must name it within the timeout).
pub fn in_migration(world_rank: usize) {
    if fault_rank() == Some(world_rank) && fault().is_some_and(|v| v == "hang-in-migration") {
        eprintln!("fault injection: this rank stops answering in expert migration");
        hang();
    }
}

/// The fault point of `PIPER_FAULT=kill-in-save`: what a node failure between a checkpoint's shards and
/// its commit looks like.
pub fn in_save(world_rank: usize, step: u64) {
    let rank_ok = std::env::var("PIPER_FAULT_RANK").map_or(true, |r| r.parse::<usize>().ok() == Some(world_rank));
    if rank_ok && fault_step() == Some(step) && fault().is_some_and(|v| v == "kill-in-save") {
        eprintln!("fault injection: SIGKILL in the middle of saving the checkpoint of step {step}");
        let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        hang();
    }
}
