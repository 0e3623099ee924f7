//! CUDA C++ for every kernel, from CubeCL's C++ code generator (CUDA dialect), as `cubecl-cuda` would
//! hand it to NVRTC on an NVIDIA GPU — no GPU, driver or CUDA install needed. [`nvrtc`](crate::nvrtc)
//! compiles it to PTX and CUBIN for A100 (sm_80) and H100/H200 (sm_90).

use cubecl::ir::{DeviceIdentity, DeviceProperties, HardwareProperties, MemoryDeviceProperties};
use cubecl::profile::TimingMethod;
use cubecl_cpp::shared::{CompilationOptions, CppSupportedFeatures};
use cubecl_cpp::target::Cuda;

pub use crate::codegen::KernelSource;
use crate::codegen::cpp_sources;

/// An NVIDIA data-centre GPU generation, as far as code generation is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmArch {
    /// A100: 108 SMs, 163 KiB shared memory per block (opt-in), 40 MiB L2.
    Sm80,
    /// H100 / H200: 132 SMs, 227 KiB shared memory per block (opt-in), 50 MiB L2.
    Sm90,
}

impl SmArch {
    /// Both, oldest first.
    pub const ALL: [SmArch; 2] = [SmArch::Sm80, SmArch::Sm90];

    /// The compute capability as NVRTC's `--gpu-architecture` names it (`sm_80`, `sm_90`).
    pub fn name(self) -> &'static str {
        match self {
            SmArch::Sm80 => "sm_80",
            SmArch::Sm90 => "sm_90",
        }
    }

    /// Shared memory one block may use (the opt-in maximum), bytes.
    pub fn max_shared_bytes(self) -> usize {
        match self {
            SmArch::Sm80 => 163 * 1024,
            SmArch::Sm90 => 227 * 1024,
        }
    }

    fn properties(self) -> DeviceProperties {
        let (sms, l2) = match self {
            SmArch::Sm80 => (108, 40),
            SmArch::Sm90 => (132, 50),
        };
        let hardware = HardwareProperties {
            load_width: 128,
            vector_register_count: None,
            plane_size_min: 32,
            plane_size_max: 32,
            max_bindings: 1024,
            max_shared_memory_size: self.max_shared_bytes(),
            max_cube_count: (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32),
            max_units_per_cube: 1024,
            max_cube_dim: (1024, 1024, 64),
            num_streaming_multiprocessors: Some(sms),
            num_cpu_cores: None,
            last_level_cache_size: Some(l2 * 1024 * 1024),
            num_tensor_cores: None,
            min_tensor_cores_dim: None,
            max_vector_size: 4,
            cube_mma_reserved_shared_memory: 0,
        };
        let name = self.name();
        let mut props = DeviceProperties::new(
            Default::default(),
            MemoryDeviceProperties::new(u64::MAX, 256),
            hardware,
            TimingMethod::Device,
            DeviceIdentity { name: name.into(), fingerprint: format!("ptx_{name}"), physical: None },
        );
        cubecl_cpp::register_supported_types(&mut props);
        props
    }
}

/// The CUDA source of every kernel for `arch` ([`cpp_sources`] in the CUDA dialect, 32-wide warps,
/// with the features `cubecl-cuda` turns on for these GPUs: fast math, dp4a, grid constants).
pub fn cuda_sources(arch: SmArch) -> Result<Vec<KernelSource>, String> {
    let features = CppSupportedFeatures { fast_math: true, dp4a: true, grid_constants: true, ..Default::default() };
    cpp_sources::<Cuda>(
        arch.properties(),
        &CompilationOptions { warp_size: 32, supports_features: features, ..Default::default() },
    )
}
