//! Every CubeCL kernel → CUDA C++ (CubeCL's CUDA dialect) → PTX and CUBIN for A100 (sm_80) and
//! H100/H200 (sm_90) with NVRTC, the compiler `cubecl-cuda` calls on NVIDIA GPUs. No GPU is needed. The
//! CUBIN reader is checked against NVIDIA's `cuobjdump --dump-resource-usage`. Skips (saying so) where
//! NVRTC is not found, unless `PIPER_REQUIRE_CUDA=1` (set by `.ci/run`, which fetches NVRTC, the headers
//! and cuobjdump with `scripts/cuda-tools.py`), which turns that into a failure.
#![cfg(feature = "cuda-codegen")]

use kernels_cubecl::cube::grouped_gemm::{BLOCK, CHUNK};
use kernels_cubecl::cubin::CubinResources;
use kernels_cubecl::cuda::{SmArch, cuda_sources};
use kernels_cubecl::nvrtc::Nvrtc;

fn required() -> bool {
    std::env::var("PIPER_REQUIRE_CUDA").as_deref() == Ok("1")
}

fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) if required() => panic!("{e}"),
        Err(e) => {
            eprintln!("skipping the PTX compile: {e}");
            None
        }
    }
}

/// `cuobjdump --dump-resource-usage` of a CUBIN: (entry, REG, SHARED, STACK).
fn cuobjdump(path: &std::path::Path) -> Option<Vec<(String, u64, u64, u64)>> {
    let tool = std::env::var("PIPER_CUOBJDUMP").unwrap_or_else(|_| "cuobjdump".into());
    let out = match std::process::Command::new(&tool).arg("--dump-resource-usage").arg(path).output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => panic!("{tool} failed on {}: {}", path.display(), String::from_utf8_lossy(&out.stderr)),
        Err(e) if required() => panic!("{tool}: {e} (scripts/cuda-tools.py fetches it)"),
        Err(_) => return None,
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut rows = Vec::new();
    let mut entry = None;
    for line in text.lines() {
        if let Some(name) = line.trim().strip_prefix("Function ") {
            entry = Some(name.trim_end_matches(':').to_string());
        }
        if line.contains("REG:") {
            let field = |key: &str| -> u64 {
                let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
                rest.split_whitespace().next().unwrap().parse().unwrap()
            };
            rows.push((entry.take().expect("a Function line"), field("REG:"), field("SHARED:"), field("STACK:")));
        }
    }
    Some(rows)
}

#[test]
fn every_kernel_compiles_for_a100_and_h100_within_their_resources() {
    let Some(nvrtc) = nvrtc() else { return };
    eprintln!("NVRTC {:?} from {}", nvrtc.version().unwrap(), nvrtc.library());
    let dir = std::env::temp_dir().join(format!("piper-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for arch in SmArch::ALL {
        let sources = cuda_sources(arch).expect("CUDA code generation");
        assert_eq!(sources.len(), 12);
        for k in sources {
            let compiled = nvrtc.compile(k.name, &k.source, arch).unwrap_or_else(|e| panic!("{e}"));
            let r = &compiled.resources;
            assert!(compiled.ptx.contains(&format!(".target {}", arch.name())), "{}: PTX target", k.name);
            assert!(compiled.ptx.contains(&format!(".entry {}", r.entry)), "{}: PTX entry {}", k.name, r.entry);
            assert!(r.registers > 0 && r.registers <= 255, "{}: {} registers", k.name, r.registers);
            assert_eq!(r.stack_bytes, 0, "{} on {}: {} bytes of stack (spills)", k.name, arch.name(), r.stack_bytes);
            let staged = k.staged_tiles();
            let shared = r.shared_bytes as usize + k.dynamic_shared_bytes;
            assert!(shared >= staged * BLOCK * CHUNK * 4, "{}: {shared} bytes of shared memory", k.name);
            assert!(shared <= arch.max_shared_bytes(), "{}: {shared} bytes of shared memory", k.name);
            eprintln!(
                "{} {}: {} registers, {} B shared ({} dynamic), {} B stack",
                arch.name(),
                k.name,
                r.registers,
                shared,
                k.dynamic_shared_bytes,
                r.stack_bytes
            );
            let path = dir.join(format!("{}-{}.cubin", k.name, arch.name()));
            std::fs::write(&path, &compiled.cubin).unwrap();
            if let Some(rows) = cuobjdump(&path) {
                assert_eq!(
                    rows,
                    vec![(r.entry.clone(), r.registers as u64, r.shared_bytes, r.stack_bytes)],
                    "{}",
                    k.name
                );
            }
            // Every cut-off CUBIN is an error, never a panic or a read past the end.
            for len in (0..compiled.cubin.len()).step_by(97) {
                let cut = CubinResources::read(&compiled.cubin[..len], k.name);
                assert!(
                    cut.is_err() || cut.as_ref() == Ok(r),
                    "{}: {len} of {} bytes read as {cut:?}",
                    k.name,
                    compiled.cubin.len()
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_broken_source_fails_with_the_kernel_name_and_the_compiler_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let err =
        nvrtc.compile("broken", "extern \"C\" __global__ void broken() { undefined_fn(); }", SmArch::Sm90).unwrap_err();
    assert!(err.starts_with("broken for sm_90: NVRTC compile failed"), "{err}");
    assert!(err.contains("undefined_fn"), "the log names the problem: {err}");
}
