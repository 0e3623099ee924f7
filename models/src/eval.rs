//! Evaluating a Hugging Face model folder on token ids: the numbers a user compares with
//! `model(input_ids, labels=input_ids)` in transformers — the mean next-token cross-entropy over every
//! sequence, the logits' shape and each position's most likely next token.

use std::path::Path;

use burn::prelude::*;
use piper_burn::state_dict;
use piper_planner::hf_files::read_hf_tensors;
use serde::Serialize;

use crate::hf_weights::load_hf;
use crate::{lm_config, resolve_model};

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

/// Loads the model folder `dir` (config.json + model.safetensors or a sharded index; F32, BF16 or F16
/// weights, converted to f32) and evaluates it on `ids` (sequences of equal length ≥ 2). Errors name the
/// file or the sequence.
pub fn evaluate(dir: &Path, ids: &[Vec<i64>]) -> Result<Evaluation, String> {
    // transformers has no multi-token-prediction module: its logits and loss come from the main model.
    let spec = resolve_model(&dir.join("config.json").display().to_string()).map_err(|e| e.to_string())?.without_mtp();
    let lm = lm_config(&spec).map_err(|e| e.to_string())?;
    let (b, s) = (ids.len(), ids.first().map_or(0, Vec::len));
    if b == 0 || s < 2 {
        return Err("input ids: give at least one sequence of at least 2 tokens".into());
    }
    for (i, seq) in ids.iter().enumerate() {
        if seq.len() != s {
            return Err(format!(
                "input ids: sequence {i} has {} tokens, sequence 0 has {s}; pad them equally",
                seq.len()
            ));
        }
        if let Some(t) = seq.iter().find(|t| !(0..lm.vocab_size as i64).contains(t)) {
            return Err(format!(
                "input ids: sequence {i} holds token {t}, outside the vocabulary of {}",
                lm.vocab_size
            ));
        }
    }
    let device = Device::flex();
    let model = lm.init(&device);
    let all = |i: usize| (0..model.layers[i].moe.as_ref().map_or(0, |m| m.experts.num_experts())).collect();
    let names: Vec<String> = state_dict::entries(&model, &spec, 0, &all).into_iter().map(|e| e.name).collect();
    let (tensors, missing) = read_hf_tensors(dir, &names).map_err(|e| e.to_string())?;
    if let Some(name) = missing.first() {
        return Err(format!("{}: the model has no tensor `{name}`", dir.display()));
    }
    let model = load_hf(model, &spec, &tensors, &device)?;
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, s]), &device);
    let logits_bsv = model.forward(ids_bs.clone()).logits_bsv;
    let v = logits_bsv.dims()[2];
    let argmax: Vec<i64> =
        logits_bsv.argmax(2).into_data().convert::<i64>().try_into_vec().map_err(|e| format!("{e:?}"))?;
    let ce: Vec<f32> =
        model.loss(ids_bs).cross_entropy.into_data().convert::<f32>().try_into_vec().map_err(|e| format!("{e:?}"))?;
    Ok(Evaluation {
        cross_entropy: ce[0] as f64,
        logits_shape: [b, s, v],
        argmax: argmax.chunks(s).map(|row| row.iter().map(|x| *x as usize).collect()).collect(),
    })
}
