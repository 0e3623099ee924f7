//! The MoE operations on Burn's Cube backend (wgpu here; ROCm/CUDA where built): each op launches
//! the matching kernel of [`super::kernels`] on contiguous inputs.
//!
//! Legend: see [`crate::backend`].

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{DType, TensorMetadata, get_or_init_device_settings};
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use super::grouped_gemm::*;
use super::kernels::*;
use crate::backend::MoeBackend;

type B = CubeBackend;

fn empty_like(reference: &CubeTensor, shape: Shape, dtype: DType) -> CubeTensor {
    empty_device_dtype(reference.client.clone(), reference.device.clone(), shape, dtype)
}

/// Launch geometry for `n` units (none launched when `n == 0`).
fn grid(t: &CubeTensor, n: usize) -> Option<(CubeCount, CubeDim)> {
    (n > 0).then(|| {
        let dim = CubeDim::new(&t.client, n);
        (calculate_cube_count_elemwise(&t.client, n, dim), dim)
    })
}

fn ints_on(reference: &CubeTensor, values: Vec<i64>) -> IntTensor<B> {
    let n = values.len();
    let data = burn::tensor::TensorData::new(values, [n]);
    let dtype = get_or_init_device_settings::<B>(&reference.device).int_dtype;
    B::int_from_data(data.convert_dtype(dtype.into()), &reference.device)
}

/// Blocks of at most [`BLOCK`] rows that each stay inside one expert, as `(expert, first row, end
/// row)` triples, and each expert's first row (`e + 1` offsets).
fn expert_blocks(reference: &CubeTensor, counts_e: &[usize]) -> (Option<IntTensor<B>>, IntTensor<B>, usize) {
    let (mut tile_r, mut offset_e) = (Vec::new(), vec![0i64]);
    let mut row0 = 0usize;
    for (e, &n) in counts_e.iter().enumerate() {
        for start in (row0..row0 + n).step_by(BLOCK) {
            tile_r.extend([e as i64, start as i64, (start + BLOCK).min(row0 + n) as i64]);
        }
        row0 += n;
        offset_e.push(row0 as i64);
    }
    let blocks = tile_r.len() / 3;
    let tiles = (blocks > 0).then(|| ints_on(reference, tile_r));
    (tiles, ints_on(reference, offset_e), blocks)
}

/// Launch geometry of the tiled GEMMs: `UNITS × UNITS` units per cube.
fn gemm_grid(x: usize, y: usize, z: usize) -> (CubeCount, CubeDim) {
    let count = |v: usize| u32::try_from(v).expect("grid fits in u32");
    (CubeCount::Static(count(x), count(y), count(z)), CubeDim::new_2d(UNITS as u32, UNITS as u32))
}

/// `out_pn[i] = x_pq[i] · w[e]` (`w` `[e, q, n]`), or `· w[e]ᵀ` (`w` `[e, n, q]`), for the rows i of
/// expert e, over the row blocks of [`expert_blocks`].
fn grouped_matmul(
    x_pq: CubeTensor,
    w: CubeTensor,
    tiles: &Option<IntTensor<B>>,
    blocks: usize,
    transpose_w: bool,
) -> CubeTensor {
    let (p, q) = (x_pq.shape()[0], x_pq.shape()[1]);
    let n = if transpose_w { w.shape()[1] } else { w.shape()[2] };
    let out = empty_like(&x_pq, Shape::new([p, n]), x_pq.dtype);
    let Some(tiles) = tiles else { return out };
    if n == 0 {
        return out;
    }
    let (count, dim) = gemm_grid(n.div_ceil(BLOCK), blocks, 1);
    let dtypes = [dtype_to_storage_type(x_pq.dtype), dtype_to_storage_type(tiles.dtype)];
    // SAFETY: every row block lies inside `[0, p)` and one expert; the kernel bounds-checks rows,
    // columns and the reduction; all tensors are contiguous with the shapes above.
    unsafe {
        grouped_matmul_kernel::launch_unchecked(
            &x_pq.client.clone(),
            count,
            dim,
            into_contiguous(x_pq).into_tensor_arg(),
            into_contiguous(w).into_tensor_arg(),
            tiles.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            q,
            n,
            transpose_w,
            dtypes,
        )
    };
    out
}

/// Gate and up projections with the SwiGLU epilogue: `(g_pf, u_pf, h_pf)`.
fn grouped_gate_up(
    x_pd: CubeTensor,
    w_gate_edf: CubeTensor,
    w_up_edf: CubeTensor,
    tiles: &Option<IntTensor<B>>,
    blocks: usize,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let (p, d, f) = (x_pd.shape()[0], x_pd.shape()[1], w_gate_edf.shape()[2]);
    let out = || empty_like(&x_pd, Shape::new([p, f]), x_pd.dtype);
    let (g, u, h) = (out(), out(), out());
    let Some(tiles) = tiles else { return (g, u, h) };
    if f == 0 {
        return (g, u, h);
    }
    let (count, dim) = gemm_grid(f.div_ceil(BLOCK), blocks, 1);
    let dtypes = [dtype_to_storage_type(x_pd.dtype), dtype_to_storage_type(tiles.dtype)];
    // SAFETY: as in `grouped_matmul`.
    unsafe {
        grouped_gate_up_kernel::launch_unchecked(
            &x_pd.client.clone(),
            count,
            dim,
            into_contiguous(x_pd).into_tensor_arg(),
            into_contiguous(w_gate_edf).into_tensor_arg(),
            into_contiguous(w_up_edf).into_tensor_arg(),
            tiles.clone().into_tensor_arg(),
            g.clone().into_tensor_arg(),
            u.clone().into_tensor_arg(),
            h.clone().into_tensor_arg(),
            d,
            f,
            dtypes,
        )
    };
    (g, u, h)
}

/// `dw_eqn[x] = a_pq[rows of x]ᵀ · b_pn[rows of x]`.
fn grouped_weight_grad(a_pq: CubeTensor, b_pn: CubeTensor, offset_e: CubeTensor, experts: usize) -> CubeTensor {
    let (q, n) = (a_pq.shape()[1], b_pn.shape()[1]);
    let out = empty_like(&a_pq, Shape::new([experts, q, n]), a_pq.dtype);
    if experts * q * n == 0 {
        return out;
    }
    let (count, dim) = gemm_grid(n.div_ceil(BLOCK), q.div_ceil(BLOCK), experts);
    let dtypes = [dtype_to_storage_type(a_pq.dtype), dtype_to_storage_type(offset_e.dtype)];
    // SAFETY: offsets are non-decreasing and end at the row count; the kernel bounds-checks q and n.
    unsafe {
        grouped_weight_grad_kernel::launch_unchecked(
            &a_pq.client.clone(),
            count,
            dim,
            into_contiguous(a_pq).into_tensor_arg(),
            into_contiguous(b_pn).into_tensor_arg(),
            offset_e.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            q,
            n,
            dtypes,
        )
    };
    out
}

/// The fused dense operations run their generic definitions (Burn's own kernels) on the Cube backend.
impl crate::fused::FusedBackend for CubeBackend {}

impl MoeBackend for CubeBackend {
    fn grouped_swiglu_forward(
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (tiles, _, blocks) = expert_blocks(&x_pd, &counts_e);
        let (g_pf, u_pf, h_pf) = grouped_gate_up(x_pd, w_gate_edf, w_up_edf, &tiles, blocks);
        (grouped_matmul(h_pf, w_down_efd, &tiles, blocks, false), g_pf, u_pf)
    }

    fn grouped_swiglu_backward(
        dy_pd: FloatTensor<Self>,
        x_pd: FloatTensor<Self>,
        w_gate_edf: FloatTensor<Self>,
        w_up_edf: FloatTensor<Self>,
        w_down_efd: FloatTensor<Self>,
        g_pf: FloatTensor<Self>,
        u_pf: FloatTensor<Self>,
        counts_e: Vec<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let experts = counts_e.len();
        let (tiles, offset_e, blocks) = expert_blocks(&dy_pd, &counts_e);
        let dh_pf = grouped_matmul(dy_pd.clone(), w_down_efd, &tiles, blocks, true);
        let h_pf = Self::swiglu(g_pf.clone(), u_pf.clone());
        let (dg_pf, du_pf) = Self::swiglu_backward(g_pf, u_pf, dh_pf);
        let dx_pd = Self::float_add(
            grouped_matmul(dg_pf.clone(), w_gate_edf, &tiles, blocks, true),
            grouped_matmul(du_pf.clone(), w_up_edf, &tiles, blocks, true),
        );
        let dwg = grouped_weight_grad(x_pd.clone(), dg_pf, offset_e.clone(), experts);
        let dwu = grouped_weight_grad(x_pd, du_pf, offset_e.clone(), experts);
        let dwd = grouped_weight_grad(h_pf, dy_pd, offset_e, experts);
        (dx_pd, dwg, dwu, dwd)
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let (gate, up) = (into_contiguous(gate), into_contiguous(up));
        let out = empty_like(&gate, gate.shape(), gate.dtype);
        if let Some((count, dim)) = grid(&gate, gate.shape().num_elements()) {
            let dtype = dtype_to_storage_type(gate.dtype);
            // SAFETY: bounds-checked unit index; same-shape contiguous tensors.
            unsafe {
                swiglu_forward_kernel::launch_unchecked(
                    &gate.client.clone(),
                    count,
                    dim,
                    gate.into_tensor_arg(),
                    up.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    dtype,
                )
            };
        }
        out
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad_h: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (gate, up, grad_h) = (into_contiguous(gate), into_contiguous(up), into_contiguous(grad_h));
        let d_gate = empty_like(&gate, gate.shape(), gate.dtype);
        let d_up = empty_like(&gate, gate.shape(), gate.dtype);
        if let Some((count, dim)) = grid(&gate, gate.shape().num_elements()) {
            let dtype = dtype_to_storage_type(gate.dtype);
            // SAFETY: bounds-checked unit index; same-shape contiguous tensors.
            unsafe {
                swiglu_backward_kernel::launch_unchecked(
                    &gate.client.clone(),
                    count,
                    dim,
                    gate.into_tensor_arg(),
                    up.into_tensor_arg(),
                    grad_h.into_tensor_arg(),
                    d_gate.clone().into_tensor_arg(),
                    d_up.clone().into_tensor_arg(),
                    dtype,
                )
            };
        }
        (d_gate, d_up)
    }

    fn permute_rows(x_td: FloatTensor<Self>, token_p: IntTensor<Self>, _row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        let (x_td, token_p) = (into_contiguous(x_td), into_contiguous(token_p));
        let (p, d) = (token_p.shape()[0], x_td.shape()[1]);
        let out = empty_like(&x_td, Shape::new([p, d]), x_td.dtype);
        if let Some((count, dim)) = grid(&x_td, p * d) {
            let dtypes = [dtype_to_storage_type(x_td.dtype), dtype_to_storage_type(token_p.dtype)];
            // SAFETY: bounds-checked unit index; token_p < rows of x_td (a RowMap invariant).
            unsafe {
                permute_rows_kernel::launch_unchecked(
                    &x_td.client.clone(),
                    count,
                    dim,
                    x_td.into_tensor_arg(),
                    token_p.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    d,
                    dtypes,
                )
            };
        }
        out
    }

    fn permute_rows_backward(dy_pd: FloatTensor<Self>, row_tk: IntTensor<Self>) -> FloatTensor<Self> {
        combine(dy_pd.clone(), dy_pd, row_tk, false)
    }

    fn combine_rows(
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        _slot_p: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        combine(y_pd, w_tk, row_tk, true)
    }

    fn combine_rows_backward(
        dout_td: FloatTensor<Self>,
        y_pd: FloatTensor<Self>,
        w_tk: FloatTensor<Self>,
        row_tk: IntTensor<Self>,
        slot_p: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dout_td, y_pd, w_tk) = (into_contiguous(dout_td), into_contiguous(y_pd), into_contiguous(w_tk));
        let (row_tk, slot_p) = (into_contiguous(row_tk), into_contiguous(slot_p));
        let (t, k, d, p) = (row_tk.shape()[0], row_tk.shape()[1], dout_td.shape()[1], slot_p.shape()[0]);
        let dy_pd = empty_like(&dout_td, Shape::new([p, d]), dout_td.dtype);
        let dw_tk = empty_like(&dout_td, Shape::new([t, k]), dout_td.dtype);
        let dtypes = [dtype_to_storage_type(dout_td.dtype), dtype_to_storage_type(row_tk.dtype)];
        if let Some((count, dim)) = grid(&dout_td, p * d) {
            // SAFETY: bounds-checked unit index; slot_p is a permutation of 0..t·k.
            unsafe {
                combine_backward_rows_kernel::launch_unchecked(
                    &dout_td.client.clone(),
                    count,
                    dim,
                    dout_td.clone().into_tensor_arg(),
                    w_tk.into_tensor_arg(),
                    slot_p.into_tensor_arg(),
                    dy_pd.clone().into_tensor_arg(),
                    k,
                    d,
                    dtypes,
                )
            };
        }
        if let Some((count, dim)) = grid(&dout_td, t * k) {
            // SAFETY: bounds-checked unit index; row_tk holds rows of y_pd.
            unsafe {
                combine_backward_weights_kernel::launch_unchecked(
                    &dout_td.client.clone(),
                    count,
                    dim,
                    dout_td.into_tensor_arg(),
                    y_pd.into_tensor_arg(),
                    row_tk.into_tensor_arg(),
                    dw_tk.clone().into_tensor_arg(),
                    k,
                    d,
                    dtypes,
                )
            };
        }
        (dy_pd, dw_tk)
    }

    fn topk_softmax(logits_te: FloatTensor<Self>, k: usize, renormalize: bool) -> (FloatTensor<Self>, IntTensor<Self>) {
        let logits_te = into_contiguous(logits_te);
        let (t, e) = (logits_te.shape()[0], logits_te.shape()[1]);
        let int_dtype: DType = get_or_init_device_settings::<B>(&logits_te.device).int_dtype.into();
        let w_tk = empty_like(&logits_te, Shape::new([t, k]), logits_te.dtype);
        let idx_tk = empty_like(&logits_te, Shape::new([t, k]), int_dtype);
        if let Some((count, dim)) = grid(&logits_te, t) {
            let dtypes = [dtype_to_storage_type(logits_te.dtype), dtype_to_storage_type(int_dtype)];
            // SAFETY: bounds-checked unit index; one unit per token row.
            unsafe {
                topk_softmax_kernel::launch_unchecked(
                    &logits_te.client.clone(),
                    count,
                    dim,
                    logits_te.into_tensor_arg(),
                    w_tk.clone().into_tensor_arg(),
                    idx_tk.clone().into_tensor_arg(),
                    e,
                    k,
                    renormalize,
                    dtypes,
                )
            };
        }
        (w_tk, idx_tk)
    }

    fn topk_softmax_backward(
        logits_te: FloatTensor<Self>,
        idx_tk: IntTensor<Self>,
        w_tk: FloatTensor<Self>,
        dw_tk: FloatTensor<Self>,
        renormalize: bool,
    ) -> FloatTensor<Self> {
        let (logits_te, idx_tk) = (into_contiguous(logits_te), into_contiguous(idx_tk));
        let (w_tk, dw_tk) = (into_contiguous(w_tk), into_contiguous(dw_tk));
        let (t, e, k) = (logits_te.shape()[0], logits_te.shape()[1], idx_tk.shape()[1]);
        let out = empty_like(&logits_te, Shape::new([t, e]), logits_te.dtype);
        if let Some((count, dim)) = grid(&logits_te, t) {
            let dtypes = [dtype_to_storage_type(logits_te.dtype), dtype_to_storage_type(idx_tk.dtype)];
            // SAFETY: bounds-checked unit index; one unit per token row.
            unsafe {
                topk_softmax_backward_kernel::launch_unchecked(
                    &logits_te.client.clone(),
                    count,
                    dim,
                    logits_te.into_tensor_arg(),
                    idx_tk.into_tensor_arg(),
                    w_tk.into_tensor_arg(),
                    dw_tk.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    e,
                    k,
                    renormalize,
                    dtypes,
                )
            };
        }
        out
    }
}

/// `out_td[t] = Σ_j w_tk[t, j] · y_pd[row_tk[t, j]]` (`weighted = false`: weights of one).
fn combine(y_pd: CubeTensor, w_tk: CubeTensor, row_tk: CubeTensor, weighted: bool) -> CubeTensor {
    let (y_pd, w_tk, row_tk) = (into_contiguous(y_pd), into_contiguous(w_tk), into_contiguous(row_tk));
    let (t, k, d) = (row_tk.shape()[0], row_tk.shape()[1], y_pd.shape()[1]);
    let out = empty_like(&y_pd, Shape::new([t, d]), y_pd.dtype);
    if let Some((count, dim)) = grid(&y_pd, t * d) {
        let dtypes = [dtype_to_storage_type(y_pd.dtype), dtype_to_storage_type(row_tk.dtype)];
        // SAFETY: bounds-checked unit index; row_tk holds rows of y_pd.
        unsafe {
            combine_rows_kernel::launch_unchecked(
                &y_pd.client.clone(),
                count,
                dim,
                y_pd.into_tensor_arg(),
                w_tk.into_tensor_arg(),
                row_tk.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                k,
                d,
                weighted,
                dtypes,
            )
        };
    }
    out
}
