//! Numerical parity with Hugging Face transformers: tiny random Mixtral, Qwen3-MoE, DeepSeek-V3 and
//! DeepSeek-V2 models built by `tests/fixtures/make_hf_fixtures.py` (torch + transformers, run once by
//! hand; the fixtures are committed): transformers 4.57.1 in `tests/fixtures/`, transformers 5.24.0 (its
//! own config.json spellings and `save_pretrained` output) in `tests/fixtures/transformers5/`. Their
//! config.json goes through the planner's loader, their safetensors weights through Piper's Hugging
//! Face loader; logits, router logits, the load-balancing loss, the cross-entropy and its gradients must
//! match to 1e-4 (f32).

use burn::prelude::*;
use piper_burn::CausalLmConfig;
use piper_burn::hf::StateDictAdapter;
use piper_burn::hf::weights::{read_f32, save_hf};
use piper_burn::moe::losses::load_balancing_loss;
use piper_planner::model::presets::load_model_str;
use piper_test_support::max_relative_difference;
use safetensors::SafeTensors;

const TOL: f32 = 1e-4;

fn fixture(version: &str, name: &str) -> (String, Vec<u8>) {
    let dir = piper_test_support::fixtures().join(version);
    let config = std::fs::read_to_string(dir.join(format!("hf_{name}_config.json"))).expect("fixture config");
    let bytes = std::fs::read(dir.join(format!("hf_{name}.safetensors"))).expect("fixture weights");
    (config, bytes)
}

/// Differences relative to max(|theirs|, 1); NaN, infinity and a length mismatch fail.
fn close(what: &str, ours: &[f32], theirs: &[f32]) {
    let f64s = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    let worst = max_relative_difference(&f64s(ours), &f64s(theirs), 1.0).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(worst <= TOL as f64, "{what}: worst difference {worst:e} > {TOL:e}");
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().unwrap()
}

/// Which tensors a family names how.
struct Family {
    /// Fixture folder under tests/fixtures: "" (transformers 4) or "transformers5".
    version: &'static str,
    name: &'static str,
    experts: [&'static str; 3],
    block: &'static str,
    first_moe_layer: usize,
}

fn parity(f: Family) {
    let Family { version, name, experts: expert_names, block, first_moe_layer } = f;
    let (config, bytes) = fixture(version, name);
    let name = &format!("{name} ({})", if version.is_empty() { "transformers 4" } else { version });
    // transformers has no MTP module (its DeepSeek-V3 ignores those weights): compare the main model.
    let spec = load_model_str(&config, &format!("hf_{name}_config.json")).unwrap().without_mtp();
    let device = Device::flex().autodiff();
    let weights = read_f32(&bytes, "weight.").unwrap();
    let fresh = CausalLmConfig::from_spec(&spec).unwrap().init(&device);
    let model = StateDictAdapter::new(&spec).from_hf(fresh, &weights).unwrap();
    let refs = read_f32(&bytes, "").unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids_view = st.tensor("input_ids").unwrap();
    let ids: Vec<i64> = ids_view.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    let shape = ids_view.shape().to_vec();
    let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(ids, [shape[0], shape[1]]), &device);

    let out = model.forward(ids_bs.clone());
    close(&format!("{name} logits"), &values(out.logits_bsv), &refs["logits"].1);
    let router: Vec<f32> = out.moe.iter().flat_map(|m| values(m.router_logits_te.clone())).collect();
    close(&format!("{name} router logits"), &router, &refs["router_logits"].1);
    // transformers' load-balancing loss over all layers' router logits at once.
    let logits_te = Tensor::cat(out.moe.iter().map(|m| m.router_logits_te.clone()).collect(), 0);
    let k = model.layers[first_moe_layer].moe.as_ref().unwrap().router.top_k;
    let (_, idx) = burn::tensor::activation::softmax(logits_te.clone(), 1).topk_with_indices(k, 1);
    let aux = load_balancing_loss(burn::tensor::activation::softmax(logits_te, 1), idx);
    close(&format!("{name} aux loss"), &values(aux), &refs["aux_loss"].1);

    let loss = model.loss(ids_bs);
    close(&format!("{name} cross-entropy"), &values(loss.cross_entropy.clone()), &refs["cross_entropy"].1);
    let grads = loss.cross_entropy.backward();
    let g = |p: &burn::module::Param<Tensor<2>>| values(p.grad(&grads).unwrap());
    let gt = |p: &burn::module::Param<Tensor<2>>| values(p.grad(&grads).unwrap().transpose());
    close("grad embed", &g(&model.embed.weight), &refs["grad.model.embed_tokens.weight"].1);
    close("grad lm_head", &gt(model.lm_head_dv.as_ref().unwrap()), &refs["grad.lm_head.weight"].1);
    match (&model.layers[0].attention, &model.layers[0].mla) {
        (Some(a), _) => {
            close("grad q_proj", &gt(&a.q_proj.weight), &refs["grad.model.layers.0.self_attn.q_proj.weight"].1)
        }
        (_, Some(m)) => match (&m.q_a_proj, &m.q_proj) {
            (Some(q_a), _) => {
                close("grad q_a_proj", &gt(&q_a.weight), &refs["grad.model.layers.0.self_attn.q_a_proj.weight"].1)
            }
            (_, Some(q)) => {
                close("grad q_proj", &gt(&q.weight), &refs["grad.model.layers.0.self_attn.q_proj.weight"].1)
            }
            _ => unreachable!(),
        },
        _ => unreachable!(),
    }
    let o_proj = match (&model.layers[1].attention, &model.layers[1].mla) {
        (Some(a), _) => &a.o_proj,
        (_, Some(m)) => &m.o_proj,
        _ => unreachable!(),
    };
    close("grad o_proj", &gt(&o_proj.weight), &refs["grad.model.layers.1.self_attn.o_proj.weight"].1);
    let experts = &model.layers[first_moe_layer].moe.as_ref().unwrap().experts;
    for (param, hf) in [
        (&experts.w_gate_edf, expert_names[0]),
        (&experts.w_up_edf, expert_names[1]),
        (&experts.w_down_efd, expert_names[2]),
    ] {
        let grad = param.grad(&grads).unwrap();
        let [_, r, c] = grad.dims();
        let expert0 = grad.narrow(0, 0, 1).reshape([r, c]).transpose();
        close(
            &format!("grad expert 0 {hf}"),
            &values(expert0),
            &refs[&format!("grad.model.layers.{first_moe_layer}.{block}.experts.0.{hf}.weight")].1,
        );
    }

    // Saving writes the same names and values back.
    let path = std::env::temp_dir().join(format!(
        "piper-hf-roundtrip-{}-{}.safetensors",
        name.replace([' ', '(', ')'], ""),
        std::process::id()
    ));
    save_hf(&model, &spec, &path).unwrap();
    let again = read_f32(&std::fs::read(&path).unwrap(), "").unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(again.len(), weights.len(), "saved tensor count");
    for (n, (shape, data)) in &weights {
        assert_eq!(&again[n].0, shape, "{n}");
        assert_eq!(&again[n].1, data, "{n}");
    }
}

const MIXTRAL: Family =
    Family { version: "", name: "mixtral", experts: ["w1", "w3", "w2"], block: "block_sparse_moe", first_moe_layer: 0 };
const QWEN3_MOE: Family = Family {
    version: "",
    name: "qwen3_moe",
    experts: ["gate_proj", "up_proj", "down_proj"],
    block: "mlp",
    first_moe_layer: 0,
};
/// MLA, a dense first layer, sigmoid router with a (random) selection bias, group-limited top-k, routed
/// scaling 2.5, one shared expert.
const DEEPSEEK_V3: Family = Family { name: "deepseek_v3", first_moe_layer: 1, ..QWEN3_MOE };
/// MLA without a q LoRA, a dense first layer, softmax router with group-limited greedy top-k, routed
/// scaling 1.5, two shared experts.
const DEEPSEEK_V2: Family = Family { name: "deepseek_v2", first_moe_layer: 1, ..QWEN3_MOE };
const V5: &str = "transformers5";

#[test]
fn mixtral_matches_transformers() {
    parity(MIXTRAL);
}

#[test]
fn qwen3_moe_matches_transformers() {
    parity(QWEN3_MOE);
}

#[test]
fn deepseek_v3_matches_transformers() {
    parity(DEEPSEEK_V3);
}

#[test]
fn mixtral_matches_transformers_5() {
    parity(Family { version: V5, ..MIXTRAL });
}

#[test]
fn qwen3_moe_matches_transformers_5() {
    parity(Family { version: V5, ..QWEN3_MOE });
}

#[test]
fn deepseek_v3_matches_transformers_5() {
    parity(Family { version: V5, ..DEEPSEEK_V3 });
}

#[test]
fn deepseek_v2_matches_transformers_5() {
    parity(Family { version: V5, ..DEEPSEEK_V2 });
}

/// q/k/v biases (random), a sigmoid-gated shared expert, no top-k renormalisation, a dense middle layer.
#[test]
fn qwen2_moe_matches_transformers_5() {
    parity(Family { version: V5, name: "qwen2_moe", ..QWEN3_MOE });
}

/// q/k RMSNorm over whole projections, q/k/v clamped to ±0.5, top-8 of 16 without renormalisation.
#[test]
fn olmoe_matches_transformers_5() {
    parity(Family { version: V5, name: "olmoe", ..QWEN3_MOE });
}
