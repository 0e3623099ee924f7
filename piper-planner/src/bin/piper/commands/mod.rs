//! Subcommands and the arguments they share.

pub mod calibrate;
pub mod checkpoint;
pub mod data;
pub mod memory;
pub mod migrate;
pub mod model;
pub mod paper;
pub mod plan;
pub mod plot;
pub mod predict;
pub mod tokenizer;
pub mod trace;
pub mod validate;

use clap::ValueEnum;
use piper_planner::Result;
use piper_planner::comm::A2aAlgo;
use piper_planner::layout::{Layout, Recompute, Schedule, StageSplit, TrainConfig};
use piper_planner::model::{ModelSpec, resolve_model};
use piper_planner::platform::{Platform, resolve_platform};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ScheduleArg {
    Gpipe,
    #[value(name = "1f1b")]
    OneFOneB,
}

impl From<ScheduleArg> for Schedule {
    fn from(s: ScheduleArg) -> Self {
        match s {
            ScheduleArg::Gpipe => Schedule::GPipe,
            ScheduleArg::OneFOneB => Schedule::OneFOneB,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RecomputeArg {
    None,
    Selective,
    Full,
}

impl From<RecomputeArg> for Recompute {
    fn from(r: RecomputeArg) -> Self {
        match r {
            RecomputeArg::None => Recompute::None,
            RecomputeArg::Selective => Recompute::Selective,
            RecomputeArg::Full => Recompute::Full,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AlgoArg {
    Flat,
    Pairwise,
    Halo,
}

impl From<AlgoArg> for A2aAlgo {
    fn from(a: AlgoArg) -> Self {
        match a {
            AlgoArg::Flat => A2aAlgo::Flat,
            AlgoArg::Pairwise => A2aAlgo::Pairwise,
            AlgoArg::Halo => A2aAlgo::Halo,
        }
    }
}

/// Training settings shared by `memory` and `plan`.
#[derive(clap::Args, Clone)]
pub struct TrainArgs {
    /// Tokens per sequence.
    #[arg(long, default_value_t = 4096)]
    pub seq_len: u64,
    /// Compute and activation dtype (its peak must be in the platform's [peak_tflops]); default: the
    /// dtype the platform's runtime trains in (`train_dtype`; fp32 on `local`), else bf16.
    #[arg(long, value_parser = ["bf16", "fp16", "fp32", "fp8"])]
    pub dtype: Option<String>,
    /// Bytes per parameter: weights (default: 4 in fp32, else 2).
    #[arg(long)]
    pub weight_bytes: Option<f64>,
    /// Bytes per parameter: gradients (default: 4 in fp32, else 2).
    #[arg(long)]
    pub grad_bytes: Option<f64>,
    /// Bytes per parameter: optimizer states (default: Adam m and v = 8 in fp32; with an fp32 master
    /// weight, 12, otherwise).
    #[arg(long)]
    pub optimizer_bytes: Option<f64>,
    /// Shard optimizer states over data-parallel copies (ZeRO-1).
    #[arg(long)]
    pub zero1: bool,
    /// Attention without flash attention: the s² score matrix is stored (the default on a platform
    /// whose runtime has none, `flash_attention = false`; Piper's runtime keeps only each row's
    /// log-sum-exp on every backend).
    #[arg(long)]
    pub no_flash_attention: bool,
    /// Tokens on the busiest expert rank ÷ mean (1 = balanced routing).
    #[arg(long, default_value_t = 1.0)]
    pub expert_imbalance: f64,
}

impl TrainArgs {
    /// The settings on `platform`: the dtype defaults to the one its runtime trains in (and attention to
    /// its runtime's kind), the bytes per
    /// parameter to that dtype's (fp32: 4 + 4 + 8 for AdamW; lower precisions: 2 + 2 + 12 with an fp32
    /// master weight).
    pub fn config(&self, platform: &Platform) -> TrainConfig {
        let dtype = self.dtype.clone().or_else(|| platform.train_dtype.clone()).unwrap_or_else(|| "bf16".into());
        let (weight, grad, optimizer) = if dtype == "fp32" { (4.0, 4.0, 8.0) } else { (2.0, 2.0, 12.0) };
        TrainConfig {
            dtype,
            weight_bytes: self.weight_bytes.unwrap_or(weight),
            grad_bytes: self.grad_bytes.unwrap_or(grad),
            optimizer_bytes: self.optimizer_bytes.unwrap_or(optimizer),
            zero1: self.zero1,
            flash_attention: !self.no_flash_attention && platform.flash_attention.unwrap_or(true),
            expert_activation_recomputed: platform.expert_activation_recomputed.unwrap_or(false),
            shared_expert_overlap: platform.shared_expert_overlap.unwrap_or(false),
            expert_imbalance: self.expert_imbalance,
            ..TrainConfig::new(self.seq_len)
        }
    }
}

/// One layout of one model on one platform: what `memory` and `predict` take.
#[derive(clap::Args, Clone)]
pub struct OneLayout {
    /// Model: preset name or file (HF config.json or native spec).
    #[arg(long)]
    model: String,
    /// Platform: preset (frontier, nvlink-8, local) or TOML file.
    #[arg(long, default_value = "frontier")]
    platform: String,
    /// Pipeline stages.
    #[arg(long, default_value_t = 1)]
    pp: u64,
    /// Expert-parallel ranks per expert group (must divide the routed experts).
    #[arg(long, default_value_t = 1)]
    ep: u64,
    /// Data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    dp: u64,
    /// Sequences per micro-batch per rank.
    #[arg(long, default_value_t = 1)]
    micro_batch_size: u64,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    num_micro_batches: u64,
    #[arg(long, value_enum, default_value_t = ScheduleArg::OneFOneB)]
    schedule: ScheduleArg,
    #[arg(long, value_enum, default_value_t = RecomputeArg::None)]
    recompute: RecomputeArg,
    /// Layers per stage, e.g. 15,16,16,14 (default: even, remainder on the last stages).
    #[arg(long)]
    split: Option<String>,
    #[command(flatten)]
    train: TrainArgs,
}

/// A [`OneLayout`], resolved and checked.
pub struct Resolved {
    pub spec: ModelSpec,
    pub platform: Platform,
    pub layout: Layout,
    pub cfg: TrainConfig,
    pub split: StageSplit,
}

impl Resolved {
    /// `MODEL on PLATFORM: PP=… EP=… DP=…, micro-batch B×S tokens, M=…, SCHEDULE, recompute R`.
    pub fn headline(&self) -> String {
        let (l, c) = (&self.layout, &self.cfg);
        format!(
            "{} on {}: PP={} EP={} DP={}, micro-batch {}×{} tokens, M={}, {}, recompute {}",
            self.spec.name,
            self.platform.name,
            l.pp,
            l.ep,
            l.dp,
            c.micro_batch_size,
            c.seq_len,
            c.num_micro_batches,
            c.schedule.name(),
            c.recompute.name()
        )
    }
}

impl OneLayout {
    pub fn resolve(&self) -> Result<Resolved> {
        let spec = resolve_model(&self.model)?;
        let platform = resolve_platform(&self.platform)?;
        let layout = Layout { pp: self.pp, ep: self.ep, dp: self.dp };
        layout.validate(&spec, None)?;
        let cfg = TrainConfig {
            micro_batch_size: self.micro_batch_size,
            num_micro_batches: self.num_micro_batches,
            schedule: self.schedule.into(),
            recompute: self.recompute.into(),
            ..self.train.config(&platform)
        };
        cfg.validate_for(&layout)?;
        let split = match &self.split {
            Some(s) => StageSplit::parse(s, spec.num_layers, self.pp)?,
            None => StageSplit::even(spec.num_layers, self.pp),
        };
        Ok(Resolved { spec, platform, layout, cfg, split })
    }
}
