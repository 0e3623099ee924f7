//! Where the experts' tasks read their rows from: a buffer already sorted by expert (`x_pd`, `dy_pd`),
//! or the token rows themselves, gathered per task into a reused per-thread buffer (the routed
//! experts of [`super::grouped_tasks`], which fuse dispatch and combine into the expert GEMMs).
//!
//! Gathering per task keeps the `[t · k, d]` copies out of memory: at top-8 each is 8× the token rows
//! (32 MiB at 2048 tokens × 512), written once and read two or three times from DRAM, while the token
//! rows (4 MiB) stay in the last-level cache and a task's gathered block (`n × d`, up to a few
//! hundred KiB) in L2 while its GEMMs read it.
//!
//! Legend: t = tokens, p = rows sorted by expert, d = row width.

use std::cell::Cell;

thread_local! {
    /// The calling thread's gather buffer, kept between calls so that steady-state steps fault in
    /// no pages.
    static GATHERED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The rows `[p, d]` the experts read, in expert order.
#[derive(Clone, Copy)]
pub(super) enum RowSource<'a> {
    /// Already sorted by expert: row i is `rows_pd[i]`.
    Sorted(&'a [f32]),
    /// Row i is `rows_td[token_p[i]]`.
    Gathered { rows_td: &'a [f32], token_p: &'a [usize] },
}

impl RowSource<'_> {
    /// Runs `body(block, row_stride)` on columns `c0..c0 + width` of rows `r0..r0 + n`: element
    /// (i, j) of the block is `block[i · row_stride + j]`. Sorted rows are read in place; gathered
    /// ones are copied (packed, row stride `width`) into this thread's buffer first.
    pub(super) fn with_block<R>(
        &self,
        (r0, n): (usize, usize),
        (c0, width): (usize, usize),
        d: usize,
        body: impl FnOnce(&[f32], usize) -> R,
    ) -> R {
        debug_assert!(c0 + width <= d, "block columns past the row width");
        match *self {
            RowSource::Sorted(rows_pd) => body(&rows_pd[r0 * d + c0..], d),
            RowSource::Gathered { rows_td, token_p } => {
                // Taken out of the thread-local while in use, so a nested call gets a buffer of its own.
                let mut buf = GATHERED.take();
                buf.clear();
                buf.reserve(n * width);
                for &t in &token_p[r0..r0 + n] {
                    buf.extend_from_slice(&rows_td[t * d + c0..t * d + c0 + width]);
                }
                let out = body(&buf, width);
                GATHERED.set(buf);
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sources hand the body the same block: rows of the sorted buffer, or the gathered token
    /// rows, for any column window.
    #[test]
    fn both_sources_give_the_same_block() {
        let (t, d) = (5, 7);
        let rows_td: Vec<f32> = (0..t * d).map(|i| i as f32 * 0.25 - 3.0).collect();
        let token_p = [3, 0, 0, 4, 1, 3, 2];
        let rows_pd: Vec<f32> = token_p.iter().flat_map(|&t| rows_td[t * d..(t + 1) * d].to_vec()).collect();
        let read = |src: RowSource, rows: (usize, usize), cols: (usize, usize)| {
            src.with_block(rows, cols, d, |block, stride| {
                (0..rows.1).flat_map(|i| (0..cols.1).map(move |j| block[i * stride + j]).collect::<Vec<_>>()).collect()
            })
        };
        for (rows, cols) in [((0, 7), (0, 7)), ((2, 3), (1, 4)), ((6, 1), (6, 1)), ((3, 0), (0, 7))] {
            let want: Vec<f32> = read(RowSource::Sorted(&rows_pd), rows, cols);
            let got: Vec<f32> = read(RowSource::Gathered { rows_td: &rows_td, token_p: &token_p }, rows, cols);
            assert_eq!(got, want, "rows {rows:?}, columns {cols:?}");
            let direct: Vec<f32> =
                (rows.0..rows.0 + rows.1).flat_map(|i| rows_td[token_p[i] * d + cols.0..][..cols.1].to_vec()).collect();
            assert_eq!(want, direct, "rows {rows:?}, columns {cols:?}");
        }
    }
}
