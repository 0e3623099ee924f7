//! The MoE layer, piece by piece, in the order a token meets them:
//! - [`router`]: token-choice top-k scores and selection (softmax, or sigmoid with a selection bias;
//!   group-limited; routed scaling), and [`losses`]: load-balancing and z-losses;
//! - [`permute`]: the local reordering of the `t · k` (token, expert) copies into expert order, and its
//!   weighted inverse (unpermute);
//! - [`dispatcher`]: the token dispatcher — dispatch sends each expert's rows to the rank that holds it,
//!   combine brings the experts' outputs back (flat, pairwise or HALO all-to-all), with the expert
//!   placement that migration changes;
//! - [`experts`]: the routed experts as one grouped SwiGLU;
//! - [`block`]: route → permute → dispatch → experts → combine → unpermute, plus shared experts.
//!
//! Legend (every file here): t = tokens, d = model width, e = experts, k = experts per token, f = expert
//! width, p = permuted rows (t · k), q = rows this rank's experts receive.

pub mod block;
pub mod dispatcher;
pub mod experts;
pub mod losses;
pub mod permute;
pub mod router;

pub use block::{ExpertRouting, MoeBlock, MoeBlockConfig};
pub use losses::MoeStats;
