//! A start-up probe of the device's reductions over a micro-batch's tokens.
//!
//! Burn 0.22 / CubeCL 0.11 on wgpu through lavapipe (Mesa's software Vulkan, 65 535 workgroups per
//! dispatch dimension) sum only the first 65 532 entries of a reduced axis: `ones([65 533, 3]).sum_dim(0)`
//! gives 65 532, `ones([100 003]).mean()` 0.655, `ones([65 533, 300]).sum()` 300 less than it should
//! (measured 2026-12-02; 65 532 and below are right). A training step reduces over the micro-batch's
//! tokens — the loss's mean, the load-balancing loss's expert fractions and mean probabilities, the norm
//! weights' gradients — so past that many tokens it would train on wrong numbers without a sign. Whether a
//! real GPU's driver does the same is not known (none has been tried), so the runtime asks the device itself:
//! [`check_token_reductions`] sums ones over an axis as long as the micro-batch and refuses the run, naming
//! the fix, when the device gets it wrong. On Flex the probe is a few microseconds.

use burn::prelude::*;

use super::error::{Result, RuntimeError, host_f32};

/// Largest count a sum of ones holds exactly in f32 (2^24): longer probes would round on any device.
const EXACT_F32: usize = 1 << 24;

/// `Ok` when `device` sums `tokens` rows (per column, and all of them) exactly; otherwise an error naming
/// the flags that shrink a micro-batch.
pub fn check_token_reductions(device: &Device, tokens: usize) -> Result<()> {
    let n = tokens.min(EXACT_F32);
    if n == 0 {
        return Ok(());
    }
    let read = |t: Tensor<1>| host_f32(t, "reduction probe");
    let mut got = read(Tensor::<2>::ones([n, 2], device).sum_dim(0).reshape([2]))?;
    got.extend(read(Tensor::<1>::ones([n], device).sum().reshape([1]))?);
    got.extend(read(Tensor::<1>::ones([n], device).mean().reshape([1]))?.iter().map(|m| m * n as f32));
    let want = n as f32;
    // Exact in f32 for any summation order; NaN is not within 0.5 either.
    let right = |g: f32| (g - want).abs() <= 0.5;
    if let Some(bad) = got.iter().find(|g| !right(**g)) {
        return Err(RuntimeError::WrongReductions { rows: n, got: *bad, tokens });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flex_sums_long_axes_exactly() {
        let device = Device::flex();
        for tokens in [1, 65_532, 65_533, 100_003] {
            assert!(check_token_reductions(&device, tokens).is_ok(), "{tokens} tokens");
        }
        assert!(check_token_reductions(&device, 0).is_ok());
    }
}
