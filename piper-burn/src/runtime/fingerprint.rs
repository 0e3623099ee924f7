//! Ranks agree before they start: every rank hashes each part of what it is about to run (model, run
//! configuration, seed, plan, data) and the job stops, naming the first part that differs and the ranks
//! concerned, instead of training something no rank asked for (or hanging on mismatched messages).

use piper_comm::Communicator;
use piper_comm::collectives::all_gather;

use super::error::{Result, RuntimeError};

/// FNV-1a, 64 bits: stable across processes and builds (unlike `std`'s hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Checks that every rank of `world` has the same `fields` (name, serialised value). The error names the
/// first differing field and the ranks that differ from rank 0.
pub fn check_ranks_agree(world: &dyn Communicator, fields: &[(&str, String)]) -> Result<()> {
    let mine: Vec<u64> = fields.iter().map(|(_, v)| fnv1a(v.as_bytes())).collect();
    if world.size() == 1 {
        return Ok(());
    }
    let all = all_gather(world, &mine, "start-up fingerprint exchange")?;
    for (i, (name, _)) in fields.iter().enumerate() {
        let differ: Vec<usize> = (1..all.len()).filter(|r| all[*r].get(i) != all[0].get(i)).collect();
        if !differ.is_empty() {
            return Err(RuntimeError::RanksDisagree { field: name.to_string(), ranks: differ });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use piper_comm::LocalWorld;

    #[test]
    fn the_first_differing_field_and_its_ranks_are_named() {
        let errs = LocalWorld::run(3, |c| {
            let seed = if c.rank() == 2 { "7" } else { "3" };
            check_ranks_agree(&c, &[("model", "m".into()), ("seed", seed.into()), ("plan", "p".into())])
        });
        for e in errs {
            let e = e.unwrap_err().to_string();
            assert!(e.contains("the seed of world rank(s) [2] differs"), "{e}");
        }
        let ok = LocalWorld::run(2, |c| check_ranks_agree(&c, &[("model", "m".into())]));
        assert!(ok.iter().all(Result::is_ok));
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
    }
}
