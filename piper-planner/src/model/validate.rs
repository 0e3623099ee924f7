//! Validation of a [`ModelSpec`]: every count in a range some real model could have, every float finite
//! and positive, at most [`limits::MAX_PARAMS`] parameters (so no count the resource model forms can
//! wrap), and the parts consistent with each other. Errors name the field and what would fix it.

use super::counts::params_upper_bound;
use super::spec::{Attention, LayerKind, ModelSpec, Moe};
use crate::error::{Error, Result};
use crate::limits;

impl ModelSpec {
    /// Checks the spec for internal consistency and size; the error names the field and the fix.
    pub fn validate(&self) -> Result<()> {
        let src = format!("model `{}`", self.name.escape_debug());
        limits::printable(&src, "name", &self.name)?;
        self.check_sizes(&src)?;
        check_attention(&src, &self.attention)?;
        if let Some(mlp) = &self.dense_mlp {
            limits::count(&src, "intermediate_size", mlp.intermediate_size, 0, limits::MAX_FFN)?;
        }
        if let Some(moe) = &self.moe {
            check_moe_sizes(&src, moe)?;
        }
        let params = params_upper_bound(self);
        if params > limits::MAX_PARAMS {
            return Err(Error::invalid(
                src,
                "num_hidden_layers",
                format!(
                    "the model would have about {params:.3e} parameters (> {:.0e}); no real model is this large — check the sizes",
                    limits::MAX_PARAMS
                ),
            ));
        }
        self.check_blocks(&src)?;
        // An MoE block is checked even when no layer uses it (an MTP module may; counts use it).
        match &self.moe {
            Some(moe) => check_moe(&src, moe),
            None => Ok(()),
        }
    }

    /// Widths, depths and floats of the whole model.
    fn check_sizes(&self, src: &str) -> Result<()> {
        limits::count(src, "hidden_size", self.hidden_size, 1, limits::MAX_WIDTH)?;
        limits::count(src, "num_hidden_layers", self.num_layers, 1, limits::MAX_LAYERS)?;
        limits::count(src, "vocab_size", self.vocab_size, 1, limits::MAX_VOCAB)?;
        limits::count(src, "num_nextn_predict_layers", self.mtp_depth, 0, limits::MAX_MTP_DEPTH)?;
        for (field, v) in
            [("rope_theta", self.rope_theta), ("rms_norm_eps", self.norm_eps), ("clip_qkv", self.clip_qkv)]
        {
            if let Some(v) = v {
                limits::positive(src, field, v, 1e12)?;
            }
        }
        if self.layers.len() as u64 != self.num_layers {
            return Err(Error::invalid(
                src,
                "layers",
                format!("has {} entries but the model has {} layers", self.layers.len(), self.num_layers),
            ));
        }
        Ok(())
    }

    /// Every layer kind the model uses has its block.
    fn check_blocks(&self, src: &str) -> Result<()> {
        if self.layers.contains(&LayerKind::Dense) && self.dense_mlp.as_ref().is_none_or(|m| m.intermediate_size == 0) {
            return Err(Error::invalid(src, "intermediate_size", "dense layers need a dense MLP width > 0"));
        }
        if self.layers.contains(&LayerKind::Moe) && self.moe.is_none() {
            return Err(Error::invalid(src, "num_experts", "MoE layers need an MoE block"));
        }
        Ok(())
    }
}

fn check_attention(src: &str, attention: &Attention) -> Result<()> {
    match attention {
        Attention::Gqa { num_heads, num_kv_heads, head_dim, .. } => {
            limits::count(src, "num_attention_heads", *num_heads, 1, limits::MAX_HEADS)?;
            limits::count(src, "head_dim", *head_dim, 1, limits::MAX_WIDTH)?;
            if *num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
                return Err(Error::invalid(
                    src,
                    "num_key_value_heads",
                    format!("{num_kv_heads} must be > 0 and divide num_attention_heads = {num_heads}"),
                ));
            }
        }
        Attention::Mla { num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            limits::count(src, "num_attention_heads", *num_heads, 1, limits::MAX_HEADS)?;
            limits::count(src, "kv_lora_rank", *kv_lora_rank, 1, limits::MAX_WIDTH)?;
            limits::count(src, "qk_nope_head_dim", *qk_nope_head_dim, 0, limits::MAX_WIDTH)?;
            limits::count(src, "qk_rope_head_dim", *qk_rope_head_dim, 0, limits::MAX_WIDTH)?;
            limits::count(src, "v_head_dim", *v_head_dim, 1, limits::MAX_WIDTH)?;
            if let Some(r) = q_lora_rank {
                limits::count(src, "q_lora_rank", *r, 1, limits::MAX_WIDTH)?;
            }
            if *qk_nope_head_dim + *qk_rope_head_dim == 0 {
                return Err(Error::invalid(src, "qk_nope_head_dim", "qk_nope_head_dim + qk_rope_head_dim must be > 0"));
            }
        }
    }
    Ok(())
}

/// The MoE block's counts, before the parameter bound is formed from them.
fn check_moe_sizes(src: &str, moe: &Moe) -> Result<()> {
    limits::count(src, "num_experts", moe.num_experts, 0, limits::MAX_EXPERTS)?;
    limits::count(src, "moe_intermediate_size", moe.expert.intermediate_size, 0, limits::MAX_FFN)?;
    limits::count(src, "n_shared_experts", moe.num_shared_experts, 0, limits::MAX_EXPERTS)?;
    if let Some(f) = moe.shared_expert_intermediate_size {
        limits::count(src, "shared_expert_intermediate_size", f, 0, limits::MAX_FFN)?;
    }
    if let Some(v) = moe.routed_scaling_factor {
        limits::positive(src, "routed_scaling_factor", v, 1e6)?;
    }
    if let Some(v) = moe.router_aux_loss_coef
        && !(v.is_finite() && (0.0..=1e3).contains(&v))
    {
        let why = format!("is {}; it must be a finite weight in [0, 1000]", limits::show(v));
        return Err(Error::invalid(src, "router_aux_loss_coef", why));
    }
    Ok(())
}

/// The MoE block's routing: experts, top-k and groups that can work together.
fn check_moe(src: &str, moe: &Moe) -> Result<()> {
    if moe.num_experts == 0 {
        return Err(Error::invalid(src, "num_experts", "must be > 0"));
    }
    if moe.top_k == 0 || moe.top_k > moe.num_experts {
        return Err(Error::invalid(
            src,
            "num_experts_per_tok",
            format!("top-k = {} must be in 1..={}", moe.top_k, moe.num_experts),
        ));
    }
    if moe.expert.intermediate_size == 0 {
        return Err(Error::invalid(src, "moe_intermediate_size", "expert width must be > 0"));
    }
    if let (Some(groups), Some(topk_group)) = (moe.n_group, moe.topk_group)
        && (groups == 0 || !moe.num_experts.is_multiple_of(groups) || topk_group == 0 || topk_group > groups)
    {
        return Err(Error::invalid(
            src,
            "n_group",
            format!(
                "n_group = {groups} must divide {} experts and topk_group = {topk_group} must be in 1..=n_group",
                moe.num_experts
            ),
        ));
    }
    Ok(())
}
