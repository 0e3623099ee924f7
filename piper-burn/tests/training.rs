//! End-to-end training on the CPU backend: the loss falls, and the same seed gives the same losses.

use burn::prelude::*;
use piper_burn::CausalLmConfig;
use piper_burn::attention::AttentionConfig;
use piper_burn::corpus::{Corpus, Grammar};
use piper_burn::decoder::DecoderLayerConfig;
use piper_burn::moe::MoeBlockConfig;
use piper_burn::router::RouterConfig;
use piper_burn::train::{TrainConfig, train};

fn tiny_moe() -> CausalLmConfig {
    let layer = DecoderLayerConfig::new()
        .with_attention(Some(AttentionConfig::new(32, 4, 2, 8)))
        .with_moe(Some(MoeBlockConfig::new(RouterConfig::new(32, 4, 2), 64)));
    CausalLmConfig::new(16, 32, vec![layer.clone(), layer])
}

fn run(steps: usize, seed: u64) -> Vec<f64> {
    let mut corpus = Grammar::new(16, 2, seed);
    let c = TrainConfig::new()
        .with_steps(steps)
        .with_batch_size(8)
        .with_seq_len(24)
        .with_lr(1e-2)
        .with_warmup_steps(5)
        .with_seed(seed);
    let (_, metrics) = train(&tiny_moe(), &mut corpus, &c, &Device::flex(), 1.0, 1.0, |_| {}).unwrap();
    metrics.iter().map(|m| m.loss).collect()
}

#[test]
fn thirty_steps_reduce_the_loss() {
    let losses = run(30, 3);
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[25..].iter().sum::<f64>() / 5.0;
    assert!(last < first - 0.3, "loss did not fall enough: {first:.3} → {last:.3} ({losses:?})");
    // Uniform guessing over 16 tokens is ln 16 ≈ 2.77: the start is near it.
    assert!((losses[0] - (16f64).ln()).abs() < 0.3, "{}", losses[0]);
}

#[test]
fn same_seed_same_losses() {
    assert_eq!(run(6, 11), run(6, 11));
    assert_ne!(run(3, 11), run(3, 12));
}

#[test]
fn grammar_vocabulary_above_the_model_is_refused() {
    let mut corpus = Grammar::new(32, 2, 0);
    assert!(corpus.vocab_size() > 16);
    let c = TrainConfig::new().with_steps(1);
    let err = train(&tiny_moe(), &mut corpus, &c, &Device::flex(), 1.0, 1.0, |_| {}).unwrap_err();
    assert!(err.contains("vocabulary"), "{err}");
}
