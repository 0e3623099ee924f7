//! Every CubeCL kernel → HIP C++ (CubeCL's HIP dialect) → AMDGPU code object for MI250X (gfx90a) with
//! HIP RTC, the compiler `cubecl-hip` calls on Frontier. No GPU is needed. Skips (saying so) where HIP
//! is not installed, unless `PIPER_REQUIRE_HIP=1` (set by `.ci/run`), which turns that into a failure.
#![cfg(feature = "hip-codegen")]

use kernels_cubecl::cube::grouped_gemm::{BLOCK, CHUNK};
use kernels_cubecl::hip::hip_sources;
use kernels_cubecl::hiprtc::HipRtc;

fn hiprtc() -> Option<HipRtc> {
    match HipRtc::load() {
        Ok(rtc) => Some(rtc),
        Err(e) if std::env::var("PIPER_REQUIRE_HIP").as_deref() == Ok("1") => panic!("{e}"),
        Err(e) => {
            eprintln!("skipping the gfx90a compile: {e}");
            None
        }
    }
}

/// HIP RTC comes from its own library (ROCm 6 and 7) or the HIP runtime (HIP 5), whichever exports it: a
/// library without it is passed over, and when none has it the error names every one tried.
#[test]
fn hip_rtc_is_loaded_from_the_library_that_exports_it() {
    let Some(rtc) = hiprtc() else { return };
    assert!(["libhiprtc.so", "libamdhip64.so"].iter().any(|l| rtc.library().starts_with(l)), "{}", rtc.library());
    let found = HipRtc::load_from(&["libc.so.6", rtc.library()]).expect("passes over libc");
    assert_eq!(found.library(), rtc.library());
    let err = HipRtc::load_from(&["libc.so.6", "libpiper-not-there.so"]).err().expect("no HIP RTC in either");
    assert!(err.contains("libc.so.6: loads but has no hiprtcCreateProgram"), "{err}");
    assert!(err.contains("libpiper-not-there.so") && err.contains("libhiprtc.so"), "{err}");
}

#[test]
fn every_kernel_generates_one_hip_entry_point() {
    let sources = hip_sources().expect("HIP code generation");
    assert_eq!(sources.len(), 12);
    for k in &sources {
        assert_eq!(k.source.matches("extern \"C\" __global__").count(), 1, "{}", k.name);
        let function = k.name.trim_end_matches("_transposed");
        assert!(k.source.contains(&format!("{function}_kernel")), "{}: entry point named after the kernel", k.name);
    }
}

/// `llvm-readelf --notes` (LLVM's own reader of the metadata), where installed: the
/// independent check of ours. Required with `PIPER_REQUIRE_HIP=1`.
fn readelf_notes(path: &std::path::Path) -> Option<std::process::Output> {
    let found = ["llvm-readelf", "/usr/lib/llvm-15/bin/llvm-readelf", "/opt/rocm/llvm/bin/llvm-readelf"]
        .iter()
        .find_map(|tool| std::process::Command::new(tool).arg("--notes").arg(path).output().ok());
    if found.is_none() && std::env::var("PIPER_REQUIRE_HIP").as_deref() == Ok("1") {
        panic!("llvm-readelf not found (it comes with hipcc's llvm-15)");
    }
    found
}

#[test]
fn every_kernel_compiles_for_mi250x_without_spills() {
    let Some(rtc) = hiprtc() else { return };
    let dir = std::env::temp_dir().join(format!("piper-hip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for k in hip_sources().unwrap() {
        let co = rtc.compile(k.name, &k.source, "gfx90a").unwrap_or_else(|e| panic!("{e}"));
        assert!(co.target.ends_with("gfx90a"), "{}: target {}", k.name, co.target);
        assert!(co.vgpr_count > 0 && co.vgpr_count <= 128, "{}: {} VGPRs", k.name, co.vgpr_count);
        assert_eq!(co.spill_count, 0, "{}: register spills", k.name);
        assert_eq!(co.scratch_bytes, 0, "{}: scratch memory", k.name);
        let staged = k.staged_tiles();
        let lds = co.lds_bytes as usize + k.dynamic_shared_bytes;
        assert!(lds >= staged * BLOCK * CHUNK * 4, "{}: {lds} bytes of LDS", k.name);
        assert!(lds <= 64 * 1024, "{}: {lds} bytes of LDS, more than an MI250X compute unit has", k.name);
        // The metadata reader against LLVM's own, where the tool is installed.
        let path = dir.join(format!("{}.co", k.name));
        std::fs::write(&path, &co.bytes).unwrap();
        if let Some(out) = readelf_notes(&path) {
            let yaml = String::from_utf8_lossy(&out.stdout);
            let field = |key: &str| -> u64 {
                let line = yaml.lines().find(|l| l.trim_start().starts_with(key)).expect(key);
                line.split(':').nth(1).unwrap().trim().parse().unwrap()
            };
            assert_eq!(field(".vgpr_count:"), co.vgpr_count, "{}", k.name);
            assert_eq!(field(".sgpr_count:"), co.sgpr_count, "{}", k.name);
            assert_eq!(field(".group_segment_fixed_size:"), co.lds_bytes, "{}", k.name);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_broken_source_fails_with_the_kernel_name_and_the_compiler_log() {
    let Some(rtc) = hiprtc() else { return };
    let err = rtc.compile("broken", "extern \"C\" __global__ void broken() { undefined_fn(); }", "gfx90a").unwrap_err();
    assert!(err.starts_with("broken: HIP RTC compile for gfx90a failed"), "{err}");
    assert!(err.contains("undefined_fn"), "the log names the problem: {err}");
}
