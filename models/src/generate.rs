//! Generation: the prompt's ids go through the model once, filling a key/value cache, then one token at
//! a time. Greedy at temperature 0 (the most likely token; among equal logits the lowest id, as
//! `torch.argmax` and transformers' `generate(do_sample=False)`), else sampled from the softmax of the
//! logits over the temperature, among the `top_k` most likely, with a seeded generator.

use burn::prelude::*;
use piper_burn::CausalLm;
use piper_burn::corpus::Rng;
use piper_burn::layers::kv_cache::KvCache;

use crate::load::ModelError;

/// The longest generation accepted (tokens).
pub const MAX_NEW_TOKENS: usize = 1 << 20;

/// How the next token is chosen, and when to stop.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub max_new_tokens: usize,
    /// 0: greedy.
    pub temperature: f64,
    /// Sample among the k most likely tokens only (`None`: all).
    pub top_k: Option<usize>,
    pub seed: u64,
    /// Stop after generating this id (an end-of-text token).
    pub stop: Option<u32>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { max_new_tokens: 32, temperature: 0.0, top_k: None, seed: 0, stop: None }
    }
}

/// The ids `model` generates after `prompt`. The prompt and settings are checked before any work; the
/// errors name the flag.
pub fn generate(model: &CausalLm, prompt: &[u32], sampling: &Sampling) -> Result<Vec<u32>, ModelError> {
    let vocab = model.embed.weight.dims()[0];
    check(prompt, vocab, sampling)?;
    let device = model.embed.weight.device();
    let mut cache = KvCache::new(model.layers.len());
    let mut rng = Rng::new(sampling.seed);
    let mut next_ids: Vec<u32> = prompt.to_vec();
    let mut generated = Vec::new();
    while generated.len() < sampling.max_new_tokens {
        let ids: Vec<i64> = next_ids.iter().map(|t| *t as i64).collect();
        let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, next_ids.len()]), &device);
        let logits_bsv = model.forward_cached(ids_bs, &mut cache);
        let s = logits_bsv.dims()[1];
        let last: Vec<f32> = logits_bsv
            .narrow(1, s - 1, 1)
            .into_data()
            .convert::<f32>()
            .try_into_vec()
            .map_err(|e| ModelError::Device(format!("{e:?}")))?;
        if last.iter().any(|x| !x.is_finite()) {
            return Err(ModelError::NotFinite(generated.len()));
        }
        let token = pick(&last, sampling, &mut rng);
        generated.push(token);
        if sampling.stop == Some(token) {
            break;
        }
        next_ids = vec![token];
    }
    Ok(generated)
}

fn check(prompt: &[u32], vocab: usize, sampling: &Sampling) -> Result<(), ModelError> {
    let refuse = |flag: &str, why: String| Err(ModelError::Flag { flag: flag.into(), why });
    if prompt.is_empty() {
        return refuse("--prompt", "encodes to no token; give some text".into());
    }
    if let Some(t) = prompt.iter().find(|t| **t as usize >= vocab) {
        return refuse("--prompt", format!("holds token {t}, outside the model's vocabulary of {vocab}"));
    }
    if !(1..=MAX_NEW_TOKENS).contains(&sampling.max_new_tokens) {
        let n = sampling.max_new_tokens;
        return refuse("--max-new-tokens", format!("is {n}; it must be in 1..={MAX_NEW_TOKENS}"));
    }
    let t = sampling.temperature;
    if !(t.is_finite() && (0.0..=100.0).contains(&t)) {
        return refuse("--temperature", format!("is {t}; it must be in [0, 100] (0: greedy)"));
    }
    if sampling.top_k == Some(0) {
        return refuse("--top-k", "is 0; it must be at least 1".into());
    }
    Ok(())
}

/// The next token from one position's logits.
fn pick(logits: &[f32], sampling: &Sampling, rng: &mut Rng) -> u32 {
    // Most likely first; equal logits by id, so greedy takes the lowest id of a tie.
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
    if sampling.temperature == 0.0 {
        return order[0] as u32;
    }
    order.truncate(sampling.top_k.unwrap_or(order.len()).min(order.len()));
    let top = logits[order[0]] as f64;
    let weights: Vec<f64> = order.iter().map(|i| ((logits[*i] as f64 - top) / sampling.temperature).exp()).collect();
    let mut u = rng.uniform() * weights.iter().sum::<f64>();
    for (i, w) in order.iter().zip(&weights) {
        if u < *w {
            return *i as u32;
        }
        u -= w;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use piper_burn::CausalLmConfig;
    use piper_planner::model::preset;

    fn model(name: &str) -> CausalLm {
        let spec = preset(name).unwrap();
        CausalLmConfig::from_spec(&spec).unwrap().init(&Device::flex())
    }

    /// Greedy generation without a cache: the whole sequence again for every token.
    fn uncached(model: &CausalLm, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut ids: Vec<i64> = prompt.iter().map(|t| *t as i64).collect();
        for _ in 0..n {
            let s = ids.len();
            let logits =
                model.forward(Tensor::from_data(TensorData::new(ids.clone(), [1, s]), &Device::flex())).logits_bsv;
            let last: Vec<f32> = logits.narrow(1, s - 1, 1).into_data().try_to_vec().unwrap();
            let best = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
            ids.push(best as i64);
        }
        ids[prompt.len()..].iter().map(|t| *t as u32).collect()
    }

    #[test]
    fn the_cache_changes_nothing_greedy_generation_gives() {
        // GQA attention (Mixtral-style), per-head q/k norms (Qwen3-style), latent attention (DeepSeek).
        for name in ["tiny", "tiny-qwen3", "tiny-deepseek"] {
            let m = model(name);
            let prompt = [5, 17, 3, 99, 42, 7];
            let sampling = Sampling { max_new_tokens: 12, ..Default::default() };
            assert_eq!(generate(&m, &prompt, &sampling).unwrap(), uncached(&m, &prompt, 12), "{name}");
        }
    }

    #[test]
    fn sampling_follows_the_seed_and_top_1_is_greedy() {
        let m = model("tiny");
        let prompt = [1, 2, 3];
        let hot = Sampling { max_new_tokens: 16, temperature: 1.5, seed: 4, ..Default::default() };
        let a = generate(&m, &prompt, &hot).unwrap();
        assert_eq!(a, generate(&m, &prompt, &hot).unwrap());
        assert_ne!(a, generate(&m, &prompt, &Sampling { seed: 5, ..hot.clone() }).unwrap());
        let top1 = Sampling { top_k: Some(1), ..hot };
        let greedy = Sampling { max_new_tokens: 16, ..Default::default() };
        assert_eq!(generate(&m, &prompt, &top1).unwrap(), generate(&m, &prompt, &greedy).unwrap());
        let stop = generate(&m, &prompt, &greedy).unwrap()[2];
        let stopped = generate(&m, &prompt, &Sampling { stop: Some(stop), ..greedy }).unwrap();
        assert_eq!(stopped.last(), Some(&stop));
        assert!(stopped.len() <= 3);
    }

    #[test]
    fn bad_settings_name_the_flag() {
        let m = model("tiny");
        let bad = |prompt: &[u32], s: Sampling| generate(&m, prompt, &s).unwrap_err().to_string();
        let ok = Sampling::default();
        assert!(bad(&[], ok.clone()).starts_with("--prompt "));
        assert!(bad(&[256], ok.clone()).contains("outside the model's vocabulary of 256"));
        assert!(bad(&[1], Sampling { max_new_tokens: 0, ..ok.clone() }).starts_with("--max-new-tokens is 0"));
        assert!(bad(&[1], Sampling { temperature: f64::NAN, ..ok.clone() }).starts_with("--temperature is NaN"));
        assert!(bad(&[1], Sampling { top_k: Some(0), ..ok }).starts_with("--top-k is 0"));
    }
}
