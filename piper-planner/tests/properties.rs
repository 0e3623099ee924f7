//! Properties of the memory model over many models and layouts.

use piper_planner::layout::{Layout, Recompute, Schedule, StageSplit, TrainConfig};
use piper_planner::memory::Footprint;
use piper_planner::model::preset;
use piper_planner::platform;
use proptest::prelude::*;

const MODELS: &[&str] =
    &["mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b", "llama4-maverick", "xmoe-large", "gpt-oss-120b"];

fn recompute(i: u8) -> Recompute {
    [Recompute::None, Recompute::Selective, Recompute::Full][i as usize % 3]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn memory_falls_as_ep_grows(model in 0..MODELS.len(), pp_pow in 0u32..4, m in 1u64..16, r in 0u8..3, zero1: bool) {
        let spec = preset(MODELS[model]).unwrap();
        let p = platform::preset("frontier").unwrap();
        let pp = 1u64 << pp_pow;
        let cfg = TrainConfig { num_micro_batches: m, recompute: recompute(r), zero1, ..TrainConfig::new(2048) };
        let split = StageSplit::even(spec.num_layers, pp);
        let experts = spec.num_experts();
        let mut prev: Option<Vec<f64>> = None;
        for ep in [1u64, 2, 4, 8].into_iter().filter(|e| experts.is_multiple_of(*e)) {
            let stages = Footprint::new(&spec, &p, &Layout { pp, ep, dp: 1 }, &cfg).unwrap().stages(&split);
            let totals: Vec<f64> = stages.iter().map(|s| s.total_bytes).collect();
            if let Some(prev) = &prev {
                for (a, b) in totals.iter().zip(prev) {
                    prop_assert!(a <= b, "{} ep={ep}: {a} > {b}", MODELS[model]);
                }
            }
            prev = Some(totals);
        }
    }

    #[test]
    fn one_f_one_b_activations_never_exceed_gpipe(model in 0..MODELS.len(), pp_pow in 0u32..4, m in 1u64..32, r in 0u8..3) {
        let spec = preset(MODELS[model]).unwrap();
        let p = platform::preset("frontier").unwrap();
        let pp = 1u64 << pp_pow;
        let layout = Layout { pp, ep: 1, dp: 1 };
        let split = StageSplit::even(spec.num_layers, pp);
        let base = TrainConfig { num_micro_batches: m, recompute: recompute(r), ..TrainConfig::new(4096) };
        let f = Footprint::new(&spec, &p, &layout, &TrainConfig { schedule: Schedule::OneFOneB, ..base.clone() }).unwrap().stages(&split);
        let g = Footprint::new(&spec, &p, &layout, &TrainConfig { schedule: Schedule::GPipe, ..base }).unwrap().stages(&split);
        for (a, b) in f.iter().zip(&g) {
            prop_assert!(a.activation_bytes <= b.activation_bytes);
            prop_assert_eq!(a.params_bytes, b.params_bytes);
        }
    }

    #[test]
    fn recomputation_only_saves_activation_memory(model in 0..MODELS.len(), m in 1u64..8) {
        let spec = preset(MODELS[model]).unwrap();
        let p = platform::preset("frontier").unwrap();
        let layout = Layout { pp: 2, ep: 1, dp: 1 };
        let split = StageSplit::even(spec.num_layers, 2);
        let at = |r| Footprint::new(&spec, &p, &layout, &TrainConfig { num_micro_batches: m, recompute: r, flash_attention: false, ..TrainConfig::new(4096) }).unwrap().stages(&split);
        let (none, sel, full) = (at(Recompute::None), at(Recompute::Selective), at(Recompute::Full));
        for s in 0..2 {
            prop_assert!(sel[s].activation_bytes <= none[s].activation_bytes);
            // Full recompute keeps one layer's working set; with several layers in flight it is smallest.
            prop_assert!(full[s].activation_bytes <= none[s].activation_bytes);
        }
    }
}
