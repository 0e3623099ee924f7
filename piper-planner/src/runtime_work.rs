//! The non-GEMM work of a training step as the runtime (piper-burn) executes it, priced with a
//! platform's measured [`RuntimeCosts`]: element counts of each kind of element-wise pass per layer and
//! micro-batch (RMSNorm, rotary embedding, softmax, SwiGLU, plain element-wise), the number of tensor
//! ops (each pays a fixed overhead), the LM head's softmax-cross-entropy, and the AdamW step.
//!
//! The counts follow piper-burn's implementation: the causal attention is one fused op (scores, mask,
//! softmax and the product with the values inside it, key/value heads read in place), priced by the
//! attention table, not counted here; MoE dispatch and combine gather `T·k·d` rows. They are counts of
//! elements, forward + backward, not FLOPs.
//!
//! Legend: T tokens per micro-batch, d width, h query heads, g key/value heads, k head dim,
//! E experts, K top-k, f expert width, V vocabulary.

use crate::model::{Attention, LayerKind, ModelSpec, QkNorm};
use crate::platform::RuntimeCosts;

/// Tensor ops of one layer, forward + backward (each pays `op_overhead_us`): read off piper-burn's
/// attention, MoE block and MLP (≈ 1 backward op per forward op, 2 for products).
const OPS_ATTENTION: f64 = 60.0;
const OPS_MOE: f64 = 70.0;
const OPS_DENSE_MLP: f64 = 20.0;
/// Final norm, LM head and cross-entropy.
const OPS_HEAD: f64 = 30.0;

/// Elements of each kind one layer touches per micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Elements {
    pub norm: f64,
    pub rope: f64,
    pub softmax: f64,
    pub swiglu: f64,
    pub elementwise: f64,
    pub ops: f64,
}

impl Elements {
    /// Forward + backward seconds.
    pub fn seconds(&self, c: &RuntimeCosts) -> f64 {
        (self.norm * c.norm_ns
            + self.rope * c.rope_ns
            + self.softmax * c.softmax_ns
            + self.swiglu * c.swiglu_ns
            + self.elementwise * c.elementwise_ns)
            * 1e-9
            + self.ops * c.op_overhead_us * 1e-6
    }
}

/// One decoder layer of `kind` on one rank, `tokens` tokens per micro-batch;
/// `ep` ranks share the routed tokens' expert work (each rank computes `T·K` expert rows on average).
pub fn layer_elements(spec: &ModelSpec, kind: LayerKind, tokens: f64) -> Elements {
    let t = tokens;
    let d = spec.hidden_size as f64;
    let mut e = Elements { norm: 2.0 * t * d, elementwise: 2.0 * t * d, ..Default::default() };
    // Attention: q/k norms, biases, rotary embedding; the fused attention op itself is in the table.
    let (rope_width, latent) = match spec.attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, qkv_bias, qk_norm, .. } => {
            let (h, g, k) = (num_heads as f64, num_kv_heads as f64, head_dim as f64);
            if qk_norm != QkNorm::None {
                e.norm += t * (h + g) * k;
            }
            if qkv_bias {
                e.elementwise += t * (h + 2.0 * g) * k;
            }
            ((h + g) * k, 0.0)
        }
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, .. } => {
            let h = num_heads as f64;
            let qk = (qk_nope_head_dim + qk_rope_head_dim) as f64;
            let latent = q_lora_rank.unwrap_or(0) as f64 + kv_lora_rank as f64;
            // Keys are assembled from their no-position and rotary parts: a copy of T·h·qk.
            e.elementwise += t * h * qk;
            ((h + 1.0) * qk_rope_head_dim as f64, latent)
        }
    };
    e.norm += t * latent;
    e.rope += t * rope_width;
    e.ops += OPS_ATTENTION;
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => {
            let (experts, k) = (moe.num_experts as f64, moe.top_k as f64);
            // Router scores and top-k over E, dispatch gather and weighted combine of T·K rows of d.
            e.softmax += t * experts;
            e.elementwise += 2.0 * t * experts + 2.0 * t * k * d;
            e.swiglu += t * k * moe.expert.intermediate_size as f64;
            let shared = moe.shared_expert();
            e.swiglu += t * moe.num_shared_experts as f64 * shared.intermediate_size as f64;
            if moe.shared_expert_gate {
                e.elementwise += 2.0 * t * d;
            }
            e.ops += OPS_MOE;
        }
        _ => {
            if let Some(m) = &spec.dense_mlp {
                e.swiglu += t * m.intermediate_size as f64;
                e.ops += OPS_DENSE_MLP;
            }
        }
    }
    e
}

/// SwiGLU elements (`silu(gate) ⊙ up`) of one layer's dense MLP or shared experts per micro-batch: what
/// selective recompute computes again in the backward (routed experts recompute theirs in any mode).
pub fn dense_swiglu_elements(spec: &ModelSpec, kind: LayerKind, tokens: f64) -> f64 {
    match (kind, &spec.moe) {
        (LayerKind::Moe, Some(moe)) => {
            tokens * moe.num_shared_experts as f64 * moe.shared_expert().intermediate_size as f64
        }
        _ => spec.dense_mlp.as_ref().map_or(0.0, |m| tokens * m.intermediate_size as f64),
    }
}

/// The last stage's final norm and softmax-cross-entropy over the vocabulary, per micro-batch (the first
/// stage's embedding lookup, one gather of `T·d`, is left out: it is below the noise).
pub fn head_elements(spec: &ModelSpec, tokens: f64) -> Elements {
    let d = spec.hidden_size as f64;
    let v = spec.vocab_size as f64;
    Elements {
        norm: tokens * d,
        softmax: tokens * v,
        // log-probabilities, the target gather and the gradient's one-hot subtraction.
        elementwise: 2.0 * tokens * v,
        ops: OPS_HEAD,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    #[test]
    fn counts_scale_with_tokens_and_price_linearly() {
        let spec = preset("tiny").unwrap();
        let (a, b) = (layer_elements(&spec, LayerKind::Moe, 100.0), layer_elements(&spec, LayerKind::Moe, 200.0));
        assert_eq!(b.norm, 2.0 * a.norm);
        assert_eq!(b.swiglu, 2.0 * a.swiglu);
        assert_eq!(a.ops, b.ops, "the op count does not depend on the tokens");
        let unit = RuntimeCosts {
            op_overhead_us: 0.0,
            norm_ns: 1.0,
            rope_ns: 1.0,
            softmax_ns: 1.0,
            swiglu_ns: 1.0,
            elementwise_ns: 1.0,
            optimizer_ns_per_param: 0.0,
            bytes_per_param: 16.0,
            activation_factor: 1.0,
            logits_factor: 1.0,
            activation_working_factor: 0.0,
            logits_working_factor: 0.0,
            expert_exchange_bytes: 0.0,
        };
        let sum = a.norm + a.rope + a.softmax + a.swiglu + a.elementwise;
        assert!((a.seconds(&unit) - sum * 1e-9).abs() < 1e-15);
    }

    /// The time model adds exactly these seconds to each layer (a third forward, two thirds backward)
    /// and prices the optimizer per parameter, when the platform carries measured runtime costs.
    #[test]
    fn the_step_adds_the_runtime_work() {
        use crate::layout::{Layout, TrainConfig};
        use crate::time::CostModel;
        let spec = preset("tiny").unwrap();
        let mut p = crate::platform::preset("local").unwrap();
        p.runtime = None;
        let layout = Layout { pp: 1, ep: 1, dp: 1 };
        let cfg = TrainConfig { micro_batch_size: 4, dtype: "fp32".into(), ..TrainConfig::new(32) };
        let algo = crate::comm::A2aAlgo::Flat;
        let without = CostModel::new(&spec, &p, &layout, &cfg, algo).unwrap();
        let rc = RuntimeCosts::distinct_for_tests();
        let p_rc = crate::platform::Platform { runtime: Some(rc), ..p.clone() };
        let with = CostModel::new(&spec, &p_rc, &layout, &cfg, algo).unwrap();
        for (i, kind) in spec.layers.iter().enumerate() {
            let extra = layer_elements(&spec, *kind, 128.0).seconds(&rc);
            assert!((with.layer_total_s(i) - without.layer_total_s(i) - extra).abs() < 1e-12);
        }
        let head = head_elements(&spec, 128.0).seconds(&rc);
        assert!((with.last_stage_extra_s() - without.last_stage_extra_s() - head).abs() < 1e-12);
        // Without runtime costs the update streams every byte of the states twice at memory_gbs: that
        // gives back the parameter count both price.
        let bytes = cfg.weight_bytes + cfg.grad_bytes + cfg.optimizer_bytes;
        let plain = without.stage(0, 0, spec.num_layers).optimizer_s;
        let params = plain * p.memory_gbs * 1e9 / (2.0 * bytes);
        let stage = with.stage(0, 0, spec.num_layers);
        assert!((stage.optimizer_s / (params * 17e-9) - 1.0).abs() < 1e-9, "{}", stage.optimizer_s);
    }
}
