//! What the planned runtime needs from a model, so that an author's own model trains on it as the
//! library's [`CausalLm`] does: [`StageModel`] is one pipeline stage of a model (its layers, the
//! embedding on the first stage, the head and loss on the last, its MoE blocks, its state dict), and
//! [`StageModelConfig`] draws the stage a rank holds ([`StagePart`]). The runtime does the rest — the
//! schedule, activations between stages, recompute, expert placement and migration, gradient
//! reduction, the optimizer, checkpoints.
//!
//! Legend: b = sequences of a micro-batch, s = sequence length, d = model width.

use std::ops::Range;
use std::sync::Arc;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use piper_planner::model::ModelSpec;

pub use crate::layers::init::draw_now;

use crate::hf::StateDictAdapter;
use crate::hf::state_dict::{Entry, Part, Slot, Target};
use crate::model::{CausalLm, CausalLmConfig};
use crate::moe::dispatcher::{ExpertPlacement, TokenDispatcher};
use crate::moe::{MoeBlock, MoeStats};

/// One pipeline stage of a model: what the runtime calls to train it. A stage holds a contiguous run of
/// the model's decoder layers; the first stage embeds the tokens, the last one computes the loss. Every
/// MoE layer is a library [`MoeBlock`], which the runtime places on the expert group's ranks.
pub trait StageModel: Module + 'static {
    /// The module field that holds the decoder layers (a `Vec`), for [`StageModel::state_entries`]'s
    /// default names.
    const LAYERS_FIELD: &'static str = "layers";
    /// The module fields the first stage owns (the embedding), for the default names; every other field
    /// outside the layers belongs to the last stage.
    const EMBEDDING_FIELDS: &'static [&'static str] = &["embed"];

    /// Decoder layers this stage holds.
    fn num_layers(&self) -> usize;

    /// First stage: the embedding.
    /// # Shapes
    /// - `ids_bs`: `[b, s]` token ids → `[b, s, d]`
    fn embed_tokens(&self, ids_bs: Tensor<2, Int>) -> Tensor<3>;

    /// The stage's layer `l` (0-based within the stage), with its MoE statistics when it is an MoE layer.
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    fn layer_forward(&self, l: usize, x_bsd: Tensor<3>) -> (Tensor<3>, Option<MoeStats>);

    /// Last stage: the head and the mean next-token cross-entropy (nats) against `targets_bs`.
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]`, `targets_bs`: `[b, s]` → `[1]`
    fn head_loss(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Tensor<1>;

    /// The stage's MoE blocks in layer order.
    fn moe_blocks(&self) -> Vec<&MoeBlock>;

    /// The model's own held-out metrics (an evaluation hook), reported beside the held-out loss at every
    /// evaluation ([`RunConfig::eval_every`](crate::runtime::RunConfig::eval_every)): each is the sum of
    /// [`StageModel::eval_metrics`]'s values over the held-out split and the data-parallel replicas
    /// divided by the sum of their counts. None by default.
    const EVAL_METRICS: &'static [&'static str] = &[];

    /// Last stage, at an evaluation: for each of [`StageModel::EVAL_METRICS`], in order, this held-out
    /// micro-batch's (sum, count) — for a next-token accuracy, the tokens predicted right and the tokens.
    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` (the stage's last layer's output), `targets_bs`: `[b, s]`
    fn eval_metrics(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Vec<(f64, f64)> {
        let _ = (x_bsd, targets_bs);
        Vec::new()
    }

    /// The same blocks, to move experts and update router biases.
    fn moe_blocks_mut(&mut self) -> Vec<&mut MoeBlock>;

    /// The named tensors of this stage (checkpoints, `--init-hf`), whose layers are the model's
    /// `first_layer..`; `experts_of(k)` gives the global expert ids of the local slots of the stage's k-th
    /// MoE block. The default names every parameter by its module path ([`path_entries`]); the library's
    /// model uses Hugging Face's names.
    fn state_entries(
        &self,
        spec: &ModelSpec,
        first_layer: usize,
        experts_of: &dyn Fn(usize) -> Vec<usize>,
    ) -> Vec<Entry> {
        let _ = spec;
        path_entries(self, first_layer, experts_of)
    }

    /// All of the stage's layers. `x_bsd`: `[b, s, d]` → `[b, s, d]` and the MoE layers' statistics.
    fn forward_stage(&self, mut x_bsd: Tensor<3>) -> (Tensor<3>, Vec<MoeStats>) {
        let mut moe = Vec::new();
        for l in 0..self.num_layers() {
            let (y_bsd, stats) = self.layer_forward(l, x_bsd);
            x_bsd = y_bsd;
            moe.extend(stats);
        }
        (x_bsd, moe)
    }
}

/// A model's configuration as the runtime builds it: the configuration checkpoints record and every
/// rank agrees on, and the stage a rank holds.
pub trait StageModelConfig: burn::config::Config + Clone + Send + Sync {
    type Model: StageModel;

    /// Decoder layers of the whole model.
    fn num_layers(&self) -> usize;

    /// The stage `part` describes. Draw the whole model in one fixed order on every rank (embedding,
    /// each layer, the head), keeping what `part` holds, so that a seed gives the same weights whatever the
    /// layout; pass each kept MoE block through [`StagePart::place_experts`] (the runtime places any block
    /// left whole, after the stage is built).
    fn init_stage(&self, part: &StagePart<'_>, device: &Device) -> Self::Model;

    /// The weight of the routers' z-loss (ST-MoE) in the training loss; none by default. The
    /// load-balancing loss's weight is the run's ([`Job::aux_loss_coef`](crate::runtime::Job::aux_loss_coef)).
    fn z_loss_coef(&self) -> f64 {
        0.0
    }
}

/// Where a rank's expert-parallel MoE blocks send their tokens, and which experts each rank holds.
pub struct ExpertRoutes<'p> {
    pub dispatcher: &'p Arc<dyn TokenDispatcher>,
    /// One placement per MoE layer of the whole model.
    pub placements: &'p [ExpertPlacement],
    pub ep_rank: usize,
}

/// What of the model a rank holds: its stage's decoder layers, and of each MoE layer the experts the
/// placement puts on it.
pub struct StagePart<'p> {
    /// The stage's decoder layers (global indices).
    pub layers: Range<usize>,
    /// Whether each decoder layer of the whole model is an MoE layer.
    pub is_moe: Vec<bool>,
    pub is_first: bool,
    pub is_last: bool,
    /// `None`: this rank holds every expert.
    pub routes: Option<ExpertRoutes<'p>>,
}

impl StagePart<'_> {
    /// The whole model on one process.
    pub fn whole(spec: &ModelSpec) -> StagePart<'static> {
        StagePart {
            layers: 0..spec.layers.len(),
            is_moe: spec.layers.iter().map(|k| *k == piper_planner::model::LayerKind::Moe).collect(),
            is_first: true,
            is_last: true,
            routes: None,
        }
    }

    /// Whether the stage holds decoder layer `layer` (global index).
    pub fn holds(&self, layer: usize) -> bool {
        self.layers.contains(&layer)
    }

    /// The MoE layer index (among the whole model's MoE layers) of decoder layer `layer`.
    pub fn moe_index(&self, layer: usize) -> usize {
        self.is_moe[..layer.min(self.is_moe.len())].iter().filter(|m| **m).count()
    }

    /// `block` of decoder layer `layer` keeping only this rank's experts, reaching the others through the
    /// expert group's dispatcher (unchanged when the rank holds every expert).
    pub fn place_experts(&self, layer: usize, block: MoeBlock) -> MoeBlock {
        match &self.routes {
            Some(r) if block.routing.is_none() => {
                block.with_routing(r.dispatcher.clone(), r.placements[self.moe_index(layer)].clone(), r.ep_rank)
            }
            _ => block,
        }
    }
}

impl StageModel for CausalLm {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn embed_tokens(&self, ids_bs: Tensor<2, Int>) -> Tensor<3> {
        CausalLm::embed_tokens(self, ids_bs)
    }

    fn layer_forward(&self, l: usize, x_bsd: Tensor<3>) -> (Tensor<3>, Option<MoeStats>) {
        self.layers[l].forward(x_bsd)
    }

    fn head_loss(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Tensor<1> {
        self.cross_entropy(self.head(x_bsd), targets_bs)
    }

    fn moe_blocks(&self) -> Vec<&MoeBlock> {
        self.layers.iter().filter_map(|l| l.moe.as_ref()).collect()
    }

    fn moe_blocks_mut(&mut self) -> Vec<&mut MoeBlock> {
        self.layers.iter_mut().filter_map(|l| l.moe.as_mut()).collect()
    }

    /// Hugging Face's names ([`StateDictAdapter`]).
    fn state_entries(
        &self,
        spec: &ModelSpec,
        first_layer: usize,
        experts_of: &dyn Fn(usize) -> Vec<usize>,
    ) -> Vec<Entry> {
        StateDictAdapter::new(spec).entries(self, first_layer, experts_of)
    }
}

impl StageModelConfig for CausalLmConfig {
    type Model = CausalLm;

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn init_stage(&self, part: &StagePart<'_>, device: &Device) -> CausalLm {
        self.init_part(device, |i, mut layer| {
            if !part.holds(i) {
                return None;
            }
            layer.moe = layer.moe.take().map(|block| part.place_experts(i, block));
            Some(layer)
        })
    }

    fn z_loss_coef(&self) -> f64 {
        self.z_loss_coef
    }
}

/// Entries named by module path (`layers.7.attn.q.weight`), the stage's layers numbered over the whole
/// model; an expert slice is its stacked parameter's path and the global expert id
/// (`layers.7.moe.experts.w_up_edf.12`); a selection bias is `layers.7.router_selection_bias`. A
/// parameter under [`StageModel::LAYERS_FIELD`] belongs to its layer, one under
/// [`StageModel::EMBEDDING_FIELDS`] to the first stage, any other to the last.
pub fn path_entries<M: StageModel>(
    model: &M,
    first_layer: usize,
    experts_of: &dyn Fn(usize) -> Vec<usize>,
) -> Vec<Entry> {
    let mut experts = Vec::new();
    let mut gates = Vec::new();
    for (k, block) in model.moe_blocks().into_iter().enumerate() {
        let ids = [block.experts.w_gate_edf.id, block.experts.w_up_edf.id, block.experts.w_down_efd.id];
        experts.extend(ids.map(|id| (id, experts_of(k))));
        gates.push((block.router.gate.weight.id, k, block.router.selection_bias));
    }
    let mut paths = Paths {
        stack: Vec::new(),
        first_layer,
        layers_field: M::LAYERS_FIELD,
        embedding_fields: M::EMBEDDING_FIELDS,
        experts,
        gates,
        out: Vec::new(),
        biases: Vec::new(),
    };
    model.visit(&mut paths);
    paths.out.append(&mut paths.biases);
    paths.out
}

struct Paths {
    stack: Vec<String>,
    first_layer: usize,
    layers_field: &'static str,
    embedding_fields: &'static [&'static str],
    /// Stacked expert parameters and the global ids of their slots.
    experts: Vec<(ParamId, Vec<usize>)>,
    /// Each MoE block's router weight, its index, and whether it has a selection bias.
    gates: Vec<(ParamId, usize, bool)>,
    out: Vec<Entry>,
    biases: Vec<Entry>,
}

impl Paths {
    /// The current path with the stage's layer index made global, and its part.
    fn named(&self) -> (String, Part) {
        let mut parts = self.stack.clone();
        let part = match (parts.first(), parts.get(1).and_then(|i| i.parse::<usize>().ok())) {
            (Some(f), Some(i)) if f == self.layers_field => {
                parts[1] = (self.first_layer + i).to_string();
                Part::Layer(self.first_layer + i)
            }
            (Some(f), _) if self.embedding_fields.contains(&f.as_str()) => Part::Embedding,
            _ => Part::Head,
        };
        (parts.join("."), part)
    }
}

impl ModuleVisitor for Paths {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let (name, part) = self.named();
        let target = Target::Param(param.id);
        if let Some((_, ids)) = self.experts.iter().find(|(id, _)| *id == param.id) {
            for (slot, x) in ids.iter().enumerate() {
                let (name, slot) = (format!("{name}.{x}"), Slot::Expert { slot });
                self.out.push(Entry { name, target, slot, part, expert: Some(*x) });
            }
            return;
        }
        if let Some(&(_, k, true)) = self.gates.iter().find(|(id, _, _)| *id == param.id) {
            let layer = match part {
                Part::Layer(g) => format!("{}.{g}", self.layers_field),
                _ => format!("moe_block_{k}"),
            };
            let (target, slot) = (Target::RouterBias(k), Slot::Whole { transpose: false });
            self.biases.push(Entry {
                name: format!("{layer}.router_selection_bias"),
                target,
                slot,
                part,
                expert: None,
            });
        }
        self.out.push(Entry { name, target, slot: Slot::Whole { transpose: false }, part, expert: None });
    }
}
