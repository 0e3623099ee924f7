//! Time model: compute of each layer from its FLOPs and the platform's measured efficiency, the expert
//! all-to-alls and pipeline p2p from the communication model, the step from simulating the schedule's op
//! lists, then data-parallel gradient reduction and the optimizer step. MFU = model FLOPs (Megatron
//! convention, recomputation not counted) / (step time × peak × GPUs).
//!
//! Per layer and micro-batch on one rank (T tokens): forward compute = attention projections (GEMM
//! efficiency at m = T), attention core (attention efficiency at s), routed experts (GEMM efficiency at
//! m = T·k·EP/E tokens per local expert, × the expert-imbalance factor), shared experts and dense MLPs
//! (m = T). Backward = 2 × forward; full recompute adds a forward; selective recompute adds the dense MLPs'
//! and shared experts' SwiGLU forward and, unless attention is flash attention, the attention core.
//! Each MoE layer adds 4 all-to-alls (dispatch and combine, forward and backward; 6 with full recompute)
//! of T·k·d·e/EP bytes per peer. Where the runtime overlaps them (`shared_expert_overlap`, flat or
//! pairwise all-to-all), the forward dispatch hides behind the shared experts' forward: it costs what
//! of its link time that compute does not cover. No other communication overlaps compute.

use std::borrow::Cow;

use serde::Serialize;

use crate::class_work::{exchange_link_s, exchange_token_dims, head_table_s, layer_tables, routed_token_experts};
use crate::comm::{A2aAlgo, GroupShape, all_reduce_s, p2p_s};
use crate::core_sharing::simulate_shared;
use crate::error::Result;
use crate::layout::{Layout, Recompute, StageSplit, TrainConfig};
use crate::model::counts::{layer_params, mtp_module_params};
use crate::model::{LayerKind, ModelSpec, training_flops_per_token};
use crate::platform::{ClassWork, Platform};
use crate::runtime_work::{dense_swiglu_elements, head_elements, layer_elements};
use crate::schedule::{Op, Simulation, simulate};

/// Of one forward dispatch's `a2a_s`, what the shared experts' forward (`shared_fwd_s`) hides where the
/// runtime overlaps them: the exchange must be posted at once (flat or pairwise; HALO's phases wait on
/// each other).
fn dispatch_hidden_s(cfg: &TrainConfig, algo: A2aAlgo, a2a_s: f64, shared_fwd_s: f64) -> f64 {
    let posted = matches!(algo, A2aAlgo::Flat | A2aAlgo::Pairwise);
    if cfg.shared_expert_overlap && posted { a2a_s.min(shared_fwd_s) } else { 0.0 }
}

/// Seconds per micro-batch of one layer on one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LayerTime {
    pub forward_compute_s: f64,
    pub backward_compute_s: f64,
    pub forward_a2a_s: f64,
    pub backward_a2a_s: f64,
}

impl LayerTime {
    pub fn forward_s(&self) -> f64 {
        self.forward_compute_s + self.forward_a2a_s
    }
    pub fn backward_s(&self) -> f64 {
        self.backward_compute_s + self.backward_a2a_s
    }
    pub fn total_s(&self) -> f64 {
        self.forward_s() + self.backward_s()
    }
}

/// Per-stage times (per micro-batch unless named per step).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageTime {
    pub stage: u64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub a2a_s: f64,
    /// Sending one micro-batch's activations (or gradients) to the next stage.
    pub p2p_s: f64,
    /// Per step: gradient all-reduce over EP·DP (non-expert) and DP (experts).
    pub grad_reduce_s: f64,
    /// Of the reduction, the data-parallel replicas' wait for the slowest (per step): when more ranks
    /// than cores share a node, a waiting rank yields its core to the others, so time sharing stretches
    /// the rest and not this.
    pub replicas_wait_s: f64,
    /// Per step: optimizer update (memory-bandwidth bound).
    pub optimizer_s: f64,
}

/// Predicted step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPrediction {
    pub stages: Vec<StageTime>,
    pub pipeline: Simulation,
    pub step_time_s: f64,
    /// Model FLOPs per step (all ranks), Megatron convention.
    pub model_flops: f64,
    pub tokens_per_s: f64,
    pub tflops_per_gpu: f64,
    pub mfu: f64,
}

/// Where a predicted step goes, on its critical stage (the busiest one for the pipeline part, the one
/// with the longest reduction and update for the tail). The parts add up to the step time: `bubble_s`
/// is what the pipeline leaves idle on the critical stage. `overhead_s` (per-op framework costs) is
/// not modelled yet and is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    pub critical_stage: u64,
    pub compute_s: f64,
    pub all_to_all_s: f64,
    pub p2p_s: f64,
    pub bubble_s: f64,
    pub grad_allreduce_s: f64,
    pub optimizer_s: f64,
    pub overhead_s: f64,
}

impl StepPrediction {
    /// The step split into its parts (see [`Breakdown`]) for `micro_batches` micro-batches per step.
    pub fn breakdown(&self, micro_batches: u64) -> Breakdown {
        let m = micro_batches as f64;
        let busy = |s: &StageTime| s.forward_s + s.backward_s;
        let Some(critical) = self.stages.iter().max_by(|a, b| busy(a).total_cmp(&busy(b))) else {
            return Breakdown::default();
        };
        let tail = self
            .stages
            .iter()
            .max_by(|a, b| (a.grad_reduce_s + a.optimizer_s).total_cmp(&(b.grad_reduce_s + b.optimizer_s)))
            .expect("a stage");
        // What the critical stage receives per micro-batch: activations from the stage before, gradients
        // from the stage after (`p2p_s` of a stage is its link to the next one).
        let s = critical.stage as usize;
        let from_prev = s.checked_sub(1).map_or(0.0, |p| self.stages[p].p2p_s);
        let p2p_s = m * (from_prev + critical.p2p_s);
        let mut b = Breakdown {
            critical_stage: critical.stage,
            compute_s: m * (busy(critical) - critical.a2a_s),
            all_to_all_s: m * critical.a2a_s,
            p2p_s,
            bubble_s: 0.0,
            grad_allreduce_s: tail.grad_reduce_s,
            optimizer_s: tail.optimizer_s,
            overhead_s: 0.0,
        };
        let parts = b.compute_s + b.all_to_all_s + b.p2p_s + b.grad_allreduce_s + b.optimizer_s;
        b.bubble_s = (self.step_time_s - parts).max(0.0);
        b
    }
}

/// Layer costs for one layout and configuration, from which any split is timed.
#[derive(Clone, Debug)]
pub struct CostModel<'a> {
    /// The platform as the layout's ranks see it (a CPU rank's thread count resolved).
    platform: Cow<'a, Platform>,
    /// Ranks of the layout on one node.
    node_ranks: u64,
    layers: Vec<LayerTime>,
    /// Extra forward compute of the first stage (none) and the last stage (logits, MTP).
    last_stage: LayerTime,
    p2p: Vec<f64>,
    /// Per-layer parameter bytes whose gradients are reduced over EP·DP and over DP.
    grad_bytes: Vec<(f64, f64)>,
    first_extra_grad: f64,
    last_extra_grad: (f64, f64),
    dense_group: Vec<GroupShape>,
    expert_group: Vec<GroupShape>,
    layout: Layout,
    cfg: TrainConfig,
    optimizer_bytes_per_param: f64,
    peak: f64,
    flops_per_token: f64,
}

impl<'a> CostModel<'a> {
    pub fn new(
        spec: &ModelSpec,
        platform: &'a Platform,
        layout: &Layout,
        cfg: &TrainConfig,
        algo: A2aAlgo,
    ) -> Result<Self> {
        let node_ranks = layout.gpus().min(platform.gpus_per_node);
        let platform = platform.for_node_ranks(node_ranks);
        let e = cfg.elem_bytes()?;
        let peak = platform.peak_flops(&cfg.dtype)?;
        let t = cfg.tokens_per_micro_batch() as f64;
        let d = spec.hidden_size;
        let layer_time = |kind: LayerKind| -> Result<LayerTime> {
            let tables = layer_tables(spec, &platform, cfg, layout.ep, kind)?;
            let a2a_each = exchange_link_s(spec, &platform, cfg, layout.ep, kind, algo)?;
            // Forward + backward compute: the measured step costs where the platform has them, else
            // the tables (backward = 2 × forward) plus the runtime's counted element-wise work.
            let (total, attention) = match &platform.step_costs {
                Some(sc) => {
                    let work = ClassWork {
                        linear_table_s: 3.0 * tables.linear_s,
                        experts_table_s: 3.0 * tables.experts_s,
                        experts_peak_s: 3.0 * tables.experts_peak_s,
                        attention_table_s: 3.0 * tables.attention_s,
                        layer_token_dims: t * d as f64,
                        routed_token_experts: routed_token_experts(spec, t, kind),
                        exchange_token_dims: exchange_token_dims(spec, cfg, layout.ep, kind),
                        layers: 1.0,
                        ..Default::default()
                    };
                    (sc.compute_s(&work, layout.ep), sc.attention * tables.attention_s)
                }
                None => {
                    let counted = platform.runtime.map_or(0.0, |rc| layer_elements(spec, kind, t).seconds(&rc));
                    (3.0 * tables.total_s() + counted, tables.attention_s)
                }
            };
            let fwd = total / 3.0;
            let shared_fwd_s = match &platform.step_costs {
                Some(sc) => sc.linear * tables.shared_s,
                None => tables.shared_s,
            };
            let hidden = dispatch_hidden_s(cfg, algo, a2a_each, shared_fwd_s);
            let (recompute_s, recompute_a2a) = match cfg.recompute {
                Recompute::None => (0.0, 0.0),
                // Flash attention recomputes its scores in any mode; otherwise selective recomputes
                // the attention core. Both recompute the dense MLPs' SwiGLU forward: a third of its
                // measured forward + backward cost, or (not measured) its traffic, two elements read
                // and one written per output element, at the memory bandwidth.
                Recompute::Selective => {
                    let scores_s = if cfg.flash_attention { 0.0 } else { attention };
                    let swiglu = dense_swiglu_elements(spec, kind, t);
                    let swiglu_s = match platform.runtime {
                        Some(rc) => swiglu * rc.swiglu_ns * 1e-9 / 3.0,
                        None => 3.0 * swiglu * e / (platform.memory_gbs * 1e9),
                    };
                    (scores_s + swiglu_s, 0.0)
                }
                Recompute::Full => (fwd, 2.0 * a2a_each),
            };
            Ok(LayerTime {
                forward_compute_s: fwd,
                backward_compute_s: total - fwd + recompute_s,
                forward_a2a_s: 2.0 * a2a_each - hidden,
                backward_a2a_s: 2.0 * a2a_each + recompute_a2a,
            })
        };
        let layers: Vec<LayerTime> = spec.layers.iter().map(|k| layer_time(*k)).collect::<Result<_>>()?;
        let head_table_s = head_table_s(spec, &platform, cfg)?;
        let head_s = match &platform.step_costs {
            Some(sc) => sc.compute_s(
                &ClassWork {
                    linear_table_s: 3.0 * head_table_s,
                    vocab_tokens: (1 + spec.mtp_depth) as f64 * t * spec.vocab_size as f64,
                    ..Default::default()
                },
                layout.ep,
            ),
            None => 3.0 * head_table_s + platform.runtime.map_or(0.0, |rc| head_elements(spec, t).seconds(&rc)),
        };
        let mut last_stage =
            LayerTime { forward_compute_s: head_s / 3.0, backward_compute_s: 2.0 * head_s / 3.0, ..Default::default() };
        for _ in 0..spec.mtp_depth {
            let l = layer_time(spec.mtp_layer_kind())?;
            last_stage.forward_compute_s += l.forward_compute_s;
            last_stage.backward_compute_s += l.backward_compute_s;
            last_stage.forward_a2a_s += l.forward_a2a_s;
            last_stage.backward_a2a_s += l.backward_a2a_s;
        }
        let stage_ranks = layout.ep * layout.dp;
        let p2p_bytes = t * d as f64 * e;
        let p2p = (0..layout.pp)
            .map(|s| {
                if s + 1 < layout.pp {
                    p2p_s(&platform, s * stage_ranks, (s + 1) * stage_ranks, p2p_bytes)
                } else {
                    0.0
                }
            })
            .collect();
        let ep = layout.ep as f64;
        let grad_bytes = spec
            .layers
            .iter()
            .map(|k| {
                let p = layer_params(spec, *k);
                (p.non_expert() as f64 * cfg.grad_bytes, p.routed_experts as f64 / ep * cfg.grad_bytes)
            })
            .collect();
        let emb = (spec.vocab_size * d) as f64 * cfg.grad_bytes;
        let mtp = spec.mtp_depth as f64 * mtp_module_params(spec) as f64 * cfg.grad_bytes;
        let head = if spec.tie_embeddings && layout.pp == 1 { 0.0 } else { emb };
        let final_norm = spec.norm.params(d) as f64 * cfg.grad_bytes;
        let dense_group = (0..layout.pp).map(|s| GroupShape::new(&platform, s * stage_ranks, stage_ranks, 1)).collect();
        let expert_group =
            (0..layout.pp).map(|s| GroupShape::new(&platform, s * stage_ranks, layout.dp, layout.ep)).collect();
        Ok(CostModel {
            platform,
            node_ranks,
            layers,
            last_stage,
            p2p,
            grad_bytes,
            first_extra_grad: emb,
            // The LM head (none beside a tied embedding on the same stage), the final norm, MTP.
            last_extra_grad: (head + final_norm + mtp, 0.0),
            dense_group,
            expert_group,
            layout: *layout,
            cfg: cfg.clone(),
            optimizer_bytes_per_param: cfg.weight_bytes + cfg.grad_bytes + cfg.optimizer_bytes,
            peak,
            flops_per_token: training_flops_per_token(spec, cfg.seq_len).total(),
        })
    }

    /// Forward + backward seconds of one micro-batch through layer `i` (for balancing splits).
    pub fn layer_total_s(&self, i: usize) -> f64 {
        self.layers[i].total_s()
    }

    /// Extra per-micro-batch seconds of the last stage (logits, MTP).
    pub fn last_stage_extra_s(&self) -> f64 {
        self.last_stage.total_s()
    }

    /// Times of stage `stage` holding layers `first..first + n`.
    pub fn stage(&self, stage: u64, first: u64, n: u64) -> StageTime {
        let range = first as usize..(first + n) as usize;
        let mut sum = self.layers[range.clone()].iter().fold(LayerTime::default(), |a, l| LayerTime {
            forward_compute_s: a.forward_compute_s + l.forward_compute_s,
            backward_compute_s: a.backward_compute_s + l.backward_compute_s,
            forward_a2a_s: a.forward_a2a_s + l.forward_a2a_s,
            backward_a2a_s: a.backward_a2a_s + l.backward_a2a_s,
        });
        let (mut dense_bytes, mut expert_bytes) =
            self.grad_bytes[range].iter().fold((0.0, 0.0), |a, g| (a.0 + g.0, a.1 + g.1));
        if stage == 0 {
            dense_bytes += self.first_extra_grad;
        }
        if stage == self.layout.pp - 1 {
            let l = &self.last_stage;
            sum.forward_compute_s += l.forward_compute_s;
            sum.backward_compute_s += l.backward_compute_s;
            sum.forward_a2a_s += l.forward_a2a_s;
            sum.backward_a2a_s += l.backward_a2a_s;
            dense_bytes += self.last_extra_grad.0;
            expert_bytes += self.last_extra_grad.1;
        }
        let s = stage as usize;
        let (dense_ranks, expert_ranks) = (self.layout.ep * self.layout.dp, self.layout.dp);
        // Data-parallel replicas wait for the slowest at the reduction (a measured share of their
        // compute), then the links' ring.
        let replicas_s = match self.platform.step_costs {
            Some(sc) if self.layout.dp > 1 => {
                sc.replica_sync * self.cfg.num_micro_batches as f64 * (sum.forward_s() + sum.backward_s())
            }
            _ => 0.0,
        };
        let grad_reduce_s = replicas_s
            + all_reduce_s(&self.platform, &self.dense_group[s], dense_ranks, dense_bytes)
            + all_reduce_s(&self.platform, &self.expert_group[s], expert_ranks, expert_bytes);
        let params = (dense_bytes + expert_bytes) / self.cfg.grad_bytes.max(1e-9);
        let shard = if self.cfg.zero1 { (self.layout.ep * self.layout.dp) as f64 } else { 1.0 };
        // Read and write weights, gradients and optimizer states once (or the runtime's measured step).
        let optimizer_s = match (&self.platform.step_costs, &self.platform.runtime) {
            (Some(sc), _) => sc.optimizer_s(params / shard, n as f64),
            (None, Some(rc)) => params / shard * rc.optimizer_ns_per_param * 1e-9,
            (None, None) => 2.0 * params * self.optimizer_bytes_per_param / shard / (self.platform.memory_gbs * 1e9),
        };
        StageTime {
            stage,
            forward_s: sum.forward_s(),
            backward_s: sum.backward_s(),
            a2a_s: sum.forward_a2a_s + sum.backward_a2a_s,
            p2p_s: self.p2p[s],
            grad_reduce_s,
            replicas_wait_s: replicas_s,
            optimizer_s,
        }
    }

    /// The schedule on a node whose ranks outnumber its cores: each op slowed by the stages computing at
    /// that moment (their ranks on the node, `node_ranks ÷ PP` per stage, time-share the cores), a stage
    /// waiting for a neighbour's activations or gradients not ([`simulate_shared`]). Inside an op, the
    /// expert-parallel path beyond the fused experts is stretched with the rest: its permutes and
    /// staging are the rank's own work, and the peers it waits for share the cores too (see
    /// `docs/resource-model.md`, time sharing). Each stage's forward and backward become their mean wall
    /// time in the simulation.
    fn simulate_sharing_cores(&self, stages: &mut [StageTime]) -> Simulation {
        let fwd: Vec<f64> = stages.iter().map(|s| s.forward_s).collect();
        let bwd: Vec<f64> = stages.iter().map(|s| s.backward_s).collect();
        let p2p: Vec<f64> = stages.iter().map(|s| s.p2p_s).collect();
        let ranks_per_stage = self.node_ranks as f64 / stages.len().max(1) as f64;
        let rate = |computing: usize| 1.0 / self.platform.time_share_busy(computing as f64 * ranks_per_stage);
        let sim = simulate_shared(self.cfg.schedule, self.cfg.num_micro_batches, &fwd, &bwd, &p2p, &rate);
        for (s, ops) in stages.iter_mut().zip(&sim.timeline) {
            let mean = |forward: bool| {
                let walls: Vec<f64> = ops
                    .iter()
                    .filter(|o| matches!(o.op, Op::Forward(_)) == forward)
                    .map(|o| o.end_s - o.start_s)
                    .collect();
                walls.iter().sum::<f64>() / walls.len().max(1) as f64
            };
            (s.forward_s, s.backward_s) = (mean(true), mean(false));
        }
        sim
    }

    /// The step for a split: simulate the schedule, add the slowest stage's reduction and update.
    pub fn predict(&self, split: &StageSplit) -> StepPrediction {
        let mut stages: Vec<StageTime> =
            split.starts().iter().zip(&split.0).enumerate().map(|(s, (f, n))| self.stage(s as u64, *f, *n)).collect();
        // The history's correction scales every time alike (the schedule's makespan with them).
        let refined = self.platform.refinement().time_scale;
        for s in &mut stages {
            for t in [
                &mut s.forward_s,
                &mut s.backward_s,
                &mut s.a2a_s,
                &mut s.p2p_s,
                &mut s.grad_reduce_s,
                &mut s.replicas_wait_s,
            ] {
                *t *= refined;
            }
            s.optimizer_s *= refined;
        }
        let simulate_stages = |stages: &[StageTime]| {
            let fwd: Vec<f64> = stages.iter().map(|s| s.forward_s).collect();
            let bwd: Vec<f64> = stages.iter().map(|s| s.backward_s).collect();
            let p2p: Vec<f64> = stages.iter().map(|s| s.p2p_s).collect();
            simulate(self.cfg.schedule, self.cfg.num_micro_batches, &fwd, &bwd, &p2p)
        };
        let mut pipeline = simulate_stages(&stages);
        let shared = self.platform.time_share(self.node_ranks, pipeline.bubble_fraction);
        // Ranks that outnumber the cores contend whenever enough of them compute at once, even where
        // the step's mean busy share fits the cores (a pipeline's steady phase).
        let everyone = self.platform.time_share(self.node_ranks, 0.0);
        if everyone > 1.0 {
            pipeline = self.simulate_sharing_cores(&mut stages);
            for s in &mut stages {
                // The waits stay as they are: the cores serve other ranks meanwhile.
                s.a2a_s *= shared;
                s.grad_reduce_s = (s.grad_reduce_s - s.replicas_wait_s) * shared + s.replicas_wait_s;
                // Every rank clips and steps its optimizer at the end of the step, none idle.
                s.optimizer_s *= everyone;
            }
        }
        let tail = crate::limits::max_or_zero(stages.iter().map(|s| s.grad_reduce_s + s.optimizer_s));
        let step_time_s = pipeline.makespan_s + tail;
        let tokens = (self.cfg.global_batch(&self.layout) * self.cfg.seq_len) as f64;
        let model_flops = self.flops_per_token * tokens;
        let gpus = self.layout.gpus() as f64;
        StepPrediction {
            stages,
            pipeline,
            step_time_s,
            model_flops,
            tokens_per_s: tokens / step_time_s,
            tflops_per_gpu: model_flops / step_time_s / gpus / 1e12,
            mfu: model_flops / (step_time_s * self.peak * gpus),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;
    use crate::platform::StepCosts;
    use crate::platform::step_costs::PerLayerCosts;

    fn costs(exchange_experts: f64, replica_sync: f64) -> StepCosts {
        StepCosts {
            linear: 1.0,
            experts: 1.0,
            experts_peak: 0.0,
            exchange_experts,
            exchange_ns: 0.0,
            attention: 1.0,
            layer_ns: 5.0,
            routing_ns: 10.0,
            cross_entropy_ns: 1.0,
            optimizer_ns: 1.0,
            replica_sync,
            per_layer_us: PerLayerCosts::default(),
        }
    }

    /// Four ranks on a node of two cores: time sharing stretches a rank's forward and backward by the
    /// share — the expert-parallel path beyond the fused experts with them — but not the replicas' wait
    /// for the slowest, and the optimizer step, which every rank runs at once, by the share of all ranks
    /// busy; with a core per rank nothing is stretched.
    #[test]
    fn time_sharing_stretches_what_a_rank_does_and_not_the_replicas_wait() {
        let spec = preset("tiny").unwrap();
        let cfg = TrainConfig { micro_batch_size: 2, dtype: "fp32".into(), ..TrainConfig::new(32) };
        let layout = Layout { pp: 1, ep: 2, dp: 2 };
        let split = StageSplit::even(spec.num_layers, 1);
        let node = |cores: u64, sc: StepCosts| {
            let mut p = Platform {
                gpus_per_node: 4,
                cores_per_node: Some(cores),
                time_share_exponent: Some(1.5),
                step_costs: Some(sc),
                threads: Vec::new(),
                ..crate::platform::preset("local").unwrap()
            };
            p.topology.gpu_to_nic = vec![0; 4];
            p
        };
        for cores in [2u64, 4] {
            let platform = node(cores, costs(0.7, 0.2));
            let model = CostModel::new(&spec, &platform, &layout, &cfg, A2aAlgo::Flat).unwrap();
            let alone = model.stage(0, 0, spec.num_layers);
            assert!(alone.replicas_wait_s > 0.0, "{alone:?}");
            // The expert-parallel path beyond the fused experts is part of the forward and backward.
            let without = node(cores, costs(0.0, 0.0));
            let bare =
                CostModel::new(&spec, &without, &layout, &cfg, A2aAlgo::Flat).unwrap().stage(0, 0, spec.num_layers);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-9);
            assert!(alone.forward_s + alone.backward_s > 1.01 * (bare.forward_s + bare.backward_s), "{alone:?}");
            let shared = model.predict(&split).stages.remove(0);
            let share = platform.time_share(4, 0.0);
            let busy = alone.forward_s + alone.backward_s;
            let (want_busy, want_reduce, want_optimizer) = if cores == 2 {
                assert!(share > 2.0, "{share}");
                (
                    busy * share,
                    (alone.grad_reduce_s - alone.replicas_wait_s) * share + alone.replicas_wait_s,
                    alone.optimizer_s * share,
                )
            } else {
                assert_eq!(share, 1.0);
                (busy, alone.grad_reduce_s, alone.optimizer_s)
            };
            assert!(alone.optimizer_s > 0.0, "{alone:?}");
            assert!(close(shared.forward_s + shared.backward_s, want_busy), "{cores} cores: {shared:?}");
            assert!(close(shared.grad_reduce_s, want_reduce), "{cores} cores: {shared:?}");
            assert!(close(shared.optimizer_s, want_optimizer), "{cores} cores: {shared:?}");
        }
    }

    /// Selective recompute costs one SwiGLU forward of the dense and shared MLPs on top of flash
    /// attention (a third of the measured SwiGLU cost per element), and the attention core without it.
    #[test]
    fn selective_recompute_costs_the_dense_swiglu_forward() {
        let rc = crate::platform::RuntimeCosts::distinct_for_tests();
        let platform = Platform { runtime: Some(rc), ..crate::platform::preset("local").unwrap() };
        let layout = Layout { pp: 1, ep: 1, dp: 1 };
        let backward = |name: &str, recompute, flash_attention| {
            let spec = preset(name).unwrap();
            let cfg = TrainConfig { recompute, flash_attention, dtype: "fp32".into(), ..TrainConfig::new(64) };
            let model = CostModel::new(&spec, &platform, &layout, &cfg, A2aAlgo::Flat).unwrap();
            model.stage(0, 0, spec.num_layers).backward_s
        };
        let spec = preset("tiny-deepseek").unwrap();
        let swiglu: f64 = spec.layers.iter().map(|k| dense_swiglu_elements(&spec, *k, 64.0)).sum();
        assert!(swiglu > 0.0, "tiny-deepseek has a dense layer and shared experts");
        let extra =
            backward("tiny-deepseek", Recompute::Selective, true) - backward("tiny-deepseek", Recompute::None, true);
        let want = swiglu * rc.swiglu_ns * 1e-9 / 3.0;
        assert!((extra - want).abs() <= 1e-9 * want, "{extra} vs {want}");
        // Mixtral-style: no dense MLP, no shared expert — nothing more to recompute under flash attention.
        assert_eq!(backward("tiny", Recompute::Selective, true), backward("tiny", Recompute::None, true));
        assert!(backward("tiny", Recompute::Selective, false) > backward("tiny", Recompute::None, false));
    }

    /// With the shared experts overlapping the dispatch, a forward's exchange costs its link time less
    /// what the shared experts' forward covers (flat and pairwise); HALO, a model without shared experts
    /// and one rank per expert group hide nothing.
    #[test]
    fn shared_experts_hide_the_forward_dispatch() {
        let platform = crate::platform::preset("local").unwrap();
        let forward = |name: &str, ep: u64, algo, overlap| {
            let spec = preset(name).unwrap();
            let cfg = TrainConfig { shared_expert_overlap: overlap, dtype: "fp32".into(), ..TrainConfig::new(64) };
            let model = CostModel::new(&spec, &platform, &Layout { pp: 1, ep, dp: 1 }, &cfg, algo).unwrap();
            let moe = spec.layers.iter().position(|k| *k == LayerKind::Moe).unwrap();
            (model.layers[moe], spec, cfg)
        };
        for algo in [A2aAlgo::Flat, A2aAlgo::Pairwise] {
            let (off, spec, cfg) = forward("tiny-deepseek", 2, algo, false);
            let (on, ..) = forward("tiny-deepseek", 2, algo, true);
            let a2a_each = exchange_link_s(&spec, &platform, &cfg, 2, LayerKind::Moe, algo).unwrap();
            let shared_s = layer_tables(&spec, &platform, &cfg, 2, LayerKind::Moe).unwrap().shared_s;
            assert!(a2a_each > 0.0 && shared_s > 0.0, "{a2a_each} {shared_s}");
            assert_eq!(off.forward_a2a_s, 2.0 * a2a_each);
            let want = 2.0 * a2a_each - a2a_each.min(shared_s);
            assert!((on.forward_a2a_s - want).abs() <= 1e-12 * want, "{algo:?}: {} vs {want}", on.forward_a2a_s);
            assert_eq!((on.backward_a2a_s, on.forward_compute_s), (off.backward_a2a_s, off.forward_compute_s));
        }
        let halo = |overlap| forward("tiny-deepseek", 2, A2aAlgo::Halo, overlap).0;
        assert_eq!(halo(true), halo(false));
        let mixtral = |overlap| forward("tiny", 2, A2aAlgo::Flat, overlap).0;
        assert_eq!(mixtral(true), mixtral(false));
        let one_rank = |overlap| forward("tiny-deepseek", 1, A2aAlgo::Flat, overlap).0;
        assert_eq!(one_rank(true), one_rank(false));
    }
}
