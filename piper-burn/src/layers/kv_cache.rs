//! A key/value cache for generation: each attention layer keeps the keys and values of the positions a
//! sequence has seen, so a new token is computed once instead of re-running the whole sequence.
//!
//! Legend: b = batch, s = new positions, t = every position so far, h = query heads, g = key/value
//! heads, k = query/key head dim, v = value head dim.

use burn::prelude::*;

/// One attention layer's keys `[b, t, g, k]` and values `[b, t, g, v]` (rotated keys, as attended).
#[derive(Clone, Debug)]
pub struct LayerCache {
    pub k_btgk: Tensor<4>,
    pub v_btgv: Tensor<4>,
}

/// Every decoder layer's cache and the number of positions it holds.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<Option<LayerCache>>,
    pub positions: usize,
}

impl KvCache {
    /// An empty cache for a model of `layers` decoder layers.
    pub fn new(layers: usize) -> Self {
        KvCache { layers: vec![None; layers], positions: 0 }
    }
}

/// Appends the new positions' keys and values to `slot`; returns every position's.
///
/// # Shapes
/// - `k_bsgk`: `[b, s, g, k]`, `v_bsgv`: `[b, s, g, v]` → `[b, t, g, k]`, `[b, t, g, v]`
pub fn extend(slot: &mut Option<LayerCache>, k_bsgk: Tensor<4>, v_bsgv: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
    let (k_btgk, v_btgv) = match slot.take() {
        Some(c) => (Tensor::cat(vec![c.k_btgk, k_bsgk], 1), Tensor::cat(vec![c.v_btgv, v_bsgv], 1)),
        None => (k_bsgk, v_bsgv),
    };
    *slot = Some(LayerCache { k_btgk: k_btgk.clone(), v_btgv: v_btgv.clone() });
    (k_btgk, v_btgv)
}

/// Causal attention of the queries of positions `start..start + s` over the keys and values of
/// positions `0..start + s`: each query sees the keys at or before its position; query head i reads
/// key/value head i / (h / g). From an empty cache it is the training path's fused attention.
///
/// # Shapes
/// - `q_bshk`: `[b, s, h, k]`, `k_btgk`: `[b, t, g, k]`, `v_btgv`: `[b, t, g, v]` → `[b, s, h, v]`
pub fn attend(q_bshk: Tensor<4>, k_btgk: Tensor<4>, v_btgv: Tensor<4>, start: usize, scale: f32) -> Tensor<4> {
    let [b, s, h, _] = q_bshk.dims();
    let [_, t, g, k] = k_btgk.dims();
    if start == 0 {
        return kernels_cubecl::causal_attention(q_bshk, k_btgk, v_btgv, scale);
    }
    let v = v_btgv.dims()[3];
    let repeat = |x_btgx: Tensor<4>, width: usize| {
        let x = x_btgx.reshape([b, t, g, 1, width]).expand([b, t, g, h / g, width]);
        x.reshape([b, t, h, width]).swap_dims(1, 2)
    };
    let (k_bhtk, v_bhtv) = (repeat(k_btgk, k), repeat(v_btgv, v));
    let scores_bhst = q_bshk.swap_dims(1, 2).matmul(k_bhtk.swap_dims(2, 3)) * scale;
    // Key j is hidden from the query at position start + i when j > start + i.
    let hidden: Vec<bool> = (0..s).flat_map(|i| (0..t).map(move |j| j > start + i)).collect();
    let mask_st = Tensor::<2, Bool>::from_data(TensorData::new(hidden, [s, t]), &scores_bhst.device());
    let scores_bhst = scores_bhst.mask_fill(mask_st.reshape([1, 1, s, t]).expand([b, h, s, t]), f32::NEG_INFINITY);
    burn::tensor::activation::softmax(scores_bhst, 3).matmul(v_bhtv).swap_dims(1, 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// Queries of positions 3..5 over a cache of 5 positions equal rows 3..5 of causal attention over
    /// all 5 at once (grouped heads: h = 4, g = 2; v ≠ k).
    #[test]
    fn cached_rows_are_the_rows_of_full_causal_attention() {
        let device = Device::flex();
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([2, 5, 4, 8], normal, &device);
        let k = Tensor::<4>::random([2, 5, 2, 8], normal, &device);
        let v = Tensor::<4>::random([2, 5, 2, 6], normal, &device);
        let full = kernels_cubecl::causal_attention(q.clone(), k.clone(), v.clone(), 0.3);
        let rows = attend(q.narrow(1, 3, 2), k, v, 3, 0.3);
        let (a, b): (Vec<f32>, Vec<f32>) =
            (full.narrow(1, 3, 2).into_data().try_to_vec().unwrap(), rows.into_data().try_to_vec().unwrap());
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{x} vs {y}");
        }
    }
}
