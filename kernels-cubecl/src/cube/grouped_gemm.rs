//! Tiled grouped expert GEMMs for tall-skinny per-expert problems: rows are sorted by expert, and the
//! host cuts each expert's rows into blocks of [`BLOCK`] rows (`tile_r`, three integers per block:
//! expert, first row, end row), so no block mixes experts and an expert with no rows costs nothing.
//!
//! A cube of `UNITS × UNITS` units computes a `BLOCK × BLOCK` output block; each unit holds a
//! `MICRO × MICRO` micro-tile in registers (rows `ty + UNITS·i`, columns `tx + UNITS·j`, so that
//! neighbouring units write neighbouring columns). The reduction runs in chunks of [`CHUNK`], both
//! operands staged in shared memory, every staged value reused `BLOCK` times.
//!
//! Legend: p = rows (sorted by expert), q = reduction length, n = output columns, e = experts.

use cubecl::prelude::*;

/// Units along each side of a cube.
pub const UNITS: usize = 16;
/// Outputs per unit along each side.
pub const MICRO: usize = 4;
/// Output block per cube along each side.
pub const BLOCK: usize = UNITS * MICRO;
/// Reduction length staged per step.
pub const CHUNK: usize = 16;
/// Staged values each unit loads per operand and step.
const LOADS: usize = BLOCK * CHUNK / (UNITS * UNITS);

/// `out_pn[i] = x_pq[i] · w_eqn[e]` for the rows i of expert e, or `· w_enq[e]ᵀ` when `transpose_w`
/// (the backward to the input). Cubes: `(⌈n / BLOCK⌉, row blocks)`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn grouped_matmul_kernel<F: Float, I: Numeric>(
    x_pq: &Tensor<F>,
    w: &Tensor<F>,
    tile_r: &Tensor<I>,
    out_pn: &mut Tensor<F>,
    q: usize,
    n: usize,
    #[comptime] transpose_w: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let block = usize::cast_from(CUBE_POS_Y);
    let expert = usize::cast_from(tile_r[block * 3]);
    let row0 = usize::cast_from(tile_r[block * 3 + 1]);
    let row_end = usize::cast_from(tile_r[block * 3 + 2]);
    let col0 = usize::cast_from(CUBE_POS_X) * BLOCK;
    let (tx, ty) = (usize::cast_from(UNIT_POS_X), usize::cast_from(UNIT_POS_Y));
    let unit = ty * UNITS + tx;
    let w_base = expert * q * n;
    // xs: [BLOCK rows, CHUNK]; ws: [CHUNK, BLOCK columns].
    let mut xs = Shared::<[F]>::new_slice(BLOCK * CHUNK);
    let mut ws = Shared::<[F]>::new_slice(CHUNK * BLOCK);
    let mut acc = zeroed::<F>();
    for step in 0..q.div_ceil(CHUNK) {
        let k0 = step * CHUNK;
        stage_tile(x_pq, &mut xs, unit, 0, row0, row_end, k0, q, CHUNK);
        stage_weights(w, &mut ws, unit, w_base, k0, q, col0, n, transpose_w);
        sync_cube();
        accumulate_chunk(&xs, &ws, &mut acc, ty, tx, false);
        sync_cube();
    }
    #[unroll]
    for i in 0..MICRO {
        let row = row0 + ty + UNITS * i;
        #[unroll]
        for j in 0..MICRO {
            let col = col0 + tx + UNITS * j;
            if row < row_end && col < n {
                out_pn[row * n + col] = acc[i * MICRO + j];
            }
        }
    }
}

/// The experts' gate and up projections with the SwiGLU epilogue, in one pass over `x_pq`:
/// `g = x · Wg_e`, `u = x · Wu_e`, `h = silu(g) ⊙ u`, all `[p, n]` (g and u are kept for the
/// backward). Cubes: `(⌈n / BLOCK⌉, row blocks)`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn grouped_gate_up_kernel<F: Float, I: Numeric>(
    x_pq: &Tensor<F>,
    w_gate: &Tensor<F>,
    w_up: &Tensor<F>,
    tile_r: &Tensor<I>,
    g_pn: &mut Tensor<F>,
    u_pn: &mut Tensor<F>,
    h_pn: &mut Tensor<F>,
    q: usize,
    n: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let block = usize::cast_from(CUBE_POS_Y);
    let expert = usize::cast_from(tile_r[block * 3]);
    let row0 = usize::cast_from(tile_r[block * 3 + 1]);
    let row_end = usize::cast_from(tile_r[block * 3 + 2]);
    let col0 = usize::cast_from(CUBE_POS_X) * BLOCK;
    let (tx, ty) = (usize::cast_from(UNIT_POS_X), usize::cast_from(UNIT_POS_Y));
    let unit = ty * UNITS + tx;
    let w_base = expert * q * n;
    let mut xs = Shared::<[F]>::new_slice(BLOCK * CHUNK);
    let mut gs = Shared::<[F]>::new_slice(CHUNK * BLOCK);
    let mut us = Shared::<[F]>::new_slice(CHUNK * BLOCK);
    let mut acc_g = zeroed::<F>();
    let mut acc_u = zeroed::<F>();
    for step in 0..q.div_ceil(CHUNK) {
        let k0 = step * CHUNK;
        stage_tile(x_pq, &mut xs, unit, 0, row0, row_end, k0, q, CHUNK);
        stage_weights(w_gate, &mut gs, unit, w_base, k0, q, col0, n, false);
        stage_weights(w_up, &mut us, unit, w_base, k0, q, col0, n, false);
        sync_cube();
        accumulate_chunk(&xs, &gs, &mut acc_g, ty, tx, false);
        accumulate_chunk(&xs, &us, &mut acc_u, ty, tx, false);
        sync_cube();
    }
    #[unroll]
    for i in 0..MICRO {
        let row = row0 + ty + UNITS * i;
        #[unroll]
        for j in 0..MICRO {
            let col = col0 + tx + UNITS * j;
            if row < row_end && col < n {
                let (g, u) = (acc_g[i * MICRO + j], acc_u[i * MICRO + j]);
                let at = row * n + col;
                g_pn[at] = g;
                u_pn[at] = u;
                h_pn[at] = g * u / (F::new(1.0) + F::exp(-g));
            }
        }
    }
}

/// Grouped weight gradient `dw_eqn[e] = a_pq[rows of e]ᵀ · b_pn[rows of e]`, expert e owning rows
/// `[offset_e[e], offset_e[e + 1])`; an expert without rows gets zeros. Cubes:
/// `(⌈n / BLOCK⌉, ⌈q / BLOCK⌉, e)`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn grouped_weight_grad_kernel<F: Float, I: Numeric>(
    a_pq: &Tensor<F>,
    b_pn: &Tensor<F>,
    offset_e: &Tensor<I>,
    dw_eqn: &mut Tensor<F>,
    q: usize,
    n: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let expert = usize::cast_from(CUBE_POS_Z);
    let q0 = usize::cast_from(CUBE_POS_Y) * BLOCK;
    let n0 = usize::cast_from(CUBE_POS_X) * BLOCK;
    let start = usize::cast_from(offset_e[expert]);
    let end = usize::cast_from(offset_e[expert + 1]);
    let (tx, ty) = (usize::cast_from(UNIT_POS_X), usize::cast_from(UNIT_POS_Y));
    let unit = ty * UNITS + tx;
    // as_: [CHUNK rows, BLOCK of q]; bs: [CHUNK rows, BLOCK of n].
    let mut as_ = Shared::<[F]>::new_slice(CHUNK * BLOCK);
    let mut bs = Shared::<[F]>::new_slice(CHUNK * BLOCK);
    let mut acc = zeroed::<F>();
    for step in 0..(end - start).div_ceil(CHUNK) {
        let r0 = start + step * CHUNK;
        stage_tile(a_pq, &mut as_, unit, 0, r0, end, q0, q, BLOCK);
        stage_tile(b_pn, &mut bs, unit, 0, r0, end, n0, n, BLOCK);
        sync_cube();
        accumulate_chunk(&as_, &bs, &mut acc, ty, tx, true);
        sync_cube();
    }
    #[unroll]
    for i in 0..MICRO {
        let row = q0 + ty + UNITS * i;
        #[unroll]
        for j in 0..MICRO {
            let col = n0 + tx + UNITS * j;
            if row < q && col < n {
                dw_eqn[expert * q * n + row * n + col] = acc[i * MICRO + j];
            }
        }
    }
}

/// A unit's micro-tile accumulators, zeroed.
#[cube]
fn zeroed<F: Float>() -> Array<F> {
    let mut acc = Array::<F>::new(MICRO * MICRO);
    #[unroll]
    for i in 0..MICRO * MICRO {
        acc[i] = F::new(0.0);
    }
    acc
}

/// Stages the tile `a[base + (r0 + r) · cols + c0 + c]` of a row-major matrix as `s[r · width + c]`
/// (`[LOADS · UNITS² / width, width]`), zero past row `r_end` or column `cols`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_tile<F: Float>(
    a: &Tensor<F>,
    s: &mut Shared<[F]>,
    unit: usize,
    base: usize,
    r0: usize,
    r_end: usize,
    c0: usize,
    cols: usize,
    #[comptime] width: usize,
) {
    #[unroll]
    for l in 0..LOADS {
        let idx = unit + l * UNITS * UNITS;
        let (r, c) = (idx / width, idx % width);
        let mut v = F::new(0.0);
        if r0 + r < r_end && c0 + c < cols {
            v = a[base + (r0 + r) * cols + c0 + c];
        }
        s[idx] = v;
    }
}

/// Stages the expert's weights `w[k0 + kk, col0 + col]` as `ws[kk · BLOCK + col]` (`[CHUNK, BLOCK]`),
/// zero past `q` or `n`; `w` is `[q, n]` per expert, or `[n, q]` when `transpose_w` (then the reduction
/// index runs fastest, as memory is laid out).
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_weights<F: Float>(
    w: &Tensor<F>,
    ws: &mut Shared<[F]>,
    unit: usize,
    w_base: usize,
    k0: usize,
    q: usize,
    col0: usize,
    n: usize,
    #[comptime] transpose_w: bool,
) {
    if transpose_w {
        #[unroll]
        for l in 0..LOADS {
            let idx = unit + l * UNITS * UNITS;
            let (col, kk) = (idx / CHUNK, idx % CHUNK);
            let mut v = F::new(0.0);
            if k0 + kk < q && col0 + col < n {
                v = w[w_base + (col0 + col) * q + k0 + kk];
            }
            ws[kk * BLOCK + col] = v;
        }
    } else {
        stage_tile(w, ws, unit, w_base, k0, q, col0, n, BLOCK);
    }
}

/// One staged chunk into the unit's micro-tile: `acc[i, j] += Σ_kk a(ty + UNITS·i, kk) ·
/// b_s[kk · BLOCK + tx + UNITS·j]`, with `a_s` laid out `[BLOCK, CHUNK]`, or `[CHUNK, BLOCK]` when
/// `a_by_chunk`.
#[cube]
fn accumulate_chunk<F: Float>(
    a_s: &Shared<[F]>,
    b_s: &Shared<[F]>,
    acc: &mut Array<F>,
    ty: usize,
    tx: usize,
    #[comptime] a_by_chunk: bool,
) {
    #[unroll]
    for kk in 0..CHUNK {
        let mut a = Array::<F>::new(MICRO);
        let mut b = Array::<F>::new(MICRO);
        #[unroll]
        for i in 0..MICRO {
            if a_by_chunk {
                a[i] = a_s[kk * BLOCK + ty + UNITS * i];
            } else {
                a[i] = a_s[(ty + UNITS * i) * CHUNK + kk];
            }
            b[i] = b_s[kk * BLOCK + tx + UNITS * i];
        }
        #[unroll]
        for i in 0..MICRO {
            #[unroll]
            for j in 0..MICRO {
                acc[i * MICRO + j] += a[i] * b[j];
            }
        }
    }
}
