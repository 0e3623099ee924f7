//! Training FLOPs per token against an independent transcription of Megatron-LM's
//! `num_floating_point_operations` (megatron/training/training.py, `transformer_flops`), written in its
//! own form (expansion factor 12, ratios to d²) rather than per component as the library does.

use piper_planner::model::{
    Attention, LayerKind, ModelSpec, active_params, param_breakdown, preset, training_flops_per_token,
};

/// Megatron's formula for one token (batch_size · seq_length = 1 token).
fn megatron_flops_per_token(spec: &ModelSpec, s: u64) -> f64 {
    let h = spec.hidden_size as f64;
    let s = s as f64;
    let moe = spec.moe.as_ref().unwrap();
    let pattern: Vec<u64> = spec.layers.iter().map(|k| u64::from(*k == LayerKind::Moe)).collect();
    let mut num_moe_layers = pattern.iter().sum::<u64>() as f64;
    let mut num_dense_layers = spec.num_layers as f64 - num_moe_layers;
    let last_layer_is_moe = *pattern.last().unwrap() as f64;
    let mtp = spec.mtp_depth as f64;
    num_moe_layers += last_layer_is_moe * mtp;
    num_dense_layers += (1.0 - last_layer_is_moe) * mtp;
    let num_layers = spec.num_layers as f64 + mtp;
    let ffn = spec.dense_mlp.as_ref().map_or(0.0, |m| m.intermediate_size as f64);
    let moe_ffn = moe.expert.intermediate_size as f64;
    let shared = moe.num_shared_experts as f64 * moe.shared_expert().intermediate_size as f64;
    let gated = if moe.expert.gated { 1.5 } else { 1.0 };
    let expansion = 12.0;
    let self_attn_term = match spec.attention {
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let (nh, qk, pe, v, kv) = (
                num_heads as f64,
                qk_nope_head_dim as f64,
                qk_rope_head_dim as f64,
                v_head_dim as f64,
                kv_lora_rank as f64,
            );
            let q_term = match q_lora_rank {
                None => h * nh * (qk + pe),
                Some(r) => r as f64 * (h + nh * (qk + pe) + 1.0),
            };
            3.0 * 2.0
                * num_layers
                * (q_term
                    + kv * (h + nh * (qk + v) + 1.0)
                    + h * pe
                    + nh * v * h
                    + s * (nh * (qk + pe)) / 2.0
                    + s * nh * v / 2.0)
        }
        Attention::Gqa { num_heads, num_kv_heads, head_dim, .. } => {
            let ratio = (head_dim * num_heads) as f64 / h;
            expansion * num_layers * h * h * ((1.0 + num_kv_heads as f64 / num_heads as f64 + s / h / 2.0) * ratio)
        }
    };
    expansion
        * num_layers
        * h
        * (ffn * gated * (num_dense_layers / num_layers)
            + moe_ffn * moe.top_k as f64 * gated * (num_moe_layers / num_layers)
            + shared * gated * (num_moe_layers / num_layers))
        + self_attn_term
        + 3.0 * 2.0 * mtp * (3.0 * h + 2.0 * h * h)
        + 3.0 * 2.0 * h * spec.vocab_size as f64 * (mtp + 1.0)
}

#[test]
fn matches_megatron_for_gqa_mla_mtp_and_dense_layers() {
    for name in
        ["mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v2", "deepseek-v3", "llama4-maverick", "xmoe-super", "tiny"]
    {
        let spec = preset(name).unwrap();
        for s in [128, 4096] {
            let ours = training_flops_per_token(&spec, s).total();
            let reference = megatron_flops_per_token(&spec, s);
            assert!(((ours - reference) / reference).abs() < 1e-12, "{name} s={s}: {ours} vs {reference}");
        }
    }
}

#[test]
fn close_to_six_n_plus_attention_for_mixtral() {
    // Kaplan/Chinchilla: training ≈ 6 FLOPs per active non-embedding parameter per token, plus the
    // attention core 6·L·s·d (causal half of 12·L·s·d) and 6·d·V for the logits.
    let spec = preset("mixtral-8x7b").unwrap();
    let b = param_breakdown(&spec);
    let n = (active_params(&spec) - b.embedding - b.lm_head - b.router - b.norms) as f64;
    let (s, d, l, v) = (4096.0, 4096.0, 32.0, 32000.0);
    let approx = 6.0 * n + 6.0 * l * s * d + 6.0 * d * v;
    let ours = training_flops_per_token(&spec, 4096).total();
    assert!(((ours - approx) / approx).abs() < 1e-9, "{ours} vs {approx}");
}
