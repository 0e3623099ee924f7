//! Train a model Piper does not define on Piper's planned runtime.
//!
//! `Sandwich` is an author's own MoE model: Burn's multi-head attention with a causal mask, LayerNorm
//! (not RMSNorm) before each sublayer and after the embedding, Piper's `MoeBlock` for the experts, and an
//! untied linear head with Burn's cross-entropy. It implements [`StageModel`] (what one pipeline stage
//! computes) and [`StageModelConfig`] (which stage a rank draws); the runtime does the rest.
//!
//! `cargo run --release --example custom_model` trains it on one process; built with `--features mpi`,
//! `mpirun -np 4 target/release/examples/custom_model --pp 2 --ep 2` trains the same model as two
//! pipeline stages of two expert-parallel ranks each, with the same losses.
//!
//! Legend: b = sequences, s = sequence length, d = model width, v = vocabulary.

// Burn's derives name `burn::…`: a crate without its own `burn` dependency brings Piper's into scope.
use clap::Parser;
use piper::burn;
use piper::burn::nn::attention::{
    MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, generate_autoregressive_mask,
};
use piper::burn::nn::loss::CrossEntropyLossConfig;
use piper::burn::nn::{Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use piper::burn::prelude::*;
use piper::comm::launch::init_world;
use piper::modules::corpus::Grammar;
use piper::modules::layers::init::draw_now;
use piper::modules::moe::router::RouterConfig;
use piper::modules::{MoeBlock, MoeBlockConfig, MoeStats, StageModel, StageModelConfig, StagePart};
use piper::planner::layout::Layout;
use piper::planner::model::ModelSpec;
use piper::runtime::checkpoint::CheckpointSettings;
use piper::runtime::{self, Job, LayoutFlags, RunConfig, RunSummary};

#[derive(Config, Debug)]
pub struct SandwichConfig {
    #[config(default = 32)]
    pub vocab_size: usize,
    #[config(default = 64)]
    pub d_model: usize,
    #[config(default = 4)]
    pub num_layers: usize,
    #[config(default = 4)]
    pub num_heads: usize,
    #[config(default = 8)]
    pub num_experts: usize,
    #[config(default = 2)]
    pub top_k: usize,
    #[config(default = 96)]
    pub expert_ffn: usize,
}

#[derive(Module, Debug)]
pub struct SandwichLayer {
    attention_norm: LayerNorm,
    attention: MultiHeadAttention,
    moe_norm: LayerNorm,
    moe: MoeBlock,
}

/// One pipeline stage of the model: the embedding on the first stage, the head on the last.
#[derive(Module, Debug)]
pub struct Sandwich {
    embed: Option<Embedding>,
    embed_norm: Option<LayerNorm>,
    layers: Vec<SandwichLayer>,
    norm: Option<LayerNorm>,
    head: Option<Linear>,
}

impl SandwichConfig {
    /// The same model as the planner sees it (it prices a Mixtral-style layer of these sizes).
    pub fn spec(&self) -> Result<ModelSpec, piper::planner::error::Error> {
        let (heads, experts) = (self.num_heads as u64, self.num_experts as u64);
        ModelSpec::mixtral("sandwich")
            .hidden_size(self.d_model as u64)
            .layers(self.num_layers as u64)
            .heads(heads, heads)
            .vocab_size(self.vocab_size as u64)
            .experts(experts, self.top_k as u64)
            .expert_ffn(self.expert_ffn as u64)
            .build()
    }

    fn layer(&self, device: &Device) -> SandwichLayer {
        let d = self.d_model;
        let router = RouterConfig::new(d, self.num_experts, self.top_k);
        SandwichLayer {
            attention_norm: LayerNormConfig::new(d).init(device),
            attention: MultiHeadAttentionConfig::new(d, self.num_heads).with_dropout(0.0).init(device),
            moe_norm: LayerNormConfig::new(d).init(device),
            moe: MoeBlockConfig::new(router, self.expert_ffn).init(device),
        }
    }
}

impl StageModelConfig for SandwichConfig {
    type Model = Sandwich;

    fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Draws the whole model in one order on every rank and keeps the stage's part.
    fn init_stage(&self, part: &StagePart<'_>, device: &Device) -> Sandwich {
        let small = Initializer::Normal { mean: 0.0, std: 0.02 };
        let embed = EmbeddingConfig::new(self.vocab_size, self.d_model).with_initializer(small.clone()).init(device);
        let embed_norm = LayerNormConfig::new(self.d_model).init(device);
        draw_now(&embed);
        draw_now(&embed_norm);
        let mut layers = Vec::new();
        for i in 0..self.num_layers {
            let mut layer = self.layer(device);
            draw_now(&layer);
            if part.holds(i) {
                layer.moe = part.place_experts(i, layer.moe);
                layers.push(layer);
            }
        }
        let norm = LayerNormConfig::new(self.d_model).init(device);
        let head = LinearConfig::new(self.d_model, self.vocab_size).with_initializer(small).init(device);
        draw_now(&norm);
        draw_now(&head);
        Sandwich {
            embed: part.is_first.then_some(embed),
            embed_norm: part.is_first.then_some(embed_norm),
            layers,
            norm: part.is_last.then_some(norm),
            head: part.is_last.then_some(head),
        }
    }
}

impl Sandwich {
    /// Last stage: `x_bsd` `[b, s, d]` → logits `[b, s, v]`.
    fn logits(&self, x_bsd: Tensor<3>) -> Tensor<3> {
        let (norm, head) = self.norm.as_ref().zip(self.head.as_ref()).expect("the last stage holds the head");
        head.forward(norm.forward(x_bsd))
    }
}

impl StageModel for Sandwich {
    const EMBEDDING_FIELDS: &'static [&'static str] = &["embed", "embed_norm"];

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn embed_tokens(&self, ids_bs: Tensor<2, Int>) -> Tensor<3> {
        let (embed, norm) = (self.embed.as_ref(), self.embed_norm.as_ref());
        let (embed, norm) = embed.zip(norm).expect("the runtime embeds on the first stage only");
        norm.forward(embed.forward(ids_bs))
    }

    fn layer_forward(&self, l: usize, x_bsd: Tensor<3>) -> (Tensor<3>, Option<MoeStats>) {
        let layer = &self.layers[l];
        let [b, s, _] = x_bsd.dims();
        let causal = generate_autoregressive_mask(b, s, &x_bsd.device());
        let input = MhaInput::self_attn(layer.attention_norm.forward(x_bsd.clone())).mask_attn(causal);
        let h_bsd = x_bsd + layer.attention.forward(input).context;
        let (y_bsd, stats) = layer.moe.forward(layer.moe_norm.forward(h_bsd.clone()));
        (h_bsd + y_bsd, Some(stats))
    }

    fn head_loss(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Tensor<1> {
        let logits_bsv = self.logits(x_bsd);
        let [b, s, v] = logits_bsv.dims();
        let loss = CrossEntropyLossConfig::new().init(&logits_bsv.device());
        loss.forward(logits_bsv.reshape([b * s, v]), targets_bs.reshape([b * s]))
    }

    /// Held out, beside the loss: the share of next tokens the model ranks first.
    const EVAL_METRICS: &'static [&'static str] = &["accuracy"];

    fn eval_metrics(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Vec<(f64, f64)> {
        let [b, s] = targets_bs.dims();
        let predicted_bs1 = self.logits(x_bsd).argmax(2);
        let right = predicted_bs1.equal(targets_bs.unsqueeze_dim::<3>(2)).int().sum().into_scalar::<i64>() as f64;
        vec![(right, (b * s) as f64)]
    }

    fn moe_blocks(&self) -> Vec<&MoeBlock> {
        self.layers.iter().map(|l| &l.moe).collect()
    }

    fn moe_blocks_mut(&mut self) -> Vec<&mut MoeBlock> {
        self.layers.iter_mut().map(|l| &mut l.moe).collect()
    }
}

/// Train the Sandwich model, on one process or under mpirun.
#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[arg(long, default_value_t = 1)]
    pp: u64,
    #[arg(long, default_value_t = 1)]
    ep: u64,
    #[arg(long, default_value_t = 1)]
    micro_batches: usize,
    /// Save checkpoints under this folder (after the last step, and every `--save-every` steps).
    #[arg(long)]
    checkpoint_dir: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 0)]
    save_every: usize,
    /// Continue from a checkpoint (a folder, or the latest under a checkpoint dir).
    #[arg(long)]
    resume: Option<std::path::PathBuf>,
    /// One JSON line per step (rank 0).
    #[arg(long)]
    metrics: Option<std::path::PathBuf>,
    /// Held-out loss and accuracy every N steps (0: never).
    #[arg(long, default_value_t = 0)]
    eval_every: usize,
    /// The run's summary (JSON, rank 0), read back once written.
    #[arg(long)]
    summary: Option<std::path::PathBuf>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let world = init_world()?;
    let config = SandwichConfig::new();
    let run = RunConfig::new().with_steps(args.steps).with_global_batch(8).with_seq_len(31).with_lr(3e-3);
    let run = run.with_eval_every(args.eval_every).with_eval_tokens(256);
    let layout = LayoutFlags {
        layout: Layout { pp: args.pp, ep: args.ep, dp: 1 },
        micro_batches: args.micro_batches,
        ..LayoutFlags::single()
    };
    let checkpoints =
        CheckpointSettings { dir: args.checkpoint_dir, save_every: args.save_every, ..CheckpointSettings::default() };
    let mut job = Job::builder(config.spec()?, world.comm.as_ref()).run(run).layout(layout).checkpoints(checkpoints);
    if let Some(path) = &args.resume {
        job = job.resume(path);
    }
    let job = job.build()?;
    let mut data = Grammar::new(config.vocab_size, 3, 9);
    let mut lines = Vec::new();
    let trained = runtime::execute_model(&job, &config, &mut data, |m| {
        lines.push(serde_json::to_string(m).expect("metrics serialize"));
        if job.world.rank() == 0 {
            println!("step {:>3}  loss {:.5}", m.step, m.loss);
            if let (Some(loss), Some(accuracy)) = (m.eval_loss, m.eval_metrics.get("accuracy")) {
                println!("step {:>3}  held-out loss {loss:.5}  accuracy {accuracy:.4}", m.step);
            }
        }
    })?;
    if let (Some(path), 0) = (&args.metrics, job.world.rank()) {
        std::fs::write(path, lines.join("\n") + "\n")?;
    }
    let summary = trained.summary(&job.plan, job.flops_per_token);
    if job.world.rank() != 0 {
        return Ok(());
    }
    println!("final loss {:.4} ({} layers on this rank)", summary.final_loss, trained.model.num_layers());
    if let Some(path) = &args.summary {
        summary.write(path)?;
        let back = RunSummary::read(path)?;
        println!(
            "summary read back: {} steps, final loss {:.5}, held-out {:?}",
            back.steps, back.final_loss, back.eval_metrics
        );
    }
    Ok(())
}
