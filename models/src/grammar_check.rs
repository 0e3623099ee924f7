//! Whether a model trained on the synthetic grammar learned it: the grammar rebuilt from a checkpoint
//! (the run's seed and the data description its manifest keeps) and the share of generated transitions
//! the grammar allows (a uniform guess scores branching / alphabet, the grammar itself 1).

use std::path::Path;

use piper_burn::corpus::{Corpus, Grammar};
use piper_planner::checkpoint::Manifest;
use piper_planner::checkpoint::resolve;

use crate::load::ModelError;

/// What a checkpoint's data description of the grammar starts with.
const GRAMMAR_PREFIX: &str = "synthetic 2nd-order grammar over ";

/// The grammar checkpoint `path` was trained on, or `None` when it trained on other data. `branching`
/// is the run's `--grammar-branching`; a value that does not rebuild the recorded grammar (its entropy
/// rate) is refused.
pub fn checkpoint_grammar(path: &Path, branching: usize) -> Result<Option<Grammar>, ModelError> {
    let manifest = Manifest::load(&resolve(path)?)?;
    let Some(describe) = manifest.data["describe"].as_str() else { return Ok(None) };
    let Some(rest) = describe.strip_prefix(GRAMMAR_PREFIX) else { return Ok(None) };
    let alphabet: usize = rest.split(' ').next().and_then(|a| a.parse().ok()).ok_or_else(|| ModelError::Flag {
        flag: "--checkpoint".into(),
        why: format!("records the grammar as `{}`, without its alphabet", describe.escape_debug()),
    })?;
    if !(1..=alphabet).contains(&branching) || alphabet < 2 {
        return Err(ModelError::Flag {
            flag: "--grammar-branching".into(),
            why: format!("is {branching}; it must be in 1..={alphabet} (the grammar's alphabet)"),
        });
    }
    let grammar = Grammar::new(alphabet, branching, manifest.seed);
    if grammar.describe() != describe {
        return Err(ModelError::Flag {
            flag: "--grammar-branching".into(),
            why: format!(
                "{branching} does not rebuild the checkpoint's grammar ({}); pass the run's --grammar-branching",
                describe.escape_debug()
            ),
        });
    }
    Ok(Some(grammar))
}
