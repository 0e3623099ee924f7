//! Every fast path against its `*_reference` twin: outputs and the gradient of every input.
//!
//! The cases run on Flex (CPU: the extension's primitive-op bodies and hand-written backwards) and,
//! with `--features wgpu`, on the CubeCL kernels through wgpu (lavapipe in CI). The reference always
//! runs on Flex with Burn's own autodiff, from the same data.

use burn::prelude::*;
use burn::tensor::Distribution;
use kernels_cubecl::*;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().unwrap()
}

fn int_values<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_to_vec().unwrap()
}

/// Relative difference per element, against at least 1 and 1% of the largest reference value: sums of
/// hundreds of products cancel to values far below their terms, whose round-off then dominates.
fn close(what: &str, a: &[f32], b: &[f32]) {
    close_within(what, a, b, 2e-5);
}

/// [`close`] with a bound of `tolerance`.
fn close_within(what: &str, a: &[f32], b: &[f32], tolerance: f32) {
    assert_eq!(a.len(), b.len(), "{what}");
    let floor = b.iter().fold(1.0f32, |m, y| m.max(0.01 * y.abs()));
    // NaN anywhere (or a NaN floor) fails: `max_by(total_cmp)` keeps NaN, and NaN < 2e-5 is false.
    assert!(floor.is_finite(), "{what}: the reference has a non-finite value");
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs().max(floor)).max_by(f32::total_cmp).unwrap_or(0.0);
    assert!(worst < tolerance, "{what}: worst difference {worst:e}");
}

/// Random data made on the CPU, so both sides see the same numbers.
fn random<const D: usize>(shape: [usize; D], std: f64, seed: u64) -> TensorData {
    let cpu = Device::flex();
    cpu.seed(seed);
    Tensor::<D>::random(shape, Distribution::Normal(0.0, std), &cpu).into_data()
}

fn reference_device() -> Device {
    Device::flex().autodiff()
}

fn swiglu_case(device: &Device, rows: usize, cols: usize) {
    let shape = [rows, cols];
    let (g, u, probe) = (random(shape, 2.0, 1), random(shape, 1.0, 2), random(shape, 1.0, 3));
    let run = |dev: &Device, fast: bool| {
        let g = Tensor::<2>::from_data(g.clone(), dev).require_grad();
        let u = Tensor::<2>::from_data(u.clone(), dev).require_grad();
        let h = if fast { swiglu(g.clone(), u.clone()) } else { swiglu_reference(g.clone(), u.clone()) };
        let grads = (h.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(h), values(g.grad(&grads).unwrap()), values(u.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close("swiglu", &fast.0, &reference.0);
    close("swiglu grad gate", &fast.1, &reference.1);
    close("swiglu grad up", &fast.2, &reference.2);
}

/// The recomputing down projection against its reference and against the two ops it fuses
/// (`linear(swiglu(g, u), w)`, which holds the product): output and every gradient — bit for bit when
/// `exact` (on the CPU; a GPU's autotuned products may pick another kernel from one call to the next).
fn swiglu_down_case(device: &Device, [b, s, f, n]: [usize; 4], exact: bool) {
    let (g, u, w) = (random([b, s, f], 2.0, 91), random([b, s, f], 1.0, 92), random([f, n], 0.3, 93));
    let probe = random([b, s, n], 1.0, 94);
    let run = |dev: &Device, how: usize| {
        let g = Tensor::<3>::from_data(g.clone(), dev).require_grad();
        let u = Tensor::<3>::from_data(u.clone(), dev).require_grad();
        let w = Tensor::<2>::from_data(w.clone(), dev).require_grad();
        let y = match how {
            0 => swiglu_down(g.clone(), u.clone(), w.clone()),
            1 => linear(swiglu(g.clone(), u.clone()), w.clone(), None),
            _ => swiglu_down_reference(g.clone(), u.clone(), w.clone()),
        };
        let grads = (y.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        let grad = |t: Tensor<3>| values(t.grad(&grads).unwrap());
        [values(y), grad(g), grad(u), values(w.grad(&grads).unwrap())]
    };
    let (fast, held, reference) = (run(device, 0), run(device, 1), run(&reference_device(), 2));
    let what = format!("swiglu_down {b}x{s}x{f}->{n}");
    for (i, part) in ["output", "grad gate", "grad up", "grad w_down"].iter().enumerate() {
        close(&format!("{what} {part}"), &fast[i], &reference[i]);
        close(&format!("{what} {part} vs linear(swiglu)"), &fast[i], &held[i]);
        let same_bits =
            |x: &[f32], y: &[f32]| x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(!exact || same_bits(&fast[i], &held[i]), "{what} {part}: differs from linear(swiglu(g, u))");
    }
}

/// Token t's k distinct experts, stably sorted by expert → the slot of each permuted row.
fn routing(t: usize, k: usize, e: usize, seed: u64) -> Vec<usize> {
    routing_with_counts(t, k, e, seed).0
}

/// [`routing`] and the rows of each expert.
fn routing_with_counts(t: usize, k: usize, e: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut experts = Vec::new();
    for _ in 0..t {
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < k {
            let x = next() % e;
            if !picked.contains(&x) {
                picked.push(x);
            }
        }
        experts.extend(picked);
    }
    let mut slots: Vec<usize> = (0..t * k).collect();
    slots.sort_by_key(|&s| experts[s]);
    let mut counts = vec![0; e];
    experts.iter().for_each(|&x| counts[x] += 1);
    (slots, counts)
}

fn permute_combine_case(device: &Device, t: usize, k: usize, e: usize) {
    permute_combine_case_sized(device, t, k, e, 19);
}

fn permute_combine_case_sized(device: &Device, t: usize, k: usize, e: usize, d: usize) {
    let slots = routing(t, k, e, (t * 31 + k) as u64);
    let (x, probe_pd) = (random([t, d], 1.0, 4), random([t * k, d], 1.0, 5));
    let (y, w, probe_td) = (random([t * k, d], 1.0, 6), random([t, k], 1.0, 7), random([t, d], 1.0, 8));
    // Permute.
    let run = |dev: &Device, fast: bool| {
        let map = RowMap::from_slots(&slots, t, k, dev).unwrap();
        let x = Tensor::<2>::from_data(x.clone(), dev).require_grad();
        let out =
            if fast { permute_rows(x.clone(), &map) } else { permute_rows_reference(x.clone(), map.token_p.clone()) };
        let grads = (out.clone() * Tensor::from_data(probe_pd.clone(), dev)).sum().backward();
        (values(out), values(x.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close("permute", &fast.0, &reference.0);
    close("permute grad x", &fast.1, &reference.1);
    // Combine.
    let run = |dev: &Device, fast: bool| {
        let map = RowMap::from_slots(&slots, t, k, dev).unwrap();
        let y = Tensor::<2>::from_data(y.clone(), dev).require_grad();
        let w = Tensor::<2>::from_data(w.clone(), dev).require_grad();
        let out = if fast {
            combine_rows(y.clone(), w.clone(), &map)
        } else {
            let w_p = w.clone().reshape([t * k]).select(0, map.slot_p.clone());
            combine_rows_reference(y.clone(), w_p, map.token_p.clone(), t)
        };
        let grads = (out.clone() * Tensor::from_data(probe_td.clone(), dev)).sum().backward();
        (values(out), values(y.grad(&grads).unwrap()), values(w.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close("combine", &fast.0, &reference.0);
    close("combine grad y", &fast.1, &reference.1);
    close("combine grad w", &fast.2, &reference.2);
}

fn topk_case(device: &Device, k: usize, renormalize: bool) {
    topk_case_sized(device, 11, 8, k, renormalize);
}

fn topk_case_sized(device: &Device, t: usize, e: usize, k: usize, renormalize: bool) {
    let (logits, probe) = (random([t, e], 2.0, 9 + k as u64), random([t, k], 1.0, 10));
    let run = |dev: &Device, fast: bool| {
        let l = Tensor::<2>::from_data(logits.clone(), dev).require_grad();
        let (w, idx) = if fast {
            topk_softmax(l.clone(), k, renormalize)
        } else {
            topk_softmax_reference(l.clone(), k, renormalize)
        };
        let grads = (w.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(w), int_values(idx), values(l.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("top-{k} of {e} softmax over {t} tokens (renormalize {renormalize})");
    assert_eq!(fast.1, reference.1, "{what}: experts picked");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad logits"), &fast.2, &reference.2);
}

/// Sigmoid top-k with a selection bias: picks, weights and the gradient of the logits (none to the bias).
fn topk_sigmoid_case(device: &Device, t: usize, e: usize, k: usize, renormalize: bool) {
    let (logits, probe) = (random([t, e], 2.0, 30 + k as u64), random([t, k], 1.0, 31));
    // A bias large enough to change some picks (sigmoid scores are in (0, 1)).
    let bias = random([e], 0.3, 32);
    let run = |dev: &Device, fast: bool| {
        let l = Tensor::<2>::from_data(logits.clone(), dev).require_grad();
        let b = Tensor::<1>::from_data(bias.clone(), dev);
        let (w, idx) = if fast {
            topk_sigmoid(l.clone(), b, k, renormalize)
        } else {
            topk_sigmoid_reference(l.clone(), b, k, renormalize)
        };
        let grads = (w.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(w), int_values(idx), values(l.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("sigmoid top-{k} of {e} over {t} tokens (renormalize {renormalize})");
    assert_eq!(fast.1, reference.1, "{what}: experts picked");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad logits"), &fast.2, &reference.2);
}

fn grouped_case(device: &Device, counts: &[usize]) {
    grouped_case_sized(device, counts, 12, 20);
}

fn grouped_case_sized(device: &Device, counts: &[usize], d: usize, f: usize) {
    let e = counts.len();
    let p: usize = counts.iter().sum();
    let seed = counts.len() as u64 * 100;
    let x = random([p, d], 1.0, seed);
    let (wg, wu, wd) =
        (random([e, d, f], 0.3, seed + 1), random([e, d, f], 0.3, seed + 2), random([e, f, d], 0.3, seed + 3));
    let probe = random([p, d], 1.0, seed + 4);
    let run = |dev: &Device, fast: bool| {
        let x = Tensor::<2>::from_data(x.clone(), dev).require_grad();
        let wg = Tensor::<3>::from_data(wg.clone(), dev).require_grad();
        let wu = Tensor::<3>::from_data(wu.clone(), dev).require_grad();
        let wd = Tensor::<3>::from_data(wd.clone(), dev).require_grad();
        let y = if fast {
            grouped_swiglu(x.clone(), wg.clone(), wu.clone(), wd.clone(), counts)
        } else {
            grouped_swiglu_reference(x.clone(), wg.clone(), wu.clone(), wd.clone(), counts)
        };
        let grads = (y.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (
            values(y),
            values(x.grad(&grads).unwrap()),
            values(wg.grad(&grads).unwrap()),
            values(wu.grad(&grads).unwrap()),
            values(wd.grad(&grads).unwrap()),
        )
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close("grouped output", &fast.0, &reference.0);
    close("grouped grad x", &fast.1, &reference.1);
    close("grouped grad w_gate", &fast.2, &reference.2);
    close("grouped grad w_up", &fast.3, &reference.3);
    close("grouped grad w_down", &fast.4, &reference.4);
}

/// Dispatch, experts and combine as one operation, against the three reference twins composed.
fn routed_case(device: &Device, [t, k, e, d, f]: [usize; 5]) {
    let (slots, counts) = routing_with_counts(t, k, e, (t * 7 + e) as u64);
    let seed = (t * 1000 + e) as u64;
    let (x, probe) = (random([t, d], 1.0, seed), random([t, d], 1.0, seed + 2));
    // Signed powers of two: scaling by them is exact, so a fast path that applies the combine weight
    // after a sum (as Flex's does, to `dout · Wdᵀ`) rounds exactly as the reference, which applies it
    // before — any difference left is an error, not a reordering (with weights such as 0.37 the two
    // orders differ by up to 3e-5 where the k rows of a token cancel).
    let w = (0..t * k).map(|i| [0.5f32, -2.0, 0.25, 1.0, -0.125, 4.0, -1.0][(i * 5 + seed as usize) % 7]);
    let w = TensorData::new(w.collect::<Vec<f32>>(), [t, k]);
    let (wg, wu, wd) =
        (random([e, d, f], 0.3, seed + 3), random([e, d, f], 0.3, seed + 4), random([e, f, d], 0.3, seed + 5));
    let run = |dev: &Device, fast: bool| {
        let map = RowMap::from_slots(&slots, t, k, dev).unwrap();
        let x = Tensor::<2>::from_data(x.clone(), dev).require_grad();
        let w = Tensor::<2>::from_data(w.clone(), dev).require_grad();
        let wg = Tensor::<3>::from_data(wg.clone(), dev).require_grad();
        let wu = Tensor::<3>::from_data(wu.clone(), dev).require_grad();
        let wd = Tensor::<3>::from_data(wd.clone(), dev).require_grad();
        let (a, b, c, g) = (x.clone(), w.clone(), (wg.clone(), wu.clone()), wd.clone());
        let out = if fast {
            routed_experts(a, b, &map, c.0, c.1, g, &counts)
        } else {
            routed_experts_reference(a, b, map.token_p.clone(), map.slot_p.clone(), c.0, c.1, g, &counts)
        };
        let grads = (out.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        let grad = |t: Tensor<2>| values(t.grad(&grads).unwrap());
        let grad3 = |t: Tensor<3>| values(t.grad(&grads).unwrap());
        (values(out), grad(x), grad(w), grad3(wg), grad3(wu), grad3(wd))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("routed experts t {t} k {k} e {e} d {d} f {f}");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad x"), &fast.1, &reference.1);
    // A fast path may take `dw = ⟨dout, h·Wd⟩` as `⟨dout·Wdᵀ, h⟩` (Flex does, from the f-wide rows): the
    // same d · f products summed in another order, where the sum cancels to a tenth of its terms.
    close_within(&format!("{what} grad w"), &fast.2, &reference.2, 1e-4);
    close(&format!("{what} grad w_gate"), &fast.3, &reference.3);
    close(&format!("{what} grad w_up"), &fast.4, &reference.4);
    close(&format!("{what} grad w_down"), &fast.5, &reference.5);
}

fn linear_case(device: &Device, [b, s, k, n]: [usize; 4], bias: bool, tied: bool) {
    linear_case_scaled(device, [b, s, k, n], bias, tied, 1.0);
}

/// `x_std` small keeps the f32 sums of a long weight gradient (reference included) within the bound.
fn linear_case_scaled(device: &Device, [b, s, k, n]: [usize; 4], bias: bool, tied: bool, x_std: f64) {
    let (x, w, bias_n, probe) =
        (random([b, s, k], x_std, 71), random([k, n], 0.3, 72), random([n], 1.0, 73), random([b, s, n], 1.0, 74));
    let what = format!("linear {b}x{s}x{k}->{n} (bias {bias}, transposed weight {tied})");
    let run = |dev: &Device, fast: bool| {
        let x = Tensor::<3>::from_data(x.clone(), dev).require_grad();
        // A head tied to the embedding reads the `[n, k]` table transposed: a strided view.
        let w_param = if tied {
            Tensor::<2>::from_data(w.clone(), dev).transpose().require_grad()
        } else {
            Tensor::<2>::from_data(w.clone(), dev).require_grad()
        };
        let w_kn = if tied { w_param.clone().transpose() } else { w_param.clone() };
        let b_n = bias.then(|| Tensor::<1>::from_data(bias_n.clone(), dev).require_grad());
        let y =
            if fast { linear(x.clone(), w_kn, b_n.clone()) } else { linear_reference(x.clone(), w_kn, b_n.clone()) };
        let grads = (y.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        let db = b_n.map(|b| values(b.grad(&grads).unwrap())).unwrap_or_default();
        (values(y), values(x.grad(&grads).unwrap()), values(w_param.grad(&grads).unwrap()), db)
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad x"), &fast.1, &reference.1);
    close(&format!("{what} grad w"), &fast.2, &reference.2);
    close(&format!("{what} grad b"), &fast.3, &reference.3);
}

fn rms_norm_case(device: &Device, [b, s, d]: [usize; 3]) {
    let (x, gamma, probe) = (random([b, s, d], 1.5, 81), random([d], 1.0, 82), random([b, s, d], 1.0, 83));
    let run = |dev: &Device, fast: bool| {
        let x = Tensor::<3>::from_data(x.clone(), dev).require_grad();
        let gamma = Tensor::<1>::from_data(gamma.clone(), dev).require_grad();
        let y = if fast {
            rms_norm(x.clone(), gamma.clone(), 1e-6)
        } else {
            rms_norm_reference(x.clone(), gamma.clone(), 1e-6)
        };
        let grads = (y.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(y), values(x.grad(&grads).unwrap()), values(gamma.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("rms norm {b}x{s}x{d}");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad x"), &fast.1, &reference.1);
    close(&format!("{what} grad gamma"), &fast.2, &reference.2);
}

fn attention_case(device: &Device, [b, s, h, g, c, e]: [usize; 6]) {
    let seed = (b * 1000 + s * 10 + h) as u64;
    let (q, k, v) =
        (random([b, s, h, c], 1.0, seed), random([b, s, g, c], 1.0, seed + 1), random([b, s, g, e], 1.0, seed + 2));
    let probe = random([b, s, h, e], 1.0, seed + 3);
    let scale = 1.0 / (c as f32).sqrt();
    let run = |dev: &Device, fast: bool| {
        let q = Tensor::<4>::from_data(q.clone(), dev).require_grad();
        let k = Tensor::<4>::from_data(k.clone(), dev).require_grad();
        let v = Tensor::<4>::from_data(v.clone(), dev).require_grad();
        let o = if fast {
            causal_attention(q.clone(), k.clone(), v.clone(), scale)
        } else {
            causal_attention_reference(q.clone(), k.clone(), v.clone(), scale)
        };
        let grads = (o.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(o), values(q.grad(&grads).unwrap()), values(k.grad(&grads).unwrap()), values(v.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("attention b {b} s {s} h {h} g {g} c {c} e {e}");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad q"), &fast.1, &reference.1);
    close(&format!("{what} grad k"), &fast.2, &reference.2);
    close(&format!("{what} grad v"), &fast.3, &reference.3);
}

/// Attention over views the kernel reads in place: queries stored head-major (`[b, h, s, c]` with
/// positions and heads swapped), keys one head broadcast to all `g` (stride 0) and values a narrowed
/// slice of a wider projection at an offset (as MLA's). Gradients reach the stored tensors.
fn attention_views_case(device: &Device, [b, s, h, g, c, e]: [usize; 6]) {
    let seed = (b * 1000 + s * 10 + h) as u64 + 7;
    let (q, k, kv) =
        (random([b, h, s, c], 1.0, seed), random([b, s, 1, c], 1.0, seed + 1), random([b, s, g, e + 5], 1.0, seed + 2));
    let probe = random([b, s, h, e], 1.0, seed + 3);
    let scale = 1.0 / (c as f32).sqrt();
    let run = |dev: &Device, fast: bool| {
        let q_bhsc = Tensor::<4>::from_data(q.clone(), dev).require_grad();
        let k_bs1c = Tensor::<4>::from_data(k.clone(), dev).require_grad();
        let kv_bsgx = Tensor::<4>::from_data(kv.clone(), dev).require_grad();
        let (q_v, k_v, v_v) =
            (q_bhsc.clone().swap_dims(1, 2), k_bs1c.clone().expand([b, s, g, c]), kv_bsgx.clone().narrow(3, 3, e));
        let o = if fast {
            causal_attention(q_v, k_v, v_v, scale)
        } else {
            causal_attention_reference(q_v, k_v, v_v, scale)
        };
        let grads = (o.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        let grad = |t: &Tensor<4>| values(t.grad(&grads).unwrap());
        (values(o), grad(&q_bhsc), grad(&k_bs1c), grad(&kv_bsgx))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("attention over views b {b} s {s} h {h} g {g} c {c} e {e}");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad q"), &fast.1, &reference.1);
    close(&format!("{what} grad k"), &fast.2, &reference.2);
    close(&format!("{what} grad kv"), &fast.3, &reference.3);
}

fn rotary_case(device: &Device, [b, s, h, k]: [usize; 4]) {
    let (x, probe) = (random([b, s, h, k], 1.0, 41), random([b, s, h, k], 1.0, 42));
    // Tables of a real rotation (cos² + sin² = 1), duplicated over the halves as the models build them.
    let angles: Vec<f32> = (0..s * k).map(|i| (i / k) as f32 * 0.37 * (1 + i % (k / 2)) as f32).collect();
    let table = |f: fn(f32) -> f32| TensorData::new(angles.iter().map(|&a| f(a)).collect::<Vec<f32>>(), [s, k]);
    let (cos, sin) = (table(f32::cos), table(f32::sin));
    let run = |dev: &Device, fast: bool| {
        let x = Tensor::<4>::from_data(x.clone(), dev).require_grad();
        let (cos, sin) = (Tensor::<2>::from_data(cos.clone(), dev), Tensor::<2>::from_data(sin.clone(), dev));
        let y = if fast { rotary(x.clone(), cos, sin) } else { rotary_reference(x.clone(), cos, sin) };
        let grads = (y.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(y), values(x.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close("rotary", &fast.0, &reference.0);
    close("rotary grad x", &fast.1, &reference.1);
}

/// `computed`: the logits are an op's output the backward alone holds (as a model's head gives them,
/// which Flex's backward overwrites in place), else the leaf itself (held by the caller too).
fn cross_entropy_case(device: &Device, n: usize, v: usize, computed: bool) {
    let (logits, probe) = (random([n, v], 3.0, 51), random([n], 1.0, 52));
    let targets = TensorData::new((0..n).map(|i| ((i * 7919) % v) as i64).collect::<Vec<_>>(), [n]);
    let run = |dev: &Device, fast: bool| {
        let l = Tensor::<2>::from_data(logits.clone(), dev).require_grad();
        let t = Tensor::<1, Int>::from_data(targets.clone(), dev);
        let x = if computed { l.clone() * 2.0 } else { l.clone() };
        let loss = if fast { cross_entropy(x, t) } else { cross_entropy_reference(x, t) };
        let grads = (loss.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(loss), values(l.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    close("cross-entropy", &fast.0, &reference.0);
    close("cross-entropy grad logits", &fast.1, &reference.1);
}

fn adamw_case(device: &Device, n: usize) {
    let (p, g, m) = (random([n], 1.0, 61), random([n], 0.1, 62), random([n], 0.01, 63));
    let v = TensorData::new(values(Tensor::<1>::from_data(random([n], 1e-3, 64), &Device::flex()).abs()), [n]);
    let step = AdamWStep {
        lr: 3e-3,
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        bias_1: 1.0 - 0.9f64.powi(3),
        bias_2: 1.0 - 0.95f64.powi(3),
        grad_scale: 0.37,
    };
    let run = |dev: &Device, fast: bool| {
        let t = |d: &TensorData| Tensor::<1>::from_data(d.clone(), dev);
        let (p, m, v) = if fast {
            adamw_step(t(&p), t(&g), t(&m), t(&v), step)
        } else {
            adamw_step_reference(t(&p), t(&g), t(&m), t(&v), step)
        };
        (values(p), values(m), values(v))
    };
    let (fast, reference) = (run(device, true), run(&Device::flex(), false));
    close("adamw param", &fast.0, &reference.0);
    close("adamw m", &fast.1, &reference.1);
    close("adamw v", &fast.2, &reference.2);
}

/// `[a | r]` per head, `r` per head (`g = h`) or broadcast (`g = 1`), values and both gradients.
fn concat_heads_case(device: &Device, [b, s, h, n, g, w]: [usize; 6]) {
    let (a, r, probe) =
        (random([b, s, h, n], 1.0, 95), random([b, s, g, w], 1.0, 96), random([b, s, h, n + w], 1.0, 97));
    let run = |dev: &Device, fast: bool| {
        let a = Tensor::<4>::from_data(a.clone(), dev).require_grad();
        let r = Tensor::<4>::from_data(r.clone(), dev).require_grad();
        let y = if fast { concat_heads(a.clone(), r.clone()) } else { concat_heads_reference(a.clone(), r.clone()) };
        let grads = (y.clone() * Tensor::from_data(probe.clone(), dev)).sum().backward();
        (values(y), values(a.grad(&grads).unwrap()), values(r.grad(&grads).unwrap()))
    };
    let (fast, reference) = (run(device, true), run(&reference_device(), false));
    let what = format!("concat heads b {b} s {s} h {h} n {n} g {g} w {w}");
    close(&what, &fast.0, &reference.0);
    close(&format!("{what} grad a"), &fast.1, &reference.1);
    close(&format!("{what} grad r"), &fast.2, &reference.2);
}

fn square_sum_case(device: &Device, n: usize) {
    let x = random([n], 1.0, 91);
    let fast = values(square_sum(Tensor::<1>::from_data(x.clone(), device)));
    let reference = values(square_sum_reference(Tensor::<1>::from_data(x, &reference_device())));
    close(&format!("square sum of {n}"), &fast, &reference);
}

fn all_cases(device: &Device) {
    // A width with a remainder past the 8-lane chunks; rows over several tasks of 32.
    rms_norm_case(device, [2, 5, 13]);
    rms_norm_case(device, [3, 30, 64]);
    // Rows over several batch entries; one row; a width past one 16 × 6 GEMM tile; a weight that is a
    // transposed view.
    linear_case(device, [2, 5, 7, 3], true, false);
    linear_case(device, [3, 4, 33, 50], false, false);
    linear_case(device, [1, 1, 6, 9], true, false);
    linear_case(device, [2, 9, 12, 20], false, true);
    adamw_case(device, 5);
    adamw_case(device, 40_000);
    // A remainder past the 8 lanes; several parallel chunks of 2^14.
    square_sum_case(device, 13);
    square_sum_case(device, 100_003);
    // Query tiles of 32: one partial tile, several with a partial last one, grouped and plain heads,
    // value heads narrower than query/key heads (MLA).
    attention_case(device, [1, 5, 2, 2, 4, 4]);
    attention_case(device, [2, 37, 4, 2, 8, 6]);
    attention_case(device, [1, 70, 3, 1, 16, 8]);
    attention_views_case(device, [2, 37, 4, 2, 8, 6]);
    attention_views_case(device, [1, 40, 3, 3, 12, 4]);
    // Rows over several tasks of 16; a broadcast rotary part (MLA's keys) and a per-head one.
    concat_heads_case(device, [2, 19, 3, 5, 1, 4]);
    concat_heads_case(device, [1, 7, 4, 6, 4, 2]);
    rotary_case(device, [2, 7, 3, 8]);
    for computed in [false, true] {
        cross_entropy_case(device, 13, 37, computed);
        cross_entropy_case(device, 3, 1000, computed);
    }
    swiglu_case(device, 6, 37);
    swiglu_down_case(device, [2, 5, 12, 7], false);
    permute_combine_case(device, 9, 2, 5);
    permute_combine_case(device, 4, 1, 3);
    permute_combine_case(device, 7, 4, 4);
    for k in [1, 2, 3] {
        topk_case(device, k, false);
        topk_case(device, k, true);
    }
    // Tokens over several tasks of 64; fine-grained experts.
    topk_case_sized(device, 150, 32, 6, true);
    topk_case_sized(device, 130, 64, 8, false);
    for (t, e, k, renormalize) in [(11, 8, 1, false), (11, 8, 3, true), (150, 32, 6, true), (130, 64, 8, false)] {
        topk_sigmoid_case(device, t, e, k, renormalize);
    }
    grouped_case(device, &[3, 0, 5, 1]);
    grouped_case(device, &[0, 0, 9, 0]);
    grouped_case(device, &[2, 2, 2, 2, 2, 2, 2, 2]);
    // Past one 64 × 64 block of the tiled GEMMs: several row blocks per expert, two column blocks,
    // reductions that end mid-chunk.
    grouped_case_sized(device, &[70, 0, 5, 130], 24, 80);
    // Many experts (fine-grained): on Flex expert 1's 400 rows span two row blocks on 2 threads, and every
    // expert's weight gradient is one task. (With 900 rows the CubeCL kernels' f32 sums over the rows
    // reached 2.7e-5 against the 2e-5 bound on lavapipe.)
    let many: Vec<usize> = (0..48).map(|e| if e == 1 { 400 } else { [3, 0, 7, 1, 150][e % 5] }).collect();
    grouped_case_sized(device, &many, 16, 24);
    // Fine-grained top-6 with empty experts; few experts (on Flex each weight gradient in pieces of
    // columns of the gathered rows); one expert per token.
    routed_case(device, [40, 6, 16, 12, 20]);
    routed_case(device, [3, 2, 8, 5, 7]);
    routed_case(device, [90, 2, 3, 24, 16]);
    routed_case(device, [9, 1, 4, 8, 8]);
}

#[test]
fn every_op_matches_its_reference_on_the_cpu() {
    all_cases(&Device::flex().autodiff());
}

/// Shapes past the CPU path's thresholds: several row chunks per element-wise pass and experts whose
/// GEMMs run multi-threaded.
#[test]
fn large_shapes_match_on_the_cpu() {
    let device = Device::flex().autodiff();
    swiglu_case(&device, 300, 129);
    swiglu_down_case(&device, [2, 5, 12, 7], true);
    swiglu_down_case(&device, [4, 48, 160, 96], true);
    permute_combine_case_sized(&device, 300, 2, 8, 70);
    grouped_case_sized(&device, &[150, 0, 7, 310], 96, 256);
    // Few experts with large GEMMs: on Flex several row blocks per expert, and each weight gradient cut
    // into pieces of rows so that two experts still make several tasks per thread.
    grouped_case_sized(&device, &[300, 0, 280], 256, 256);
    // Weight rows of 512 columns and more: on Flex the backward transposes them into a buffer first
    // (ragged 8 × 8 tiles here), except for the one-row expert, which reads them in place.
    grouped_case_sized(&device, &[1, 0, 140, 37], 515, 521);
    // Routed: top-8 of 64 over several row blocks; rows of 515 (transposed down-projection weights).
    routed_case(&device, [300, 8, 64, 40, 24]);
    routed_case(&device, [150, 2, 4, 515, 36]);
    // Large enough that the GEMMs split over threads (few enough rows that the f32 sums of the weight
    // gradient, reference included, stay within the bound).
    linear_case(&device, [4, 48, 96, 160], true, false);
    // A row-major weight with rows of 512+ (a vocabulary head): on Flex dX = dY·Wᵀ transposes W first.
    linear_case(&device, [2, 40, 24, 521], false, false);
    // 640 rows: on Flex the weight gradient is summed in parts of rows, one per thread, then added.
    linear_case_scaled(&device, [4, 160, 24, 40], true, true, 0.05);
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

#[test]
fn row_map_rejects_what_is_not_a_permutation() {
    let device = Device::flex();
    assert!(RowMap::from_slots(&[0, 1, 1, 3], 2, 2, &device).unwrap_err().contains("not a permutation"));
    assert!(RowMap::from_slots(&[0, 1, 2], 2, 2, &device).unwrap_err().contains("expected tokens · k = 4"));
    let map = RowMap::from_slots(&[1, 2, 3, 0], 2, 2, &device).unwrap();
    assert_eq!(int_values(map.row_tk), vec![3, 0, 1, 2]);
    assert_eq!(int_values(map.token_p), vec![0, 1, 1, 0]);
}

/// The CubeCL kernels (forward and backward) on wgpu, in one test: the first launches compile shaders.
#[cfg(feature = "wgpu")]
#[test]
fn every_kernel_matches_its_reference_on_wgpu() {
    // Nothing here is worth autotuning on a software rasteriser.
    // SAFETY: set before any thread reads the environment (the first CubeCL client is created below).
    unsafe { std::env::set_var("CUBECL_AUTOTUNE_LEVEL", "minimal") };
    let device = Device::wgpu(Default::default()).autodiff();
    all_cases(&device);
}

/// The generic definitions on Burn's NdArray backend (`--backend ndarray`).
#[cfg(feature = "ndarray")]
#[test]
#[allow(deprecated)]
fn every_op_matches_its_reference_on_ndarray() {
    all_cases(&Device::ndarray().autodiff());
}

/// The same on the first AMD GPU (ROCm builds only; never run: it needs a ROCm build and an AMD GPU).
#[cfg(feature = "rocm")]
#[test]
fn every_kernel_matches_its_reference_on_rocm() {
    all_cases(&Device::rocm(0usize).autodiff());
}

/// Inconsistent inputs stop before any kernel runs (a GPU kernel would read out of bounds), naming the field.
#[test]
#[should_panic(expected = "counts_e must sum to the 7 rows of x_pd")]
fn grouped_swiglu_refuses_counts_that_do_not_cover_the_rows() {
    let device = Device::flex();
    let x = Tensor::<2>::zeros([7, 4], &device);
    let w = |a, b| Tensor::<3>::zeros([3, a, b], &device);
    grouped_swiglu(x, w(4, 6), w(4, 6), w(6, 4), &[4, 0, 2]);
}

#[test]
#[should_panic(expected = "combine_rows: w_tk must be [tokens, k] = [2, 2]")]
fn combine_rows_refuses_weights_of_the_wrong_shape() {
    let device = Device::flex();
    let map = RowMap::from_slots(&[1, 2, 3, 0], 2, 2, &device).unwrap();
    combine_rows(Tensor::<2>::zeros([4, 3], &device), Tensor::<2>::zeros([2, 1], &device), &map);
}

/// The comparison itself can fail: a NaN output (say, from a broken kernel) is not "within tolerance".
#[test]
#[should_panic(expected = "worst difference NaN")]
fn the_comparison_fails_on_nan() {
    close("nan output", &[1.0, f32::NAN], &[1.0, 1.0]);
}
