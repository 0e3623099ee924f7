//! Expert and data parallelism equal one process: the same seed, weights and data give the same loss
//! curve on 4 in-process ranks (EP=4, EP=2×DP=2, DP=4) as on one rank, to 1e-4 relative per step.
//! (The multi-process version of this test runs `mixtral_train` under mpirun: tests/parallel_mpirun.rs
//! at the workspace root.)

use burn::prelude::*;
use piper_burn::CausalLmConfig;
use piper_burn::attention::AttentionConfig;
use piper_burn::corpus::Grammar;
use piper_burn::decoder::DecoderLayerConfig;
use piper_burn::moe::MoeBlockConfig;
use piper_burn::parallel::train::{Layout, train_parallel};
use piper_burn::router::RouterConfig;
use piper_burn::train::TrainConfig;
use piper_comm::alltoall::Algo;
use piper_comm::{Communicator, LocalComm, LocalWorld, Topology};

fn model() -> CausalLmConfig {
    let layer = DecoderLayerConfig::new()
        .with_attention(Some(AttentionConfig::new(32, 4, 2, 8)))
        .with_moe(Some(MoeBlockConfig::new(RouterConfig::new(32, 8, 2), 48)));
    // No auxiliary loss: it is computed over each rank's tokens, which differs from one process by design.
    CausalLmConfig::new(16, 32, vec![layer.clone(), layer]).with_aux_loss_coef(0.0)
}

fn config() -> TrainConfig {
    TrainConfig::new()
        .with_steps(8)
        .with_batch_size(8)
        .with_seq_len(16)
        .with_lr(1e-2)
        .with_warmup_steps(2)
        .with_grad_clip(0.0)
        .with_seed(5)
}

fn losses(world: &dyn Communicator, layout: Layout, per_node: usize, algo: Algo) -> Vec<f64> {
    let topo = Topology::uniform(world.size(), per_node).unwrap();
    let mut corpus = Grammar::new(16, 3, 9);
    train_parallel(&model(), &mut corpus, &config(), world, &topo, layout, algo, &Device::flex(), 1.0, 1.0, |_| {})
        .unwrap()
        .1
        .iter()
        .map(|m| m.loss)
        .collect()
}

fn assert_same(what: &str, got: &[f64], want: &[f64]) {
    let worst = got.iter().zip(want).map(|(a, b)| ((a - b) / b).abs()).fold(0.0, f64::max);
    eprintln!("{what}: worst relative loss difference over {} steps {worst:e}", got.len());
    assert!(worst < 1e-4, "{what}: worst relative difference {worst:e}\n got {got:?}\nwant {want:?}");
}

#[test]
fn expert_and_data_parallel_runs_equal_one_process() {
    let single = losses(&LocalComm::single(), Layout { ep: 1, dp: 1 }, 1, Algo::Flat);
    assert!(single[7] < single[0], "the reference run must learn: {single:?}");
    for (layout, algo) in [
        (Layout { ep: 4, dp: 1 }, Algo::Flat),
        (Layout { ep: 2, dp: 2 }, Algo::Halo),
        (Layout { ep: 1, dp: 4 }, Algo::Flat),
    ] {
        let runs = LocalWorld::run(4, |c| losses(&c, layout, 2, algo));
        for r in &runs {
            assert_eq!(r, &runs[0], "every rank reports the same losses");
        }
        assert_same(&format!("{layout:?} {algo:?}"), &runs[0], &single);
    }
}

/// The error every rank of a `ranks`-rank job gets for `layout`.
fn refusal(ranks: usize, layout: Layout) -> Vec<String> {
    LocalWorld::run(ranks, move |c| {
        let topo = Topology::uniform(ranks, ranks).unwrap();
        let mut corpus = Grammar::new(16, 3, 9);
        train_parallel(
            &model(),
            &mut corpus,
            &config(),
            &c,
            &topo,
            layout,
            Algo::Flat,
            &Device::flex(),
            1.0,
            1.0,
            |_| {},
        )
        .unwrap_err()
    })
}

#[test]
fn bad_layouts_are_refused_before_any_work() {
    let err = refusal(4, Layout { ep: 2, dp: 1 });
    assert!(err[0].contains("--ep 2 × --dp 1 = 2 ranks, but the job has 4"), "{}", err[0]);
    let err = refusal(3, Layout { ep: 3, dp: 1 });
    assert!(err[0].contains("divisible by EP·DP = 3") || err[0].contains("must divide the 8 experts"), "{}", err[0]);
}

mod pipelined {
    use super::*;
    use piper_burn::parallel::pipeline::{PipelineLayout, train_pipelined};
    use piper_planner::layout::Schedule;

    fn run(world: &dyn Communicator, layout: &PipelineLayout, algo: Algo) -> Vec<f64> {
        let topo = Topology::uniform(world.size(), 2.min(world.size())).unwrap();
        let mut corpus = Grammar::new(16, 3, 9);
        train_pipelined(&model(), &mut corpus, &config(), world, &topo, layout, algo, &Device::flex(), 1.0, 1.0, |_| {})
            .unwrap()
            .iter()
            .map(|m| m.loss)
            .collect()
    }

    #[test]
    fn pipeline_stages_equal_one_process() {
        let single = losses(&LocalComm::single(), Layout { ep: 1, dp: 1 }, 1, Algo::Flat);
        let cases = [
            (2, PipelineLayout { pp: 2, ep: 1, dp: 1, micro_batches: 4, schedule: Schedule::OneFOneB, split: None }),
            (2, PipelineLayout { pp: 2, ep: 1, dp: 1, micro_batches: 2, schedule: Schedule::GPipe, split: None }),
            (4, PipelineLayout { pp: 2, ep: 2, dp: 1, micro_batches: 2, schedule: Schedule::OneFOneB, split: None }),
            (4, PipelineLayout { pp: 2, ep: 1, dp: 2, micro_batches: 2, schedule: Schedule::OneFOneB, split: None }),
        ];
        for (ranks, layout) in cases {
            let runs = LocalWorld::run(ranks, |c| run(&c, &layout, Algo::Flat));
            for r in &runs {
                assert_eq!(r, &runs[0], "every rank reports the same losses");
            }
            assert_same(&format!("{layout:?}"), &runs[0], &single);
        }
    }
}

mod zero_tokens {
    use burn::module::Param;
    use burn::tensor::Distribution;
    use piper_burn::moe::{ExpertGroup, MoeBlockConfig};
    use piper_burn::parallel::exchange::{GroupGuard, register_group};
    use piper_burn::router::RouterConfig;
    use piper_comm::alltoall::Algo;
    use piper_comm::{LocalWorld, Topology};

    use super::*;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_into_vec().unwrap()
    }

    /// With a zero router every token ties and picks experts 0 and 1, both on rank 0: rank 1's experts
    /// get no tokens, and its rows of the all-to-all are all empty. The expert-parallel block must
    /// still equal the one-process block, in values and input gradients.
    #[test]
    fn an_expert_group_member_with_zero_tokens() {
        let results = LocalWorld::run(2, |c| {
            let device = Device::flex().autodiff();
            let config = MoeBlockConfig::new(RouterConfig::new(8, 4, 2), 6);
            let mut full = {
                let _one = piper_burn::parallel::init_lock();
                device.seed(1);
                let block = config.init(&device);
                // Parameters are drawn lazily: draw them now, under the lock, the same on both ranks.
                let _ = (block.experts.w_gate_edf.val(), block.experts.w_up_edf.val(), block.experts.w_down_efd.val());
                block
            };
            full.router.gate.weight = Param::from_tensor(Tensor::zeros([8, 4], &device));
            let x = {
                let _one = piper_burn::parallel::init_lock();
                device.seed(2);
                Tensor::<3>::random([1, 5, 8], Distribution::Normal(0.0, 1.0), &device)
            };
            let x = Tensor::<3>::from_data(x.into_data(), &device).require_grad();
            let handle = register_group(Box::new(c), Topology::uniform(2, 2).unwrap(), Algo::Flat);
            let _release = GroupGuard(handle);
            let rank = piper_burn::parallel::exchange::with_group(handle, |comm, _, _| comm.rank());
            let sharded = full.clone().into_expert_parallel(ExpertGroup { handle, rank, size: 2 });
            let (y_ep, stats) = sharded.forward(x.clone());
            let g_ep = x.grad(&y_ep.clone().sum().backward()).unwrap();
            let (y_one, _) = full.forward(x.clone());
            let g_one = x.grad(&y_one.clone().sum().backward()).unwrap();
            (values(y_ep), values(y_one), values(g_ep), values(g_one), stats.tokens_per_expert)
        });
        for (y_ep, y_one, g_ep, g_one, load) in results {
            assert_eq!(load, vec![5, 5, 0, 0], "experts 2 and 3 (rank 1) get no tokens");
            assert!(y_ep.iter().zip(&y_one).all(|(a, b)| (a - b).abs() < 1e-6));
            assert!(g_ep.iter().zip(&g_one).all(|(a, b)| (a - b).abs() < 1e-6));
        }
    }
}
