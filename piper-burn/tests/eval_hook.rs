//! The evaluation hook: a model's own held-out metrics (`StageModel::EVAL_METRICS`, `eval_metrics`) are
//! summed over the micro-batches, the last stage and the data-parallel replicas like the held-out loss.
//! `Metered` is the library's language model with two metrics of its own, checked against what is
//! computed outside the runtime: the held-out targets' mean token id (a closed form of the data alone)
//! and the trained model's next-token accuracy (its logits' argmax counted on the host).
//!
//! Legend: b = sequences, s = sequence length, d = model width, v = vocabulary.

use burn::prelude::*;
use piper_burn::corpus::{Corpus as _, Grammar};
use piper_burn::hf::state_dict::Entry;
use piper_burn::runtime::{self, Job, LayoutFlags, RunConfig, StepMetrics};
use piper_burn::{CausalLm, CausalLmConfig, MoeBlock, MoeStats, StageModel, StageModelConfig, StagePart};
use piper_comm::{Communicator, LocalComm, LocalWorld};
use piper_planner::layout::Layout;
use piper_planner::model::{ModelSpec, preset};
use piper_test_support::assert_close;

#[derive(Config, Debug)]
struct MeteredConfig {
    lm: CausalLmConfig,
}

#[derive(Module, Debug)]
struct Metered {
    lm: CausalLm,
}

impl StageModelConfig for MeteredConfig {
    type Model = Metered;

    fn num_layers(&self) -> usize {
        StageModelConfig::num_layers(&self.lm)
    }

    fn init_stage(&self, part: &StagePart<'_>, device: &Device) -> Metered {
        Metered { lm: self.lm.init_stage(part, device) }
    }
}

impl StageModel for Metered {
    const EVAL_METRICS: &'static [&'static str] = &["target_mean", "accuracy"];

    fn eval_metrics(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Vec<(f64, f64)> {
        let tokens = targets_bs.dims().iter().product::<usize>() as f64;
        let target_sum = targets_bs.clone().float().sum().into_scalar::<f64>();
        let predicted_bs1 = self.lm.head(x_bsd).argmax(2);
        let right = predicted_bs1.equal(targets_bs.unsqueeze_dim::<3>(2)).int().sum().into_scalar::<i64>() as f64;
        vec![(target_sum, tokens), (right, tokens)]
    }

    fn num_layers(&self) -> usize {
        StageModel::num_layers(&self.lm)
    }

    fn embed_tokens(&self, ids_bs: Tensor<2, Int>) -> Tensor<3> {
        self.lm.embed_tokens(ids_bs)
    }

    fn layer_forward(&self, l: usize, x_bsd: Tensor<3>) -> (Tensor<3>, Option<MoeStats>) {
        self.lm.layer_forward(l, x_bsd)
    }

    fn head_loss(&self, x_bsd: Tensor<3>, targets_bs: Tensor<2, Int>) -> Tensor<1> {
        self.lm.head_loss(x_bsd, targets_bs)
    }

    fn moe_blocks(&self) -> Vec<&MoeBlock> {
        self.lm.moe_blocks()
    }

    fn moe_blocks_mut(&mut self) -> Vec<&mut MoeBlock> {
        self.lm.moe_blocks_mut()
    }

    fn state_entries(&self, spec: &ModelSpec, first: usize, experts_of: &dyn Fn(usize) -> Vec<usize>) -> Vec<Entry> {
        self.lm.state_entries(spec, first, experts_of)
    }
}

fn run() -> RunConfig {
    let run = RunConfig::new().with_steps(16).with_global_batch(8).with_seq_len(15).with_lr(2e-2).with_seed(5);
    run.with_eval_every(8).with_eval_tokens(200)
}

/// `Metered` trained on this rank with `layout` and `m` micro-batches.
fn train(world: &dyn Communicator, layout: Layout, m: usize) -> runtime::Trained<Metered> {
    let spec = preset("tiny").unwrap();
    let flags = LayoutFlags { layout, micro_batches: m, ..LayoutFlags::single() };
    let job = Job::builder(spec.clone(), world)
        .run(run())
        .layout(flags)
        .platform(piper_planner::platform::preset("local").unwrap())
        .peak_flops(1.0)
        .build()
        .unwrap();
    let config = MeteredConfig::new(CausalLmConfig::from_spec(&spec).unwrap());
    runtime::execute_model(&job, &config, &mut Grammar::new(32, 3, 9), |_| {}).unwrap()
}

/// (step, metric) of every evaluation.
fn evaluations(metrics: &[StepMetrics], name: &str) -> Vec<(usize, f64)> {
    metrics.iter().filter_map(|m| m.eval_metrics.get(name).map(|v| (m.step, *v))).collect()
}

#[test]
fn the_models_own_metrics_are_summed_like_the_held_out_loss() {
    let mut grammar = Grammar::new(32, 3, 9);
    grammar.hold_out(run().eval_sequences(), 16).unwrap();
    let rows = grammar.held_out().to_vec();
    let targets: Vec<i64> = rows.chunks(16).flat_map(|r| r[1..].to_vec()).collect();
    let target_mean = targets.iter().sum::<i64>() as f64 / targets.len() as f64;

    // Two micro-batches, as each replica of the layout below has (they change the load-balancing loss).
    let single = train(&LocalComm::single(), Layout { pp: 1, ep: 1, dp: 1 }, 2);
    assert_eq!(evaluations(&single.metrics, "target_mean"), vec![(8, target_mean), (16, target_mean)]);

    let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(rows, [targets.len() / 15, 16]), &Device::flex());
    let lm = &single.model.lm;
    let (h_bsd, _) = lm.forward_layers(lm.embed_tokens(ids_bs.narrow(1, 0, 15)), 0..lm.layers.len());
    let logits_bsv = lm.head(h_bsd);
    let v = logits_bsv.dims()[2];
    let logits = logits_bsv.into_data().try_to_vec::<f32>().unwrap();
    let right = logits.chunks(v).zip(&targets).filter(|(row, t)| argmax(row) == **t as usize).count();
    let accuracy = evaluations(&single.metrics, "accuracy");
    assert_close("accuracy after the last step", &[accuracy[1].1], &[right as f64 / targets.len() as f64], 1e-6);

    // Two stages of two micro-batches, two replicas: the sums cross the pipeline and the replicas.
    let layout = Layout { pp: 2, ep: 1, dp: 2 };
    let ranks = LocalWorld::run(4, |c| train(&c, layout, 2).metrics);
    for metrics in &ranks {
        assert_eq!(evaluations(metrics, "target_mean"), vec![(8, target_mean), (16, target_mean)]);
        // Training equals one process to ~1e-4; an argmax may flip for a token or two of the 240.
        assert_eq!(evaluations(metrics, "accuracy").len(), accuracy.len());
        for ((_, a), (_, b)) in evaluations(metrics, "accuracy").iter().zip(&accuracy) {
            assert!((a - b).abs() <= 2.0 / targets.len() as f64 + 1e-9, "PP=2 × DP=2 accuracy {a} vs {b}");
            eprintln!("held-out accuracy: PP=2 × DP=2 {a}, one process {b}");
        }
    }
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        assert!(v.is_finite(), "a logit is {v}");
        if *v > row[best] {
            best = i;
        }
    }
    best
}
