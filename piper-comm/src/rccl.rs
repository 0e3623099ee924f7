//! RCCL / NCCL transport for device buffers (feature `rccl`): a thin FFI over the NCCL API names, which
//! RCCL exports too, loaded at run time with `libloading` — building needs no ROCm or CUDA.
//!
//! **Status: compile-checked only.** No GPU, RCCL or NCCL exists where this was written; nothing here
//! has run. Host-side tests cover the algorithms through the MPI and in-process backends instead.
//!
//! The expert all-to-all is grouped `ncclSend` / `ncclRecv` (what RCCL's own all-to-all does); zero-size
//! blocks are skipped on both sides, which avoids the zero-token hang X-MoE reports for RCCL.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Arc;

use crate::collectives::all_gather_bytes;
use crate::communicator::Communicator;
use crate::error::{CommError, Result};

/// NCCL's opaque unique id (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

type NcclResult = c_int;
type Comm = *mut c_void;
type Stream = *mut c_void;

/// `ncclDataType_t` values used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum DataType {
    Uint8 = 1,
    Float32 = 7,
    Bfloat16 = 9,
}

const NCCL_SUM: c_int = 0;

struct Fns {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

/// The loaded library.
pub struct Rccl {
    fns: Fns,
    _lib: libloading::Library,
}

/// Library names tried, in order (RCCL first; NCCL's dev symlink and soname).
pub const LIBRARY_NAMES: &[&str] = &["librccl.so", "librccl.so.1", "libnccl.so.2", "libnccl.so"];

impl Rccl {
    /// Loads RCCL (or NCCL) from the library path.
    pub fn load() -> Result<Arc<Rccl>> {
        let mut last = String::new();
        for name in LIBRARY_NAMES {
            // SAFETY: loading a shared library runs its initialisers; RCCL/NCCL's are benign.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Self::bind(lib).map(Arc::new),
                Err(e) => last = e.to_string(),
            }
        }
        Err(CommError::invalid(
            "RCCL",
            "LD_LIBRARY_PATH",
            format!("none of {LIBRARY_NAMES:?} could be loaded ({last}); load the ROCm module"),
        ))
    }

    fn bind(lib: libloading::Library) -> Result<Rccl> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the NCCL 2.x C signature declared in `Fns`.
                *unsafe { lib.get($name) }.map_err(|e| {
                    CommError::invalid("RCCL", "symbol", format!("{}: {e}", String::from_utf8_lossy($name)))
                })?
            };
        }
        let fns = Fns {
            get_unique_id: sym!(b"ncclGetUniqueId"),
            comm_init_rank: sym!(b"ncclCommInitRank"),
            comm_destroy: sym!(b"ncclCommDestroy"),
            group_start: sym!(b"ncclGroupStart"),
            group_end: sym!(b"ncclGroupEnd"),
            send: sym!(b"ncclSend"),
            recv: sym!(b"ncclRecv"),
            all_reduce: sym!(b"ncclAllReduce"),
            error_string: sym!(b"ncclGetErrorString"),
        };
        Ok(Rccl { fns, _lib: lib })
    }

    fn check(&self, op: &str, code: NcclResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr((self.fns.error_string)(code)) }.to_string_lossy().into_owned();
        Err(CommError::invalid(op, "rccl", format!("error {code}: {text}")))
    }
}

/// A device communicator over the ranks of a host communicator.
pub struct DeviceComm {
    rccl: Arc<Rccl>,
    comm: Comm,
    rank: usize,
    size: usize,
}

impl DeviceComm {
    /// Creates the device communicator of `host`'s group: rank 0 makes the unique id, the host
    /// communicator hands it to everyone. Each rank must have selected its GPU first.
    pub fn from_host<C: Communicator + ?Sized>(rccl: Arc<Rccl>, host: &C) -> Result<Self> {
        let mut id = UniqueId([0; 128]);
        if host.rank() == 0 {
            // SAFETY: `id` is a valid out-pointer.
            rccl.check("ncclGetUniqueId", unsafe { (rccl.fns.get_unique_id)(&mut id) })?;
        }
        let ids = all_gather_bytes(host, if host.rank() == 0 { &id.0 } else { &[] }, "RCCL unique id")?;
        id.0.copy_from_slice(&ids[0]);
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer, id from rank 0, ranks and size from the host group.
        rccl.check("ncclCommInitRank", unsafe {
            (rccl.fns.comm_init_rank)(&mut comm, host.size() as c_int, id, host.rank() as c_int)
        })?;
        Ok(DeviceComm { rccl, comm, rank: host.rank(), size: host.size() })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Variable all-to-all of device buffers as grouped sends and receives (counts in elements).
    ///
    /// # Safety
    /// `send` and `recv` must be device buffers holding the summed counts of `dtype` elements, valid
    /// until `stream` has completed the operation.
    pub unsafe fn all_to_all_v(
        &self,
        send: *const c_void,
        send_counts: &[usize],
        recv: *mut c_void,
        recv_counts: &[usize],
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<()> {
        if send_counts.len() != self.size || recv_counts.len() != self.size {
            return Err(CommError::invalid("RCCL all-to-all", "counts", format!("need {} entries", self.size)));
        }
        let elem = match dtype {
            DataType::Uint8 => 1,
            DataType::Float32 => 4,
            DataType::Bfloat16 => 2,
        };
        let f = &self.rccl.fns;
        // SAFETY: the caller guarantees the buffers; offsets stay inside them by the counts.
        unsafe {
            self.rccl.check("ncclGroupStart", (f.group_start)())?;
            let (mut s_off, mut r_off) = (0usize, 0usize);
            for peer in 0..self.size {
                if send_counts[peer] > 0 {
                    let p = send.cast::<u8>().add(s_off * elem).cast();
                    self.rccl.check(
                        "ncclSend",
                        (f.send)(p, send_counts[peer], dtype as c_int, peer as c_int, self.comm, stream),
                    )?;
                }
                if recv_counts[peer] > 0 {
                    let p = recv.cast::<u8>().add(r_off * elem).cast();
                    self.rccl.check(
                        "ncclRecv",
                        (f.recv)(p, recv_counts[peer], dtype as c_int, peer as c_int, self.comm, stream),
                    )?;
                }
                s_off += send_counts[peer];
                r_off += recv_counts[peer];
            }
            self.rccl.check("ncclGroupEnd", (f.group_end)())
        }
    }

    /// In-place sum of `count` f32s on the device.
    ///
    /// # Safety
    /// `data` must be a device buffer of `count` f32s, valid until `stream` has completed.
    pub unsafe fn all_reduce_sum_f32(&self, data: *mut c_void, count: usize, stream: *mut c_void) -> Result<()> {
        // SAFETY: per the caller's guarantee.
        unsafe {
            self.rccl.check(
                "ncclAllReduce",
                (self.rccl.fns.all_reduce)(data, data, count, DataType::Float32 as c_int, NCCL_SUM, self.comm, stream),
            )
        }
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        // SAFETY: `comm` came from ncclCommInitRank and is destroyed once.
        unsafe { (self.rccl.fns.comm_destroy)(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_library_is_a_clear_error() {
        // On machines without ROCm/NCCL this must fail with the names it tried, not crash.
        if let Err(e) = super::Rccl::load() {
            assert!(e.to_string().contains("librccl.so"), "{e}");
        }
    }
}
