//! Each head's `[a | r]` on Flex ([`crate::concat_heads`]): one multi-threaded pass over the
//! `(batch, position)` rows forward and one backward, the broadcast part summed over the heads there.
//!
//! Legend: rows = b · s, h = heads, n = width of `a`, g = heads of `r` (h or 1), w = width of `r`.

use rayon::prelude::*;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// Shape of one call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    pub rows: usize,
    pub h: usize,
    pub n: usize,
    pub g: usize,
    pub w: usize,
}

impl Heads {
    /// Head `j`'s part of `r` within a row of `g · w`.
    fn r_head(&self, j: usize) -> usize {
        if self.g == 1 { 0 } else { j * self.w }
    }
}

/// `out[row, j] = [a[row, j] | r[row, j or 0]]`.
pub(super) fn concat(a: &[f32], r: &[f32], d: Heads) -> Vec<f32> {
    let Heads { h, n, g, w, .. } = d;
    let x = n + w;
    let mut out = vec![0f32; d.rows * h * x];
    out.par_chunks_mut((ROWS_PER_TASK * h * x).max(1)).enumerate().for_each(|(c, chunk)| {
        for (i, out_row) in chunk.chunks_mut((h * x).max(1)).enumerate() {
            let row = c * ROWS_PER_TASK + i;
            let (a_row, r_row) = (&a[row * h * n..(row + 1) * h * n], &r[row * g * w..(row + 1) * g * w]);
            for (j, head) in out_row.chunks_mut(x.max(1)).enumerate() {
                head[..n].copy_from_slice(&a_row[j * n..(j + 1) * n]);
                head[n..].copy_from_slice(&r_row[d.r_head(j)..d.r_head(j) + w]);
            }
        }
    });
    out
}

/// Backward of [`concat`] from `dout`: `(da, dr)`, `dr` summed over the heads when `g = 1`.
pub(super) fn concat_backward(dout: &[f32], d: Heads) -> (Vec<f32>, Vec<f32>) {
    let Heads { h, n, g, w, .. } = d;
    let x = n + w;
    let (mut da, mut dr) = (vec![0f32; d.rows * h * n], vec![0f32; d.rows * g * w]);
    let (a_chunk, r_chunk) = ((ROWS_PER_TASK * h * n).max(1), (ROWS_PER_TASK * g * w).max(1));
    // Empty widths leave nothing to split: the zip below would then pair no chunks at all.
    if d.rows == 0 || h == 0 {
        return (da, dr);
    }
    let tasks = d.rows.div_ceil(ROWS_PER_TASK);
    let mut da_chunks: Vec<&mut [f32]> = da.chunks_mut(a_chunk).collect();
    let mut dr_chunks: Vec<&mut [f32]> = dr.chunks_mut(r_chunk).collect();
    da_chunks.resize_with(tasks, Default::default);
    dr_chunks.resize_with(tasks, Default::default);
    da_chunks.into_par_iter().zip(dr_chunks).enumerate().for_each(|(c, (da_c, dr_c))| {
        for i in 0..ROWS_PER_TASK.min(d.rows - c * ROWS_PER_TASK) {
            let d_row = &dout[(c * ROWS_PER_TASK + i) * h * x..][..h * x];
            let dr_row = &mut dr_c[i * g * w..(i + 1) * g * w];
            for (j, head) in d_row.chunks(x.max(1)).enumerate() {
                if n > 0 {
                    da_c[(i * h + j) * n..(i * h + j + 1) * n].copy_from_slice(&head[..n]);
                }
                let at = d.r_head(j);
                if g == 1 && j > 0 {
                    dr_row[at..at + w].iter_mut().zip(&head[n..]).for_each(|(s, &v)| *s += v);
                } else {
                    dr_row[at..at + w].copy_from_slice(&head[n..]);
                }
            }
        }
    });
    (da, dr)
}
