//! Every fast path against its `*_reference` twin: outputs and the gradient of every input.

use burn::prelude::*;
use burn::tensor::Distribution;
use kernels_cubecl::{grouped_swiglu, grouped_swiglu_reference};

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().unwrap()
}

fn close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}");
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs().max(1.0)).fold(0.0f32, f32::max);
    assert!(worst < 1e-5, "{what}: worst difference {worst:e}");
}

fn grouped_case(counts: &[usize]) {
    let device = Device::flex().autodiff();
    device.seed(counts.len() as u64);
    let (e, d, f) = (counts.len(), 12, 20);
    let p: usize = counts.iter().sum();
    let x = Tensor::<2>::random([p, d], Distribution::Normal(0.0, 1.0), &device);
    let wg = Tensor::<3>::random([e, d, f], Distribution::Normal(0.0, 0.3), &device);
    let wu = Tensor::<3>::random([e, d, f], Distribution::Normal(0.0, 0.3), &device);
    let wd = Tensor::<3>::random([e, f, d], Distribution::Normal(0.0, 0.3), &device);
    let probe = Tensor::<2>::random([p, d], Distribution::Normal(0.0, 1.0), &device);
    let run = |fast: bool| {
        let (x, wg, wu, wd) =
            (x.clone().require_grad(), wg.clone().require_grad(), wu.clone().require_grad(), wd.clone().require_grad());
        let y = if fast {
            grouped_swiglu(x.clone(), wg.clone(), wu.clone(), wd.clone(), counts)
        } else {
            grouped_swiglu_reference(x.clone(), wg.clone(), wu.clone(), wd.clone(), counts)
        };
        let grads = (y.clone() * probe.clone()).sum().backward();
        (
            values(y),
            values(x.grad(&grads).unwrap()),
            values(wg.grad(&grads).unwrap()),
            values(wu.grad(&grads).unwrap()),
            values(wd.grad(&grads).unwrap()),
        )
    };
    let (fast, reference) = (run(true), run(false));
    close("output", &fast.0, &reference.0);
    close("grad x", &fast.1, &reference.1);
    close("grad w_gate", &fast.2, &reference.2);
    close("grad w_up", &fast.3, &reference.3);
    close("grad w_down", &fast.4, &reference.4);
}

#[test]
fn grouped_swiglu_matches_reference_with_uneven_and_zero_counts() {
    grouped_case(&[3, 0, 5, 1]);
    grouped_case(&[0, 0, 9, 0]);
    grouped_case(&[2, 2, 2, 2, 2, 2, 2, 2]);
}

#[test]
fn grouped_swiglu_without_gradients_matches_too() {
    let device = Device::flex();
    let x = Tensor::<2>::random([7, 4], Distribution::Normal(0.0, 1.0), &device);
    let w = |a, b| Tensor::<3>::random([3, a, b], Distribution::Normal(0.0, 0.5), &device);
    let (wg, wu, wd) = (w(4, 6), w(4, 6), w(6, 4));
    let counts = [4, 0, 3];
    close(
        "inference output",
        &values(grouped_swiglu(x.clone(), wg.clone(), wu.clone(), wd.clone(), &counts)),
        &values(grouped_swiglu_reference(x, wg, wu, wd, &counts)),
    );
}
