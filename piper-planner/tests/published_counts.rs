//! Parameter counts against the figures the model authors published.
//!
//! A published figure is rounded to its last digit, so each check allows half a unit of that digit.
//! Where an author counts "active" without the input embedding (a lookup, not a GEMM), the test says so.

use piper_planner::model::{active_params, param_breakdown, preset};

const B: f64 = 1e9;

fn total(name: &str) -> f64 {
    param_breakdown(&preset(name).unwrap()).total() as f64 / B
}

fn active(name: &str) -> f64 {
    active_params(&preset(name).unwrap()) as f64 / B
}

fn embedding(name: &str) -> f64 {
    param_breakdown(&preset(name).unwrap()).embedding as f64 / B
}

/// `got` equals a figure published as `published` with `decimals` digits after the point.
fn assert_rounds_to(what: &str, got: f64, published: f64, decimals: i32) {
    let half_unit = 0.5 * 10f64.powi(-decimals) + 1e-9;
    assert!((got - published).abs() <= half_unit, "{what}: computed {got:.4}B, published {published}B (±{half_unit})");
}

/// `got` equals a figure published by cutting off after `decimals` digits.
fn assert_truncates_to(what: &str, got: f64, published: f64, decimals: i32) {
    let unit = 10f64.powi(-decimals);
    assert!(
        got >= published - 1e-9 && got < published + unit,
        "{what}: computed {got:.4}B, published {published}B (truncated)"
    );
}

#[test]
fn mixtral_8x7b() {
    // Mistral AI, "Mixtral of experts" (2023-12-11, mistral.ai/news/mixtral-of-experts): 46.7B total
    // parameters, 12.9B used per token.
    assert_rounds_to("total", total("mixtral-8x7b"), 46.7, 1);
    assert_rounds_to("active", active("mixtral-8x7b"), 12.9, 1);
}

#[test]
fn mixtral_8x22b() {
    // Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): 141B total, 39B active.
    assert_rounds_to("total", total("mixtral-8x22b"), 141.0, 0);
    assert_rounds_to("active", active("mixtral-8x22b"), 39.0, 0);
}

#[test]
fn deepseek_v2() {
    // DeepSeek-V2 technical report (arXiv 2405.04434), abstract: 236B total, 21B activated per token.
    assert_rounds_to("total", total("deepseek-v2"), 236.0, 0);
    assert_rounds_to("active", active("deepseek-v2"), 21.0, 0);
}

#[test]
fn deepseek_v3_with_mtp() {
    // DeepSeek-V3 technical report (arXiv 2412.19437): 671B total, 37B activated; the HF checkpoint is
    // 685B = 671B main model + 14B MTP module (README of deepseek-ai/DeepSeek-V3). DeepSeek's "activated"
    // leaves out the input embedding; the checkpoint stores the MTP module with its own copy of the
    // embedding and head, which Piper shares with the main model (so they are added back here).
    let spec = preset("deepseek-v3").unwrap();
    let b = param_breakdown(&spec);
    let main = (b.total() - b.mtp) as f64 / B;
    assert_rounds_to("main total", main, 671.0, 0);
    let main_only = piper_planner::model::ModelSpec { mtp_depth: 0, ..spec.clone() };
    let main_active = active_params(&main_only) as f64 / B;
    assert_rounds_to("active without input embedding", main_active - embedding("deepseek-v3"), 37.0, 0);
    let checkpoint = b.total() as f64 / B + 2.0 * embedding("deepseek-v3");
    // The 685B shown for the checkpoint also counts its FP8 block-scale tensors (~0.04B), not modelled.
    assert!((checkpoint - 685.0).abs() < 1.0, "checkpoint incl. MTP: {checkpoint:.3}B vs 685B");
}

#[test]
fn qwen3_moe() {
    // Qwen3 model cards (huggingface.co/Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B): 30.5B total, 3.3B activated,
    // 29.9B non-embedding; 235B total, 22B activated, 234B non-embedding.
    assert_rounds_to("30B total", total("qwen3-30b-a3b"), 30.5, 1);
    // Qwen truncates: 3.35B computed is published as 3.3B.
    assert_truncates_to("30B active", active("qwen3-30b-a3b"), 3.3, 1);
    assert_rounds_to("30B non-embedding", total("qwen3-30b-a3b") - 2.0 * embedding("qwen3-30b-a3b"), 29.9, 1);
    assert_rounds_to("235B total", total("qwen3-235b-a22b"), 235.0, 0);
    assert_rounds_to("235B active", active("qwen3-235b-a22b"), 22.0, 0);
    assert_rounds_to("235B non-embedding", total("qwen3-235b-a22b") - 2.0 * embedding("qwen3-235b-a22b"), 234.0, 0);
}

#[test]
fn qwen1_5_moe() {
    // Qwen blog "Qwen1.5-MoE: Matching 7B Model Performance with 1/3 Activated Parameters" (2024-03-28):
    // 14.3B total, 2.7B activated.
    assert_rounds_to("total", total("qwen1.5-moe-a2.7b"), 14.3, 1);
    assert_rounds_to("active", active("qwen1.5-moe-a2.7b"), 2.7, 1);
}

#[test]
fn olmoe() {
    // OLMoE paper (arXiv 2409.02060), abstract: 6.9B total, 1.3B active per input token.
    assert_rounds_to("total", total("olmoe-1b-7b"), 6.9, 1);
    assert_rounds_to("active", active("olmoe-1b-7b"), 1.3, 1);
}

#[test]
fn gpt_oss() {
    // OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025-08-05), Table 1: 120b: MLP 114.71B, attention
    // 0.96B, embed + unembed 1.16B, active 5.13B, total 116.83B; 20b: MLP 19.12B, attention 0.64B, active
    // 3.61B, total 20.91B. OpenAI's active count leaves out the input embedding.
    for (name, mlp, attn, act, tot) in
        [("gpt-oss-120b", 114.71, 0.96, 5.13, 116.83), ("gpt-oss-20b", 19.12, 0.64, 3.61, 20.91)]
    {
        let b = param_breakdown(&preset(name).unwrap());
        assert_rounds_to("mlp", (b.routed_experts + b.router) as f64 / B, mlp, 2);
        assert_rounds_to("attention", b.attention as f64 / B, attn, 2);
        assert_rounds_to("embed+unembed", (b.embedding + b.lm_head) as f64 / B, 1.16, 2);
        // The model card rounds each component, so the totals are checked to the same 0.01B.
        assert_rounds_to("total", total(name), tot, 2);
        assert_rounds_to("active", active(name) - embedding(name), act, 2);
    }
}

#[test]
fn dbrx() {
    // Databricks, "Introducing DBRX" (2024-03-27): 132B total, 36B active on any input.
    assert_rounds_to("total", total("dbrx"), 132.0, 0);
    assert_rounds_to("active", active("dbrx"), 36.0, 0);
}

#[test]
fn llama4() {
    // Meta, "The Llama 4 herd" (2025-04-05): Scout and Maverick have 17B active parameters; Maverick 400B
    // total. Scout's published 109B total includes the vision encoder, which this text-only spec omits.
    assert_rounds_to("scout active", active("llama4-scout"), 17.0, 0);
    assert_rounds_to("maverick active", active("llama4-maverick"), 17.0, 0);
    // "400B" is a round figure: 400.7B computed; checked to within 1B.
    assert!((total("llama4-maverick") - 400.0).abs() < 1.0, "{}", total("llama4-maverick"));
}

#[test]
fn piper_weak_scaling_family() {
    // Piper §VII: 110B / 862B / 1.7T for E = 16 / 128 / 256; the paper counts attention (4d²) and 2-matrix
    // experts per layer, no embeddings or norms.
    for (name, published, decimals) in [("piper-110b", 110.0, -1), ("piper-862b", 862.0, 0), ("piper-1.7t", 1700.0, -2)]
    {
        let b = param_breakdown(&preset(name).unwrap());
        assert_rounds_to(name, (b.attention + b.routed_experts) as f64 / B, published, decimals);
    }
}

#[test]
fn xmoe_family() {
    // X-MoE (arXiv 2508.13337): Small 10.1B, Medium 55.2B, Large 201.4B, Super 545.4B, counted as
    // L·(4h² + 2·E·h·f) in units of 2³⁰.
    let gib = (1u64 << 30) as f64;
    for (name, published) in [("xmoe-small", 10.1), ("xmoe-medium", 55.2), ("xmoe-large", 201.4), ("xmoe-super", 545.4)]
    {
        let b = param_breakdown(&preset(name).unwrap());
        let got = (b.attention + b.routed_experts) as f64 / gib;
        // Super's published 545.4 is 0.1 below the formula (545.5); allow one unit there.
        assert!((got - published).abs() <= 0.1 + 1e-9, "{name}: {got:.3} vs {published}");
    }
}
