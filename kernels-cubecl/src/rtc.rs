//! What HIP RTC and NVRTC share: their C entry points have the same shapes (hip/hiprtc.h, nvrtc.h), and
//! each is loaded at run time from the first library that exports it, once, and never unloaded
//! (unloading a GPU runtime while its threads live crashes the process).

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

pub(crate) type Program = *mut c_void;
/// `*CreateProgram(prog, source, name, headers, header_sources, header_names)`.
pub(crate) type Create = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
/// `*CompileProgram(prog, options, option_strings)`.
pub(crate) type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
/// `*Get…Size(prog, size)`: the program log's, the code's.
pub(crate) type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
/// `*Get…(prog, buffer)`.
pub(crate) type Get = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
/// `*DestroyProgram(prog)`.
pub(crate) type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;

/// The first of `names` that loads and exports `symbol` (NUL-terminated), kept loaded for the process,
/// and its name; else what each one tried gave.
pub(crate) fn load_first<'n>(
    names: impl IntoIterator<Item = &'n str>,
    symbol: &[u8],
) -> Result<(&'static Library, String), Vec<String>> {
    let shown = String::from_utf8_lossy(symbol.strip_suffix(b"\0").unwrap_or(symbol)).into_owned();
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading the compiler's library runs its initialisers, which touch no device.
        match unsafe { Library::new(name) } {
            Err(e) => tried.push(format!("{name}: {e}")),
            // SAFETY: only looked up, not called.
            Ok(lib) if unsafe { lib.get::<*const c_void>(symbol) }.is_err() => {
                tried.push(format!("{name}: loads but has no {shown}"));
            }
            Ok(lib) => return Ok((Box::leak(Box::new(lib)), name.to_string())),
        }
    }
    Err(tried)
}
