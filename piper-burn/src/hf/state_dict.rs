//! The state-dict adapter: the one name map between the Burn model and Hugging Face's tensor names,
//! used both ways — export ([`StateDictAdapter::to_hf`], checkpoints) and import
//! ([`StateDictAdapter::from_hf`], `--init-hf`, resume, resharding) — as torchtitan's state-dict adapters
//! are. Each [`Entry`] says where an HF tensor lives in a Burn parameter: the whole parameter (linear
//! weights transposed: Burn stores `[in, out]`, transformers `[out, in]`), or one expert's slice of a
//! stacked expert parameter, named by its *global* expert id — so a stage's or an expert-group rank's
//! state dict is the slice of the whole model's that it holds, for any layout and after any migration.
//! The names that differ between families (the MoE block's and the experts') come from [`FamilyNames`].
//!
//! Legend: e = local experts, d = model width, f = expert width, v = vocabulary.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use piper_planner::checkpoint::shard::Fill;
use piper_planner::model::ModelSpec;

use crate::layers::attention::Attention;
use crate::layers::mla::Mla;
use crate::layers::mlp::Mlp;
use crate::model::causal_lm::CausalLm;
use crate::moe::MoeBlock;

/// Tensors by name: shape and f32 values (HF layout).
pub type NamedTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Where one Hugging Face tensor sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The whole parameter, transposed for a linear weight.
    Whole { transpose: bool },
    /// Local slot `slot` of a stacked expert parameter `[e, r, c]`, stored transposed as `[c, r]`.
    Expert { slot: usize },
}

/// What holds the tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Param(ParamId),
    /// A router's selection bias (DeepSeek-V3's `e_score_correction_bias`): state, not a parameter;
    /// the index is the block's position among the model's MoE blocks ([`StageModel::moe_blocks`]).
    RouterBias(usize),
}

/// Which part of a pipeline decides who holds a tensor: the first stage (embedding), the stage of a
/// decoder layer, or the last stage (final norm, head, anything else outside the layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Embedding,
    /// Global index of the decoder layer.
    Layer(usize),
    Head,
}

/// One named tensor of the state dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub target: Target,
    pub slot: Slot,
    /// The part of the model it belongs to.
    pub part: Part,
    /// Global expert id for an expert slice.
    pub expert: Option<usize>,
}

/// Why tensors do not fit the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateDictError {
    /// A tensor the model needs is absent.
    #[error("no tensor `{name}`")]
    Missing { name: String },
    /// A tensor has another shape than the model's parameter slot.
    #[error("tensor `{name}` has shape {shape:?}, the model expects {expected:?}")]
    Shape { name: String, shape: Vec<usize>, expected: Vec<usize> },
    /// An entry whose target the model does not have.
    #[error("`{name}` has no slot in the model")]
    NotInModel { name: String },
    /// An entry whose slot does not fit its parameter (a name map out of step with the model).
    #[error("state dict entry `{name}` does not fit a parameter of shape {dims:?}")]
    NoSlot { name: String, dims: Vec<usize> },
}

/// The tensor names one family gives its MoE block (the rest is common to every supported family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FamilyNames {
    /// The MoE block under `model.layers.N.` (`block_sparse_moe`, `mlp`).
    pub block: &'static str,
    /// An expert's gate, up and down projections (`w1`/`w3`/`w2`, `gate_proj`/`up_proj`/`down_proj`).
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
    /// The shared expert(s) inside the block (`shared_expert`, `shared_experts`).
    pub shared: &'static str,
}

impl FamilyNames {
    /// The names of `spec`'s family: Mixtral (and Piper's native specs), DeepSeek, and the Qwen-style
    /// rest (Qwen2/3-MoE, OLMoE).
    pub fn of(spec: &ModelSpec) -> Self {
        let shared = if spec.model_type.starts_with("deepseek") { "shared_experts" } else { "shared_expert" };
        match spec.model_type.as_str() {
            "mixtral" | "piper" => FamilyNames { block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2", shared },
            _ => FamilyNames { block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", shared },
        }
    }
}

/// The state dict of a model family: entries for any part of the model, and whole-model conversion
/// both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateDictAdapter {
    pub names: FamilyNames,
}

impl StateDictAdapter {
    pub fn new(spec: &ModelSpec) -> Self {
        StateDictAdapter { names: FamilyNames::of(spec) }
    }

    /// The state dict of `model`, whose `layers` are the model's layers `first_layer..`; `experts_of(k)`
    /// gives the global expert ids of the local slots of the model's k-th MoE block.
    pub fn entries(
        &self,
        model: &CausalLm,
        first_layer: usize,
        experts_of: &dyn Fn(usize) -> Vec<usize>,
    ) -> Vec<Entry> {
        let mut b = Builder { part: Part::Embedding, ..Builder::default() };
        b.vector("model.embed_tokens.weight".into(), model.embed.weight.id);
        let mut k = 0;
        for (i, layer) in model.layers.iter().enumerate() {
            let g = first_layer + i;
            let p = format!("model.layers.{g}");
            b.part = Part::Layer(g);
            b.vector(format!("{p}.input_layernorm.weight"), layer.input_norm.gamma.id);
            b.vector(format!("{p}.post_attention_layernorm.weight"), layer.post_attention_norm.gamma.id);
            if let Some(a) = &layer.attention {
                b.attention(&format!("{p}.self_attn"), a);
            }
            if let Some(m) = &layer.mla {
                b.mla(&format!("{p}.self_attn"), m);
            }
            if let Some(mlp) = &layer.dense {
                b.mlp(&format!("{p}.mlp"), mlp);
            }
            if let Some(moe) = &layer.moe {
                b.moe(&format!("{p}.{}", self.names.block), moe, &self.names, k, &experts_of(k));
                k += 1;
            }
        }
        b.part = Part::Head;
        b.vector("model.norm.weight".into(), model.norm.gamma.id);
        if let Some(head) = &model.lm_head_dv {
            b.linear("lm_head.weight".into(), head.id);
        }
        b.finish()
    }

    /// The state dict of a whole model on one rank (every expert in its own slot).
    pub fn whole_model_entries(&self, model: &CausalLm) -> Vec<Entry> {
        let blocks = moe_blocks(model);
        let all_experts = |k: usize| (0..blocks[k].experts.num_experts()).collect();
        self.entries(model, 0, &all_experts)
    }

    /// Every tensor of the whole `model` under its Hugging Face name, in HF layout: `(name, shape, values)`.
    pub fn to_hf(&self, model: &CausalLm) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let host = host_values(model, &moe_blocks(model));
        self.whole_model_entries(model)
            .iter()
            .map(|e| {
                let (dims, values) = &host[&e.target];
                let (shape, v) = e.to_hf(dims, values);
                (e.name.clone(), shape, v)
            })
            .collect()
    }

    /// `model` (a whole model) with every weight replaced by the tensor of the same Hugging Face name in
    /// `tensors`; every name must be there with the expected shape (the error names the first that is not).
    pub fn from_hf(&self, model: CausalLm, tensors: &NamedTensors) -> Result<CausalLm, StateDictError> {
        let entries = self.whole_model_entries(&model);
        let values = assemble(&entries, &host_dims(&model, &moe_blocks(&model)), tensors, &|e| e.name.clone())?;
        let mut model = replace(model, &values);
        replace_router_biases(model.layers.iter_mut().filter_map(|l| l.moe.as_mut()), &values);
        Ok(model)
    }
}

/// Collects entries in the state dict's order: the model's own tensors, then every expert slice, then
/// the router biases.
struct Builder {
    out: Vec<Entry>,
    experts: Vec<Entry>,
    biases: Vec<Entry>,
    part: Part,
}

impl Default for Builder {
    fn default() -> Self {
        Builder { out: Vec::new(), experts: Vec::new(), biases: Vec::new(), part: Part::Head }
    }
}

impl Builder {
    fn whole(&mut self, name: String, id: ParamId, transpose: bool) {
        let (target, slot, part) = (Target::Param(id), Slot::Whole { transpose }, self.part);
        self.out.push(Entry { name, target, slot, part, expert: None });
    }

    fn linear(&mut self, name: String, id: ParamId) {
        self.whole(name, id, true);
    }

    fn vector(&mut self, name: String, id: ParamId) {
        self.whole(name, id, false);
    }

    fn attention(&mut self, a_: &str, a: &Attention) {
        for (proj, lin) in [("q_proj", &a.q_proj), ("k_proj", &a.k_proj), ("v_proj", &a.v_proj), ("o_proj", &a.o_proj)]
        {
            self.linear(format!("{a_}.{proj}.weight"), lin.weight.id);
            if let Some(bias) = &lin.bias {
                self.vector(format!("{a_}.{proj}.bias"), bias.id);
            }
        }
        if let (Some(q), Some(k)) = (&a.q_norm, &a.k_norm) {
            self.vector(format!("{a_}.q_norm.weight"), q.gamma.id);
            self.vector(format!("{a_}.k_norm.weight"), k.gamma.id);
        }
    }

    fn mla(&mut self, a_: &str, m: &Mla) {
        if let Some(q) = &m.q_proj {
            self.linear(format!("{a_}.q_proj.weight"), q.weight.id);
        }
        if let (Some(qa), Some(qn), Some(qb)) = (&m.q_a_proj, &m.q_a_norm, &m.q_b_proj) {
            self.linear(format!("{a_}.q_a_proj.weight"), qa.weight.id);
            self.vector(format!("{a_}.q_a_layernorm.weight"), qn.gamma.id);
            self.linear(format!("{a_}.q_b_proj.weight"), qb.weight.id);
        }
        self.linear(format!("{a_}.kv_a_proj_with_mqa.weight"), m.kv_a_proj.weight.id);
        self.vector(format!("{a_}.kv_a_layernorm.weight"), m.kv_a_norm.gamma.id);
        self.linear(format!("{a_}.kv_b_proj.weight"), m.kv_b_proj.weight.id);
        self.linear(format!("{a_}.o_proj.weight"), m.o_proj.weight.id);
    }

    fn mlp(&mut self, prefix: &str, mlp: &Mlp) {
        self.linear(format!("{prefix}.gate_proj.weight"), mlp.gate_proj.weight.id);
        self.linear(format!("{prefix}.up_proj.weight"), mlp.up_proj.weight.id);
        self.linear(format!("{prefix}.down_proj.weight"), mlp.down_proj.weight.id);
    }

    /// The router, its bias, the expert slices of `experts` (global ids of the local slots), the shared
    /// expert and its gate, for the model's MoE block `index`.
    fn moe(&mut self, b_: &str, moe: &MoeBlock, names: &FamilyNames, index: usize, experts: &[usize]) {
        self.linear(format!("{b_}.gate.weight"), moe.router.gate.weight.id);
        if moe.router.selection_bias {
            self.biases.push(Entry {
                name: format!("{b_}.gate.e_score_correction_bias"),
                target: Target::RouterBias(index),
                slot: Slot::Whole { transpose: false },
                part: self.part,
                expert: None,
            });
        }
        let stacked = [
            (names.gate, moe.experts.w_gate_edf.id),
            (names.up, moe.experts.w_up_edf.id),
            (names.down, moe.experts.w_down_efd.id),
        ];
        for (slot, x) in experts.iter().enumerate() {
            for (which, id) in stacked {
                self.experts.push(Entry {
                    name: format!("{b_}.experts.{x}.{which}.weight"),
                    target: Target::Param(id),
                    slot: Slot::Expert { slot },
                    part: self.part,
                    expert: Some(*x),
                });
            }
        }
        if let Some(shared) = &moe.shared {
            self.mlp(&format!("{b_}.{}", names.shared), shared);
        }
        if let Some(gate) = &moe.shared_gate {
            self.linear(format!("{b_}.shared_expert_gate.weight"), gate.weight.id);
        }
    }

    fn finish(mut self) -> Vec<Entry> {
        self.out.append(&mut self.experts);
        self.out.append(&mut self.biases);
        self.out
    }
}

impl Entry {
    /// `(rows, cols, first element)` of this entry's matrix inside its holder of Burn-layout `dims`
    /// (`None`: a whole untransposed parameter, copied as it is).
    fn matrix(&self, dims: &[usize]) -> Result<Option<(usize, usize, usize)>, StateDictError> {
        match (self.slot, dims) {
            (Slot::Whole { transpose: false }, _) => Ok(None),
            (Slot::Whole { transpose: true }, [r, c]) => Ok(Some((*r, *c, 0))),
            (Slot::Expert { slot }, [_, r, c]) => Ok(Some((*r, *c, slot * r * c))),
            _ => Err(StateDictError::NoSlot { name: self.name.clone(), dims: dims.to_vec() }),
        }
    }

    /// The HF-layout tensor of this entry from its holder's Burn-layout `values` of shape `dims`.
    pub fn to_hf(&self, dims: &[usize], values: &[f32]) -> (Vec<usize>, Vec<f32>) {
        let Some((r, c, base)) = self.matrix(dims).unwrap_or_else(|e| panic!("{e}")) else {
            return (dims.to_vec(), values.to_vec());
        };
        let mut out = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                out[j * r + i] = values[base + i * c + j];
            }
        }
        (vec![c, r], out)
    }

    /// The HF-layout shape of this entry and a function that fills HF-layout values from row-major index
    /// `start` on, reading the holder's Burn-layout `values` in place (no transposed copy is made).
    pub fn hf_view<'a>(&self, dims: &[usize], values: &'a [f32]) -> (Vec<usize>, Fill<'a>) {
        let Some((r, c, base)) = self.matrix(dims).unwrap_or_else(|e| panic!("{e}")) else {
            return (dims.to_vec(), Box::new(move |start, out| out.copy_from_slice(&values[start..start + out.len()])));
        };
        // HF index k = j·r + i holds Burn element (i, j) = values[base + i·c + j].
        let fill = move |start: usize, out: &mut [f32]| {
            for (k, o) in (start..).zip(out.iter_mut()) {
                *o = values[base + (k % r) * c + k / r];
            }
        };
        (vec![c, r], Box::new(fill))
    }

    /// Writes an HF-layout tensor of `shape` into its holder's Burn-layout `buffer` of `dims` (the inverse
    /// of [`Entry::to_hf`]); the error names the tensor when its shape does not fit.
    pub fn copy_from_hf(
        &self,
        dims: &[usize],
        buffer: &mut [f32],
        shape: &[usize],
        hf: &[f32],
    ) -> Result<(), StateDictError> {
        let mismatch = |expected: &[usize]| StateDictError::Shape {
            name: self.name.clone(),
            shape: shape.to_vec(),
            expected: expected.to_vec(),
        };
        let Some((r, c, base)) = self.matrix(dims)? else {
            if shape != dims {
                return Err(mismatch(dims));
            }
            buffer.copy_from_slice(hf);
            return Ok(());
        };
        if shape != [c, r] || hf.len() != r * c {
            return Err(mismatch(&[c, r]));
        }
        for i in 0..r {
            for j in 0..c {
                buffer[base + i * c + j] = hf[j * r + i];
            }
        }
        Ok(())
    }
}

/// Host copies of tensors by target: dims (Burn layout) and row-major values.
pub type HostValues = HashMap<Target, (Vec<usize>, Vec<f32>)>;

struct Gather(HostValues);

impl ModuleVisitor for Gather {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val();
        let dims = t.dims().to_vec();
        let values = t.into_data().convert::<f32>().try_into_vec::<f32>().expect("float parameter");
        self.0.insert(Target::Param(param.id), (dims, values));
    }
}

/// The MoE blocks of the library's model, in layer order.
fn moe_blocks(model: &CausalLm) -> Vec<&MoeBlock> {
    model.layers.iter().filter_map(|l| l.moe.as_ref()).collect()
}

/// Every parameter's values, and the router biases of `blocks` (the model's MoE blocks), on the host.
pub fn host_values<M: Module>(model: &M, blocks: &[&MoeBlock]) -> HostValues {
    let mut g = Gather(HashMap::new());
    model.visit(&mut g);
    for (i, moe) in blocks.iter().enumerate() {
        if moe.router.selection_bias {
            let b = moe.router.bias_e.clone();
            let dims = b.dims().to_vec();
            g.0.insert(
                Target::RouterBias(i),
                (dims, b.into_data().convert::<f32>().try_into_vec::<f32>().expect("bias")),
            );
        }
    }
    g.0
}

/// The Burn-layout dims of every target of `model`.
pub fn host_dims<M: Module>(model: &M, blocks: &[&MoeBlock]) -> HashMap<Target, Vec<usize>> {
    host_values(model, blocks).into_iter().map(|(t, (d, _))| (t, d)).collect()
}

/// Assembles Burn-layout values for every target from HF-layout tensors, looked up by `name_of(entry)`
/// (e.g. the entry's name, or its moment's name). Every element of every target must be covered; the
/// error names the first missing tensor.
pub fn assemble(
    entries: &[Entry],
    dims_of: &HashMap<Target, Vec<usize>>,
    tensors: &NamedTensors,
    name_of: &dyn Fn(&Entry) -> String,
) -> Result<HashMap<Target, Vec<f32>>, StateDictError> {
    let mut out: HashMap<Target, Vec<f32>> = HashMap::new();
    for e in entries {
        let dims = dims_of.get(&e.target).ok_or_else(|| StateDictError::NotInModel { name: e.name.clone() })?;
        let name = name_of(e);
        let (shape, values) = tensors.get(&name).ok_or(StateDictError::Missing { name })?;
        let buffer = out.entry(e.target).or_insert_with(|| vec![0.0; dims.iter().product()]);
        e.copy_from_hf(dims, buffer, shape, values)?;
    }
    Ok(out)
}

struct Replace<'a> {
    values: &'a HashMap<Target, Vec<f32>>,
}

impl ModuleMapper for Replace<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(values) = self.values.get(&Target::Param(param.id)) else { return param };
        let (id, tensor, mapper) = param.consume();
        let (require_grad, device, shape) = (tensor.is_require_grad(), tensor.device(), tensor.shape());
        let mut out = Tensor::<D>::from_data(TensorData::new(values.clone(), shape), &device);
        if require_grad {
            out = out.require_grad();
        }
        Param::from_mapped_value(id, out, mapper)
    }
}

/// `model` with every parameter in `values` replaced (they keep their ids and gradient flags); the
/// router biases are [`replace_router_biases`]'.
pub fn replace<M: Module>(model: M, values: &HashMap<Target, Vec<f32>>) -> M {
    model.map(&mut Replace { values })
}

/// The router biases in `values` written into `blocks` (the model's MoE blocks, in order).
pub fn replace_router_biases<'a>(
    blocks: impl IntoIterator<Item = &'a mut MoeBlock>,
    values: &HashMap<Target, Vec<f32>>,
) {
    for (i, moe) in blocks.into_iter().enumerate() {
        if let Some(v) = values.get(&Target::RouterBias(i)) {
            let device = moe.router.bias_e.device();
            moe.router.bias_e = Tensor::<1>::from_data(TensorData::new(v.clone(), [v.len()]), &device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(slot: Slot) -> Entry {
        Entry { name: "t".into(), target: Target::RouterBias(0), slot, part: Part::Head, expert: None }
    }

    /// The streaming view, the materialised HF tensor and the inverse agree for every slot kind, against
    /// a naive transpose written out index by index.
    #[test]
    fn views_copies_and_inverse_agree() {
        let (e, r, c) = (3, 4, 5);
        let values: Vec<f32> = (0..e * r * c).map(|x| x as f32).collect();
        for (slot, dims) in [
            (Slot::Whole { transpose: false }, vec![e * r * c]),
            (Slot::Whole { transpose: true }, vec![r * e, c]),
            (Slot::Expert { slot: 2 }, vec![e, r, c]),
        ] {
            let en = entry(slot);
            let (shape, hf) = en.to_hf(&dims, &values);
            let naive: Vec<f32> = match slot {
                Slot::Whole { transpose: false } => values.clone(),
                Slot::Whole { transpose: true } => {
                    (0..c).flat_map(|j| (0..r * e).map(move |i| (i * c + j) as f32)).collect()
                }
                Slot::Expert { slot } => {
                    (0..c).flat_map(|j| (0..r).map(move |i| (slot * r * c + i * c + j) as f32)).collect()
                }
            };
            assert_eq!(hf, naive, "{slot:?}");
            let (view_shape, fill) = en.hf_view(&dims, &values);
            assert_eq!(view_shape, shape);
            let mut streamed = vec![0.0; hf.len()];
            for start in (0..hf.len()).step_by(7) {
                let end = (start + 7).min(hf.len());
                fill(start, &mut streamed[start..end]);
            }
            assert_eq!(streamed, hf, "{slot:?} streamed");
            let mut back = vec![f32::NAN; values.len()];
            if let Slot::Expert { .. } = slot {
                back.copy_from_slice(&values);
                back[2 * r * c..3 * r * c].fill(f32::NAN);
            }
            en.copy_from_hf(&dims, &mut back, &shape, &hf).unwrap();
            assert_eq!(back, values, "{slot:?} inverse");
            let err = en.copy_from_hf(&dims, &mut back, &[1, 2], &hf).unwrap_err().to_string();
            assert!(err.contains("has shape [1, 2]"), "{err}");
        }
    }
}
