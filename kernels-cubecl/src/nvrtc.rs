//! NVRTC, loaded at run time (`$PIPER_NVRTC`, else `libnvrtc.so`, `.so.13`, `.so.12` on the library
//! path): the compiler `cubecl-cuda` uses on NVIDIA GPUs. It needs no GPU or driver, so a machine
//! without one turns the generated CUDA C++ into PTX and a CUBIN for a given compute capability, and
//! reads what each kernel costs in registers and shared memory from the CUBIN
//! ([`CubinResources`](crate::cubin::CubinResources)). `scripts/cuda-tools.py` fetches NVRTC and the
//! CUDA headers from PyPI.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use libloading::{Library, Symbol};

use crate::cubin::CubinResources;
use crate::cuda::SmArch;
use crate::rtc::{Compile, Create, Destroy, Get, Program, Size, load_first};

/// One kernel compiled for one compute capability.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// The PTX NVRTC emitted (what `cubecl-cuda` loads through the driver).
    pub ptx: String,
    /// The CUBIN (ELF, `EM_CUDA`) for the compute capability.
    pub cubin: Vec<u8>,
    /// Registers, shared and local memory of the kernel, read from the CUBIN.
    pub resources: CubinResources,
}

/// Where NVRTC is looked for after `$PIPER_NVRTC`, in order.
pub const LIBRARIES: [&str; 3] = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"];

/// NVRTC, loaded once and never unloaded; compiles are serialised.
pub struct Nvrtc {
    lib: &'static Library,
    name: String,
    include: Option<PathBuf>,
}

static LIBRARY: OnceLock<Result<(&'static Library, String), String>> = OnceLock::new();
static COMPILING: Mutex<()> = Mutex::new(());

impl Nvrtc {
    /// Loads NVRTC from `$PIPER_NVRTC` or the first of [`LIBRARIES`] that exports it, with the CUDA
    /// headers of `$PIPER_CUDA_INCLUDE` (NVRTC's own built-in headers otherwise); an error says what to
    /// install.
    pub fn load() -> Result<Self, String> {
        let loaded = LIBRARY.get_or_init(|| {
            let explicit = std::env::var("PIPER_NVRTC").ok().filter(|p| !p.is_empty());
            let names: Vec<String> = explicit.into_iter().chain(LIBRARIES.iter().map(|s| s.to_string())).collect();
            find(&names)
        });
        let include = std::env::var_os("PIPER_CUDA_INCLUDE").filter(|p| !p.is_empty()).map(PathBuf::from);
        loaded.as_ref().map(|(lib, name)| Nvrtc { lib, name: name.clone(), include }).map_err(Clone::clone)
    }

    /// The library NVRTC was loaded from.
    pub fn library(&self) -> &str {
        &self.name
    }

    /// NVRTC's version, (major, minor).
    pub fn version(&self) -> Result<(i32, i32), String> {
        type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `nvrtcVersion(int*, int*)` (nvrtc.h).
        let rc = unsafe {
            std::mem::transmute::<*const c_void, Version>(self.sym(b"nvrtcVersion\0")?)(&mut major, &mut minor)
        };
        if rc != 0 {
            return Err(format!("nvrtcVersion failed ({rc})"));
        }
        Ok((major, minor))
    }

    fn sym(&self, s: &[u8]) -> Result<*const c_void, String> {
        // SAFETY: the symbol is only cast to its documented NVRTC signature by the caller.
        unsafe { self.lib.get::<*const c_void>(s).map(|f: Symbol<*const c_void>| *f) }
            .map_err(|e| format!("NVRTC symbol {}: {e}", String::from_utf8_lossy(s)))
    }

    /// Compiles one CUDA C++ source for `arch`, with the options `cubecl-cuda` uses, to PTX and a CUBIN.
    pub fn compile(&self, name: &str, source: &str, arch: SmArch) -> Result<CompiledKernel, String> {
        let mut options = vec![format!("--gpu-architecture={}", arch.name()), "-lineinfo".to_string()];
        if let Some(dir) = &self.include {
            options.push(format!("--include-path={}", dir.display()));
        }
        let (ptx, cubin) = self.run(name, source, &options).map_err(|e| format!("{name} for {}: {e}", arch.name()))?;
        let resources = CubinResources::read(&cubin, name).map_err(|e| format!("{name} for {}: {e}", arch.name()))?;
        Ok(CompiledKernel { ptx, cubin, resources })
    }

    /// nvrtcCreateProgram → nvrtcCompileProgram → PTX and CUBIN; the compiler's log on failure.
    fn run(&self, name: &str, source: &str, options: &[String]) -> Result<(String, Vec<u8>), String> {
        // SAFETY: each pointer is the library's export of that name, whose C signature is the one
        // given (nvrtc.h).
        let (create, compile, log_size, log, ptx_size, ptx, cubin_size, cubin, destroy) = unsafe {
            (
                std::mem::transmute::<*const c_void, Create>(self.sym(b"nvrtcCreateProgram\0")?),
                std::mem::transmute::<*const c_void, Compile>(self.sym(b"nvrtcCompileProgram\0")?),
                std::mem::transmute::<*const c_void, Size>(self.sym(b"nvrtcGetProgramLogSize\0")?),
                std::mem::transmute::<*const c_void, Get>(self.sym(b"nvrtcGetProgramLog\0")?),
                std::mem::transmute::<*const c_void, Size>(self.sym(b"nvrtcGetPTXSize\0")?),
                std::mem::transmute::<*const c_void, Get>(self.sym(b"nvrtcGetPTX\0")?),
                std::mem::transmute::<*const c_void, Size>(self.sym(b"nvrtcGetCUBINSize\0")?),
                std::mem::transmute::<*const c_void, Get>(self.sym(b"nvrtcGetCUBIN\0")?),
                std::mem::transmute::<*const c_void, Destroy>(self.sym(b"nvrtcDestroyProgram\0")?),
            )
        };
        let src = CString::new(source).map_err(|e| format!("the source has a NUL byte: {e}"))?;
        let cname = CString::new(format!("{name}.cu")).map_err(|e| format!("bad name: {e}"))?;
        let opts: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).expect("option")).collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        let _serial = COMPILING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let fetch = |size: Size, get: Get, prog: Program| -> Vec<u8> {
            let mut n = 0usize;
            // SAFETY: `prog` is a live program; the buffer holds the `n` bytes NVRTC reported.
            unsafe {
                size(prog, &mut n);
                let mut buf = vec![0u8; n.max(1)];
                get(prog, buf.as_mut_ptr() as *mut c_char);
                buf.truncate(n);
                buf
            }
        };
        // SAFETY: every pointer is valid for the call; the program is destroyed before returning.
        unsafe {
            let rc = create(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null());
            if rc != 0 {
                return Err(format!("nvrtcCreateProgram failed ({rc})"));
            }
            let rc = compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            if rc != 0 {
                let text = fetch(log_size, log, prog);
                destroy(&mut prog);
                let text =
                    CStr::from_bytes_until_nul(&text).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
                return Err(format!("NVRTC compile failed ({rc}):\n{text}"));
            }
            let ptx_bytes = fetch(ptx_size, ptx, prog);
            let cubin_bytes = fetch(cubin_size, cubin, prog);
            destroy(&mut prog);
            let ptx_text = CStr::from_bytes_until_nul(&ptx_bytes).map_err(|_| "the PTX is not NUL-terminated")?;
            Ok((ptx_text.to_string_lossy().into_owned(), cubin_bytes))
        }
    }
}

/// The first of `names` that exports NVRTC; the error names each one tried and what to install.
fn find(names: &[String]) -> Result<(&'static Library, String), String> {
    load_first(names.iter().map(String::as_str), b"nvrtcCreateProgram\0").map_err(|tried| {
        format!(
            "NVRTC not found (tried {}): run `eval \"$(scripts/cuda-tools.py DIR)\"` (NVRTC and the CUDA headers from \
             PyPI) or set PIPER_NVRTC to a libnvrtc.so, to compile the kernels for NVIDIA GPUs",
            tried.join("; ")
        )
    })
}
