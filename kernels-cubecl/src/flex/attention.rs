//! Causal attention on Flex: per (batch, head, query tile) the scores of the tile against the keys it
//! may see (`S = scale · Q_t Kᵀ`, keys past the tile's last query skipped), a row softmax in place and
//! `O_t = P V` — small single-threaded GEMMs through the `gemm` crate, read and written at the strides
//! of the `[b, s, heads, width]` projections (no head transposes, no repeated key/value heads, no mask
//! tensor, no `s × s` tensor kept). The backward runs per (batch, key/value head) so that the key and
//! value gradients of all the query heads that share them accumulate in one place, recomputing each
//! tile's probabilities from the saved log-sum-exp. Inputs are read through [`View`]s, so slices of a
//! wider projection (MLA's values, say) and broadcast heads are read in place.
//!
//! Legend: b = batch, s = sequence, h = query heads, g = key/value heads, c = query/key head width,
//! e = value head width; a tile is up to [`TILE`] consecutive queries.

use rayon::prelude::*;

use super::gemm::gemm_block;
use super::simd::{self, multiversion};

/// Queries per tile.
const TILE: usize = 32;

/// Shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub b: usize,
    pub s: usize,
    pub h: usize,
    pub g: usize,
    pub c: usize,
    pub e: usize,
}

impl Dims {
    /// (query, visible key) pairs over every batch entry and head: `b·h·s(s + 1)/2`.
    pub(super) fn causal_pairs(&self) -> f64 {
        (self.b * self.h) as f64 * (self.s * (self.s + 1) / 2) as f64
    }

    fn tiles(&self) -> usize {
        self.s.div_ceil(TILE)
    }

    /// Query rows `r0..r1` of tile `t`.
    fn tile(&self, t: usize) -> (usize, usize) {
        (t * TILE, ((t + 1) * TILE).min(self.s))
    }
}

/// A `[b, s, heads, width]` operand read in place: element `(bi, si, hi, x)` is
/// `data[off + bi·bs + si·ss + hi·hs + x]` (the width contiguous; any non-negative outer strides).
#[derive(Debug, Clone, Copy)]
pub(super) struct View<'a> {
    pub data: &'a [f32],
    pub off: usize,
    pub bs: usize,
    pub ss: usize,
    pub hs: usize,
}

impl<'a> View<'a> {
    /// The elements from `(bi, si, hi, 0)` on; rows (positions) are [`Self::ss`] apart.
    fn from(&self, bi: usize, si: usize, hi: usize) -> &'a [f32] {
        &self.data[self.off + bi * self.bs + si * self.ss + hi * self.hs..]
    }
}

/// A buffer written by several tasks at disjoint positions.
struct Shared {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: tasks write disjoint elements (argued at each use) and nobody reads until they have joined.
unsafe impl Sync for Shared {}

impl Shared {
    fn new(buf: &mut [f32]) -> Self {
        Shared { ptr: buf.as_mut_ptr(), len: buf.len() }
    }

    /// Copies `src` to `at..at + src.len()`.
    ///
    /// # Safety
    /// No other task writes or reads those elements meanwhile.
    unsafe fn copy_in(&self, at: usize, src: &[f32]) {
        assert!(at + src.len() <= self.len, "attention: write out of bounds");
        // SAFETY: in bounds (checked); exclusive by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) };
    }
}

/// [`gemm_block`] into rows of `dst` from `dst_off` on, `dst_rs` apart.
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    dims: (usize, usize, usize),
    dst: &Shared,
    dst_off: usize,
    dst_rs: usize,
    accumulate: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
    beta: f32,
) {
    assert!(dst_off <= dst.len, "attention gemm: destination offset out of bounds");
    // SAFETY: the block lies within the buffer's last `len − dst_off` elements (`gemm_block` checks);
    // it is written by this task only (see the callers) and does not alias the operands.
    unsafe {
        let at = dst.ptr.add(dst_off);
        gemm_block(dims, at, dst.len - dst_off, dst_rs, accumulate, lhs, lhs_strides, rhs, rhs_strides, beta, false);
    }
}

multiversion! {
    /// Softmax of `row[..valid]` in place, zeros after it; returns the log-sum-exp of `row[..valid]`.
    fn softmax_prefix(row: &mut [f32], valid: usize) -> f32 {
        let (head, tail) = row.split_at_mut(valid.min(row.len()));
        let max = simd::max(head);
        for x in head.iter_mut() {
            *x = simd::exp(*x - max);
        }
        let sum = simd::sum(head);
        let inv = 1.0 / sum;
        for x in head.iter_mut() {
            *x *= inv;
        }
        tail.fill(0.0);
        max + sum.ln()
    }
}

multiversion! {
    /// `p[j] = e^(p[j] − lse)` for `j < valid`, zeros after.
    fn probs_prefix(p: &mut [f32], valid: usize, lse: f32) {
        let (head, tail) = p.split_at_mut(valid.min(p.len()));
        for x in head.iter_mut() {
            *x = simd::exp(*x - lse);
        }
        tail.fill(0.0);
    }
}

multiversion! {
    /// `ds[j] = p[j] · (dp[j] − delta)` in place over `dp`.
    fn softmax_grad(p: &[f32], dp: &mut [f32], delta: f32) {
        for (d, &p) in dp.iter_mut().zip(p) {
            *d = p * (*d - delta);
        }
    }
}

/// Forward: `(o [b, s, h, e], lse [b, h, s])`.
pub(super) fn forward(q: View, k: View, v: View, d: Dims, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let Dims { b, s, h, g, c, e } = d;
    let mut o = vec![0f32; b * s * h * e];
    let mut lse = vec![0f32; b * h * s];
    let (o_out, lse_out) = (Shared::new(&mut o), Shared::new(&mut lse));
    let rep = h / g;
    (0..b * h * d.tiles()).into_par_iter().for_each(|task| {
        let (bh, t) = (task / d.tiles(), task % d.tiles());
        let (bi, hi) = (bh / h, bh % h);
        let gi = hi / rep;
        let (r0, r1) = d.tile(t);
        let (m, n) = (r1 - r0, r1);
        let (q_t, k_b, v_b) = (q.from(bi, r0, hi), k.from(bi, 0, gi), v.from(bi, 0, gi));
        let mut p = vec![0f32; m * n];
        let scores = Shared::new(&mut p);
        gemm_into((m, n, c), &scores, 0, n, false, q_t, (q.ss, 1), k_b, (1, k.ss), scale);
        let mut lse_t = [0f32; TILE];
        for (i, row) in p.chunks_mut(n).enumerate() {
            lse_t[i] = softmax_prefix(row, r0 + i + 1);
        }
        // Task (bi, hi, t) alone writes rows r0..r1 of head hi in batch bi of `o` and of `lse`.
        gemm_into((m, e, n), &o_out, ((bi * s + r0) * h + hi) * e, h * e, false, &p, (n, 1), v_b, (v.ss, 1), 1.0);
        // SAFETY: disjoint across tasks (above).
        unsafe { lse_out.copy_in((bi * h + hi) * s + r0, &lse_t[..m]) };
    });
    (o, lse)
}

/// Backward: `(dq [b, s, h, c], dk [b, s, g, c], dv [b, s, g, e])`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    dout: View,
    q: View,
    k: View,
    v: View,
    o: View,
    lse: &[f32],
    d: Dims,
    scale: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Dims { b, s, h, g, c, e } = d;
    let (mut dq, mut dk, mut dv) = (vec![0f32; b * s * h * c], vec![0f32; b * s * g * c], vec![0f32; b * s * g * e]);
    let (dq_out, dk_out, dv_out) = (Shared::new(&mut dq), Shared::new(&mut dk), Shared::new(&mut dv));
    let rep = h / g;
    (0..b * g).into_par_iter().for_each(|task| {
        let (bi, gi) = (task / g, task % g);
        let (k_b, v_b) = (k.from(bi, 0, gi), v.from(bi, 0, gi));
        let (mut dk_acc, mut dv_acc) = (vec![0f32; s * c], vec![0f32; s * e]);
        let (dk_acc_out, dv_acc_out) = (Shared::new(&mut dk_acc), Shared::new(&mut dv_acc));
        let (mut p, mut dp) = (vec![0f32; TILE * s], vec![0f32; TILE * s]);
        for hi in gi * rep..(gi + 1) * rep {
            for t in 0..d.tiles() {
                let (r0, r1) = d.tile(t);
                let (m, n) = (r1 - r0, r1);
                let (p, dp) = (&mut p[..m * n], &mut dp[..m * n]);
                let (q_t, do_t) = (q.from(bi, r0, hi), dout.from(bi, r0, hi));
                // P = exp(scale · Q_t Kᵀ − lse).
                gemm_into((m, n, c), &Shared::new(p), 0, n, false, q_t, (q.ss, 1), k_b, (1, k.ss), scale);
                for (i, p_row) in p.chunks_mut(n).enumerate() {
                    probs_prefix(p_row, r0 + i + 1, lse[(bi * h + hi) * s + r0 + i]);
                }
                // dV += Pᵀ dO_t.
                gemm_into((n, e, m), &dv_acc_out, 0, e, true, p, (1, n), do_t, (dout.ss, 1), 1.0);
                // dP = dO_t Vᵀ, then dS = P ⊙ (dP − ⟨dO_i, O_i⟩).
                gemm_into((m, n, e), &Shared::new(dp), 0, n, false, do_t, (dout.ss, 1), v_b, (1, v.ss), 1.0);
                for (i, (dp_row, p_row)) in dp.chunks_mut(n).zip(p.chunks(n)).enumerate() {
                    let (do_i, o_i) = (&dout.from(bi, r0 + i, hi)[..e], &o.from(bi, r0 + i, hi)[..e]);
                    let delta: f32 = do_i.iter().zip(o_i).map(|(a, b)| a * b).sum();
                    softmax_grad(p_row, dp_row, delta);
                }
                // dQ_t = scale · dS K (task (bi, gi) alone writes the rows of its query heads);
                // dK += scale · dSᵀ Q_t.
                let dq_at = ((bi * s + r0) * h + hi) * c;
                gemm_into((m, c, n), &dq_out, dq_at, h * c, false, dp, (n, 1), k_b, (k.ss, 1), scale);
                gemm_into((n, c, m), &dk_acc_out, 0, c, true, dp, (1, n), q_t, (q.ss, 1), scale);
            }
        }
        // Task (bi, gi) alone writes key/value head gi of batch bi.
        for j in 0..s {
            // SAFETY: disjoint across tasks (above).
            unsafe {
                dk_out.copy_in(((bi * s + j) * g + gi) * c, &dk_acc[j * c..(j + 1) * c]);
                dv_out.copy_in(((bi * s + j) * g + gi) * e, &dv_acc[j * e..(j + 1) * e]);
            }
        }
    });
    (dq, dk, dv)
}
