//! A row-major matrix's transpose, written into a reused per-thread buffer, for the GEMMs whose right
//! operand is a transposed weight (`dH = dY·Wdᵀ`, `dX = dG·Wgᵀ + dU·Wuᵀ` in the experts' backward).
//!
//! The `gemm` crate takes such an operand by strides, but then packs it with a strided gather: one
//! stream per packed row, 2–4 KiB apart for weights of 512–1024 columns, so the streams share a few
//! L1 sets and, with the weights cold in memory, the gather costs more than the product at the
//! shapes of the experts' row blocks. Measured on the dev VM (Zen 5, AVX-512, one thread, 24 experts'
//! weights cycled so they come from memory as in training): `dX = dG·Wgᵀ` with `d = 512, f = 1024`
//! 154 → 189 GFLOP/s at 512 rows and 85 → 149 at 128 rows; `dH = dY·Wdᵀ` 185 → 191 and 124 → 143; at
//! shorter weight rows (128–256 columns) the gather is as fast as transposing first, so only rows of
//! at least [`TRANSPOSE_MIN_COLS`] are transposed.

use std::cell::Cell;

use rayon::prelude::*;

/// Weights with rows at least this long are transposed before a GEMM that reads them transposed.
pub(super) const TRANSPOSE_MIN_COLS: usize = 512;
/// GEMMs with fewer rows than this read the weight in place (one row is a matrix-vector product,
/// which `gemm` runs as dot products over the weight's rows, no packing).
const TRANSPOSE_MIN_ROWS: usize = 2;
/// Tile edge: an 8 × 8 tile is read row by row and written column by column through registers.
const TILE: usize = 8;

thread_local! {
    /// The calling thread's transpose buffer, kept between calls so that steady-state steps fault
    /// in no pages.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `dst[c, r] = src[r, c]` for a row-major `src` of `rows × cols` (`dst` is `cols × rows`); on all
/// threads if `threads`, each writing a strip of `dst`'s rows.
pub(super) fn transpose_into(src: &[f32], rows: usize, cols: usize, dst: &mut [f32], threads: bool) {
    assert_eq!(src.len(), rows * cols, "transpose: source is not rows × cols");
    assert_eq!(dst.len(), rows * cols, "transpose: destination is not cols × rows");
    if rows == 0 || cols == 0 {
        return;
    }
    if !threads {
        return transpose_strip(src, rows, cols, 0, dst);
    }
    // One wide strip per thread: narrow strips read each source line in more pieces (measured slower).
    let strip_cols = cols.div_ceil(rayon::current_num_threads()).next_multiple_of(TILE);
    dst.par_chunks_mut(strip_cols * rows)
        .enumerate()
        .for_each(|(s, strip)| transpose_strip(src, rows, cols, s * strip_cols, strip));
}

/// Rows `j0..` of the transpose (`strip.len() / rows` of them, columns `j0..` of `src`), by 8 × 8 tiles
/// read row by row and written column by column through registers, source rows outermost.
fn transpose_strip(src: &[f32], rows: usize, cols: usize, j0: usize, strip: &mut [f32]) {
    let width = strip.len() / rows;
    let (full_r, full_w) = (rows / TILE * TILE, width / TILE * TILE);
    let mut tile = [[0f32; TILE]; TILE];
    for i0 in (0..full_r).step_by(TILE) {
        for jj in (0..full_w).step_by(TILE) {
            for (a, src_row) in src[i0 * cols + j0 + jj..].chunks(cols).take(TILE).enumerate() {
                for (b, &v) in src_row[..TILE].iter().enumerate() {
                    tile[b][a] = v;
                }
            }
            for (b, t) in tile.iter().enumerate() {
                strip[(jj + b) * rows + i0..][..TILE].copy_from_slice(t);
            }
        }
    }
    // The ragged edges: the strip's last columns of every row, then the last rows' first columns.
    for i in 0..rows {
        for jj in full_w..width {
            strip[jj * rows + i] = src[i * cols + j0 + jj];
        }
    }
    for i in full_r..rows {
        for jj in 0..full_w {
            strip[jj * rows + i] = src[i * cols + j0 + jj];
        }
    }
}

/// Runs `body(wᵀ, strides)` with the transpose of the row-major `rows × cols` weight `w` as a
/// `cols × rows` operand given by slice and `(row stride, column stride)`: a transposed copy in this
/// thread's buffer when a GEMM of `gemm_rows` rows would gather it slowly, else `w` itself with
/// swapped strides. The copy is made on all threads if `threads`.
pub(super) fn with_transposed<R>(
    w: &[f32],
    (rows, cols): (usize, usize),
    gemm_rows: usize,
    threads: bool,
    body: impl FnOnce(&[f32], (usize, usize)) -> R,
) -> R {
    let w = &w[..rows * cols];
    if cols < TRANSPOSE_MIN_COLS || gemm_rows < TRANSPOSE_MIN_ROWS {
        return body(w, (1, cols));
    }
    // Taken out of the thread-local while in use, so a nested call gets a buffer of its own.
    let mut buf = SCRATCH.take();
    buf.resize(rows * cols, 0.0);
    transpose_into(w, rows, cols, &mut buf, threads);
    let out = body(&buf, (rows, 1));
    SCRATCH.set(buf);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the definition, on shapes with and without ragged edges in either dimension.
    #[test]
    fn transpose_matches_the_definition() {
        for (rows, cols) in
            [(1, 1), (8, 8), (16, 24), (13, 8), (8, 21), (19, 35), (64, 3), (2, 517), (9, 100), (0, 5), (5, 0)]
        {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 7.0).collect();
            // Threaded: strips of a column or more per thread, ragged last strip included.
            for threads in [false, true] {
                let mut dst = vec![f32::NAN; rows * cols];
                transpose_into(&src, rows, cols, &mut dst, threads);
                for i in 0..rows {
                    for j in 0..cols {
                        let at = format!("({rows}×{cols}, threads {threads}) at ({i}, {j})");
                        assert_eq!(dst[j * rows + i].to_bits(), src[i * cols + j].to_bits(), "{at}");
                    }
                }
            }
        }
    }

    /// Both branches hand the body the same matrix: the copy (long rows) and the strided view (short
    /// rows, or a one-row GEMM) read element (l, j) of `wᵀ` as `w[j, l]`.
    #[test]
    fn with_transposed_gives_the_transpose_either_way() {
        for (rows, cols, gemm_rows) in [(4, TRANSPOSE_MIN_COLS + 3, 64), (4, TRANSPOSE_MIN_COLS + 3, 1), (5, 7, 64)] {
            let w: Vec<f32> = (0..rows * cols).map(|i| (i % 97) as f32 - 40.0).collect();
            let seen = with_transposed(&w, (rows, cols), gemm_rows, false, |wt, (rs, cs)| {
                let mut out = vec![f32::NAN; rows * cols];
                for l in 0..cols {
                    for j in 0..rows {
                        out[j * cols + l] = wt[l * rs + j * cs];
                    }
                }
                out
            });
            assert_eq!(seen, w, "rows {rows}, cols {cols}, gemm rows {gemm_rows}");
        }
    }
}
