//! Rotary position embedding in the Hugging Face convention (`rotate_half`: the first and second halves
//! of each head are the two coordinates of a pair).
//!
//! Legend: b = batch, s = sequence, h = heads, k = head dim (`x_bshk`).

use burn::prelude::*;

/// Rotary embedding settings.
#[derive(Config, Debug)]
pub struct RotaryEmbeddingConfig {
    /// Dimension of one head (even).
    pub head_dim: usize,
    /// Base of the frequencies.
    #[config(default = 10000.0)]
    pub theta: f64,
}

/// Rotary embedding; holds no parameters.
#[derive(Module, Debug)]
pub struct RotaryEmbedding {
    pub head_dim: usize,
    pub theta: f64,
}

impl RotaryEmbeddingConfig {
    pub fn init(&self) -> RotaryEmbedding {
        assert!(self.head_dim.is_multiple_of(2), "rotary embedding needs an even head_dim, got {}", self.head_dim);
        RotaryEmbedding { head_dim: self.head_dim, theta: self.theta }
    }
}

impl RotaryEmbedding {
    /// cos and sin tables, `[s, k]`.
    pub fn tables(&self, seq_len: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
        self.tables_at(0, seq_len, device)
    }

    /// cos and sin tables of positions `start..start + seq_len`, `[s, k]`.
    pub fn tables_at(&self, start: usize, seq_len: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
        let half = self.head_dim / 2;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| (1.0 / self.theta.powf(2.0 * i as f64 / self.head_dim as f64)) as f32).collect();
        let inv_freq_1k = Tensor::<1>::from_data(TensorData::new(inv_freq, [half]), device).reshape([1, half]);
        let positions = start as i64..(start + seq_len) as i64;
        let pos_s1 = Tensor::<1, Int>::arange(positions, device).float().reshape([seq_len, 1]);
        let freqs_sk = pos_s1.matmul(inv_freq_1k);
        let emb_sk = Tensor::cat(vec![freqs_sk.clone(), freqs_sk], 1);
        (emb_sk.clone().cos(), emb_sk.sin())
    }

    /// Rotates queries or keys (one fused pass: [`kernels_cubecl::rotary`]).
    ///
    /// # Shapes
    /// - `x_bshk`: `[b, s, h, k]` → `[b, s, h, k]`
    pub fn forward(&self, x_bshk: Tensor<4>) -> Tensor<4> {
        let s = x_bshk.dims()[1];
        let (cos_sk, sin_sk) = self.tables(s, &x_bshk.device());
        kernels_cubecl::rotary(x_bshk, cos_sk, sin_sk)
    }

    /// Rotates queries and keys of one sequence length with one pair of tables.
    ///
    /// # Shapes
    /// - `q_bshk`: `[b, s, h, k]`, `k_bsgk`: `[b, s, g, k]` → the same shapes
    pub fn forward_qk(&self, q_bshk: Tensor<4>, k_bsgk: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        self.forward_qk_at(q_bshk, k_bsgk, 0)
    }

    /// Rotates queries and keys of positions `start..start + s` (generation with a key/value cache).
    ///
    /// # Shapes
    /// - `q_bshk`: `[b, s, h, k]`, `k_bsgk`: `[b, s, g, k]` → the same shapes
    pub fn forward_qk_at(&self, q_bshk: Tensor<4>, k_bsgk: Tensor<4>, start: usize) -> (Tensor<4>, Tensor<4>) {
        let s = q_bshk.dims()[1];
        let (cos_sk, sin_sk) = self.tables_at(start, s, &q_bshk.device());
        (kernels_cubecl::rotary(q_bshk, cos_sk.clone(), sin_sk.clone()), kernels_cubecl::rotary(k_bsgk, cos_sk, sin_sk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norms_and_is_identity_at_position_zero() {
        let device = Device::flex();
        let rope = RotaryEmbeddingConfig::new(8).init();
        let x = Tensor::<4>::random([1, 5, 2, 8], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let y = rope.forward(x.clone());
        let nx: Vec<f32> = x.clone().powi_scalar(2).sum_dim(3).into_data().try_to_vec().unwrap();
        let ny: Vec<f32> = y.clone().powi_scalar(2).sum_dim(3).into_data().try_to_vec().unwrap();
        for (a, b) in nx.iter().zip(&ny) {
            assert!((a - b).abs() < 1e-4 * a.max(1.0));
        }
        let x0: Vec<f32> = x.narrow(1, 0, 1).into_data().try_to_vec().unwrap();
        let y0: Vec<f32> = y.narrow(1, 0, 1).into_data().try_to_vec().unwrap();
        assert_eq!(x0, y0);
    }
}
