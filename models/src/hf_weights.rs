//! Weights in Hugging Face's safetensors layout: tensor names and `[out, in]` linear weights as
//! `transformers` stores them for Mixtral, Qwen2/3-MoE and DeepSeek-style models, so their checkpoints
//! load and what Piper saves loads back into `transformers`.

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use piper_burn::CausalLm;
use piper_burn::mlp::Mlp;
use piper_planner::model::ModelSpec;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

/// Tensors by name: shape and f32 values.
pub type NamedTensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

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

/// Every tensor of `model` under its Hugging Face name, as `(name, shape, f32 values)` in HF layout.
pub fn hf_tensors(model: &CausalLm, spec: &ModelSpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    let mut put = |name: String, t: Tensor<2>, transpose: bool| {
        let t = if transpose { t.transpose() } else { t };
        out.push((name, t.dims().to_vec(), values(&t)));
    };
    let n = moe_names(spec);
    put("model.embed_tokens.weight".into(), model.embed.weight.val(), false);
    for (i, layer) in model.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let vec1 = |t: Tensor<1>| t.unsqueeze::<2>();
        put(format!("{p}.input_layernorm.weight"), vec1(layer.input_norm.gamma.val()), false);
        put(format!("{p}.post_attention_layernorm.weight"), vec1(layer.post_attention_norm.gamma.val()), false);
        if let Some(a) = &layer.attention {
            for (proj, lin) in
                [("q_proj", &a.q_proj), ("k_proj", &a.k_proj), ("v_proj", &a.v_proj), ("o_proj", &a.o_proj)]
            {
                put(format!("{p}.self_attn.{proj}.weight"), lin.weight.val(), true);
            }
            if let (Some(q), Some(k)) = (&a.q_norm, &a.k_norm) {
                put(format!("{p}.self_attn.q_norm.weight"), vec1(q.gamma.val()), false);
                put(format!("{p}.self_attn.k_norm.weight"), vec1(k.gamma.val()), false);
            }
        }
        if let Some(m) = &layer.mla {
            let a = format!("{p}.self_attn");
            if let Some(q) = &m.q_proj {
                put(format!("{a}.q_proj.weight"), q.weight.val(), true);
            }
            if let (Some(qa), Some(qn), Some(qb)) = (&m.q_a_proj, &m.q_a_norm, &m.q_b_proj) {
                put(format!("{a}.q_a_proj.weight"), qa.weight.val(), true);
                put(format!("{a}.q_a_layernorm.weight"), vec1(qn.gamma.val()), false);
                put(format!("{a}.q_b_proj.weight"), qb.weight.val(), true);
            }
            put(format!("{a}.kv_a_proj_with_mqa.weight"), m.kv_a_proj.weight.val(), true);
            put(format!("{a}.kv_a_layernorm.weight"), vec1(m.kv_a_norm.gamma.val()), false);
            put(format!("{a}.kv_b_proj.weight"), m.kv_b_proj.weight.val(), true);
            put(format!("{a}.o_proj.weight"), m.o_proj.weight.val(), true);
        }
        if let Some(mlp) = &layer.dense {
            put_mlp(&mut put, &format!("{p}.mlp"), mlp);
        }
        if let Some(moe) = &layer.moe {
            let b = format!("{p}.{}", n.block);
            put(format!("{b}.gate.weight"), moe.router.gate.weight.val(), true);
            if moe.router.selection_bias {
                put(format!("{b}.gate.e_score_correction_bias"), vec1(moe.router.bias_e.clone()), false);
            }
            let e = moe.experts.num_experts();
            for x in 0..e {
                let pick = |w: Tensor<3>| {
                    let [_, r, c] = w.dims();
                    w.narrow(0, x, 1).reshape([r, c])
                };
                put(format!("{b}.experts.{x}.{}.weight", n.gate), pick(moe.experts.w_gate_edf.val()), true);
                put(format!("{b}.experts.{x}.{}.weight", n.up), pick(moe.experts.w_up_edf.val()), true);
                put(format!("{b}.experts.{x}.{}.weight", n.down), pick(moe.experts.w_down_efd.val()), true);
            }
            if let Some(shared) = &moe.shared {
                put_mlp(&mut put, &format!("{b}.{}", shared_name(spec)), shared);
            }
            if let Some(g) = &moe.shared_gate {
                put(format!("{b}.shared_expert_gate.weight"), g.weight.val(), true);
            }
        }
    }
    put("model.norm.weight".into(), model.norm.gamma.val().unsqueeze::<2>(), false);
    if let Some(head) = &model.lm_head_dv {
        put("lm_head.weight".into(), head.val(), true);
    }
    // Norm weights were lifted to 2-D for `put`; store them 1-D as transformers does.
    for (name, shape, _) in out.iter_mut() {
        if name.ends_with("norm.weight")
            || name.ends_with("layernorm.weight")
            || name.ends_with("e_score_correction_bias")
        {
            *shape = vec![shape[1]];
        }
    }
    out
}

fn put_mlp(put: &mut impl FnMut(String, Tensor<2>, bool), prefix: &str, mlp: &Mlp) {
    put(format!("{prefix}.gate_proj.weight"), mlp.gate_proj.weight.val(), true);
    put(format!("{prefix}.up_proj.weight"), mlp.up_proj.weight.val(), true);
    put(format!("{prefix}.down_proj.weight"), mlp.down_proj.weight.val(), true);
}

fn values<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
    t.to_data().convert::<f32>().try_to_vec().expect("float data")
}

/// Writes the model as a Hugging Face safetensors file (f32).
pub fn save_hf(model: &CausalLm, spec: &ModelSpec, path: &Path) -> Result<(), String> {
    let tensors = hf_tensors(model, spec);
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).expect("shape matches data")))
        .collect();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| format!("{}: cannot write safetensors: {e}", path.display()))
}

/// Reads f32 tensors by name from safetensors bytes (an optional prefix is stripped from names).
pub fn read_f32(bytes: &[u8], prefix: &str) -> Result<NamedTensors, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let Some(name) = name.strip_prefix(prefix) else { continue };
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => {
                view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
            }
            Dtype::BF16 => view
                .data()
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            Dtype::F16 => view.data().chunks_exact(2).map(|c| half_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
            _ => continue,
        };
        out.insert(name.to_string(), (view.shape().to_vec(), data));
    }
    Ok(out)
}

fn half_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if frac == 0 => sign,
        0 => return f32::from_bits(sign) + (frac as f32) * 2f32.powi(-24) * if sign != 0 { -1.0 } else { 1.0 },
        31 => sign | 0x7f80_0000 | (frac << 13),
        e => sign | (((e - 15 + 127) as u32) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

/// Replaces every weight of `model` by the tensor of the same Hugging Face name in `tensors`. Every
/// expected name must be present with the expected shape; the error names the first that is not.
pub fn load_hf(
    mut model: CausalLm,
    spec: &ModelSpec,
    tensors: &HashMap<String, (Vec<usize>, Vec<f32>)>,
    device: &Device,
) -> Result<CausalLm, String> {
    let expected = hf_tensors(&model, spec);
    let mut fetch = |name: &str| -> Result<Tensor<2>, String> {
        let want = expected.iter().find(|(n, _, _)| n == name).ok_or_else(|| format!("no slot named `{name}`"))?;
        let (shape, data) = tensors.get(name).ok_or_else(|| format!("checkpoint has no tensor `{name}`"))?;
        if *shape != want.1 {
            return Err(format!("tensor `{name}` has shape {shape:?}, the model expects {:?}", want.1));
        }
        let (r, c) = if shape.len() == 1 { (1, shape[0]) } else { (shape[0], shape[1]) };
        Ok(Tensor::<2>::from_data(TensorData::new(data.clone(), [r, c]), device))
    };
    let lin = |t: Tensor<2>| Param::from_tensor(t.transpose());
    let vec1 = |t: Tensor<2>| {
        let [_, c] = t.dims();
        Param::from_tensor(t.reshape([c]))
    };
    let n = moe_names(spec);
    model.embed.weight = Param::from_tensor(fetch("model.embed_tokens.weight")?);
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let p = format!("model.layers.{i}");
        layer.input_norm.gamma = vec1(fetch(&format!("{p}.input_layernorm.weight"))?);
        layer.post_attention_norm.gamma = vec1(fetch(&format!("{p}.post_attention_layernorm.weight"))?);
        if let Some(a) = layer.attention.as_mut() {
            a.q_proj.weight = lin(fetch(&format!("{p}.self_attn.q_proj.weight"))?);
            a.k_proj.weight = lin(fetch(&format!("{p}.self_attn.k_proj.weight"))?);
            a.v_proj.weight = lin(fetch(&format!("{p}.self_attn.v_proj.weight"))?);
            a.o_proj.weight = lin(fetch(&format!("{p}.self_attn.o_proj.weight"))?);
            if let (Some(q), Some(k)) = (a.q_norm.as_mut(), a.k_norm.as_mut()) {
                q.gamma = vec1(fetch(&format!("{p}.self_attn.q_norm.weight"))?);
                k.gamma = vec1(fetch(&format!("{p}.self_attn.k_norm.weight"))?);
            }
        }
        if let Some(m) = layer.mla.as_mut() {
            let a = format!("{p}.self_attn");
            if let Some(q) = m.q_proj.as_mut() {
                q.weight = lin(fetch(&format!("{a}.q_proj.weight"))?);
            }
            if let (Some(qa), Some(qn), Some(qb)) = (m.q_a_proj.as_mut(), m.q_a_norm.as_mut(), m.q_b_proj.as_mut()) {
                qa.weight = lin(fetch(&format!("{a}.q_a_proj.weight"))?);
                qn.gamma = vec1(fetch(&format!("{a}.q_a_layernorm.weight"))?);
                qb.weight = lin(fetch(&format!("{a}.q_b_proj.weight"))?);
            }
            m.kv_a_proj.weight = lin(fetch(&format!("{a}.kv_a_proj_with_mqa.weight"))?);
            m.kv_a_norm.gamma = vec1(fetch(&format!("{a}.kv_a_layernorm.weight"))?);
            m.kv_b_proj.weight = lin(fetch(&format!("{a}.kv_b_proj.weight"))?);
            m.o_proj.weight = lin(fetch(&format!("{a}.o_proj.weight"))?);
        }
        if let Some(mlp) = layer.dense.as_mut() {
            load_mlp(mlp, &format!("{p}.mlp"), &mut fetch, &lin)?;
        }
        if let Some(moe) = layer.moe.as_mut() {
            let b = format!("{p}.{}", n.block);
            moe.router.gate.weight = lin(fetch(&format!("{b}.gate.weight"))?);
            if moe.router.selection_bias {
                let t = fetch(&format!("{b}.gate.e_score_correction_bias"))?;
                let [_, c] = t.dims();
                moe.router.bias_e = t.reshape([c]);
            }
            let e = moe.experts.num_experts();
            let stack = |which: &str,
                         fetch: &mut dyn FnMut(&str) -> Result<Tensor<2>, String>|
             -> Result<Tensor<3>, String> {
                let parts = (0..e)
                    .map(|x| fetch(&format!("{b}.experts.{x}.{which}.weight")).map(|t| t.transpose().unsqueeze::<3>()))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Tensor::cat(parts, 0))
            };
            moe.experts.w_gate_edf = Param::from_tensor(stack(n.gate, &mut fetch)?);
            moe.experts.w_up_edf = Param::from_tensor(stack(n.up, &mut fetch)?);
            moe.experts.w_down_efd = Param::from_tensor(stack(n.down, &mut fetch)?);
            if let Some(shared) = moe.shared.as_mut() {
                load_mlp(shared, &format!("{b}.{}", shared_name(spec)), &mut fetch, &lin)?;
            }
            if let Some(g) = moe.shared_gate.as_mut() {
                g.weight = lin(fetch(&format!("{b}.shared_expert_gate.weight"))?);
            }
        }
    }
    model.norm.gamma = vec1(fetch("model.norm.weight")?);
    if model.lm_head_dv.is_some() {
        model.lm_head_dv = Some(lin(fetch("lm_head.weight")?));
    }
    Ok(model)
}

fn load_mlp(
    mlp: &mut Mlp,
    prefix: &str,
    fetch: &mut dyn FnMut(&str) -> Result<Tensor<2>, String>,
    lin: &dyn Fn(Tensor<2>) -> Param<Tensor<2>>,
) -> Result<(), String> {
    let set = |l: &mut Linear, w: Tensor<2>| l.weight = lin(w);
    set(&mut mlp.gate_proj, fetch(&format!("{prefix}.gate_proj.weight"))?);
    set(&mut mlp.up_proj, fetch(&format!("{prefix}.up_proj.weight"))?);
    set(&mut mlp.down_proj, fetch(&format!("{prefix}.down_proj.weight"))?);
    Ok(())
}
