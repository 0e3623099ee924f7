//! The CubeCL side: kernel definitions and, with a runtime, their launch as Burn backend ops.

pub mod grouped_gemm;
pub mod kernels;
#[cfg(feature = "cube-runtime")]
mod launch;
