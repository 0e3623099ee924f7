//! HIP RTC, loaded at run time from `libhiprtc.so` (ROCm 6 and 7) or `libamdhip64.so` (HIP 5): the
//! compiler `cubecl-hip` uses on AMD GPUs.
//! It needs no GPU, so a machine without one can turn the generated HIP C++ into AMDGPU code objects (Debian 12:
//! `apt-get install hipcc libamdhip64-dev rocm-device-libs`, HIP 5.2), and read what each kernel costs
//! in registers and LDS from the code object's metadata.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

use libloading::{Library, Symbol};

use crate::rtc::{Compile, Create, Destroy, Get, Program, Size, load_first};

/// A compiled AMDGPU code object and the resource usage its metadata reports.
#[derive(Debug, Clone)]
pub struct CodeObject {
    /// The ELF code object (`EM_AMDGPU`).
    pub bytes: Vec<u8>,
    /// Vector registers per lane.
    pub vgpr_count: u64,
    /// Scalar registers per wavefront.
    pub sgpr_count: u64,
    /// Registers spilled to scratch (VGPR + SGPR).
    pub spill_count: u64,
    /// Static LDS (shared memory) per workgroup, bytes.
    pub lds_bytes: u64,
    /// Scratch (private) memory per lane, bytes.
    pub scratch_bytes: u64,
    /// The `amdhsa.target` string, e.g. `amdgcn-amd-amdhsa--gfx90a`.
    pub target: String,
}

/// Where HIP RTC is looked for, in order: its own library (since ROCm 6.0, and the only one since 7.0,
/// which took it out of the HIP runtime), then the HIP runtime, which held it up to ROCm 5 (Debian 12's
/// HIP 5.2).
pub const LIBRARIES: [&str; 6] =
    ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];

/// HIP RTC from the system's libraries. The library is loaded once and never unloaded (unloading the
/// HIP runtime while its threads live crashes the process); compiles are serialised.
pub struct HipRtc {
    lib: &'static Library,
    name: String,
}

static LIBRARY: OnceLock<Result<(&'static Library, String), String>> = OnceLock::new();
static COMPILING: Mutex<()> = Mutex::new(());

impl HipRtc {
    /// Loads HIP RTC from the first of [`LIBRARIES`] that exports it; an error says what to install.
    pub fn load() -> Result<Self, String> {
        let loaded = LIBRARY.get_or_init(|| find(&LIBRARIES));
        loaded.as_ref().map(|(lib, name)| HipRtc { lib, name: name.clone() }).map_err(Clone::clone)
    }

    /// Loads HIP RTC from the first of `names` that exports it (a library without it is passed over); the
    /// error names each one tried and why it was not used.
    pub fn load_from(names: &[&str]) -> Result<Self, String> {
        find(names).map(|(lib, name)| HipRtc { lib, name })
    }

    /// The library HIP RTC was loaded from, e.g. `libhiprtc.so` or `libamdhip64.so`.
    pub fn library(&self) -> &str {
        &self.name
    }

    /// Compiles one HIP C++ source for `arch` (e.g. `gfx90a`) with the options `cubecl-hip` uses.
    pub fn compile(&self, name: &str, source: &str, arch: &str) -> Result<CodeObject, String> {
        let sym = |s: &[u8]| -> Result<*const c_void, String> {
            // SAFETY: the symbol is only cast to its documented HIP RTC signature below.
            unsafe { self.lib.get::<*const c_void>(s).map(|f: Symbol<*const c_void>| *f) }
                .map_err(|e| format!("HIP RTC symbol {}: {e}", String::from_utf8_lossy(s)))
        };
        // SAFETY: the pointers come from the library's exported hiprtc* functions, whose C signatures
        // are those above (hip/hiprtc.h).
        let (create, compile, log_size, log, code_size, code, destroy) = unsafe {
            (
                std::mem::transmute::<*const c_void, Create>(sym(b"hiprtcCreateProgram\0")?),
                std::mem::transmute::<*const c_void, Compile>(sym(b"hiprtcCompileProgram\0")?),
                std::mem::transmute::<*const c_void, Size>(sym(b"hiprtcGetProgramLogSize\0")?),
                std::mem::transmute::<*const c_void, Get>(sym(b"hiprtcGetProgramLog\0")?),
                std::mem::transmute::<*const c_void, Size>(sym(b"hiprtcGetCodeSize\0")?),
                std::mem::transmute::<*const c_void, Get>(sym(b"hiprtcGetCode\0")?),
                std::mem::transmute::<*const c_void, Destroy>(sym(b"hiprtcDestroyProgram\0")?),
            )
        };
        let src = CString::new(source).map_err(|e| format!("{name}: source has a NUL byte: {e}"))?;
        let cname = CString::new(name).map_err(|e| format!("{name}: bad name: {e}"))?;
        let opts: Vec<CString> = [format!("--gpu-architecture={arch}"), "-O3".into(), "--std=c++17".into()]
            .into_iter()
            .map(|o| CString::new(o).expect("option"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        let _serial = COMPILING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: every pointer is valid for the call; the program is destroyed before returning.
        unsafe {
            let rc = create(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null());
            if rc != 0 {
                return Err(format!("{name}: hiprtcCreateProgram failed ({rc})"));
            }
            let rc = compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            let mut n = 0usize;
            log_size(prog, &mut n);
            let mut buf = vec![0 as c_char; n.max(1)];
            log(prog, buf.as_mut_ptr());
            let text = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            if rc != 0 {
                destroy(&mut prog);
                return Err(format!("{name}: HIP RTC compile for {arch} failed ({rc}):\n{text}"));
            }
            let mut size = 0usize;
            code_size(prog, &mut size);
            let mut bytes = vec![0u8; size];
            code(prog, bytes.as_mut_ptr() as *mut c_char);
            destroy(&mut prog);
            CodeObject::parse(bytes).map_err(|e| format!("{name}: {e}"))
        }
    }
}

/// The first of `names` that exports HIP RTC; the error names each one tried and what to install.
fn find(names: &[&str]) -> Result<(&'static Library, String), String> {
    load_first(names.iter().copied(), b"hiprtcCreateProgram\0").map_err(|tried| {
        format!(
            "HIP RTC not found (tried {}): install HIP (Debian/Ubuntu: `apt-get install libamdhip64-dev \
             rocm-device-libs`, or ROCm, whose libhiprtc.so holds it since 6.0) to compile the kernels for AMD GPUs",
            tried.join("; ")
        )
    })
}

impl CodeObject {
    /// Reads the kernel's resource usage from the code object's `NT_AMDGPU_METADATA` note (MessagePack).
    fn parse(bytes: Vec<u8>) -> Result<Self, String> {
        if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" || u16::from_le_bytes([bytes[18], bytes[19]]) != 0xe0 {
            return Err("HIP RTC returned something that is not an AMDGPU ELF code object".into());
        }
        let uint = |key: &str| msgpack_uint_after(&bytes, key).ok_or(format!("no {key} in the code object metadata"));
        let target = msgpack_str_after(&bytes, "amdhsa.target").ok_or("no amdhsa.target in the metadata")?;
        Ok(CodeObject {
            vgpr_count: uint(".vgpr_count")?,
            sgpr_count: uint(".sgpr_count")?,
            spill_count: uint(".vgpr_spill_count")? + uint(".sgpr_spill_count")?,
            lds_bytes: uint(".group_segment_fixed_size")?,
            scratch_bytes: uint(".private_segment_fixed_size")?,
            target,
            bytes,
        })
    }
}

/// Position just after the MessagePack string `key` (fixstr or str8) in `bytes`.
fn after_key(bytes: &[u8], key: &str) -> Option<usize> {
    let k = key.as_bytes();
    let mut pattern = if k.len() < 32 { vec![0xa0 | k.len() as u8] } else { vec![0xd9, k.len() as u8] };
    pattern.extend_from_slice(k);
    bytes.windows(pattern.len()).position(|w| w == pattern.as_slice()).map(|i| i + pattern.len())
}

/// The unsigned integer stored right after `key` (positive fixint, uint8/16/32/64).
fn msgpack_uint_after(bytes: &[u8], key: &str) -> Option<u64> {
    let i = after_key(bytes, key)?;
    let be = |n: usize| bytes.get(i + 1..i + 1 + n).map(|b| b.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64));
    match *bytes.get(i)? {
        x @ 0x00..=0x7f => Some(x as u64),
        0xcc => be(1),
        0xcd => be(2),
        0xce => be(4),
        0xcf => be(8),
        _ => None,
    }
}

/// The string stored right after `key` (fixstr or str8).
fn msgpack_str_after(bytes: &[u8], key: &str) -> Option<String> {
    let i = after_key(bytes, key)?;
    let (start, len) = match *bytes.get(i)? {
        x @ 0xa0..=0xbf => (i + 1, (x & 0x1f) as usize),
        0xd9 => (i + 2, *bytes.get(i + 1)? as usize),
        _ => return None,
    };
    bytes.get(start..start + len).map(|s| String::from_utf8_lossy(s).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msgpack_reader_decodes_each_integer_width_and_strings() {
        let mut b = vec![0xab];
        b.extend_from_slice(b".vgpr_count");
        b.push(0x0b);
        b.push(0xb1);
        b.extend_from_slice(b".sgpr_spill_count");
        b.extend_from_slice(&[0xcd, 0x01, 0x02]);
        b.push(0xad);
        b.extend_from_slice(b"amdhsa.target");
        b.push(0xb9);
        b.extend_from_slice(b"amdgcn-amd-amdhsa--gfx90a");
        assert_eq!(msgpack_uint_after(&b, ".vgpr_count"), Some(11));
        assert_eq!(msgpack_uint_after(&b, ".sgpr_spill_count"), Some(0x0102));
        assert_eq!(msgpack_uint_after(&b, ".lds"), None);
        assert_eq!(msgpack_str_after(&b, "amdhsa.target").as_deref(), Some("amdgcn-amd-amdhsa--gfx90a"));
    }
}
