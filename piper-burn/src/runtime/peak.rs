//! The peak FLOP/s the measured MFU refers to: the dense f32 GEMM rate of the device, timed at start.

use std::time::Instant;

use burn::prelude::*;

/// Dense f32 GEMM rate of `device` (FLOP/s), the best of a few runs of 8 back-to-back 1024³ products:
/// the peak MFU refers to. Each run ends by reading one element of the last product back to the host,
/// so on asynchronous backends (wgpu) the time covers the work, not only its launch.
pub fn measure_peak_flops(device: &Device) -> f64 {
    let (n, reps) = (1024usize, 8usize);
    let a = Tensor::<2>::random([n, n], burn::tensor::Distribution::Default, device);
    let b = Tensor::<2>::random([n, n], burn::tensor::Distribution::Default, device);
    let wait = |c: Tensor<2>| -> f32 { c.slice([0..1, 0..1]).into_data().try_to_vec::<f32>().map_or(0.0, |v| v[0]) };
    wait(a.clone().matmul(b.clone()));
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let mut last = a.clone().matmul(b.clone());
            for _ in 1..reps {
                last = a.clone().matmul(b.clone());
            }
            wait(last);
            2.0 * (reps * n * n * n) as f64 / t.elapsed().as_secs_f64()
        })
        .max_by(f64::total_cmp)
        .unwrap_or(f64::NAN)
}
