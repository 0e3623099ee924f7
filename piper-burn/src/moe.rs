//! The MoE block: route, dispatch (dropless, padding-free), grouped experts, combine, plus shared
//! experts (optionally gated, Qwen2-MoE) applied to every token.
//!
//! Legend: b = batch, s = sequence, t = tokens (b · s), d = model width, e = experts, k = top-k,
//! p = permuted rows (t · k).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, softmax};

use crate::dispatch::{DispatchPlan, combine, permute};
use crate::experts::{GroupedExperts, GroupedExpertsConfig};
use crate::init::normal_linear;
use crate::losses::{load_balancing_loss, z_loss};
use crate::mlp::{Mlp, MlpConfig};
use crate::parallel::exchange::{GroupHandle, exchange_rows, with_group};
use crate::router::{Router, RouterConfig};

/// This rank's place in an expert group: it holds experts `[rank · E/size, (rank + 1) · E/size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertGroup {
    pub handle: GroupHandle,
    pub rank: usize,
    pub size: usize,
}

#[derive(Config, Debug)]
pub struct MoeBlockConfig {
    pub router: RouterConfig,
    /// Width of one routed expert.
    pub expert_ffn: usize,
    /// Shared experts (merged into one MLP of `num_shared · shared_ffn`).
    #[config(default = 0)]
    pub num_shared: usize,
    #[config(default = 0)]
    pub shared_ffn: usize,
    /// A sigmoid gate `d → 1` on the shared experts' output (Qwen2-MoE).
    #[config(default = false)]
    pub shared_gate: bool,
}

#[derive(Module, Debug)]
pub struct MoeBlock {
    pub router: Router,
    pub experts: GroupedExperts,
    pub shared: Option<Mlp>,
    pub shared_gate: Option<Linear>,
    /// Expert parallelism: `None` when this rank holds every expert.
    #[module(skip)]
    pub expert_group: Option<ExpertGroup>,
}

/// Per-layer routing statistics of one forward pass.
#[derive(Debug, Clone)]
pub struct MoeStats {
    /// Load-balancing auxiliary loss (softmax over all experts).
    pub aux_loss: Tensor<1>,
    /// Router z-loss.
    pub z_loss: Tensor<1>,
    /// Token copies per expert.
    pub tokens_per_expert: Vec<usize>,
    /// Router logits `[t, e]`.
    pub router_logits_te: Tensor<2>,
}

impl MoeStats {
    /// Max / mean tokens per expert (1 = balanced).
    pub fn imbalance(&self) -> f64 {
        let n = self.tokens_per_expert.len().max(1) as f64;
        let mean = self.tokens_per_expert.iter().sum::<usize>() as f64 / n;
        if mean == 0.0 { 1.0 } else { *self.tokens_per_expert.iter().max().unwrap_or(&0) as f64 / mean }
    }
}

impl MoeBlockConfig {
    pub fn init(&self, device: &Device) -> MoeBlock {
        let d = self.router.d_model;
        MoeBlock {
            router: self.router.init(device),
            experts: GroupedExpertsConfig::new(self.router.num_experts, d, self.expert_ffn).init(device),
            shared: (self.num_shared > 0).then(|| MlpConfig::new(d, self.num_shared * self.shared_ffn).init(device)),
            shared_gate: (self.num_shared > 0 && self.shared_gate)
                .then(|| normal_linear(LinearConfig::new(d, 1), device)),
            expert_group: None,
        }
    }
}

impl MoeBlock {
    /// Keeps only this rank's experts (`E / size` of them) and routes other experts' rows through the
    /// group's all-to-all.
    pub fn into_expert_parallel(mut self, group: ExpertGroup) -> Self {
        let e = self.router.num_experts;
        assert!(group.size > 0 && e.is_multiple_of(group.size), "EP = {} must divide the {e} experts", group.size);
        let local = e / group.size;
        let start = group.rank * local;
        let shard = |p: burn::module::Param<Tensor<3>>| {
            burn::module::Param::from_tensor(p.val().narrow(0, start, local).detach())
        };
        self.experts.w_gate_edf = shard(self.experts.w_gate_edf);
        self.experts.w_up_edf = shard(self.experts.w_up_edf);
        self.experts.w_down_efd = shard(self.experts.w_down_efd);
        self.expert_group = Some(group);
        self
    }

    /// Dispatch to the experts' ranks, run the local experts, combine back.
    ///
    /// # Shapes
    /// - `x_pd`: rows sorted by global expert, `counts_e` per expert → `[p, d]` in the same order
    fn expert_parallel(&self, x_pd: Tensor<2>, counts_e: &[usize], group: ExpertGroup) -> Tensor<2> {
        let (n, local) = (group.size, counts_e.len() / group.size);
        // Rows per (destination rank, its local expert), and what every source sends here.
        let send_counts: Vec<usize> = (0..n).map(|r| counts_e[r * local..(r + 1) * local].iter().sum()).collect();
        let counts_u64: Vec<u64> = counts_e.iter().map(|c| *c as u64).collect();
        let (incoming, _) = with_group(group.handle, |comm, _, _| {
            piper_comm::collectives::all_to_all_v(comm, &counts_u64, &vec![local; n], "expert counts exchange")
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let from: Vec<Vec<usize>> = incoming.chunks(local).map(|c| c.iter().map(|x| *x as usize).collect()).collect();
        let recv_counts: Vec<usize> = from.iter().map(|c| c.iter().sum()).collect();
        let x_qd = exchange_rows(x_pd, group.handle, &send_counts, &recv_counts, "expert dispatch all-to-all");
        // Received rows are grouped by source, then local expert; the experts want them by expert.
        let source_start: Vec<usize> = recv_counts
            .iter()
            .scan(0, |a, c| {
                let s = *a;
                *a += c;
                Some(s)
            })
            .collect();
        let mut order: Vec<i64> = Vec::with_capacity(recv_counts.iter().sum());
        for j in 0..local {
            for s in 0..n {
                let start = source_start[s] + from[s][..j].iter().sum::<usize>();
                order.extend((start..start + from[s][j]).map(|i| i as i64));
            }
        }
        let mut inverse = vec![0i64; order.len()];
        for (pos, &row) in order.iter().enumerate() {
            inverse[row as usize] = pos as i64;
        }
        let device = x_qd.device();
        let q = order.len();
        let by_expert = x_qd.select(0, Tensor::<1, Int>::from_data(TensorData::new(order, [q]), &device));
        let local_counts: Vec<usize> = (0..local).map(|j| from.iter().map(|c| c[j]).sum()).collect();
        let y_sorted = self.experts.forward(by_expert, &local_counts);
        let y_qd = y_sorted.select(0, Tensor::<1, Int>::from_data(TensorData::new(inverse, [q]), &device));
        exchange_rows(y_qd, group.handle, &recv_counts, &send_counts, "expert combine all-to-all")
    }

    /// # Shapes
    /// - `x_bsd`: `[b, s, d]` → `[b, s, d]`
    pub fn forward(&self, x_bsd: Tensor<3>) -> (Tensor<3>, MoeStats) {
        let [b, s, d] = x_bsd.dims();
        let t = b * s;
        let x_td = x_bsd.reshape([t, d]);
        let routing = self.router.forward(x_td.clone());
        let num_experts = self.router.num_experts;
        let plan = DispatchPlan::new(&routing.topk_idx_tk, num_experts);
        let x_pd = permute(x_td.clone(), &plan);
        let y_pd = match self.expert_group {
            None => self.experts.forward(x_pd, &plan.counts_e),
            Some(group) => self.expert_parallel(x_pd, &plan.counts_e, group),
        };
        let mut out_td = combine(y_pd, routing.topk_w_tk.clone(), &plan);
        if let Some(shared) = &self.shared {
            let mut shared_td = shared.forward(x_td.clone());
            if let Some(gate) = &self.shared_gate {
                shared_td = shared_td * sigmoid(gate.forward(x_td));
            }
            out_td = out_td + shared_td;
        }
        let probs_te = softmax(routing.logits_te.clone(), 1);
        let stats = MoeStats {
            aux_loss: load_balancing_loss(probs_te, routing.topk_idx_tk),
            z_loss: z_loss(routing.logits_te.clone()),
            tokens_per_expert: plan.counts_e,
            router_logits_te: routing.logits_te,
        };
        (out_td.reshape([b, s, d]), stats)
    }
}
