//! HIP C++ for every kernel, from CubeCL's C++ code generator (HIP dialect) — no ROCm runtime, GPU or
//! LLVM needed. The sources are what `cubecl-hip` would hand to HIP RTC on an AMD GPU; the tests and
//! `examples/hip_codegen.rs` compile them for MI250X (gfx90a) with HIP RTC.

use cubecl::ir::{DeviceIdentity, DeviceProperties, HardwareProperties, MemoryDeviceProperties};
use cubecl::profile::TimingMethod;
use cubecl_cpp::shared::CompilationOptions;
use cubecl_cpp::target::Hip;

pub use crate::codegen::KernelSource;
use crate::codegen::cpp_sources;

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

/// The HIP source of every kernel for MI250X ([`cpp_sources`] in the HIP dialect, 64-wide wavefronts).
pub fn hip_sources() -> Result<Vec<KernelSource>, String> {
    cpp_sources::<Hip>(mi250x_properties(), &CompilationOptions { warp_size: 64, ..Default::default() })
}
