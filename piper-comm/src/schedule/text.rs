//! The text form of one rank's schedule, read by the SMPI replayer (`scripts/simgrid/replay.c`):
//!
//! ```text
//! piper-schedule 1 <ranks> <rank> <algo>
//! S <id> <peer> <tag> <fixed> <per_byte>      post a send of fixed + per_byte·B bytes
//! R <id> <peer> <tag> <fixed> <per_byte>      post a receive
//! A <n> <fixed per_byte>×n <fixed per_byte>×n  the native all-to-all: sizes to, then from, each rank
//! W <groups>                                   a wait over groups, then one line per group:
//! G <k> <id>×k
//! T <g> <c>                                    for each group g: c S/R lines posted once g has arrived
//! E                                            the wait ends when every group has arrived
//! ```

use std::fmt::Write;

use super::{Schedule, Size, Step};

/// The text of rank r's schedule.
pub fn write_rank(schedule: &Schedule, r: usize) -> String {
    let mut out = format!("piper-schedule 1 {} {r} {}\n", schedule.ranks.len(), schedule.algo.name());
    for step in &schedule.ranks[r] {
        write_step(&mut out, step);
    }
    out
}

fn write_step(out: &mut String, step: &Step<Size>) {
    // Writing to a String cannot fail.
    let _ = match step {
        Step::Send { id, peer, tag, size } => writeln!(out, "S {id} {peer} {tag} {} {}", size.fixed, size.per_byte),
        Step::Recv { id, peer, tag, size } => writeln!(out, "R {id} {peer} {tag} {} {}", size.fixed, size.per_byte),
        Step::AllToAll { send, recv } => {
            let pairs: Vec<String> = send.iter().chain(recv).map(|s| format!("{} {}", s.fixed, s.per_byte)).collect();
            writeln!(out, "A {} {}", send.len(), pairs.join(" "))
        }
        Step::Wait { groups, then } => {
            let _ = writeln!(out, "W {}", groups.len());
            for g in groups {
                let ids: Vec<String> = g.iter().map(u64::to_string).collect();
                let _ = writeln!(out, "G {} {}", g.len(), ids.join(" "));
            }
            for (g, steps) in then.iter().enumerate() {
                let _ = writeln!(out, "T {g} {}", steps.len());
                for s in steps {
                    write_step(out, s);
                }
            }
            writeln!(out, "E")
        }
    };
}
