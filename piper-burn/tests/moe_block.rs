//! The dropless MoE path (route → permute → grouped experts → combine) against a naive per-token loop
//! that applies each selected expert to each token separately: values and input gradients.

use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::silu;
use piper_burn::moe::experts::GroupedExpertsConfig;
use piper_burn::moe::router::{RouterConfig, Scoring};
use piper_burn::moe::{MoeBlock, MoeBlockConfig};

fn vec2(t: &Tensor<2>) -> Vec<f32> {
    t.to_data().convert::<f32>().try_to_vec().unwrap()
}

/// Naive MoE: for every token and every selected expert, run that expert on that token alone.
fn naive(block: &MoeBlock, x_td: Tensor<2>) -> Tensor<2> {
    let [t, d] = x_td.dims();
    let routing = block.router.forward(x_td.clone());
    let idx: Vec<i64> = routing.topk_idx_tk.to_data().convert::<i64>().try_to_vec().unwrap();
    let k = routing.topk_idx_tk.dims()[1];
    let f = block.experts.w_gate_edf.dims()[2];
    let mut rows = Vec::new();
    for tok in 0..t {
        let x_1d = x_td.clone().narrow(0, tok, 1);
        let mut acc = Tensor::<2>::zeros([1, d], &x_td.device());
        for slot in 0..k {
            let e = idx[tok * k + slot] as usize;
            let w = |p: &Tensor<3>, a: usize, b: usize| p.clone().narrow(0, e, 1).reshape([a, b]);
            let h = silu(x_1d.clone().matmul(w(&block.experts.w_gate_edf.val(), d, f)))
                * x_1d.clone().matmul(w(&block.experts.w_up_edf.val(), d, f));
            let y = h.matmul(w(&block.experts.w_down_efd.val(), f, d));
            acc = acc + y * routing.topk_w_tk.clone().narrow(0, tok, 1).narrow(1, slot, 1);
        }
        if let Some(shared) = &block.shared {
            let mut s = shared.forward(x_1d.clone());
            if let Some(g) = &block.shared_gate {
                s = s * burn::tensor::activation::sigmoid(g.forward(x_1d.clone()));
            }
            acc = acc + s;
        }
        rows.push(acc);
    }
    Tensor::cat(rows, 0)
}

fn check(config: MoeBlockConfig, tokens: usize) {
    let device = Device::flex().autodiff();
    device.seed(5);
    let block = config.init(&device);
    let d = config.router.d_model;
    let x = Tensor::<2>::random([tokens, d], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let (fast, _) = block.forward(x.clone().reshape([1, tokens, d]));
    let fast = fast.reshape([tokens, d]);
    let slow = naive(&block, x.clone());
    for (a, b) in vec2(&fast).iter().zip(vec2(&slow)) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    let probe = Tensor::<2>::random([tokens, d], Distribution::Normal(0.0, 1.0), &device);
    let g_fast = x.grad(&(fast * probe.clone()).sum().backward()).unwrap();
    let g_slow = x.grad(&(slow * probe).sum().backward()).unwrap();
    for (a, b) in vec2(&g_fast).iter().zip(vec2(&g_slow)) {
        assert!((a - b).abs() < 1e-5, "grad {a} vs {b}");
    }
}

#[test]
fn mixtral_style_block_matches_the_naive_loop() {
    check(MoeBlockConfig::new(RouterConfig::new(16, 8, 2), 24), 13);
}

#[test]
fn deepseek_style_block_matches_the_naive_loop() {
    let router = RouterConfig::new(16, 16, 6)
        .with_scoring(Scoring::Sigmoid)
        .with_num_groups(Some(4))
        .with_topk_groups(Some(2))
        .with_routed_scaling(2.5)
        .with_selection_bias(true);
    check(MoeBlockConfig::new(router, 8).with_num_shared(1).with_shared_ffn(8), 11);
}

#[test]
fn qwen2_style_gated_shared_expert_matches_the_naive_loop() {
    let router = RouterConfig::new(16, 6, 3).with_norm_topk_prob(false);
    check(MoeBlockConfig::new(router, 8).with_num_shared(1).with_shared_ffn(12).with_shared_gate(true), 9);
}

#[test]
fn experts_with_zero_rows_and_one_expert_taking_all() {
    let device = Device::flex();
    let experts = GroupedExpertsConfig::new(4, 8, 6).init(&device);
    let x = Tensor::<2>::random([7, 8], Distribution::Normal(0.0, 1.0), &device);
    for counts in [vec![0, 4, 0, 3], vec![0, 0, 7, 0], vec![7, 0, 0, 0]] {
        let y = experts.forward(x.clone(), &counts);
        let mut row = 0;
        for (e, n) in counts.iter().enumerate() {
            for _ in 0..*n {
                let single = experts
                    .forward(x.clone().narrow(0, row, 1), &(0..4).map(|i| usize::from(i == e)).collect::<Vec<_>>());
                let a = vec2(&y.clone().narrow(0, row, 1));
                let b = vec2(&single);
                assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-6));
                row += 1;
            }
        }
    }
}

#[test]
fn group_limited_selection_stays_in_the_chosen_groups_and_bias_moves_selection_only() {
    let device = Device::flex();
    let router = RouterConfig::new(8, 16, 4)
        .with_scoring(Scoring::Sigmoid)
        .with_num_groups(Some(4))
        .with_topk_groups(Some(1))
        .with_selection_bias(true)
        .init(&device);
    let x = Tensor::<2>::random([20, 8], Distribution::Normal(0.0, 1.0), &device);
    let r = router.forward(x.clone());
    let idx: Vec<i64> = r.topk_idx_tk.to_data().convert::<i64>().try_to_vec().unwrap();
    for tok in idx.chunks(4) {
        assert!(tok.iter().all(|e| e / 4 == tok[0] / 4), "one group per token: {tok:?}");
    }
    // A large bias on expert 0 draws every token to it; its weight still comes from the plain score.
    let mut load = vec![100usize; 16];
    load[0] = 0;
    let biased = router.clone().update_selection_bias(&load, 10.0);
    let r2 = biased.forward(x.clone());
    let idx2: Vec<i64> = r2.topk_idx_tk.to_data().convert::<i64>().try_to_vec().unwrap();
    assert!(idx2.chunks(4).all(|t| t.contains(&0)));
    let scores: Vec<f32> = r2.scores_te.to_data().convert::<f32>().try_to_vec().unwrap();
    let w: Vec<f32> = r2.topk_w_tk.to_data().convert::<f32>().try_to_vec().unwrap();
    for tok in 0..20 {
        let picked: Vec<usize> = idx2[tok * 4..tok * 4 + 4].iter().map(|e| *e as usize).collect();
        let sum: f32 = picked.iter().map(|e| scores[tok * 16 + e]).sum();
        for (slot, e) in picked.iter().enumerate() {
            assert!((w[tok * 4 + slot] - scores[tok * 16 + e] / sum).abs() < 1e-5);
        }
    }
}

#[test]
fn bias_update_follows_the_load_sign() {
    let device = Device::flex();
    let router = RouterConfig::new(4, 3, 1).with_scoring(Scoring::Sigmoid).with_selection_bias(true).init(&device);
    let b = router.update_selection_bias(&[30, 10, 20], 0.5).bias_e;
    assert_eq!(b.to_data().convert::<f32>().try_to_vec::<f32>().unwrap(), vec![-0.5, 0.5, 0.0]);
}
