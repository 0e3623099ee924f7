//! C++ for every kernel from CubeCL's C++ code generator, in the HIP dialect ([`hip`](crate::hip), for
//! AMD GPUs) or the CUDA one ([`cuda`](crate::cuda), for NVIDIA GPUs) — no GPU, runtime or LLVM needed.

use std::sync::Arc;

use cubecl::ir::{AddressType, DeviceProperties, ElemType, FloatKind, IntKind, TargetProperties};
use cubecl::prelude::*;
use cubecl::{Compiler, CubeKernel};
use cubecl_cpp::ComputeKernel;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler};
use cubecl_cpp::target::CppTarget;

use crate::cube::grouped_gemm::*;
use crate::cube::kernels::*;

/// One kernel's generated source.
#[derive(Debug, Clone)]
pub struct KernelSource {
    /// The kernel's name (its Rust function name).
    pub name: &'static str,
    /// C++ source, one `extern "C" __global__` entry point.
    pub source: String,
    /// Shared memory (LDS on AMD) the kernel declares as `extern __shared__`: passed at launch, so it is
    /// not in the compiled kernel's fixed size.
    pub dynamic_shared_bytes: usize,
}

impl KernelSource {
    /// Operand tiles of `BLOCK × CHUNK` f32 the kernel stages in shared memory: three for the gate + up
    /// GEMM, two for the other tiled GEMMs, none for the rest.
    pub fn staged_tiles(&self) -> usize {
        match self.name {
            "grouped_gate_up" => 3,
            "grouped_matmul" | "grouped_matmul_transposed" | "grouped_weight_grad" => 2,
            _ => 0,
        }
    }
}

fn tensor() -> TensorCompilationArg {
    TensorCompilationArg {
        meta: TensorMetaCompilationArg { len: (), rank: () },
        buffer: BufferCompilationArg { inplace: None },
    }
}

/// Generates the C++ source of every kernel in `T`'s dialect for a device of `props`, for `f32` data and
/// `i32` indices (top-k = 2, the Mixtral/Qwen setting, for the gating kernels whose `k` is compile-time).
pub fn cpp_sources<T: CppTarget>(
    props: DeviceProperties,
    options: &CompilationOptions,
) -> Result<Vec<KernelSource>, String>
where
    CppCompiler<T>: Compiler<Representation = ComputeKernel, CompilationOptions = CompilationOptions>,
{
    let props = Arc::new(props);
    let target = Arc::new(TargetProperties::default());
    let settings = || KernelSettings::new(CubeDim::new_1d(256).into(), ExecutionMode::Checked, AddressType::U32);
    let tiled = || {
        KernelSettings::new(
            CubeDim::new_2d(UNITS as u32, UNITS as u32).into(),
            ExecutionMode::Checked,
            AddressType::U32,
        )
    };
    let f = ElemType::Float(FloatKind::F32);
    let i = ElemType::Int(IntKind::I32);
    let (p, t) = (props.clone(), target.clone());
    let kernels: Vec<(&'static str, Box<dyn CubeKernel>)> = vec![
        (
            "swiglu_forward",
            Box::new(swiglu_forward_kernel::SwigluForwardKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                f,
            )),
        ),
        (
            "swiglu_backward",
            Box::new(swiglu_backward_kernel::SwigluBackwardKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                f,
            )),
        ),
        (
            "permute_rows",
            Box::new(permute_rows_kernel::PermuteRowsKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                (),
                [f, i],
            )),
        ),
        (
            "combine_rows",
            Box::new(combine_rows_kernel::CombineRowsKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                true,
                [f, i],
            )),
        ),
        (
            "combine_backward_rows",
            Box::new(combine_backward_rows_kernel::CombineBackwardRowsKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                [f, i],
            )),
        ),
        (
            "combine_backward_weights",
            Box::new(combine_backward_weights_kernel::CombineBackwardWeightsKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                [f, i],
            )),
        ),
        (
            "topk_softmax",
            Box::new(topk_softmax_kernel::TopkSoftmaxKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                (),
                2,
                true,
                [f, i],
            )),
        ),
        (
            "topk_softmax_backward",
            Box::new(topk_softmax_backward_kernel::TopkSoftmaxBackwardKernel::new(
                settings(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                2,
                true,
                [f, i],
            )),
        ),
        (
            "grouped_gate_up",
            Box::new(grouped_gate_up_kernel::GroupedGateUpKernel::new(
                tiled(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                [f, i],
            )),
        ),
        (
            "grouped_matmul",
            Box::new(grouped_matmul_kernel::GroupedMatmulKernel::new(
                tiled(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                false,
                [f, i],
            )),
        ),
        (
            "grouped_matmul_transposed",
            Box::new(grouped_matmul_kernel::GroupedMatmulKernel::new(
                tiled(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                true,
                [f, i],
            )),
        ),
        (
            "grouped_weight_grad",
            Box::new(grouped_weight_grad_kernel::GroupedWeightGradKernel::new(
                tiled(),
                p.clone(),
                t.clone(),
                tensor(),
                tensor(),
                tensor(),
                tensor(),
                (),
                (),
                [f, i],
            )),
        ),
    ];
    let mut out = Vec::new();
    for (name, kernel) in kernels {
        let definition = cubecl::define_kernel(kernel.as_ref()).map_err(|e| format!("{name}: {e:?}"))?;
        let mut compiler = CppCompiler::<T>::default();
        let compiled = Compiler::compile(&mut compiler, definition, options).map_err(|e| format!("{name}: {e:?}"))?;
        out.push(KernelSource { name, source: compiled.source, dynamic_shared_bytes: compiled.shared_memory_size });
    }
    Ok(out)
}
