//! HIP C++ for every kernel, from CubeCL's C++ code generator (HIP dialect) — no ROCm runtime, GPU or
//! LLVM needed. The sources are what `cubecl-hip` would hand to HIP RTC on an AMD GPU; the tests and
//! `examples/hip_codegen.rs` compile them for MI250X (gfx90a) with `hipcc`.

use std::sync::Arc;

use cubecl::ir::{
    AddressType, DeviceIdentity, DeviceProperties, ElemType, FloatKind, HardwareProperties, IntKind,
    MemoryDeviceProperties, TargetProperties,
};
use cubecl::prelude::*;
use cubecl::profile::TimingMethod;
use cubecl::{Compiler, CubeKernel};
use cubecl_cpp::shared::{CompilationOptions, CppCompiler};
use cubecl_cpp::target::Hip;

use crate::cube::grouped_gemm::*;
use crate::cube::kernels::*;

/// One kernel's generated HIP source.
#[derive(Debug, Clone)]
pub struct HipKernelSource {
    /// The kernel's name (its Rust function name).
    pub name: &'static str,
    /// HIP C++ source, one `extern "C" __global__` entry point.
    pub source: String,
    /// Shared memory (LDS) the kernel declares as `extern __shared__`: passed at launch, so it is
    /// not in the code object's fixed LDS size.
    pub dynamic_lds_bytes: usize,
}

/// An MI250X GCD as far as code generation is concerned: 64-wide wavefronts, 64 KiB LDS, 1024 units
/// per block, 110 compute units.
fn mi250x_properties() -> DeviceProperties {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 64,
        plane_size_max: 64,
        max_bindings: 1024,
        max_shared_memory_size: 64 * 1024,
        max_cube_count: (u32::MAX, u16::MAX as u32, u16::MAX as u32),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 1024),
        num_streaming_multiprocessors: Some(110),
        num_cpu_cores: None,
        last_level_cache_size: Some(8 * 1024 * 1024),
        num_tensor_cores: None,
        min_tensor_cores_dim: None,
        max_vector_size: 4,
        cube_mma_reserved_shared_memory: 0,
    };
    let mut props = DeviceProperties::new(
        Default::default(),
        MemoryDeviceProperties::new(u64::MAX, 256),
        hardware,
        TimingMethod::Device,
        DeviceIdentity { name: "gfx90a (MI250X)".into(), fingerprint: "gfx90a".into(), physical: None },
    );
    cubecl_cpp::register_supported_types(&mut props);
    props
}

fn tensor() -> TensorCompilationArg {
    TensorCompilationArg {
        meta: TensorMetaCompilationArg { len: (), rank: () },
        buffer: BufferCompilationArg { inplace: None },
    }
}

/// Generates the HIP source of every kernel for `f32` data and `i32` indices (top-k = 2, the
/// Mixtral/Qwen setting, for the gating kernels whose `k` is compile-time).
pub fn hip_sources() -> Result<Vec<HipKernelSource>, String> {
    let props = Arc::new(mi250x_properties());
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
        let mut compiler = CppCompiler::<Hip>::default();
        let options = CompilationOptions { warp_size: 64, ..Default::default() };
        let compiled = Compiler::compile(&mut compiler, definition, &options).map_err(|e| format!("{name}: {e:?}"))?;
        out.push(HipKernelSource { name, source: compiled.source, dynamic_lds_bytes: compiled.shared_memory_size });
    }
    Ok(out)
}
