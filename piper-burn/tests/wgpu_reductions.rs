//! The runtime's reduction probe on wgpu (lavapipe in CI): its verdict on a long micro-batch agrees with
//! the device's own reduction of another shape, and a refusal names the flags that fix it. Needs the
//! `wgpu` feature; CI runs it as the root package's test target of the same name (`.ci/run`).

use burn::prelude::*;
use piper_burn::runtime::reductions::check_token_reductions;

#[test]
fn the_probe_agrees_with_the_device() {
    let device = Device::wgpu(Default::default());
    for tokens in [4096usize, 70_000] {
        let direct: Vec<f32> = Tensor::<2>::ones([tokens, 3], &device)
            .sum_dim(0)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        let right = direct.iter().all(|s| (*s - tokens as f32).abs() <= 0.5);
        let verdict = check_token_reductions(&device, tokens);
        assert_eq!(verdict.is_ok(), right, "{tokens} tokens: device summed {direct:?}, probe said {verdict:?}");
        if let Err(e) = verdict {
            let e = e.to_string();
            assert!(e.contains("--micro-batches") && e.contains("--backend flex"), "{e}");
        }
    }
}
