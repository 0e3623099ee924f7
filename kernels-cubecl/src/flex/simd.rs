//! Vectorised element-wise math for the host kernels: `exp` as straight-line arithmetic (no calls, no
//! branches) that LLVM vectorises, and [`multiversion!`] to compile a kernel's loop twice more, for
//! AVX-512 and for AVX2 + FMA, the widest the CPU has picked at run time — the workspace builds for
//! baseline x86-64, where these loops would stay four-wide SSE2 and `f32::exp` a scalar libm call (7% of
//! a training step's profile).

/// Defines `fn $name(args) -> ret` whose body is compiled three times: as written, and (on x86-64) with
/// AVX-512 (F, VL, BW, DQ) and with AVX2 + FMA enabled, the widest the CPU has chosen at run time.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && $crate::flex::simd::take($crate::flex::simd::Tier::Avx512)
                {
                    // SAFETY: the CPU has the features `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && $crate::flex::simd::take($crate::flex::simd::Tier::Avx2)
                {
                    // SAFETY: the CPU has the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $crate::flex::simd::take($crate::flex::simd::Tier::Baseline);
            imp($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// The versions [`multiversion!`] picks among, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Tier {
    /// As written: the build's baseline (SSE2 on x86-64).
    Baseline,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512 (F, VL, BW, DQ).
    Avx512,
}

/// Whether [`multiversion!`] takes the version for `tier` (which the CPU has): always, outside this
/// crate's unit tests.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn take(_tier: Tier) -> bool {
    true
}

#[cfg(test)]
thread_local! {
    /// The widest version the unit tests let this thread take ([`with_widest`]), and the last taken.
    static WIDEST: std::cell::Cell<Tier> = const { std::cell::Cell::new(Tier::Avx512) };
    static TAKEN: std::cell::Cell<Option<Tier>> = const { std::cell::Cell::new(None) };
}

/// Whether [`multiversion!`] takes the version for `tier` on this thread: the unit tests cap it, so
/// that the AVX2 and baseline versions are checked on a CPU that has AVX-512 (which would otherwise
/// always win), and note the one taken.
#[cfg(test)]
pub(crate) fn take(tier: Tier) -> bool {
    let allowed = WIDEST.get() >= tier;
    if allowed {
        TAKEN.set(Some(tier));
    }
    allowed
}

/// Runs `f` with [`multiversion!`] taking at most `tier` on this thread; also returns the version
/// the last call in `f` took.
#[cfg(test)]
pub(crate) fn with_widest<R>(tier: Tier, f: impl FnOnce() -> R) -> (R, Option<Tier>) {
    let before = WIDEST.replace(tier);
    TAKEN.set(None);
    let out = f();
    WIDEST.set(before);
    (out, TAKEN.take())
}

/// Every tier, narrowest first (the tests run a kernel under each and compare with the baseline).
#[cfg(test)]
pub(crate) const TIERS: [Tier; 3] = [Tier::Baseline, Tier::Avx2, Tier::Avx512];

/// `e^x` for f32, within 2 ulp of the correctly rounded value on `[-87.3, 88.7]` (Cephes' `expf`:
/// `x = n·ln 2 + r`, a degree-6 polynomial in `r`, `2^n` through the exponent bits); 0 below that
/// range, +∞ above, NaN for NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n · C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Adding 1.5 · 2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const HI: f32 = 88.72;
    const LO: f32 = -87.33;
    let xc = x.clamp(LO, HI);
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let n_i = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let r = n.mul_add(-C2, n.mul_add(-C1, xc));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_2e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 0.166_666_65);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n: n ∈ [-126, 128]; 2^128 is built as 2 · 2^127 so that the top of the range stays finite.
    let half_n = n_i >> 1;
    let scale_a = f32::from_bits(((half_n + 127) as u32) << 23);
    let scale_b = f32::from_bits(((n_i - half_n + 127) as u32) << 23);
    let out = y * scale_a * scale_b;
    if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        out
    }
}

/// The largest element; NaN if any element is NaN, −∞ for an empty slice. Eight lanes with plain
/// compare-and-select maxima and a separate NaN flag, so that the loop vectorises (a NaN-aware running
/// maximum is a serial chain of branches).
#[inline(always)]
pub(crate) fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut nan = [0u32; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
            nan[l] |= c[l].is_nan() as u32;
        }
    }
    let max = acc.iter().chain(rest).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if nan.iter().any(|&n| n != 0) || rest.iter().any(|x| x.is_nan()) { f32::NAN } else { max }
}

/// The sum of the elements in eight lanes (vectorises; rounding differs from a serial sum).
#[inline(always)]
pub(crate) fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// `⟨a, b⟩` over their common length in eight lanes (vectorises; rounding differs from a serial sum).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (a[..n].chunks_exact(8), b[..n].chunks_exact(8));
    let rest: f32 = a.remainder().iter().zip(b.remainder()).map(|(x, y)| x * y).sum();
    let mut acc = [0f32; 8];
    for (x, y) in a.zip(b) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the standard library's `f64` exponential over the whole finite range, in ulps.
    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let mut worst = 0f64;
        let mut x = -87.3f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = (want as f32).next_up() as f64 - want as f32 as f64;
            let err = (got - want).abs() / ulp;
            assert!(err.is_finite(), "exp({x}) = {got}, want {want}");
            worst = worst.max(err);
            x += 0.000_731;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
    }

    multiversion! {
        fn exp_slice(xs: &[f32], out: &mut [f32]) {
            for (o, &x) in out.iter_mut().zip(xs) {
                *o = exp(x);
            }
        }
    }

    /// The loop compiled for each version this CPU has (AVX-512, AVX2 + FMA, SSE2) gives the scalar
    /// `exp` bit for bit: `mul_add` is fused in every version, so vector width changes nothing.
    #[test]
    fn exp_vectorised_equals_the_scalar_one() {
        let xs: Vec<f32> = (0..4099).map(|i| -100.0 + i as f32 * 0.0493).chain([f32::NAN, f32::INFINITY]).collect();
        for tier in TIERS {
            let mut out = vec![0f32; xs.len()];
            let ((), taken) = with_widest(tier, || exp_slice(&xs, &mut out));
            assert!(taken.is_some_and(|t| t <= tier), "{tier:?}: took {taken:?}");
            for (&x, &o) in xs.iter().zip(&out) {
                if x.is_nan() {
                    assert!(o.is_nan(), "{tier:?}: exp(NaN) = {o}");
                } else {
                    assert_eq!(o.to_bits(), exp(x).to_bits(), "{tier:?}: exp({x}) = {o}, scalar {}", exp(x));
                }
            }
        }
    }

    /// The cap is what picks the version: each tier the CPU has is the one taken under its own cap.
    #[test]
    fn the_cap_picks_the_version() {
        let x = [1.0f32; 3];
        let mut out = [0f32; 3];
        assert_eq!(with_widest(Tier::Baseline, || exp_slice(&x, &mut out)).1, Some(Tier::Baseline));
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                assert_eq!(with_widest(Tier::Avx2, || exp_slice(&x, &mut out)).1, Some(Tier::Avx2));
            }
            if has!("avx512f")
                && has!("avx512vl")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx2")
                && has!("fma")
            {
                assert_eq!(with_widest(Tier::Avx512, || exp_slice(&x, &mut out)).1, Some(Tier::Avx512));
            }
        }
    }

    #[test]
    fn max_and_sum_match_the_serial_ones_and_keep_nan() {
        let xs: Vec<f32> = (0..37).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
        assert_eq!(max(&xs), xs.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(sum(&xs), xs.iter().sum::<f32>());
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        for at in [0, 5, 36] {
            let mut with_nan = xs.clone();
            with_nan[at] = f32::NAN;
            assert!(max(&with_nan).is_nan(), "NaN at {at}");
        }
    }

    #[test]
    fn dot_matches_the_serial_one() {
        // Small integers: every partial sum is exact, so any order gives the same value.
        let a: Vec<f32> = (0..37).map(|i| ((i * 31) % 17) as f32 - 8.0).collect();
        let b: Vec<f32> = (0..37).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let serial = |n: usize| a[..n].iter().zip(&b[..n]).map(|(x, y)| x * y).sum::<f32>();
        for n in [0, 5, 8, 16, 37] {
            assert_eq!(dot(&a[..n], &b[..n]), serial(n), "length {n}");
        }
        assert_eq!(dot(&a, &b[..9]), serial(9), "the common length");
        assert!(dot(&[1.0, f32::NAN], &[1.0, 1.0]).is_nan());
    }

    #[test]
    fn exp_saturates_and_keeps_nan() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }
}
