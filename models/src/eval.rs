//! Evaluating a Hugging Face model folder on token ids: the numbers a user compares with
//! `model(input_ids, labels=input_ids)` in transformers — the mean next-token cross-entropy over every
//! sequence, the logits' shape and each position's most likely next token.

use std::path::Path;

use burn::prelude::*;
use serde::Serialize;

use crate::load::{ModelError, folder_spec, load_weights};

/// What [`evaluate`] finds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    /// Mean next-token cross-entropy over all predicted positions of all sequences, nats.
    pub cross_entropy: f64,
    /// `[b, s, v]`.
    pub logits_shape: [usize; 3],
    /// `[b][s]`: the argmax of the logits at each position.
    pub argmax: Vec<Vec<usize>>,
}

/// Loads the model folder `dir` and evaluates it on `ids` (sequences of equal length ≥ 2, inside the
/// vocabulary). Errors name the file or the sequence; the ids are checked before the weights are read.
pub fn evaluate(dir: &Path, ids: &[Vec<i64>]) -> Result<Evaluation, ModelError> {
    let spec = folder_spec(dir)?;
    check_ids(ids, spec.vocab_size as usize)?;
    let device = Device::flex();
    let model = load_weights(dir, &spec, &device)?;
    let (b, s) = (ids.len(), ids[0].len());
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, s]), &device);
    let logits_bsv = model.forward(ids_bs.clone()).logits_bsv;
    let v = logits_bsv.dims()[2];
    let device_error = |e| ModelError::Device(format!("{e:?}"));
    let argmax: Vec<i64> = logits_bsv.argmax(2).into_data().convert::<i64>().try_into_vec().map_err(device_error)?;
    let ce: Vec<f32> =
        model.loss(ids_bs).cross_entropy.into_data().convert::<f32>().try_into_vec().map_err(device_error)?;
    Ok(Evaluation {
        cross_entropy: ce[0] as f64,
        logits_shape: [b, s, v],
        argmax: argmax.chunks(s).map(|row| row.iter().map(|x| *x as usize).collect()).collect(),
    })
}

/// At least one sequence of at least 2 tokens, all of one length, every id inside the vocabulary.
fn check_ids(ids: &[Vec<i64>], vocab_size: usize) -> Result<(), ModelError> {
    let (b, s) = (ids.len(), ids.first().map_or(0, Vec::len));
    if b == 0 || s < 2 {
        return Err(ModelError::InputIds("give at least one sequence of at least 2 tokens".into()));
    }
    for (i, seq) in ids.iter().enumerate() {
        if seq.len() != s {
            return Err(ModelError::InputIds(format!(
                "sequence {i} has {} tokens, sequence 0 has {s}; pad them equally",
                seq.len()
            )));
        }
        if let Some(t) = seq.iter().find(|t| !(0..vocab_size as i64).contains(t)) {
            return Err(ModelError::InputIds(format!(
                "sequence {i} holds token {t}, outside the vocabulary of {vocab_size}"
            )));
        }
    }
    Ok(())
}
