//! The parallel layout (PP × EP × DP), the training configuration, and a pipeline's stage split.
//!
//! Rank order: expert-parallel rank innermost, then data-parallel replica, then pipeline stage —
//! `rank = ep + EP·(dp + DP·stage)` — so an expert group is a block of consecutive ranks (inside one node
//! whenever EP divides the GPUs per node) and a stage is a block of EP·DP consecutive ranks.
//!
//! Every EP rank of a stage processes its own micro-batches: EP borrows from data parallelism for the
//! non-expert layers, as in Megatron-Core and DeepSpeed-MoE. The global batch is `mbs · M · EP · DP`
//! sequences; non-expert gradients are reduced over the EP·DP ranks of a stage, expert gradients over DP.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;
use crate::model::ModelSpec;

/// Degrees of pipeline, expert and data parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
}

impl Layout {
    pub fn gpus(&self) -> u64 {
        self.pp * self.ep * self.dp
    }

    /// Global rank of (stage, data-parallel replica, expert-parallel rank).
    pub fn rank(&self, stage: u64, dp: u64, ep: u64) -> u64 {
        ep + self.ep * (dp + self.dp * stage)
    }

    /// (stage, data-parallel replica, expert-parallel rank) of a global rank.
    pub fn coords(&self, rank: u64) -> (u64, u64, u64) {
        (rank / (self.ep * self.dp), (rank / self.ep) % self.dp, rank % self.ep)
    }

    /// Checks the layout against the model (and the GPU count if given); the error names the flag.
    pub fn validate(&self, spec: &ModelSpec, gpus: Option<u64>) -> Result<()> {
        let src = "layout";
        for (flag, v) in [("--pp", self.pp), ("--ep", self.ep), ("--dp", self.dp)] {
            limits::count(src, flag, v, 1, limits::MAX_GPUS)?;
        }
        limits::product(
            src,
            "--pp × --ep × --dp",
            &[("pp", self.pp), ("ep", self.ep), ("dp", self.dp)],
            limits::MAX_GPUS,
        )?;
        if let Some(g) = gpus
            && self.gpus() != g
        {
            return Err(Error::invalid(
                src,
                "--pp/--ep/--dp",
                format!(
                    "PP·EP·DP = {}·{}·{} = {} but {g} GPUs (ranks) are available; the product must equal it",
                    self.pp,
                    self.ep,
                    self.dp,
                    self.gpus()
                ),
            ));
        }
        if self.pp > spec.num_layers {
            return Err(Error::invalid(
                src,
                "--pp",
                format!(
                    "{} stages > {} layers of {}; use --pp ≤ {}",
                    self.pp, spec.num_layers, spec.name, spec.num_layers
                ),
            ));
        }
        let e = spec.num_experts();
        if self.ep > 1 && (e == 0 || !e.is_multiple_of(self.ep)) {
            return Err(Error::invalid(
                src,
                "--ep",
                format!(
                    "EP = {} must divide the {e} routed experts of {}; try one of {}",
                    self.ep,
                    spec.name,
                    divisors(e.max(1)).iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// Pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Schedule {
    #[serde(rename = "gpipe")]
    GPipe,
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl Schedule {
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        }
    }
}

/// Activation recomputation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    /// Keep every activation.
    None,
    /// Recompute the attention core and the MLP activation function (cheap element-wise work).
    Selective,
    /// Keep only each layer's input; recompute the layer (and its all-to-alls) in backward.
    Full,
}

impl Recompute {
    pub fn name(&self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// Everything about a training step other than the layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub seq_len: u64,
    /// Sequences per micro-batch per rank.
    pub micro_batch_size: u64,
    /// Micro-batches per step per pipeline, `M`.
    pub num_micro_batches: u64,
    pub schedule: Schedule,
    pub recompute: Recompute,
    /// Compute / activation dtype (`bf16`, `fp16`, `fp32`, `fp8`).
    pub dtype: String,
    /// Bytes per parameter for weights, gradients and optimizer states (default 2 + 2 + 12 = 16: bf16
    /// weight and grad, fp32 master weight and Adam m, v).
    pub weight_bytes: f64,
    pub grad_bytes: f64,
    pub optimizer_bytes: f64,
    /// Shard optimizer states over the data-parallel ranks that hold the same parameters (ZeRO-1).
    pub zero1: bool,
    /// Flash attention: no s² score matrix is stored.
    pub flash_attention: bool,
    /// The routed experts' backward recomputes their activation from the gate and up projections it
    /// keeps, instead of holding it (Piper's fused routed-experts op): `(m − 1)·f + d` per routed row,
    /// not `m·f + d`.
    #[serde(default)]
    pub expert_activation_recomputed: bool,
    /// Tokens on the busiest expert rank ÷ the mean (1 = perfectly balanced routing).
    pub expert_imbalance: f64,
    /// The shared experts' forward runs while the expert dispatch's rows travel (flat or pairwise
    /// all-to-all), hiding up to its compute of that exchange.
    #[serde(default)]
    pub shared_expert_overlap: bool,
}

impl TrainConfig {
    /// Defaults for a sequence length: 1 sequence per micro-batch, 1F1B, no recompute, bf16, flash.
    pub fn new(seq_len: u64) -> Self {
        TrainConfig {
            seq_len,
            micro_batch_size: 1,
            num_micro_batches: 1,
            schedule: Schedule::OneFOneB,
            recompute: Recompute::None,
            dtype: "bf16".into(),
            weight_bytes: 2.0,
            grad_bytes: 2.0,
            optimizer_bytes: 12.0,
            zero1: false,
            flash_attention: true,
            expert_activation_recomputed: false,
            expert_imbalance: 1.0,
            shared_expert_overlap: false,
        }
    }

    /// Bytes of one activation element.
    pub fn elem_bytes(&self) -> Result<f64> {
        match self.dtype.as_str() {
            "bf16" | "fp16" => Ok(2.0),
            "fp32" => Ok(4.0),
            "fp8" => Ok(1.0),
            other => Err(Error::invalid(
                "training config",
                "--dtype",
                format!("`{other}` is not one of bf16, fp16, fp32, fp8"),
            )),
        }
    }

    /// Tokens one rank processes per micro-batch.
    pub fn tokens_per_micro_batch(&self) -> u64 {
        self.micro_batch_size * self.seq_len
    }

    /// Sequences per optimizer step across all ranks.
    pub fn global_batch(&self, layout: &Layout) -> u64 {
        self.micro_batch_size * self.num_micro_batches * layout.ep * layout.dp
    }

    pub fn validate(&self) -> Result<()> {
        let src = "training config";
        limits::count(src, "--seq-len", self.seq_len, 1, limits::MAX_SEQ_LEN)?;
        limits::count(src, "--micro-batch-size", self.micro_batch_size, 1, limits::MAX_BATCH)?;
        limits::count(src, "--num-micro-batches", self.num_micro_batches, 1, limits::MAX_BATCH)?;
        // max/mean tokens per expert rank: ≥ 1 by definition (and ≤ the expert-parallel degree).
        limits::number(src, "--expert-imbalance", self.expert_imbalance, 1.0, limits::MAX_EXPERTS as f64)?;
        for (flag, v) in [
            ("--weight-bytes", self.weight_bytes),
            ("--grad-bytes", self.grad_bytes),
            ("--optimizer-bytes", self.optimizer_bytes),
        ] {
            limits::number(src, flag, v, 0.0, limits::MAX_BYTES_PER_PARAM)?;
        }
        self.elem_bytes().map(|_| ())
    }

    /// [`TrainConfig::validate`], and the tokens of one step under `layout` (micro-batch size × micro-batches
    /// × EP × DP × sequence length) within [`limits::MAX_STEP_TOKENS`], its schedule's stage ×
    /// micro-batch pairs within [`limits::MAX_PIPELINE_PAIRS`].
    pub fn validate_for(&self, layout: &Layout) -> Result<()> {
        self.validate()?;
        pipeline_pairs(layout.pp, self.num_micro_batches)?;
        let factors = [
            ("micro-batch size", self.micro_batch_size),
            ("micro-batches", self.num_micro_batches),
            ("ep", layout.ep),
            ("dp", layout.dp),
            ("seq-len", self.seq_len),
        ];
        limits::product("training config", "tokens per step", &factors, limits::MAX_STEP_TOKENS).map(|_| ())
    }
}

/// The stage × micro-batch pairs of a schedule of `pp` stages and `m` micro-batches, refused past
/// [`limits::MAX_PIPELINE_PAIRS`] before anything lists them.
pub fn pipeline_pairs(pp: u64, m: u64) -> Result<u64> {
    match pp.checked_mul(m).filter(|p| *p <= limits::MAX_PIPELINE_PAIRS) {
        Some(p) => Ok(p),
        None => Err(Error::invalid(
            "training config",
            "--num-micro-batches",
            format!(
                "is {m} on {pp} stages: {} stage·micro-batch pairs, more than a schedule lists ({}); use fewer, \
                 larger micro-batches",
                (pp as u128) * (m as u128),
                limits::MAX_PIPELINE_PAIRS
            ),
        )),
    }
}

/// Layers per pipeline stage, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSplit(pub Vec<u64>);

impl StageSplit {
    /// `L / PP` layers per stage; the remainder goes to the last stages (stage 0 holds the most
    /// in-flight activations under 1F1B).
    pub fn even(num_layers: u64, pp: u64) -> Self {
        let (base, extra) = (num_layers / pp, num_layers % pp);
        StageSplit((0..pp).map(|s| base + u64::from(s >= pp - extra)).collect())
    }

    /// Parses `--split 15,16,16,14` and checks it against the model and PP.
    pub fn parse(text: &str, num_layers: u64, pp: u64) -> Result<Self> {
        let parts: std::result::Result<Vec<u64>, _> = text.split(',').map(|p| p.trim().parse::<u64>()).collect();
        let split = StageSplit(parts.map_err(|_| {
            Error::invalid(
                "layout",
                "--split",
                format!("`{text}` must be comma-separated layer counts, e.g. 15,16,16,14"),
            )
        })?);
        split.validate(num_layers, pp)?;
        Ok(split)
    }

    pub fn validate(&self, num_layers: u64, pp: u64) -> Result<()> {
        if self.0.len() as u64 != pp || self.0.contains(&0) || self.0.iter().sum::<u64>() != num_layers {
            return Err(Error::invalid(
                "layout",
                "--split",
                format!("{:?} must give each of the {pp} stages ≥ 1 layer and sum to {num_layers} layers", self.0),
            ));
        }
        Ok(())
    }

    /// Index of the first layer of each stage.
    pub fn starts(&self) -> Vec<u64> {
        self.0
            .iter()
            .scan(0, |acc, n| {
                let start = *acc;
                *acc += n;
                Some(start)
            })
            .collect()
    }
}

/// Divisors of `n`, increasing (trial division up to √n).
pub fn divisors(n: u64) -> Vec<u64> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1u64;
    while d.checked_mul(d).is_some_and(|dd| dd <= n) {
        if n.is_multiple_of(d) {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// The dtype Piper's runtime trains in.
pub const RUNTIME_DTYPE: &str = "fp32";
/// Piper's runtime runs flash attention on every backend: its fused causal attention keeps each row's
/// log-sum-exp for the backward, not the `s × s` scores (`kernels_cubecl::causal_attention`).
pub const RUNTIME_FLASH_ATTENTION: bool = true;
/// Piper's runtime computes the shared experts while the expert dispatch's rows travel
/// (`MoeBlock::forward`, the flat and pairwise all-to-alls; `--overlap off` turns it off).
pub const RUNTIME_SHARED_EXPERT_OVERLAP: bool = true;
/// Piper's routed experts recompute their activation in the backward: `kernels_cubecl::routed_experts`
/// keeps the gate and up projections and its output rows.
pub const RUNTIME_EXPERT_ACTIVATION_RECOMPUTED: bool = true;

/// How Piper's runtime (piper-burn) trains, as the planner prices it — the one definition runtime plans,
/// calibration's memory fit and calibrated platforms share: [`RUNTIME_DTYPE`] weights, gradients and
/// AdamW moments (4 + 4 + 8 bytes per parameter), [`RUNTIME_FLASH_ATTENTION`],
/// [`RUNTIME_EXPERT_ACTIVATION_RECOMPUTED`] and [`RUNTIME_SHARED_EXPERT_OVERLAP`], with the run's shape, schedule and recompute mode.
pub fn runtime_train_config(
    seq_len: u64,
    micro_batch_size: u64,
    num_micro_batches: u64,
    schedule: Schedule,
    recompute: Recompute,
) -> TrainConfig {
    TrainConfig {
        micro_batch_size,
        num_micro_batches,
        schedule,
        recompute,
        dtype: RUNTIME_DTYPE.into(),
        weight_bytes: 4.0,
        grad_bytes: 4.0,
        optimizer_bytes: 8.0,
        flash_attention: RUNTIME_FLASH_ATTENTION,
        expert_activation_recomputed: RUNTIME_EXPERT_ACTIVATION_RECOMPUTED,
        shared_expert_overlap: RUNTIME_SHARED_EXPERT_OVERLAP,
        ..TrainConfig::new(seq_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset;

    #[test]
    fn ranks_and_coords_are_inverse() {
        let l = Layout { pp: 3, ep: 4, dp: 2 };
        for r in 0..l.gpus() {
            let (s, d, e) = l.coords(r);
            assert_eq!(l.rank(s, d, e), r);
        }
        assert_eq!(l.rank(0, 0, 3), 3); // expert group = consecutive ranks
        assert_eq!(l.rank(1, 0, 0), 8); // a stage = EP·DP consecutive ranks
    }

    #[test]
    fn divisors_match_trial_division_of_every_number() {
        for n in 1..=400u64 {
            let naive: Vec<u64> = (1..=n).filter(|d| n % d == 0).collect();
            assert_eq!(divisors(n), naive, "{n}");
        }
        assert_eq!(divisors(1 << 40).len(), 41);
    }

    #[test]
    fn even_split_puts_the_remainder_last() {
        assert_eq!(StageSplit::even(61, 4).0, vec![15, 15, 15, 16]);
        assert_eq!(StageSplit::even(32, 4).0, vec![8; 4]);
        assert_eq!(StageSplit::even(61, 4).starts(), vec![0, 15, 30, 45]);
    }

    #[test]
    fn bad_layouts_name_the_flag() {
        let spec = preset("mixtral-8x7b").unwrap();
        let err = Layout { pp: 1, ep: 3, dp: 1 }.validate(&spec, None).unwrap_err().to_string();
        assert!(err.contains("`--ep` EP = 3 must divide the 8 routed experts") && err.contains("1, 2, 4, 8"), "{err}");
        let err = Layout { pp: 33, ep: 1, dp: 1 }.validate(&spec, None).unwrap_err().to_string();
        assert!(err.contains("`--pp` 33 stages > 32 layers"), "{err}");
        let err = Layout { pp: 2, ep: 2, dp: 1 }.validate(&spec, Some(8)).unwrap_err().to_string();
        assert!(err.contains("= 4 but 8 GPUs"), "{err}");
        let err = Layout { pp: 0, ep: 1, dp: 1 }.validate(&spec, None).unwrap_err().to_string();
        assert!(err.contains("`--pp` is 0; it must be in 1..="), "{err}");
        let err = StageSplit::parse("10,10", 32, 2).unwrap_err().to_string();
        assert!(err.contains("sum to 32"), "{err}");
    }
}
