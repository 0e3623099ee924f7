//! The local permute, dropless and padding-free: the `t · k` (token, expert) copies sorted by expert
//! position with counts, gathered into one buffer of exactly `t · k` rows; and the unpermute, the
//! weighted sum of each token's rows back into tokens.
//!
//! Legend: t = tokens, d = model width, k = experts per token, e = experts, p = permuted rows (t · k).

use burn::prelude::*;
use kernels_cubecl::RowMap;

/// Where each permuted row comes from. Built on the host (the counts decide the expert GEMM shapes).
#[derive(Debug, Clone)]
pub struct PermutePlan {
    /// Token, slot and inverse maps of the permuted rows (what the permute/unpermute kernels read).
    pub map: RowMap,
    /// Rows per expert, in expert order (sums to p; zeros allowed).
    pub counts_e: Vec<usize>,
}

impl PermutePlan {
    /// Sorts the copies by expert (stable: token order inside an expert).
    ///
    /// # Shapes
    /// - `topk_idx_tk`: `[t, k]`
    pub fn new(topk_idx_tk: &Tensor<2, Int>, num_experts: usize) -> Self {
        Self::with_positions(topk_idx_tk, num_experts, None)
    }

    /// Sorts the copies by `positions[expert]` (an expert placement's order; `None`: by expert
    /// id), stably. `counts_e` is then per position.
    ///
    /// # Shapes
    /// - `topk_idx_tk`: `[t, k]`
    pub fn with_positions(topk_idx_tk: &Tensor<2, Int>, num_experts: usize, positions: Option<&[usize]>) -> Self {
        let [t, k] = topk_idx_tk.dims();
        let mut experts: Vec<i64> =
            topk_idx_tk.to_data().convert::<i64>().try_to_vec::<i64>().expect("int tensor data");
        if let Some(pos) = positions {
            for x in experts.iter_mut() {
                *x = pos[*x as usize] as i64;
            }
        }
        let mut counts_e = vec![0usize; num_experts];
        for &x in &experts {
            counts_e[x as usize] += 1;
        }
        let mut next: Vec<usize> = counts_e
            .iter()
            .scan(0, |acc, c| {
                let start = *acc;
                *acc += c;
                Some(start)
            })
            .collect();
        let mut slot_p = vec![0usize; experts.len()];
        for (flat, &x) in experts.iter().enumerate() {
            slot_p[next[x as usize]] = flat;
            next[x as usize] += 1;
        }
        let map = RowMap::from_slots(&slot_p, t, k, &topk_idx_tk.device()).expect("a stable sort is a permutation");
        PermutePlan { map, counts_e }
    }

    pub fn num_rows(&self) -> usize {
        self.counts_e.iter().sum()
    }
}

/// Gathers each copy's token row: `x_pd[i] = x_td[token_p[i]]`.
pub fn permute(x_td: Tensor<2>, plan: &PermutePlan) -> Tensor<2> {
    kernels_cubecl::permute_rows(x_td, &plan.map)
}

/// The weighted unpermute: `out_td[t] = Σ_j topk_w_tk[t, j] · y_pd[row of (t, j)]`.
pub fn unpermute(y_pd: Tensor<2>, topk_w_tk: Tensor<2>, plan: &PermutePlan) -> Tensor<2> {
    kernels_cubecl::combine_rows(y_pd, topk_w_tk, &plan.map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: Vec<i64>, shape: [usize; 2], device: &Device) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(v, shape), device)
    }

    #[test]
    fn plan_sorts_by_expert_and_counts_zero_experts() {
        let device = Device::flex();
        // 3 tokens, top-2, 4 experts; expert 3 gets nothing.
        let plan = PermutePlan::new(&ints(vec![2, 0, 0, 1, 2, 1], [3, 2], &device), 4);
        assert_eq!(plan.counts_e, vec![2, 2, 2, 0]);
        let slots: Vec<i64> = plan.map.slot_p.to_data().convert::<i64>().try_to_vec().unwrap();
        assert_eq!(slots, vec![1, 2, 3, 5, 0, 4]);
        let tokens: Vec<i64> = plan.map.token_p.to_data().convert::<i64>().try_to_vec().unwrap();
        assert_eq!(tokens, vec![0, 1, 1, 2, 0, 2]);
    }

    #[test]
    fn permute_then_unpermute_with_unit_weights_is_k_times_identity_and_so_is_its_gradient() {
        let device = Device::flex().autodiff();
        let x = Tensor::<2>::random([5, 3], burn::tensor::Distribution::Normal(0.0, 1.0), &device).require_grad();
        let idx = ints(vec![0, 3, 3, 1, 2, 0, 1, 1, 0, 2], [5, 2], &device);
        let plan = PermutePlan::new(&idx, 4);
        let w = Tensor::<2>::ones([5, 2], &device) / 2.0;
        let y = unpermute(permute(x.clone(), &plan), w, &plan);
        let xv: Vec<f32> = x.to_data().try_to_vec().unwrap();
        let yv: Vec<f32> = y.to_data().try_to_vec().unwrap();
        for (a, b) in xv.iter().zip(&yv) {
            assert!((a - b).abs() < 1e-6);
        }
        let grads = y.sum().backward();
        let g: Vec<f32> = x.grad(&grads).unwrap().to_data().try_to_vec().unwrap();
        assert!(g.iter().all(|v| (v - 1.0).abs() < 1e-6), "{g:?}");
    }

    #[test]
    fn positions_reorder_the_rows_and_their_counts() {
        let device = Device::flex();
        // Expert 2 first, then 0, then 1 (a placement that put expert 2 on rank 0).
        let idx = ints(vec![2, 0, 0, 1, 2, 1], [3, 2], &device);
        let plan = PermutePlan::with_positions(&idx, 3, Some(&[1, 2, 0]));
        assert_eq!(plan.counts_e, vec![2, 2, 2]);
        let slots: Vec<i64> = plan.map.slot_p.to_data().convert::<i64>().try_to_vec().unwrap();
        assert_eq!(slots, vec![0, 4, 1, 2, 3, 5]);
    }

    #[test]
    fn all_tokens_to_one_expert() {
        let device = Device::flex();
        let plan = PermutePlan::new(&ints(vec![2; 8], [8, 1], &device), 4);
        assert_eq!(plan.counts_e, vec![0, 0, 8, 0]);
    }
}
