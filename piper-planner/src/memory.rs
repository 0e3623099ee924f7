//! Per-rank memory of each pipeline stage: parameters, gradients, optimizer states, activations of the
//! in-flight micro-batches, and the framework's overhead — every term reported.
//!
//! Activations per layer per micro-batch on one rank (T = micro-batch size · s tokens, e = element bytes):
//! - attention: e·T·(2d + q + 2·kv + o_in) — layer input, normed input, q, k, v and the attention output
//!   (MHA: 6·d, Piper's 12·b·s·d bytes at 2-byte elements); MLA adds its q and kv latents;
//! - attention scores: without flash attention e·2·b·H·s² (Piper's 4·b·H·s² bytes), with flash attention
//!   the fp32 log-sum-exp 4·b·H·s;
//! - MLP input: e·T·d (the second norm's input);
//! - routed experts: e·T·k·(m·f + d) for m-matrix experts (gated: Piper's 2·b·s·k·(3f + d) bytes);
//!   selective recompute keeps e·T·k·((m−1)·f + d); shared experts and dense MLPs alike with k = 1;
//! - router: fp32 scores 4·T·E plus the top-k indices and weights 12·T·k.
//!
//! Full recompute keeps only e·T·d per layer and micro-batch, plus one layer's full working set.
//! The last stage also holds the final norm's input and the logits (e + 4 fp32 bytes per vocab entry).
//! In-flight micro-batches come from the schedule's op list: GPipe M, 1F1B min(M, PP − stage).

use serde::Serialize;

use crate::error::Result;
use crate::layout::{Layout, Recompute, StageSplit, TrainConfig};
use crate::model::counts::{layer_params, mtp_module_params};
use crate::model::{Attention, LayerKind, ModelSpec};
use crate::platform::Platform;
use crate::schedule;

/// Activation bytes of a stage by term (all in-flight micro-batches included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ActivationTerms {
    pub attention: f64,
    pub attention_scores: f64,
    pub mlp_input: f64,
    pub routed_experts: f64,
    pub shared_experts: f64,
    pub dense_mlp: f64,
    pub router: f64,
    /// Full recompute: layer inputs kept for the recomputation.
    pub checkpoints: f64,
    /// Full recompute: one layer's activations, rebuilt during its backward.
    pub recompute_working_set: f64,
    /// Last stage: final-norm input and logits.
    pub logits: f64,
}

impl ActivationTerms {
    pub fn total(&self) -> f64 {
        self.attention
            + self.attention_scores
            + self.mlp_input
            + self.routed_experts
            + self.shared_experts
            + self.dense_mlp
            + self.router
            + self.checkpoints
            + self.recompute_working_set
            + self.logits
    }

    fn scaled(&self, k: f64) -> Self {
        ActivationTerms {
            attention: self.attention * k,
            attention_scores: self.attention_scores * k,
            mlp_input: self.mlp_input * k,
            routed_experts: self.routed_experts * k,
            shared_experts: self.shared_experts * k,
            dense_mlp: self.dense_mlp * k,
            router: self.router * k,
            checkpoints: self.checkpoints * k,
            recompute_working_set: self.recompute_working_set * k,
            logits: self.logits * k,
        }
    }

    fn add(&mut self, o: &Self) {
        *self = ActivationTerms {
            attention: self.attention + o.attention,
            attention_scores: self.attention_scores + o.attention_scores,
            mlp_input: self.mlp_input + o.mlp_input,
            routed_experts: self.routed_experts + o.routed_experts,
            shared_experts: self.shared_experts + o.shared_experts,
            dense_mlp: self.dense_mlp + o.dense_mlp,
            router: self.router + o.router,
            checkpoints: self.checkpoints + o.checkpoints,
            recompute_working_set: self.recompute_working_set + o.recompute_working_set,
            logits: self.logits + o.logits,
        }
    }
}

/// Memory of one rank of one pipeline stage, bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageMemory {
    pub stage: u64,
    pub first_layer: u64,
    pub num_layers: u64,
    /// Micro-batches whose activations are resident at the peak.
    pub in_flight: u64,
    /// Parameters held by this rank.
    pub params: f64,
    pub params_bytes: f64,
    pub grads_bytes: f64,
    pub optimizer_bytes: f64,
    pub activation_bytes: f64,
    pub activations: ActivationTerms,
    pub overhead_bytes: f64,
    /// The history's correction (`refinement.memory_scale` − 1 of the other parts; 0 without one).
    pub refined_bytes: f64,
    pub total_bytes: f64,
}

/// A runtime's measured activation bytes ÷ the model's count: `held` per micro-batch the schedule keeps,
/// `working` once, for the backward that runs.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scale {
    held: f64,
    working: f64,
}

impl Scale {
    /// The model's own count, every micro-batch's activations held until its backward.
    const COUNTED: Scale = Scale { held: 1.0, working: 0.0 };

    /// The factor on one micro-batch's count with `in_flight` micro-batches held.
    fn of(&self, in_flight: u64) -> f64 {
        in_flight as f64 * self.held + self.working
    }
}

/// Static and per-micro-batch memory of each layer, from which any stage split is priced.
#[derive(Clone, Debug)]
pub struct Footprint {
    /// Parameters per layer held by one rank (non-expert + routed / EP), and the optimizer-state share.
    layer_params: Vec<(f64, f64)>,
    /// Activations per layer per micro-batch (checkpointed part under full recompute).
    layer_act: Vec<ActivationTerms>,
    /// Full recompute: the working set of each layer (transient, once per stage).
    layer_working_set: Vec<f64>,
    first_stage_params: (f64, f64),
    last_stage_params: (f64, f64),
    last_stage_act: ActivationTerms,
    cfg: TrainConfig,
    layout: Layout,
    overhead: f64,
    /// The history's correction of the total (1 without one).
    memory_scale: f64,
    /// The runtime's measured bytes per parameter ÷ the configured ones, and its activation factor (1
    /// where the platform has no runtime measurements).
    state_factor: f64,
    /// The runtime's activation bytes ÷ the model's count: per micro-batch held and once for the
    /// backward that runs (layers; logits). 1 and 0 where the platform has no runtime measurements.
    activation_scale: Scale,
    logits_scale: Scale,
    /// Prefix sums over layers (index i = layers 0..i): held params, optimizer-state params,
    /// activation bytes per micro-batch, MoE layer count.
    prefix: Vec<[f64; 4]>,
    /// Full-recompute working set of a dense and of an MoE layer.
    working_set_dense: f64,
    working_set_moe: f64,
}

impl Footprint {
    pub fn new(spec: &ModelSpec, platform: &Platform, layout: &Layout, cfg: &TrainConfig) -> Result<Self> {
        // The platform as the layout's ranks see it: a CPU rank's memory is that of its thread count.
        let platform = platform.for_node_ranks(layout.gpus().min(platform.gpus_per_node));
        let e = cfg.elem_bytes()?;
        let t = cfg.tokens_per_micro_batch() as f64;
        let d = spec.hidden_size as f64;
        let (ep, dp) = (layout.ep as f64, layout.dp as f64);
        // Optimizer-state shards: non-expert states over EP·DP ranks, expert states over DP (ZeRO-1).
        let (dense_shard, expert_shard) = if cfg.zero1 { (ep * dp, dp) } else { (1.0, 1.0) };
        let params_of = |kind: LayerKind| {
            let p = layer_params(spec, kind);
            let held = p.non_expert() as f64 + p.routed_experts as f64 / ep;
            let opt = p.non_expert() as f64 / dense_shard + p.routed_experts as f64 / ep / expert_shard;
            (held, opt)
        };
        let full_act = |kind: LayerKind| layer_activations(spec, kind, cfg, e, Recompute::None);
        let mut layer_params_v = Vec::new();
        let mut layer_act = Vec::new();
        let mut layer_ws = Vec::new();
        for kind in &spec.layers {
            layer_params_v.push(params_of(*kind));
            match cfg.recompute {
                Recompute::Full => {
                    layer_act.push(ActivationTerms { checkpoints: e * t * d, ..Default::default() });
                    layer_ws.push(full_act(*kind).total());
                }
                r => {
                    layer_act.push(layer_activations(spec, *kind, cfg, e, r));
                    layer_ws.push(0.0);
                }
            }
        }
        let v = spec.vocab_size as f64;
        let emb = v * d;
        let mut last_params = spec.norm.params(spec.hidden_size) as f64 + emb; // final norm + head (tied: a copy)
        let mut last_opt = last_params / dense_shard;
        if spec.mtp_depth > 0 {
            let mtp_total = mtp_module_params(spec) as f64;
            let mtp_experts = layer_params(spec, spec.mtp_layer_kind()).routed_experts as f64;
            let mtp = spec.mtp_depth as f64;
            last_params += mtp * (mtp_total - mtp_experts + mtp_experts / ep);
            last_opt += mtp * ((mtp_total - mtp_experts) / dense_shard + mtp_experts / ep / expert_shard);
        }
        let depth = 1.0 + spec.mtp_depth as f64;
        let mut last_act = ActivationTerms { logits: depth * (e * t * d + t * v * (e + 4.0)), ..Default::default() };
        if spec.mtp_depth > 0 {
            last_act.add(&full_act(spec.mtp_layer_kind()).scaled(spec.mtp_depth as f64));
        }
        let mut prefix = vec![[0.0; 4]];
        for (i, kind) in spec.layers.iter().enumerate() {
            let p = prefix[i];
            let moe = f64::from(u8::from(*kind == LayerKind::Moe));
            prefix.push([
                p[0] + layer_params_v[i].0,
                p[1] + layer_params_v[i].1,
                p[2] + layer_act[i].total(),
                p[3] + moe,
            ]);
        }
        let ws_of = |want: LayerKind| {
            crate::limits::max_or_zero(spec.layers.iter().zip(&layer_ws).filter(|(k, _)| **k == want).map(|(_, w)| *w))
        };
        Ok(Footprint {
            prefix,
            working_set_dense: ws_of(LayerKind::Dense),
            working_set_moe: ws_of(LayerKind::Moe),
            layer_params: layer_params_v,
            layer_act,
            layer_working_set: layer_ws,
            first_stage_params: (emb, emb / dense_shard),
            last_stage_params: (last_params, last_opt),
            last_stage_act: last_act,
            cfg: cfg.clone(),
            layout: *layout,
            overhead: platform.overhead_bytes() + expert_exchange_bytes(&platform, layout),
            memory_scale: platform.refinement().memory_scale,
            state_factor: platform.runtime.map_or(1.0, |r| {
                let configured = cfg.weight_bytes + cfg.grad_bytes + cfg.optimizer_bytes;
                if configured > 0.0 { r.bytes_per_param / configured } else { 1.0 }
            }),
            activation_scale: platform
                .runtime
                .map_or(Scale::COUNTED, |r| Scale { held: r.activation_factor, working: r.activation_working_factor }),
            logits_scale: platform
                .runtime
                .map_or(Scale::COUNTED, |r| Scale { held: r.logits_factor, working: r.logits_working_factor }),
        })
    }

    /// Memory of stage `stage` holding layers `first..first + n`, with the schedule's in-flight count.
    pub fn stage(&self, stage: u64, first: u64, n: u64) -> StageMemory {
        let pp = self.layout.pp;
        let in_flight = schedule::peak_in_flight(self.cfg.schedule, stage, pp, self.cfg.num_micro_batches);
        let range = first as usize..(first + n) as usize;
        let (mut params, mut opt_params) =
            self.layer_params[range.clone()].iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
        let mut act = ActivationTerms::default();
        for a in &self.layer_act[range.clone()] {
            act.add(a);
        }
        let (layers, logits) = (self.activation_scale.of(in_flight), self.logits_scale.of(in_flight));
        let mut act = act.scaled(layers);
        act.recompute_working_set =
            self.activation_scale.held * crate::limits::max_or_zero(self.layer_working_set[range].iter().copied());
        if stage == 0 {
            params += self.first_stage_params.0;
            opt_params += self.first_stage_params.1;
        }
        if stage == pp - 1 {
            params += self.last_stage_params.0;
            opt_params += self.last_stage_params.1;
            let l = &self.last_stage_act;
            act.add(&ActivationTerms { logits: l.logits * logits, ..l.scaled(layers) });
        }
        let c = &self.cfg;
        let (pb, gb, ob) = (params * c.weight_bytes, params * c.grad_bytes, opt_params * c.optimizer_bytes);
        let (pb, gb, ob) = (pb * self.state_factor, gb * self.state_factor, ob * self.state_factor);
        let activation_bytes = act.total();
        StageMemory {
            stage,
            first_layer: first,
            num_layers: n,
            in_flight,
            params,
            params_bytes: pb,
            grads_bytes: gb,
            optimizer_bytes: ob,
            activation_bytes,
            activations: act,
            overhead_bytes: self.overhead,
            refined_bytes: (self.memory_scale - 1.0) * (pb + gb + ob + activation_bytes + self.overhead),
            total_bytes: self.memory_scale * (pb + gb + ob + activation_bytes + self.overhead),
        }
    }

    /// `stage(..).total_bytes` in O(1), for split search.
    pub fn stage_total_bytes(&self, stage: u64, first: u64, n: u64) -> f64 {
        let pp = self.layout.pp;
        let in_flight = schedule::peak_in_flight(self.cfg.schedule, stage, pp, self.cfg.num_micro_batches);
        let (layers, logits) = (self.activation_scale.of(in_flight), self.logits_scale.of(in_flight));
        let (a, b) = (self.prefix[first as usize], self.prefix[(first + n) as usize]);
        let (mut params, mut opt_params) = (b[0] - a[0], b[1] - a[1]);
        let mut act = (b[2] - a[2]) * layers;
        let moe_layers = b[3] - a[3];
        act += self.activation_scale.held
            * if moe_layers > 0.0 { self.working_set_moe } else { 0.0 }.max(if moe_layers < n as f64 {
                self.working_set_dense
            } else {
                0.0
            });
        if stage == 0 {
            params += self.first_stage_params.0;
            opt_params += self.first_stage_params.1;
        }
        if stage == pp - 1 {
            params += self.last_stage_params.0;
            opt_params += self.last_stage_params.1;
            let l = &self.last_stage_act;
            act += (l.total() - l.logits) * layers + l.logits * logits;
        }
        let c = &self.cfg;
        self.memory_scale
            * ((params * (c.weight_bytes + c.grad_bytes) + opt_params * c.optimizer_bytes) * self.state_factor
                + act
                + self.overhead)
    }

    /// Memory of every stage of a split.
    pub fn stages(&self, split: &StageSplit) -> Vec<StageMemory> {
        split
            .starts()
            .iter()
            .zip(&split.0)
            .enumerate()
            .map(|(s, (first, n))| self.stage(s as u64, *first, *n))
            .collect()
    }
}

/// Activations of one layer for one micro-batch on one rank.
/// What an expert-parallel rank holds for the exchange beyond the model's count (none at `ep = 1`).
fn expert_exchange_bytes(platform: &Platform, layout: &Layout) -> f64 {
    if layout.ep > 1 { platform.runtime.map_or(0.0, |r| r.expert_exchange_bytes) } else { 0.0 }
}

fn layer_activations(
    spec: &ModelSpec,
    kind: LayerKind,
    cfg: &TrainConfig,
    e: f64,
    recompute: Recompute,
) -> ActivationTerms {
    let t = cfg.tokens_per_micro_batch() as f64;
    let d = spec.hidden_size as f64;
    let b = cfg.micro_batch_size as f64;
    let s = cfg.seq_len as f64;
    let h = spec.num_heads() as f64;
    let attn_width = match spec.attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, .. } => {
            (2 * d as u64 + 2 * num_heads * head_dim + 2 * num_kv_heads * head_dim) as f64
        }
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let qk = num_heads * (qk_nope_head_dim + qk_rope_head_dim);
            (2 * d as u64
                + q_lora_rank.unwrap_or(0)
                + kv_lora_rank
                + qk_rope_head_dim
                + 2 * qk
                + 2 * num_heads * v_head_dim) as f64
        }
    };
    let scores = if cfg.flash_attention || recompute == Recompute::Selective {
        4.0 * b * h * s
    } else {
        e * 2.0 * b * h * s * s
    };
    // Stored MLP activations per token per copy: m·f + d, or (m−1)·f + d when the activation function is recomputed.
    let mlp = |mlp: &crate::model::Mlp, activation_recomputed: bool| {
        let recomputed = activation_recomputed || recompute == Recompute::Selective;
        let kept = if recomputed { mlp.matrices() - 1 } else { mlp.matrices() };
        (kept * mlp.intermediate_size) as f64 + d
    };
    let mut a = ActivationTerms {
        attention: e * t * attn_width,
        attention_scores: scores,
        mlp_input: e * t * d,
        ..Default::default()
    };
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => {
            let k = moe.top_k as f64;
            a.routed_experts = e * t * k * mlp(&moe.expert, cfg.expert_activation_recomputed) * cfg.expert_imbalance;
            a.shared_experts = e * t * moe.num_shared_experts as f64 * mlp(&moe.shared_expert(), false);
            a.router = 4.0 * t * moe.num_experts as f64 + 12.0 * t * k;
        }
        _ => a.dense_mlp = spec.dense_mlp.as_ref().map_or(0.0, |m| e * t * mlp(m, false)),
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Schedule;
    use crate::model::preset;
    use crate::platform;

    fn cfg(m: u64) -> TrainConfig {
        TrainConfig { num_micro_batches: m, micro_batch_size: 2, ..TrainConfig::new(4096) }
    }

    #[test]
    fn mha_layer_matches_pipers_closed_form() {
        // Piper (via [R]): attention 12·b·s·d + 4·b·H·s², experts 2·b·s·k·(3f + d) bytes per layer (bf16).
        let spec = preset("piper-110b").unwrap(); // MHA, d 5120, 40 heads
        let mut c = cfg(1);
        c.flash_attention = false;
        let a = layer_activations(&spec, LayerKind::Moe, &c, 2.0, Recompute::None);
        let (b, s, d, h) = (2.0, 4096.0, 5120.0, 40.0);
        assert_eq!(a.attention, 12.0 * b * s * d);
        assert_eq!(a.attention_scores, 4.0 * b * h * s * s);
        // piper-110b has 2-matrix experts: 2·b·s·k·(2f + d).
        assert_eq!(a.routed_experts, 2.0 * b * s * 2.0 * (2.0 * 20480.0 + d));
        let mix = preset("mixtral-8x7b").unwrap();
        let a = layer_activations(&mix, LayerKind::Moe, &c, 2.0, Recompute::None);
        assert_eq!(a.routed_experts, 2.0 * b * s * 2.0 * (3.0 * 14336.0 + 4096.0));
    }

    /// A routed-experts op that recomputes its activation holds `(m − 1)·f + d` per routed row (as
    /// selective recompute prices it), and nothing else changes: the shared experts and the attention
    /// are held as before.
    #[test]
    fn experts_that_recompute_their_activation_hold_one_f_less_per_routed_row() {
        let spec = preset("deepseek-v2").unwrap(); // routed and shared experts
        let moe = spec.moe.clone().unwrap();
        let (b, s, f, k) = (2.0, 4096.0, moe.expert.intermediate_size as f64, moe.top_k as f64);
        let held = layer_activations(&spec, LayerKind::Moe, &cfg(1), 2.0, Recompute::None);
        let c = TrainConfig { expert_activation_recomputed: true, ..cfg(1) };
        let recomputed = layer_activations(&spec, LayerKind::Moe, &c, 2.0, Recompute::None);
        assert_eq!(held.routed_experts - recomputed.routed_experts, 2.0 * b * s * k * f);
        assert_eq!(ActivationTerms { routed_experts: held.routed_experts, ..recomputed }, held);
        let selective = layer_activations(&spec, LayerKind::Moe, &cfg(1), 2.0, Recompute::Selective);
        assert_eq!(recomputed.routed_experts, selective.routed_experts);
        let both = layer_activations(&spec, LayerKind::Moe, &c, 2.0, Recompute::Selective);
        assert_eq!(both, selective, "selective recompute already recomputes it");
    }

    #[test]
    fn states_are_sixteen_bytes_per_param_split_over_ep() {
        // Piper: 64·d² attention + 48·E·d·f / EP expert bytes per layer (16 B/param), non-experts replicated.
        let spec = preset("mixtral-8x7b").unwrap();
        let p = platform::preset("frontier").unwrap();
        let layout = Layout { pp: 4, ep: 8, dp: 1 };
        let fp = Footprint::new(&spec, &p, &layout, &cfg(8)).unwrap();
        let st = fp.stage(1, 8, 8); // a middle stage: no embedding or head
        let lp = layer_params(&spec, LayerKind::Moe);
        let expect = 8.0 * (lp.non_expert() as f64 + lp.routed_experts as f64 / 8.0) * 16.0;
        assert!((st.params_bytes + st.grads_bytes + st.optimizer_bytes - expect).abs() < 1.0);
        assert_eq!(lp.routed_experts, 8 * 3 * 4096 * 14336);
    }

    #[test]
    fn in_flight_follows_the_schedule() {
        let spec = preset("mixtral-8x7b").unwrap();
        let p = platform::preset("frontier").unwrap();
        let layout = Layout { pp: 4, ep: 8, dp: 1 };
        for (sched, expect) in [(Schedule::OneFOneB, [4, 3, 2, 1]), (Schedule::GPipe, [8, 8, 8, 8])] {
            let c = TrainConfig { schedule: sched, ..cfg(8) };
            let stages = Footprint::new(&spec, &p, &layout, &c).unwrap().stages(&StageSplit::even(32, 4));
            assert_eq!(stages.iter().map(|s| s.in_flight).collect::<Vec<_>>(), expect);
        }
    }

    #[test]
    fn fast_total_matches_the_itemised_stage() {
        let mut p = platform::preset("frontier").unwrap();
        // With a runtime's measured memory too: 20 B per parameter, activations ×1.5 per micro-batch held
        // and ×0.25 for the one in its backward, logits ×3 and ×0.5.
        let measured = crate::platform::RuntimeCosts {
            op_overhead_us: 1.0,
            norm_ns: 1.0,
            rope_ns: 1.0,
            softmax_ns: 1.0,
            swiglu_ns: 1.0,
            elementwise_ns: 1.0,
            optimizer_ns_per_param: 1.0,
            bytes_per_param: 20.0,
            activation_factor: 1.5,
            logits_factor: 3.0,
            activation_working_factor: 0.25,
            logits_working_factor: 0.5,
            expert_exchange_bytes: 3.0e6,
        };
        for runtime in [None, Some(measured)] {
            p.runtime = runtime;
            fast_total_matches_on(&p);
        }
        // The factors apply term by term: states × 20/16; with n micro-batches held, layer activations
        // × (1.5·n + 0.25)/n and logits × (3·n + 0.5)/n of the model's count (which holds n).
        let spec = preset("mixtral-8x7b").unwrap();
        let layout = Layout { pp: 2, ep: 8, dp: 1 };
        for (schedule, held) in [(Schedule::OneFOneB, 1.0), (Schedule::GPipe, 4.0)] {
            let c = TrainConfig { schedule, ..cfg(4) };
            let frontier = platform::preset("frontier").unwrap();
            let plain = Footprint::new(&spec, &frontier, &layout, &c).unwrap().stage(1, 16, 16);
            let got = Footprint::new(&spec, &p, &layout, &c).unwrap().stage(1, 16, 16);
            assert_eq!(got.in_flight as f64, held);
            let states = |m: &StageMemory| m.params_bytes + m.grads_bytes + m.optimizer_bytes;
            let ratio = |a: f64, b: f64, want: f64| assert!((a / b - want).abs() < 1e-12, "{a} / {b} ≠ {want}");
            ratio(states(&got), states(&plain), 20.0 / 16.0);
            ratio(got.activations.logits, plain.activations.logits, (3.0 * held + 0.5) / held);
            ratio(got.activations.routed_experts, plain.activations.routed_experts, (1.5 * held + 0.25) / held);
        }
    }

    fn fast_total_matches_on(p: &Platform) {
        for (name, recompute) in [
            ("deepseek-v3", Recompute::Full),
            ("llama4-maverick", Recompute::Selective),
            ("mixtral-8x7b", Recompute::None),
        ] {
            let spec = preset(name).unwrap();
            let layout = Layout { pp: 4, ep: 4, dp: 2 };
            let fp = Footprint::new(&spec, p, &layout, &TrainConfig { recompute, ..cfg(6) }).unwrap();
            for (s, first, n) in [(0, 0, 5), (1, 3, 7), (3, spec.num_layers - 9, 9), (2, 10, 1)] {
                let slow = fp.stage(s, first, n).total_bytes;
                assert!((fp.stage_total_bytes(s, first, n) - slow).abs() <= 1e-6 * slow, "{name} {s} {first} {n}");
            }
        }
    }

    #[test]
    fn only_expert_parallel_ranks_hold_the_exchange_overhead() {
        let spec = preset("mixtral-8x7b").unwrap();
        let mut p = platform::preset("frontier").unwrap();
        let total = |p: &Platform, ep: u64| {
            Footprint::new(&spec, p, &Layout { pp: 2, ep, dp: 1 }, &cfg(4)).unwrap().stage(1, 16, 16).total_bytes
        };
        let costs = p.runtime.unwrap_or_else(crate::platform::RuntimeCosts::distinct_for_tests);
        p.runtime = Some(crate::platform::RuntimeCosts { expert_exchange_bytes: 5.0e7, ..costs });
        let without = crate::platform::RuntimeCosts { expert_exchange_bytes: 0.0, ..costs };
        let mut q = p.clone();
        q.runtime = Some(without);
        // Against the same platform without the term: + 50 MB on an expert-parallel rank, nothing at ep = 1.
        assert_eq!(total(&p, 1), total(&q, 1));
        assert!((total(&p, 8) - total(&q, 8) - 5.0e7).abs() < 1e-3, "{} {}", total(&p, 8), total(&q, 8));
    }

    #[test]
    fn zero1_shards_optimizer_states() {
        let spec = preset("mixtral-8x7b").unwrap();
        let p = platform::preset("frontier").unwrap();
        let layout = Layout { pp: 1, ep: 8, dp: 4 };
        let plain = Footprint::new(&spec, &p, &layout, &cfg(1)).unwrap().stage(0, 0, 32);
        let z = Footprint::new(&spec, &p, &layout, &TrainConfig { zero1: true, ..cfg(1) }).unwrap().stage(0, 0, 32);
        assert!(z.optimizer_bytes < plain.optimizer_bytes / 3.9 && z.optimizer_bytes > plain.optimizer_bytes / 32.1);
        assert_eq!(z.params_bytes, plain.params_bytes);
    }
}
