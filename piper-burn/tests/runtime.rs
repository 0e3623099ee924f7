//! The runtime on in-process ranks (threads, the real exchange code): every layout of the plan — EP,
//! EP × DP (HALO across emulated nodes), DP, PP with 1F1B and GPipe, PP × EP, PP × DP — trains the same
//! model as one process, with default flags (global load-balancing loss, global-norm clipping), to 1e-4
//! relative per step; a plan file drives a run; bad plans and disagreeing ranks are refused before any
//! work. (The multi-process versions run `mixtral_train` under mpirun: tests/parallel_mpirun.rs.)

use burn::prelude::*;
use piper_burn::corpus::Grammar;
use piper_burn::runtime::{self, Job, LayoutFlags, RunConfig, StepMetrics};
use piper_comm::{Communicator, LocalComm, LocalWorld, Topology};
use piper_planner::comm::A2aAlgo;
use piper_planner::layout::{Layout, Recompute, Schedule};
use piper_planner::model::preset;
use piper_planner::run_plan::RunPlan;
use piper_test_support::{assert_close, assert_close_scaled};

fn config() -> RunConfig {
    RunConfig::new().with_steps(8).with_global_batch(8).with_seq_len(15).with_lr(1e-2).with_warmup_steps(2).with_seed(5)
}

fn flags(pp: u64, ep: u64, dp: u64, m: usize, schedule: Schedule, algo: A2aAlgo) -> LayoutFlags {
    LayoutFlags {
        layout: Layout { pp, ep, dp },
        micro_batches: m,
        schedule,
        split: None,
        all_to_all: algo,
        ..LayoutFlags::single()
    }
}

fn plan_for(flags: &LayoutFlags, ranks: usize, run: &RunConfig) -> Result<RunPlan, String> {
    let spec = preset("tiny").unwrap();
    let platform = piper_planner::platform::preset("local").unwrap();
    runtime::plan_from_flags(&spec, &platform, run, flags, ranks).map_err(|e| e.to_string())
}

/// Runs `plan` on this rank with the `tiny` model on the seeded grammar (emulated nodes of `per_node` ranks).
fn execute(
    world: &dyn Communicator,
    plan: &RunPlan,
    run: &RunConfig,
    per_node: usize,
    zero_router: bool,
) -> Result<runtime::Trained, String> {
    execute_preset("tiny", world, plan, run, per_node, zero_router)
}

fn execute_preset(
    name: &str,
    world: &dyn Communicator,
    plan: &RunPlan,
    run: &RunConfig,
    per_node: usize,
    zero_router: bool,
) -> Result<runtime::Trained, String> {
    let job = Job::builder(preset(name).unwrap(), world)
        .run(run.clone().with_zero_router(zero_router))
        .plan(plan.clone())
        .topology(Topology::uniform(world.size(), per_node).unwrap())
        .platform(piper_planner::platform::preset("local").unwrap())
        .peak_flops(1.0)
        .build()
        .map_err(|e| e.to_string())?;
    runtime::execute(&job, &mut Grammar::new(32, 3, 9), |_| {}).map_err(|e| e.to_string())
}

fn train(
    world: &dyn Communicator,
    plan: &RunPlan,
    run: &RunConfig,
    per_node: usize,
) -> Result<Vec<StepMetrics>, String> {
    execute(world, plan, run, per_node, false).map(|t| t.metrics)
}

fn losses(metrics: &[StepMetrics]) -> Vec<f64> {
    metrics.iter().map(|m| m.loss).collect()
}

/// One process with `m` micro-batches (gradient accumulation): what a layout with `m` micro-batches equals.
fn one_process_m(run: &RunConfig, m: usize) -> Vec<f64> {
    let plan = plan_for(&LayoutFlags { micro_batches: m, ..LayoutFlags::single() }, 1, run).unwrap();
    losses(&train(&LocalComm::single(), &plan, run, 1).unwrap())
}

fn one_process(run: &RunConfig) -> Vec<f64> {
    one_process_m(run, 1)
}

#[test]
fn micro_batches_only_change_what_the_load_balancing_loss_sees() {
    // Without the load-balancing loss, gradient accumulation over 4 micro-batches is the full batch.
    let run = config().with_aux_loss_coef(Some(0.0));
    let worst = assert_close("M=4 vs M=1, no aux loss", &one_process_m(&run, 4), &one_process(&run), 1e-5);
    eprintln!("M=4 vs M=1 without the aux loss: {worst:e}");
}

#[test]
fn one_process_learns_and_the_same_seed_gives_the_same_losses() {
    let run = config().with_steps(20);
    let a = one_process(&run);
    assert_eq!(a.len(), 20);
    assert!(a[19] < a[0] - 0.5, "the loss must fall: {a:?}");
    assert_eq!(a, one_process(&run));
    assert_ne!(a[1..], one_process(&run.clone().with_seed(6))[1..]);
}

#[test]
fn every_layout_equals_one_process_with_default_flags() {
    let run = config();
    let cases = [
        (flags(1, 4, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), 2),
        (flags(1, 2, 2, 1, Schedule::OneFOneB, A2aAlgo::Halo), 1), // expert groups across two "nodes"
        (flags(1, 2, 2, 1, Schedule::OneFOneB, A2aAlgo::Pairwise), 2),
        (flags(1, 1, 4, 1, Schedule::OneFOneB, A2aAlgo::Flat), 2),
        (flags(2, 1, 1, 4, Schedule::OneFOneB, A2aAlgo::Flat), 2),
        (flags(2, 1, 1, 2, Schedule::GPipe, A2aAlgo::Flat), 2),
        (flags(2, 2, 1, 2, Schedule::OneFOneB, A2aAlgo::Flat), 2),
        (flags(2, 1, 2, 2, Schedule::OneFOneB, A2aAlgo::Flat), 2),
    ];
    for (f, per_node) in cases {
        let ranks = f.layout.gpus() as usize;
        let plan = plan_for(&f, ranks, &run).unwrap();
        let runs = LocalWorld::run(ranks, |c| losses(&train(&c, &plan, &run, per_node).unwrap()));
        for r in &runs {
            assert_eq!(r, &runs[0], "every rank reports the same losses");
        }
        let single = one_process_m(&run, f.micro_batches);
        let worst = assert_close(&format!("{:?}", f), &runs[0], &single, 1e-4);
        eprintln!(
            "{:?} M={} {:?} {:?}: worst relative difference {worst:e}",
            f.layout, f.micro_batches, f.schedule, f.all_to_all
        );
    }
}

/// Evaluation on the held-out split (`--eval-every`): after the last step it is the trained model's mean
/// cross-entropy on the held-out rows computed outside the runtime (one forward of them all); every
/// layout gives the one-process figures (1e-4, as training does); training with evaluations is training
/// without them, bit for bit.
#[test]
fn evaluation_is_the_trained_models_held_out_loss_on_every_layout() {
    use piper_burn::corpus::Corpus as _;
    let run = config().with_steps(6).with_eval_every(4).with_eval_tokens(200);
    assert_eq!(run.eval_sequences(), 16, "two global batches of 8");
    let evals = |m: &[StepMetrics]| m.iter().filter_map(|m| m.eval_loss.map(|l| (m.step, l))).collect::<Vec<_>>();
    let plan = plan_for(&LayoutFlags::single(), 1, &run).unwrap();
    let trained = execute(&LocalComm::single(), &plan, &run, 1, false).unwrap();
    let single = evals(&trained.metrics);
    assert_eq!(single.iter().map(|e| e.0).collect::<Vec<_>>(), vec![4, 6]);
    let mut grammar = Grammar::new(32, 3, 9);
    grammar.hold_out(16, 16).unwrap();
    let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(grammar.held_out().to_vec(), [16, 16]), &Device::flex());
    let model = &trained.model;
    let (h_bsd, _) = model.forward_layers(model.embed_tokens(ids_bs.clone().narrow(1, 0, 15)), 0..model.layers.len());
    let reference = model.cross_entropy(model.head(h_bsd), ids_bs.narrow(1, 1, 15)).into_scalar::<f32>() as f64;
    assert_close("held-out loss after the last step", &[single[1].1], &[reference], 1e-5);
    assert_eq!(losses_and_norms(&trained.metrics), {
        let quiet = run.clone().with_eval_every(0);
        losses_and_norms(
            &train(&LocalComm::single(), &plan_for(&LayoutFlags::single(), 1, &quiet).unwrap(), &quiet, 1).unwrap(),
        )
    });
    for f in
        [flags(2, 2, 1, 2, Schedule::OneFOneB, A2aAlgo::Flat), flags(1, 2, 2, 1, Schedule::OneFOneB, A2aAlgo::Halo)]
    {
        let ranks = f.layout.gpus() as usize;
        let plan = plan_for(&f, ranks, &run).unwrap();
        let runs = LocalWorld::run(ranks, |c| evals(&train(&c, &plan, &run, 2).unwrap()));
        assert!(runs.iter().all(|r| r == &runs[0]), "every rank reports the same held-out losses");
        let single_m = evals(&{
            let p =
                plan_for(&LayoutFlags { micro_batches: f.micro_batches, ..LayoutFlags::single() }, 1, &run).unwrap();
            train(&LocalComm::single(), &p, &run, 1).unwrap()
        });
        let flat = |v: &[(usize, f64)]| v.iter().map(|e| e.1).collect::<Vec<f64>>();
        let worst = assert_close(&format!("{:?} held-out", f.layout), &flat(&runs[0]), &flat(&single_m), 1e-4);
        eprintln!("{:?}: held-out losses vs one process, worst relative difference {worst:e}", f.layout);
    }
}

fn losses_and_norms(metrics: &[StepMetrics]) -> Vec<(f64, f64)> {
    metrics.iter().map(|m| (m.loss, m.grad_norm)).collect()
}

/// Full recompute rebuilds each layer in the backward from its kept input: on one process the losses
/// and gradient norms are those without recompute bit for bit (Mixtral- and Qwen3-style models); on PP ×
/// EP layouts (the all-to-alls run again in the recompute, on both schedules) within 1e-6 of the same
/// layout without it. The DeepSeek-style preset (dense first layer, shared expert, grouped sigmoid
/// routing) drifts by about one rounding from the second step on: within 1e-6. Selective recompute
/// (the dense MLPs' and shared experts' `silu(gate) ⊙ up` recomputed) runs the same ops in the same
/// order: bit for bit everywhere, the DeepSeek-style preset included.
#[test]
fn recompute_gives_the_same_training() {
    let run = config().with_steps(6);
    let single = |name: &str, recompute| {
        let spec = preset(name).unwrap();
        let platform = piper_planner::platform::preset("local").unwrap();
        let flags = LayoutFlags { micro_batches: 2, recompute, ..LayoutFlags::single() };
        let plan = runtime::plan_from_flags(&spec, &platform, &run, &flags, 1).unwrap();
        assert_eq!(plan.recompute, recompute);
        let world = LocalComm::single();
        losses_and_norms(&execute_preset(name, &world, &plan, &run, 1, false).unwrap().metrics)
    };
    for name in ["tiny", "tiny-qwen3"] {
        let none = single(name, Recompute::None);
        assert_eq!(single(name, Recompute::Full), none, "{name}: (loss, gradient norm) per step, full");
        assert_eq!(single(name, Recompute::Selective), none, "{name}: (loss, gradient norm) per step, selective");
    }
    let flat = |v: Vec<(f64, f64)>| v.into_iter().flat_map(|(l, n)| [l, n]).collect::<Vec<f64>>();
    let deepseek = [Recompute::None, Recompute::Full, Recompute::Selective].map(|r| flat(single("tiny-deepseek", r)));
    let worst = assert_close("tiny-deepseek full recompute", &deepseek[1], &deepseek[0], 1e-6);
    eprintln!("tiny-deepseek, one process: full recompute vs none, worst relative difference {worst:e}");
    assert_eq!(deepseek[2], deepseek[0], "tiny-deepseek: selective recompute changes nothing");
    for base in [
        flags(2, 2, 1, 2, Schedule::OneFOneB, A2aAlgo::Flat),
        flags(2, 2, 1, 2, Schedule::GPipe, A2aAlgo::Flat),
        flags(1, 4, 1, 1, Schedule::OneFOneB, A2aAlgo::Pairwise),
    ] {
        let ranks = base.layout.gpus() as usize;
        let [kept, recomputed, selective] = [Recompute::None, Recompute::Full, Recompute::Selective].map(|recompute| {
            let plan = plan_for(&LayoutFlags { recompute, ..base.clone() }, ranks, &run).unwrap();
            let rank0 = LocalWorld::run(ranks, |c| losses_and_norms(&train(&c, &plan, &run, 2).unwrap())).remove(0);
            rank0.into_iter().flat_map(|(l, n)| [l, n]).collect::<Vec<f64>>()
        });
        let worst = assert_close(&format!("{:?} full recompute", base), &recomputed, &kept, 1e-6);
        eprintln!("{:?} {:?}: full recompute vs none, worst relative difference {worst:e}", base.layout, base.schedule);
        assert_eq!(selective, kept, "{:?} {:?}: selective recompute", base.layout, base.schedule);
    }
}

#[test]
fn a_plan_file_drives_the_run() {
    let run = config().with_steps(4);
    let plan = plan_for(&flags(2, 2, 1, 2, Schedule::OneFOneB, A2aAlgo::Flat), 4, &run).unwrap();
    let path = std::env::temp_dir().join(format!("piper-plan-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
    let loaded = RunPlan::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded, plan);
    let from_file = LocalWorld::run(4, |c| losses(&train(&c, &loaded, &run, 2).unwrap()));
    let from_flags = LocalWorld::run(4, |c| losses(&train(&c, &plan, &run, 2).unwrap()));
    assert_eq!(from_file, from_flags);
}

#[test]
fn plans_that_do_not_fit_the_run_are_refused_naming_the_field() {
    let run = config();
    let plan = plan_for(&flags(1, 2, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), 2, &run).unwrap();
    let refusal = |p: &RunPlan, r: &RunConfig, ranks: usize| {
        LocalWorld::run(ranks, |c| train(&c, p, r, 2).expect_err("refused"))[0].clone()
    };
    assert!(refusal(&plan, &run, 4).contains("`gpus` is 2 but the job has 4 ranks"));
    assert!(refusal(&plan, &run.clone().with_seq_len(31), 2).contains("`seq_len` is 15 but the run's `seq_len` is 31"));
    assert!(
        refusal(&plan, &run.clone().with_global_batch(16), 2)
            .contains("`global_batch` is 8 but the run's `global_batch` is 16")
    );
    let mut other = plan.clone();
    other.model = "tiny-qwen3".into();
    assert!(refusal(&other, &run, 2).contains("`model` is `tiny-qwen3` but the run trains `tiny`"));
    let mut bf16 = plan.clone();
    bf16.dtype = "bf16".into();
    assert!(refusal(&bf16, &run, 2).contains("trains in fp32"));
    // Layout flags that cannot work.
    let err = plan_for(&flags(1, 2, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), 4, &run).unwrap_err();
    assert!(err.starts_with("layout.pp 1 × `layout.ep` 2 × `layout.dp` 1 = 2 ranks, but the job has 4"), "{err}");
    let err = plan_for(&flags(1, 3, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), 3, &run).unwrap_err();
    assert!(err.contains("`--ep` EP = 3 must divide the 8 routed experts"), "{err}");
    let err = plan_for(&flags(2, 1, 1, 3, Schedule::OneFOneB, A2aAlgo::Flat), 2, &run).unwrap_err();
    assert!(err.contains("global_batch 8 must be divisible by EP·DP·micro-batches = 1·1·3"), "{err}");
    let err = plan_for(&LayoutFlags::single(), 1, &run.clone().with_steps(0)).unwrap_err();
    assert!(err.starts_with("steps is 0"), "the library names the field: {err}");
}

#[test]
fn ranks_that_disagree_are_stopped_before_the_first_step() {
    let run = config().with_steps(2);
    let plan = plan_for(&flags(1, 1, 2, 1, Schedule::OneFOneB, A2aAlgo::Flat), 2, &run).unwrap();
    let errs = LocalWorld::run(2, |c| {
        let mine = if c.rank() == 1 { run.clone().with_seed(99) } else { run.clone() };
        train(&c, &plan, &mine, 2).expect_err("refused")
    });
    for e in errs {
        assert!(e.contains("the seed of world rank(s) [1] differs from rank 0's"), "{e}");
    }
}

#[test]
fn metrics_report_the_load_per_expert_and_per_expert_rank() {
    let run = config().with_steps(2);
    let plan = plan_for(&flags(1, 2, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), 2, &run).unwrap();
    let m = LocalWorld::run(2, |c| train(&c, &plan, &run, 2).unwrap()).remove(0);
    // tiny: 2 MoE layers; max/mean over 8 experts and over 2 ranks is ≥ 1 and below the count.
    for s in &m {
        assert_eq!((s.expert_load.len(), s.rank_load_max_mean.len()), (2, 2));
        assert!(s.expert_load.iter().all(|x| (1.0..=8.0).contains(x)), "{:?}", s.expert_load);
        assert!(s.rank_load_max_mean.iter().all(|x| (1.0..=2.0).contains(x)), "{:?}", s.rank_load_max_mean);
        assert!(s.rank_load_max_mean.iter().zip(&s.expert_load).all(|(r, e)| r <= e));
    }
}

mod expert_parallel_block {
    use std::sync::Arc;

    use burn::module::Param;
    use burn::tensor::Distribution;
    use piper_burn::model::stage_model::draw_now;
    use piper_burn::moe::MoeBlockConfig;
    use piper_burn::moe::dispatcher::exchange::ExchangeGroup;
    use piper_burn::moe::dispatcher::{AllToAllDispatcher, ExpertPlacement, SharedComm};
    use piper_burn::moe::router::RouterConfig;
    use piper_comm::{LocalWorld, Topology};
    use piper_planner::comm::A2aAlgo;

    use super::*;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
        t.into_data().convert::<f32>().try_into_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
    }

    /// An expert-parallel block (2 ranks) with a gated shared expert against the whole block on one
    /// rank: outputs and input gradients, for a contiguous and a shuffled placement, with the shared
    /// expert computed before the dispatch and while its rows travel (posted flat and pairwise exchanges;
    /// HALO completes when posted). With a zero router every token ties and picks experts 0 and 1: under
    /// the contiguous placement rank 1's experts get no tokens and its rows of the all-to-all are all empty.
    #[test]
    fn expert_parallel_blocks_equal_the_whole_block_including_ranks_without_tokens() {
        let cases = [
            (vec![0, 0, 1, 1], true, false, A2aAlgo::Flat),
            (vec![1, 0, 1, 0], false, false, A2aAlgo::Flat),
            (vec![1, 1, 0, 0], true, false, A2aAlgo::Flat),
            (vec![0, 0, 1, 1], true, true, A2aAlgo::Flat),
            (vec![1, 0, 1, 0], false, true, A2aAlgo::Flat),
            (vec![1, 0, 1, 0], false, true, A2aAlgo::Pairwise),
            (vec![1, 0, 1, 0], false, true, A2aAlgo::Halo),
        ];
        for (placement, zero_router, overlap, algo) in cases {
            let results = LocalWorld::run(2, |c| {
                let device = Device::flex().autodiff();
                let config = MoeBlockConfig::new(RouterConfig::new(8, 4, 2), 6)
                    .with_num_shared(1)
                    .with_shared_ffn(5)
                    .with_shared_gate(true);
                let mut full = {
                    let _one = piper_burn::init_lock();
                    device.seed(1);
                    let block = config.init(&device);
                    // Every weight now, the shared expert's too: a lazy one drawn later by one rank
                    // would take numbers from the other rank's draw under the lock.
                    draw_now(&block);
                    block
                };
                if zero_router {
                    full.router.gate.weight = Param::from_tensor(Tensor::zeros([8, 4], &device));
                }
                let x = {
                    let _one = piper_burn::init_lock();
                    device.seed(2);
                    Tensor::<3>::random([1, 5, 8], Distribution::Normal(0.0, 1.0), &device)
                };
                let x = Tensor::<3>::from_data(x.into_data(), &device).require_grad();
                let rank = c.rank();
                let group =
                    ExchangeGroup::new(SharedComm::new(Box::new(c)), Arc::new(Topology::uniform(2, 2).unwrap()), algo);
                let dispatcher = Arc::new(AllToAllDispatcher { group, local_experts: 2, layer_group: None, overlap });
                let placement = ExpertPlacement::new(placement.clone(), 2).unwrap();
                let sharded = full.clone().with_routing(dispatcher, placement, rank);
                let (y_ep, stats) = sharded.forward(x.clone());
                let g_ep = x.grad(&y_ep.clone().sum().backward()).unwrap();
                let (y_one, _) = full.forward(x.clone());
                let g_one = x.grad(&y_one.clone().sum().backward()).unwrap();
                (values(y_ep), values(y_one), values(g_ep), values(g_one), stats.tokens_per_expert)
            });
            for (y_ep, y_one, g_ep, g_one, load) in results {
                if zero_router {
                    assert_eq!(load, vec![5, 5, 0, 0], "experts 2 and 3 get no tokens");
                }
                assert_close("outputs", &y_ep, &y_one, 1e-5);
                // The whole block runs dispatch, experts and combine as one operation, which applies the
                // combine weight after `dout·Wdᵀ` where the sharded path applies it before: the same sums
                // rounded in another order, and these gradients pass near zero — so relative to the
                // largest.
                assert_close_scaled("input gradients", &g_ep, &g_one, 1e-5);
            }
        }
    }
}

mod migration {
    use std::collections::BTreeMap;

    use super::*;

    /// This rank's expert weights (gate, up, down) by (MoE layer, expert id), read through the placement.
    type Experts = BTreeMap<(usize, usize), Vec<f64>>;

    fn run_with(
        world: &dyn Communicator,
        plan: &RunPlan,
        run: &RunConfig,
        zero_router: bool,
    ) -> (Vec<StepMetrics>, Experts) {
        let trained = execute(world, plan, run, 2, zero_router).unwrap();
        let (stage, _, ep) = plan.layout().coords(world.rank() as u64);
        let first_moe = plan.stages[stage as usize].first_layer as usize; // every layer of `tiny` is MoE
        let mut experts = Experts::new();
        for (j, block) in trained.model.layers.iter().filter_map(|l| l.moe.as_ref()).enumerate() {
            let layer = first_moe + j;
            let mine = trained.placements[layer].experts_of(ep as usize);
            let ws = [block.experts.w_gate_edf.val(), block.experts.w_up_edf.val(), block.experts.w_down_efd.val()];
            let host: Vec<Vec<f32>> =
                ws.into_iter().map(|w| w.into_data().convert::<f32>().try_into_vec().unwrap()).collect();
            for (slot, e) in mine.iter().enumerate() {
                let mut v = Vec::new();
                for h in &host {
                    let per = h.len() / mine.len();
                    v.extend(h[slot * per..(slot + 1) * per].iter().map(|x| *x as f64));
                }
                experts.insert((layer, *e), v);
            }
        }
        (trained.metrics, experts)
    }

    /// Threshold 1 (any imbalance) and a check every 3 steps force migrations; the loss curve and the
    /// final expert weights (gathered by expert id) equal the run without migration.
    #[test]
    fn forced_migrations_preserve_the_function() {
        let base = config().with_steps(10);
        for (f, zero_router) in [
            (flags(1, 2, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), false),
            (flags(1, 4, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), false),
            (flags(2, 2, 1, 2, Schedule::OneFOneB, A2aAlgo::Flat), false),
            (flags(1, 2, 2, 1, Schedule::OneFOneB, A2aAlgo::Halo), false),
            // Every token on experts 0 and 1 at first: swaps with experts that got no tokens.
            (flags(1, 4, 1, 1, Schedule::OneFOneB, A2aAlgo::Flat), true),
        ] {
            let ranks = f.layout.gpus() as usize;
            let plan = plan_for(&f, ranks, &base).unwrap();
            let off_run = base.clone().with_migration(false);
            let on_run = base
                .clone()
                .with_migration_threshold(Some(1.0))
                .with_migration_every(Some(3))
                .with_migration_decision(runtime::MigrationDecision::Threshold);
            let off = LocalWorld::run(ranks, |c| run_with(&c, &plan, &off_run, zero_router));
            let on = LocalWorld::run(ranks, |c| run_with(&c, &plan, &on_run, zero_router));
            let events: Vec<_> =
                on[0].0.iter().flat_map(|m| m.migration.iter().map(move |e| (m.step, e.clone()))).collect();
            assert!(!events.is_empty(), "{f:?}: no migration happened");
            for (_, e) in &events {
                assert!(e.experts_moved > 0 && e.imbalance_after <= e.imbalance_before, "{e:?}");
                assert!(e.seconds.is_finite() && e.predicted_seconds > 0.0, "{e:?}");
            }
            // Each check's moves get their outcome when the window after them (3 steps) has closed.
            for m in on[0].0.iter().filter(|m| !m.migration.is_empty() && m.step + 3 <= base.steps) {
                let closing = &on[0].0[m.step + 3 - 1];
                let o = closing
                    .migration_outcome
                    .as_ref()
                    .unwrap_or_else(|| panic!("{f:?}: no outcome at step {}", closing.step));
                assert_eq!(o.moved_after_step, m.step);
                assert_eq!(o.layers, m.migration.iter().map(|e| e.layer).collect::<Vec<_>>());
                assert_eq!(o.steps_after, 3);
                let after: Vec<f64> = on[0].0[m.step..m.step + 3].iter().map(|s| s.step_time_s).collect();
                let mut sorted = after.clone();
                sorted.sort_by(f64::total_cmp);
                assert_eq!(o.step_time_after_s, sorted[1], "the median of the window after");
                assert_eq!(o.realised_gain_per_step_s, o.step_time_before_s - o.step_time_after_s);
            }
            let outcomes = on[0].0.iter().filter(|m| m.migration_outcome.is_some()).count();
            assert!(outcomes > 0, "{f:?}: no outcome closed");
            // With a zero router, later top-k ties break on round-off: compare the steps up to the
            // first one after the first migration (steps count from 1).
            let upto = if zero_router { events[0].0 + 1 } else { base.steps };
            let (l_on, l_off) = (losses(&on[0].0), losses(&off[0].0));
            let worst = assert_close(&format!("{f:?} losses"), &l_on[..upto], &l_off[..upto], 1e-5);
            eprintln!(
                "{:?} zero_router={zero_router}: {} migrations, worst loss difference {worst:e}",
                f.layout,
                events.len()
            );
            if !zero_router {
                let gather = |runs: &[(Vec<StepMetrics>, Experts)]| -> Experts {
                    runs.iter().flat_map(|(_, e)| e.clone()).collect()
                };
                let (w_on, w_off) = (gather(&on), gather(&off));
                assert_eq!(w_on.keys().collect::<Vec<_>>(), w_off.keys().collect::<Vec<_>>());
                for (k, v) in &w_on {
                    assert_close_scaled(&format!("{f:?} expert {k:?}"), v, &w_off[k], 1e-5);
                }
            }
        }
    }
}

/// The losses of one process training `spec` with `run`, the job built with the builder's defaults but
/// the platform (so the test does not read a calibrated one) and the peak.
fn built_losses(spec: piper_planner::model::ModelSpec, run: &RunConfig) -> Vec<f64> {
    let world = LocalComm::single();
    let job = Job::builder(spec, &world)
        .run(run.clone())
        .platform(piper_planner::platform::preset("local").unwrap())
        .peak_flops(1.0)
        .build()
        .unwrap();
    losses(&runtime::execute(&job, &mut Grammar::new(32, 3, 9), |_| {}).unwrap().metrics)
}

#[test]
fn the_load_balancing_weight_is_the_runs_else_the_models_else_the_default() {
    let run = config().with_steps(4);
    let with_coef = |coef: Option<f64>| {
        let mut spec = preset("tiny").unwrap();
        spec.moe.as_mut().unwrap().router_aux_loss_coef = coef;
        spec
    };
    let models = built_losses(with_coef(Some(0.3)), &run);
    let runs = built_losses(with_coef(None), &run.clone().with_aux_loss_coef(Some(0.3)));
    assert_eq!(models, runs, "the model's weight is used when the run gives none");
    let default = built_losses(with_coef(None), &run);
    assert_eq!(default, built_losses(with_coef(None), &run.clone().with_aux_loss_coef(Some(0.01))));
    assert_ne!(models, default, "a weight of 0.3 must change the losses");
    let overridden = built_losses(with_coef(Some(0.3)), &run.clone().with_aux_loss_coef(Some(0.01)));
    assert_eq!(overridden, default, "the run's weight wins over the model's");
}

#[test]
fn a_job_without_a_plan_gets_one_for_its_world() {
    let run = config();
    let layout = |ranks: usize| {
        LocalWorld::run(ranks, |c| {
            let job = Job::builder(preset("tiny").unwrap(), &c)
                .run(run.clone())
                .platform(piper_planner::platform::preset("local").unwrap())
                .topology(Topology::uniform(ranks, 2).unwrap())
                .peak_flops(1.0)
                .build()
                .unwrap();
            (job.plan.layout(), job.plan.num_micro_batches)
        })
    };
    let one = layout(1);
    assert_eq!(one[0].0, Layout { pp: 1, ep: 1, dp: 1 });
    assert_eq!(one[0].1, 1, "one process, one micro-batch unless asked");
    let two = layout(2);
    assert_eq!(two[0].0.gpus(), 2, "the planner's layout uses every rank");
    assert!(two.iter().all(|l| *l == two[0]), "every rank builds the same plan");
}

/// AdamW's β and ε are the run's: the defaults given explicitly change nothing, another β₂ or ε changes
/// the losses.
#[test]
fn the_optimizers_settings_are_the_runs() {
    let run = config().with_steps(4);
    let spec = || preset("tiny").unwrap();
    let default = built_losses(spec(), &run);
    let explicit = run.clone().with_adam_beta1(0.9).with_adam_beta2(0.95).with_adam_epsilon(1e-8);
    assert_eq!(built_losses(spec(), &explicit), default);
    assert_ne!(built_losses(spec(), &run.clone().with_adam_beta2(0.999)), default);
    assert_ne!(built_losses(spec(), &run.clone().with_adam_epsilon(1e-3)), default);
}

/// A model given beside the job's spec must be the model the spec describes (the one the planner
/// priced): another expert count, another width of the experts, another layer count are refused before
/// the first step, naming the spec's field; the same model trains.
#[test]
fn a_model_that_is_not_the_specs_is_refused_naming_the_field() {
    use piper_burn::CausalLmConfig;
    let spec = piper_planner::model::ModelSpec::mixtral("spec").vocab_size(32).build().unwrap();
    let world = LocalComm::single();
    let run = config().with_steps(2);
    let job = Job::builder(spec.clone(), &world)
        .run(run)
        .platform(piper_planner::platform::preset("local").unwrap())
        .peak_flops(1.0)
        .build()
        .unwrap();
    let builder = || piper_planner::model::ModelSpec::mixtral("model").vocab_size(32);
    let moe = spec.moe.clone().unwrap();
    let cases = [
        (builder().experts(2 * moe.num_experts, moe.top_k).build().unwrap(), "moe.num_experts"),
        (builder().expert_ffn(2 * moe.expert.intermediate_size).build().unwrap(), "moe.expert.intermediate_size"),
        (builder().layers(spec.num_layers + 1).build().unwrap(), "num_layers"),
    ];
    for (other, field) in cases {
        let model = CausalLmConfig::from_spec(&other).unwrap();
        let err = runtime::execute_model(&job, &model, &mut Grammar::new(32, 3, 9), |_| {}).err().expect("refused");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    let same = CausalLmConfig::from_spec(&spec).unwrap();
    let trained = runtime::execute_model(&job, &same, &mut Grammar::new(32, 3, 9), |_| {}).unwrap();
    assert_eq!(trained.metrics.len(), 2);
}

/// The author's learning-rate schedule drives the optimizer: a constant schedule equals the run's
/// schedule made constant (no warm-up, no decay) bit for bit and the metrics report its rate; another
/// schedule changes the losses; a schedule that gives NaN stops the run naming the step.
#[test]
fn the_authors_schedule_sets_each_steps_learning_rate() {
    struct Constant(f64);
    impl runtime::LrSchedule for Constant {
        fn learning_rate(&self, _step: usize) -> f64 {
            self.0
        }
    }
    struct NanAt(usize);
    impl runtime::LrSchedule for NanAt {
        fn learning_rate(&self, step: usize) -> f64 {
            if step == self.0 { f64::NAN } else { 1e-2 }
        }
    }
    let world = LocalComm::single();
    let spec = preset("tiny").unwrap();
    let train = |run: RunConfig, schedule: Option<std::sync::Arc<dyn runtime::LrSchedule>>| {
        let mut job = Job::builder(spec.clone(), &world)
            .run(run)
            .platform(piper_planner::platform::preset("local").unwrap())
            .peak_flops(1.0)
            .build()
            .unwrap();
        job.schedule = schedule;
        runtime::execute(&job, &mut Grammar::new(32, 3, 9), |_| {})
    };
    let flat = config().with_warmup_steps(0).with_min_lr_ratio(1.0).with_lr(3e-3);
    let want = train(flat, None).unwrap().metrics;
    let got = train(config(), Some(std::sync::Arc::new(Constant(3e-3)))).unwrap().metrics;
    assert_eq!(losses(&got), losses(&want));
    assert!(got.iter().all(|m| m.lr == 3e-3), "{:?}", got.iter().map(|m| m.lr).collect::<Vec<_>>());
    let other = train(config(), Some(std::sync::Arc::new(Constant(3e-2)))).unwrap().metrics;
    assert_ne!(losses(&other)[1..], losses(&want)[1..]);
    let err = train(config(), Some(std::sync::Arc::new(NanAt(2)))).err().expect("refused").to_string();
    assert!(err.contains("learning-rate schedule") && err.contains("step 3"), "{err}");
}

/// A run priced on a platform measured through this runtime says nothing; on a preset's defaults (a GPU
/// preset here: never measured through it) it names the platform and `piper calibrate`.
#[test]
fn a_run_on_an_uncalibrated_platform_says_so() {
    let world = LocalComm::single();
    let note = |platform: piper_planner::platform::Platform| {
        let job = Job::builder(preset("tiny").unwrap(), &world).platform(platform).peak_flops(1.0).build().unwrap();
        job.uncalibrated_note()
    };
    let preset_note = note(piper_planner::platform::preset("frontier").unwrap()).expect("a preset's defaults");
    assert!(preset_note.contains("frontier") && preset_note.contains("piper calibrate"), "{preset_note}");
    let calibrated = concat!(env!("CARGO_MANIFEST_DIR"), "/../benchmarks/results/platforms/local-2026-12-06T0544.toml");
    assert_eq!(note(piper_planner::platform::load(std::path::Path::new(calibrated)).unwrap()), None);
}
