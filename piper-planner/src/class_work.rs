//! A step's work by class on one rank, from the platform's efficiency tables: the forward seconds of
//! each layer's non-expert GEMMs, routed experts and attention core (what [`crate::time`] prices and
//! what the step costs of a CPU platform scale), and the units of the other classes
//! ([`crate::platform::step_costs`]).

use crate::comm::{A2aAlgo, GroupShape, all_to_all_s};
use crate::error::Result;
use crate::layout::TrainConfig;
use crate::model::counts::{attention_forward_flops, mlp_forward_flops};
use crate::model::{Attention, LayerKind, ModelSpec};
use crate::platform::Platform;
use crate::platform::step_costs::ClassWork;

/// Forward seconds of one layer and micro-batch on one rank, by class, at the tables' efficiency.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTables {
    /// Attention projections, dense MLP or shared experts.
    pub linear_s: f64,
    /// Routed experts at the tokens per local expert of an expert group of `ep`.
    pub experts_s: f64,
    /// The same at the peak rate (their FLOPs ÷ peak).
    pub experts_peak_s: f64,
    /// The attention core.
    pub attention_s: f64,
    /// Of `linear_s`: the shared experts.
    pub shared_s: f64,
}

impl LayerTables {
    pub fn total_s(&self) -> f64 {
        self.linear_s + self.experts_s + self.attention_s
    }
}

/// The tables' forward seconds of a layer of `kind` (`platform` as the rank sees it).
pub fn layer_tables(
    spec: &ModelSpec,
    platform: &Platform,
    cfg: &TrainConfig,
    ep: u64,
    kind: LayerKind,
) -> Result<LayerTables> {
    let peak = platform.peak_flops(&cfg.dtype)?;
    let t = cfg.tokens_per_micro_batch() as f64;
    let d = spec.hidden_size;
    let gemm = |flops: f64, m: f64, n: u64, k: u64| {
        if flops <= 0.0 { 0.0 } else { flops / (peak * platform.gemm_efficiency(m, n, k)) }
    };
    let (proj_flops, core_flops) = attention_forward_flops(spec, cfg.seq_len);
    let q_width = match spec.attention {
        Attention::Gqa { num_heads, head_dim, .. } => num_heads * head_dim,
        Attention::Mla { num_heads, v_head_dim, .. } => num_heads * v_head_dim,
    };
    let mut out = LayerTables {
        linear_s: gemm(proj_flops * t, t, q_width, d),
        experts_s: 0.0,
        attention_s: core_flops * t / (peak * platform.attention_efficiency(cfg.seq_len)),
        shared_s: 0.0,
        experts_peak_s: 0.0,
    };
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => {
            let copies = t * moe.top_k as f64 * cfg.expert_imbalance;
            let per_expert = copies * ep as f64 / moe.num_experts as f64;
            let (flops, f) = (copies * mlp_forward_flops(d, &moe.expert), moe.expert.intermediate_size);
            out.experts_s =
                if flops > 0.0 { flops / (peak * platform.experts_efficiency(per_expert, f, d)) } else { 0.0 };
            out.experts_peak_s = flops / peak;
            let shared = moe.shared_expert();
            out.shared_s =
                gemm(t * moe.num_shared_experts as f64 * mlp_forward_flops(d, &shared), t, shared.intermediate_size, d);
            out.linear_s += out.shared_s;
        }
        _ => {
            if let Some(m) = &spec.dense_mlp {
                out.linear_s += gemm(t * mlp_forward_flops(d, m), t, m.intermediate_size, d);
            }
        }
    }
    Ok(out)
}

/// The tables' forward seconds of the LM head (and the MTP modules' heads) for one micro-batch.
pub fn head_table_s(spec: &ModelSpec, platform: &Platform, cfg: &TrainConfig) -> Result<f64> {
    let peak = platform.peak_flops(&cfg.dtype)?;
    let t = cfg.tokens_per_micro_batch() as f64;
    let (d, v) = (spec.hidden_size, spec.vocab_size);
    let depth = 1.0 + spec.mtp_depth as f64;
    Ok(depth * 2.0 * (d * v) as f64 * t / (peak * platform.gemm_efficiency(t, v, d)))
}

/// Seconds the links take for one expert all-to-all of a layer of `kind` (dispatch or combine, forward
/// or backward) in the expert group of `ep` ranks starting at rank 0 (groups are aligned blocks).
pub fn exchange_link_s(
    spec: &ModelSpec,
    platform: &Platform,
    cfg: &TrainConfig,
    ep: u64,
    kind: LayerKind,
    algo: A2aAlgo,
) -> Result<f64> {
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) if ep > 1 => {
            let copies = cfg.tokens_per_micro_batch() as f64 * moe.top_k as f64 * cfg.expert_imbalance;
            let bytes_per_peer = copies * spec.hidden_size as f64 * cfg.elem_bytes()? / ep as f64;
            Ok(all_to_all_s(platform, &GroupShape::new(platform, 0, ep, 1), bytes_per_peer, algo))
        }
        _ => Ok(0.0),
    }
}

/// The whole model's work for one micro-batch on one rank holding every layer, in an expert group of
/// `ep` ranks (no other parallelism; the runtime's default flat all-to-all), forward + backward: what
/// a profiled calibration run is set against.
pub fn class_work(spec: &ModelSpec, platform: &Platform, cfg: &TrainConfig, ep: u64) -> Result<ClassWork> {
    let t = cfg.tokens_per_micro_batch() as f64;
    let mut w = ClassWork::default();
    let kinds = spec.layers.iter().copied().chain(std::iter::repeat_n(spec.mtp_layer_kind(), spec.mtp_depth as usize));
    for kind in kinds {
        let l = layer_tables(spec, platform, cfg, ep, kind)?;
        w.linear_table_s += 3.0 * l.linear_s;
        w.experts_table_s += 3.0 * l.experts_s;
        w.experts_peak_s += 3.0 * l.experts_peak_s;
        w.attention_table_s += 3.0 * l.attention_s;
        w.layer_token_dims += t * spec.hidden_size as f64;
        w.routed_token_experts += routed_token_experts(spec, t, kind);
        // Dispatch and combine, forward and backward.
        w.exchange_link_s += 4.0 * exchange_link_s(spec, platform, cfg, ep, kind, A2aAlgo::Flat)?;
        w.exchange_token_dims += exchange_token_dims(spec, cfg, ep, kind);
        w.layers += 1.0;
    }
    w.linear_table_s += 3.0 * head_table_s(spec, platform, cfg)?;
    w.vocab_tokens = (1 + spec.mtp_depth) as f64 * t * spec.vocab_size as f64;
    w.params = crate::model::counts::param_breakdown(spec).total() as f64;
    Ok(w)
}

/// Routed token copies × hidden width of one layer and micro-batch under expert parallelism (0 for a
/// dense layer or a rank holding every expert): what the exchange path stages, permutes and combines.
pub fn exchange_token_dims(spec: &ModelSpec, cfg: &TrainConfig, ep: u64, kind: LayerKind) -> f64 {
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) if ep > 1 => {
            cfg.tokens_per_micro_batch() as f64 * moe.top_k as f64 * cfg.expert_imbalance * spec.hidden_size as f64
        }
        _ => 0.0,
    }
}

/// Tokens × routed experts of one layer (0 for a dense layer): the routing work of its router.
pub fn routed_token_experts(spec: &ModelSpec, tokens: f64, kind: LayerKind) -> f64 {
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => tokens * moe.num_experts as f64,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Layout, StageSplit};
    use crate::model::preset;
    use crate::platform::StepCosts;
    use crate::platform::step_costs::PerLayerCosts;
    use crate::time::CostModel;

    /// On one rank, the time model's step is the step costs applied to the whole model's work, summed
    /// here layer by layer apart from it: compute from [`StepCosts::compute_s`], the update from the
    /// parameters.
    #[test]
    fn one_rank_step_is_the_step_costs_of_its_work() {
        let sc = StepCosts {
            linear: 1.1,
            experts: 0.9,
            experts_peak: 0.3,
            attention: 1.4,
            exchange_experts: 0.6,
            exchange_ns: 5.0,
            layer_ns: 12.0,
            routing_ns: 40.0,
            cross_entropy_ns: 1.5,
            optimizer_ns: 2.0,
            replica_sync: 0.0,
            per_layer_us: PerLayerCosts { linear: 30.0, experts: 20.0, attention: 10.0, layer: 70.0, optimizer: 15.0 },
        };
        let platform = Platform { step_costs: Some(sc), ..crate::platform::preset("local").unwrap() };
        for name in ["tiny", "tiny-deepseek", "tiny-qwen3"] {
            let spec = preset(name).unwrap();
            let cfg = TrainConfig { micro_batch_size: 4, dtype: "fp32".into(), ..TrainConfig::new(64) };
            let layout = Layout { pp: 1, ep: 1, dp: 1 };
            let model = CostModel::new(&spec, &platform, &layout, &cfg, A2aAlgo::Flat).unwrap();
            let stage = model.stage(0, 0, spec.num_layers);
            let w = class_work(&spec, &platform, &cfg, 1).unwrap();
            let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-9;
            assert!(close(stage.forward_s + stage.backward_s, sc.compute_s(&w, 1)), "{name}");
            assert!(close(stage.optimizer_s, sc.optimizer_s(w.params, w.layers)), "{name}");
            let p = model.predict(&StageSplit(vec![spec.num_layers]));
            assert!(close(p.step_time_s, sc.compute_s(&w, 1) + stage.optimizer_s), "{name}");
        }
    }

    /// Data-parallel replicas add their measured reduction share of the stage's compute (every
    /// micro-batch) to the gradient reduction; expert parallelism alone (replicas that meet at every
    /// all-to-all) and one rank add nothing.
    #[test]
    fn replicas_wait_their_measured_share_of_the_compute() {
        let sc = |replica_sync| StepCosts {
            linear: 1.0,
            experts: 1.0,
            experts_peak: 0.0,
            attention: 1.0,
            exchange_experts: 0.0,
            exchange_ns: 0.0,
            layer_ns: 1.0,
            routing_ns: 1.0,
            cross_entropy_ns: 1.0,
            optimizer_ns: 1.0,
            replica_sync,
            per_layer_us: PerLayerCosts::default(),
        };
        let local = crate::platform::preset("local").unwrap();
        let spec = preset("tiny").unwrap();
        for (pp, ep, dp, m) in [(1u64, 1u64, 1u64, 1u64), (1, 1, 2, 1), (1, 2, 1, 1), (1, 2, 2, 2), (2, 1, 2, 4)] {
            let cfg =
                TrainConfig { micro_batch_size: 2, num_micro_batches: m, dtype: "fp32".into(), ..TrainConfig::new(32) };
            let layout = Layout { pp, ep, dp };
            let stage = |sync: f64| {
                let platform = Platform { step_costs: Some(sc(sync)), ..local.clone() };
                CostModel::new(&spec, &platform, &layout, &cfg, A2aAlgo::Flat).unwrap().stage(
                    0,
                    0,
                    spec.num_layers / pp,
                )
            };
            let (with, without) = (stage(0.25), stage(0.0));
            let want = if dp > 1 { 0.25 * m as f64 * (without.forward_s + without.backward_s) } else { 0.0 };
            let got = with.grad_reduce_s - without.grad_reduce_s;
            assert!((got - want).abs() <= 1e-12 * want.max(1e-9), "PP {pp} EP {ep} DP {dp} M {m}: {got} vs {want}");
            assert_eq!((with.forward_s, with.backward_s), (without.forward_s, without.backward_s));
        }
    }
}
