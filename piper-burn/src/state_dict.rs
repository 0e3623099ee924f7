//! The one name map between the Burn model and Hugging Face's tensor names, used both ways: export
//! (`save_hf`, checkpoints) and import (`load_hf`, resume, resharding) — as torchtitan's state-dict
//! adapters do. Each entry says where an HF tensor lives in a Burn parameter: the whole parameter
//! (linear weights transposed: Burn stores `[in, out]`, transformers `[out, in]`), or one expert's slice
//! of a stacked expert parameter, named by its *global* expert id — so a stage's or an expert-group rank's
//! state dict is the slice of the whole model's that it holds, for any layout and after any migration.
//!
//! Legend: `e` local experts, `d` model width, `f` expert FFN width, `v` vocabulary.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use piper_planner::checkpoint::shard::Fill;
use piper_planner::model::ModelSpec;

use crate::lm::CausalLm;
use crate::mlp::Mlp;

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
    /// the index is the layer's position in `model.layers`.
    RouterBias(usize),
}

/// One named tensor of the state dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub target: Target,
    pub slot: Slot,
    /// Global index of the decoder layer it belongs to (`None`: embedding, final norm, LM head).
    pub layer: Option<usize>,
    /// Global expert id for an expert slice.
    pub expert: Option<usize>,
}

/// Names of one layer's MoE tensors in a family.
struct MoeNames {
    block: &'static str,
    gate: &'static str,
    up: &'static str,
    down: &'static str,
}

fn moe_names(spec: &ModelSpec) -> MoeNames {
    match spec.model_type.as_str() {
        "mixtral" | "piper" => MoeNames { block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2" },
        _ => MoeNames { block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj" },
    }
}

fn shared_name(spec: &ModelSpec) -> &'static str {
    if spec.model_type.starts_with("deepseek") { "shared_experts" } else { "shared_expert" }
}

/// The state dict of `model`, whose `layers` are the model's layers `first_layer..`; `experts_of(i)`
/// gives the global expert ids of the local slots of the MoE block in `model.layers[i]` (identity for a
/// whole model on one rank).
pub fn entries(
    model: &CausalLm,
    spec: &ModelSpec,
    first_layer: usize,
    experts_of: &dyn Fn(usize) -> Vec<usize>,
) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut put = |name: String, id: ParamId, transpose: bool, layer: Option<usize>| {
        out.push(Entry { name, target: Target::Param(id), slot: Slot::Whole { transpose }, layer, expert: None });
    };
    put("model.embed_tokens.weight".into(), model.embed.weight.id, false, None);
    let n = moe_names(spec);
    let mut experts = Vec::new();
    let mut biases = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        let g = first_layer + i;
        let p = format!("model.layers.{g}");
        let l = Some(g);
        put(format!("{p}.input_layernorm.weight"), layer.input_norm.gamma.id, false, l);
        put(format!("{p}.post_attention_layernorm.weight"), layer.post_attention_norm.gamma.id, false, l);
        if let Some(a) = &layer.attention {
            for (proj, lin) in
                [("q_proj", &a.q_proj), ("k_proj", &a.k_proj), ("v_proj", &a.v_proj), ("o_proj", &a.o_proj)]
            {
                put(format!("{p}.self_attn.{proj}.weight"), lin.weight.id, true, l);
                if let Some(bias) = &lin.bias {
                    put(format!("{p}.self_attn.{proj}.bias"), bias.id, false, l);
                }
            }
            if let (Some(q), Some(k)) = (&a.q_norm, &a.k_norm) {
                put(format!("{p}.self_attn.q_norm.weight"), q.gamma.id, false, l);
                put(format!("{p}.self_attn.k_norm.weight"), k.gamma.id, false, l);
            }
        }
        if let Some(m) = &layer.mla {
            let a = format!("{p}.self_attn");
            if let Some(q) = &m.q_proj {
                put(format!("{a}.q_proj.weight"), q.weight.id, true, l);
            }
            if let (Some(qa), Some(qn), Some(qb)) = (&m.q_a_proj, &m.q_a_norm, &m.q_b_proj) {
                put(format!("{a}.q_a_proj.weight"), qa.weight.id, true, l);
                put(format!("{a}.q_a_layernorm.weight"), qn.gamma.id, false, l);
                put(format!("{a}.q_b_proj.weight"), qb.weight.id, true, l);
            }
            put(format!("{a}.kv_a_proj_with_mqa.weight"), m.kv_a_proj.weight.id, true, l);
            put(format!("{a}.kv_a_layernorm.weight"), m.kv_a_norm.gamma.id, false, l);
            put(format!("{a}.kv_b_proj.weight"), m.kv_b_proj.weight.id, true, l);
            put(format!("{a}.o_proj.weight"), m.o_proj.weight.id, true, l);
        }
        if let Some(mlp) = &layer.dense {
            put_mlp(&mut put, &format!("{p}.mlp"), mlp, l);
        }
        if let Some(moe) = &layer.moe {
            let b = format!("{p}.{}", n.block);
            put(format!("{b}.gate.weight"), moe.router.gate.weight.id, true, l);
            if moe.router.selection_bias {
                biases.push((format!("{b}.gate.e_score_correction_bias"), i, g));
            }
            for (slot, x) in experts_of(i).into_iter().enumerate() {
                for (which, w) in [
                    (n.gate, moe.experts.w_gate_edf.id),
                    (n.up, moe.experts.w_up_edf.id),
                    (n.down, moe.experts.w_down_efd.id),
                ] {
                    let name = format!("{b}.experts.{x}.{which}.weight");
                    experts.push(Entry {
                        name,
                        target: Target::Param(w),
                        slot: Slot::Expert { slot },
                        layer: l,
                        expert: Some(x),
                    });
                }
            }
            if let Some(shared) = &moe.shared {
                put_mlp(&mut put, &format!("{b}.{}", shared_name(spec)), shared, l);
            }
            if let Some(gate) = &moe.shared_gate {
                put(format!("{b}.shared_expert_gate.weight"), gate.weight.id, true, l);
            }
        }
    }
    put("model.norm.weight".into(), model.norm.gamma.id, false, None);
    if let Some(head) = &model.lm_head_dv {
        put("lm_head.weight".into(), head.id, true, None);
    }
    out.extend(experts);
    out.extend(biases.into_iter().map(|(name, i, g)| Entry {
        name,
        target: Target::RouterBias(i),
        slot: Slot::Whole { transpose: false },
        layer: Some(g),
        expert: None,
    }));
    out
}

fn put_mlp(put: &mut impl FnMut(String, ParamId, bool, Option<usize>), prefix: &str, mlp: &Mlp, l: Option<usize>) {
    put(format!("{prefix}.gate_proj.weight"), mlp.gate_proj.weight.id, true, l);
    put(format!("{prefix}.up_proj.weight"), mlp.up_proj.weight.id, true, l);
    put(format!("{prefix}.down_proj.weight"), mlp.down_proj.weight.id, true, l);
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

/// Every parameter's values, and the router biases, on the host.
pub fn host_values(model: &CausalLm) -> HostValues {
    let mut g = Gather(HashMap::new());
    model.visit(&mut g);
    for (i, layer) in model.layers.iter().enumerate() {
        if let Some(moe) = layer.moe.as_ref().filter(|m| m.router.selection_bias) {
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

/// The HF-layout tensor of `entry` from its holder's Burn-layout `values` of shape `dims`.
pub fn to_hf(entry: &Entry, dims: &[usize], values: &[f32]) -> (Vec<usize>, Vec<f32>) {
    let (r, c, base) = match (entry.slot, dims) {
        (Slot::Whole { transpose: false }, _) => return (dims.to_vec(), values.to_vec()),
        (Slot::Whole { transpose: true }, [r, c]) => (*r, *c, 0),
        (Slot::Expert { slot }, [_, r, c]) => (*r, *c, slot * r * c),
        _ => panic!("state dict entry `{}` does not fit a parameter of shape {dims:?}", entry.name),
    };
    let mut out = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = values[base + i * c + j];
        }
    }
    (vec![c, r], out)
}

/// The HF-layout shape of `entry` and a function that fills HF-layout values from row-major index
/// `start` on, reading the holder's Burn-layout `values` in place (no transposed copy is made).
pub fn hf_view<'a>(entry: &Entry, dims: &[usize], values: &'a [f32]) -> (Vec<usize>, Fill<'a>) {
    let (r, c, base) = match (entry.slot, dims) {
        (Slot::Whole { transpose: false }, _) => {
            return (dims.to_vec(), Box::new(move |start, out| out.copy_from_slice(&values[start..start + out.len()])));
        }
        (Slot::Whole { transpose: true }, [r, c]) => (*r, *c, 0),
        (Slot::Expert { slot }, [_, r, c]) => (*r, *c, slot * r * c),
        _ => panic!("state dict entry `{}` does not fit a parameter of shape {dims:?}", entry.name),
    };
    // HF index k = j·r + i holds Burn element (i, j) = values[base + i·c + j].
    let fill = move |start: usize, out: &mut [f32]| {
        for (k, o) in (start..).zip(out.iter_mut()) {
            *o = values[base + (k % r) * c + k / r];
        }
    };
    (vec![c, r], Box::new(fill))
}

/// Writes an HF-layout tensor into its holder's Burn-layout buffer (the inverse of [`to_hf`]); the
/// error names the tensor when its shape does not fit.
pub fn from_hf(entry: &Entry, dims: &[usize], buffer: &mut [f32], shape: &[usize], hf: &[f32]) -> Result<(), String> {
    let (r, c, base) = match (entry.slot, dims) {
        (Slot::Whole { transpose: false }, _) => {
            if shape != dims {
                return Err(format!("tensor `{}` has shape {shape:?}, the model expects {dims:?}", entry.name));
            }
            buffer.copy_from_slice(hf);
            return Ok(());
        }
        (Slot::Whole { transpose: true }, [r, c]) => (*r, *c, 0),
        (Slot::Expert { slot }, [_, r, c]) => (*r, *c, slot * r * c),
        _ => return Err(format!("state dict entry `{}` does not fit a parameter of shape {dims:?}", entry.name)),
    };
    if shape != [c, r] || hf.len() != r * c {
        return Err(format!("tensor `{}` has shape {shape:?}, the model expects {:?}", entry.name, [c, r]));
    }
    for i in 0..r {
        for j in 0..c {
            buffer[base + i * c + j] = hf[j * r + i];
        }
    }
    Ok(())
}

/// Assembles Burn-layout values for every target from HF-layout tensors, looked up by `name_of(entry)`
/// (e.g. the entry's name, or its moment's name). Every element of every target must be covered; the
/// error names the first missing tensor.
pub fn assemble(
    entries: &[Entry],
    dims_of: &HashMap<Target, Vec<usize>>,
    tensors: &HashMap<String, (Vec<usize>, Vec<f32>)>,
    name_of: &dyn Fn(&Entry) -> String,
) -> Result<HashMap<Target, Vec<f32>>, String> {
    let mut out: HashMap<Target, Vec<f32>> = HashMap::new();
    for e in entries {
        let dims = dims_of.get(&e.target).ok_or_else(|| format!("`{}` has no slot in the model", e.name))?;
        let name = name_of(e);
        let (shape, values) = tensors.get(&name).ok_or_else(|| format!("no tensor `{name}`"))?;
        let buffer = out.entry(e.target).or_insert_with(|| vec![0.0; dims.iter().product()]);
        from_hf(e, dims, buffer, shape, values)?;
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

/// `model` with every target in `values` replaced (parameters keep their ids and gradient flags).
pub fn replace(model: CausalLm, values: &HashMap<Target, Vec<f32>>) -> CausalLm {
    let mut model = model.map(&mut Replace { values });
    for (i, layer) in model.layers.iter_mut().enumerate() {
        if let (Some(moe), Some(v)) = (layer.moe.as_mut(), values.get(&Target::RouterBias(i))) {
            let device = moe.router.bias_e.device();
            moe.router.bias_e = Tensor::<1>::from_data(TensorData::new(v.clone(), [v.len()]), &device);
        }
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(slot: Slot) -> Entry {
        Entry { name: "t".into(), target: Target::RouterBias(0), slot, layer: None, expert: None }
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
            let (shape, hf) = to_hf(&en, &dims, &values);
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
            let (view_shape, fill) = hf_view(&en, &dims, &values);
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
            from_hf(&en, &dims, &mut back, &shape, &hf).unwrap();
            assert_eq!(back, values, "{slot:?} inverse");
            assert!(from_hf(&en, &dims, &mut back, &[1, 2], &hf).unwrap_err().contains("has shape [1, 2]"));
        }
    }
}
