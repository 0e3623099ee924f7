//! Atomic file writes: what a user saved (a plan, a run summary, a checkpoint manifest) is never half
//! written, even when the process is killed mid-write — and what is not a regular file is never
//! replaced by one.

use std::fs::{FileType, Metadata, OpenOptions};
use std::io::Write as _;
use std::path::Path;

/// Writes `bytes` to a temporary file beside `path`, syncs it, and renames it over `path`: a reader (or a
/// crash) sees the old file or the new one, never half of one. A `path` that exists and is not a
/// regular file is never renamed over (see [`write_in_place`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Ok(meta) = std::fs::metadata(path)
        && !meta.is_file()
    {
        return write_in_place(path, &meta, bytes);
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::other("not a file path"))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A target that is not a regular file: a character device (`/dev/null`, a terminal) is written in
/// place; a FIFO only when a process has it open for reading (a FIFO nobody reads would block the
/// write forever); anything else — a directory, a socket, a block device — is refused.
#[cfg(unix)]
fn write_in_place(path: &Path, meta: &Metadata, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let ft = meta.file_type();
    if ft.is_char_device() {
        return OpenOptions::new().write(true).open(path)?.write_all(bytes);
    }
    if !ft.is_fifo() {
        return Err(std::io::Error::other(format!("is {}, not a file; name a file path", kind(&ft))));
    }
    // Opening a FIFO for writing without blocking fails (ENXIO) when no process reads it.
    let probe = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENXIO) {
            std::io::Error::other("is a FIFO that no process reads; start its reader first, or name a file path")
        } else {
            e
        }
    })?;
    // With the reader there (and `probe` holding the FIFO open), a blocking open returns at once.
    let mut f = OpenOptions::new().write(true).open(path)?;
    drop(probe);
    f.write_all(bytes)
}

#[cfg(not(unix))]
fn write_in_place(_: &Path, meta: &Metadata, _: &[u8]) -> std::io::Result<()> {
    Err(std::io::Error::other(format!("is {}, not a file; name a file path", kind(&meta.file_type()))))
}

fn kind(ft: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_block_device() {
            return "a block device";
        }
    }
    if ft.is_dir() { "a directory" } else { "not a regular file" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("piper-atomic-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = scratch("file");
        let path = dir.join("summary.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_is_refused_and_stays() {
        let dir = scratch("dir");
        let e = write_atomic(&dir, b"x").unwrap_err().to_string();
        assert!(e.contains("is a directory, not a file"), "{e}");
        assert!(dir.is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_written_in_place_when_read_and_refused_when_not() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("fifo");
        let fifo = dir.join("out.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let start = std::time::Instant::now();
        let e = write_atomic(&fifo, b"x").unwrap_err().to_string();
        assert!(e.contains("FIFO that no process reads") && start.elapsed().as_secs() < 5, "{e}");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        // The reader's open blocks until a writer comes; retry until it is there.
        let mut written = write_atomic(&fifo, b"summary");
        while written.is_err() && start.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            written = write_atomic(&fifo, b"summary");
        }
        written.unwrap();
        assert_eq!(reader.join().unwrap(), b"summary");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A character device — one made in a temporary folder where the process may (root), else
    /// `/dev/null` itself — is written in place and stays a device.
    #[cfg(unix)]
    #[test]
    fn a_character_device_is_written_in_place_and_stays_one() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("device");
        let node = dir.join("null");
        let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mknod creates the node (1, 3: the null device) or fails.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
        let device = if made { node } else { std::path::PathBuf::from("/dev/null") };
        write_atomic(&device, b"discarded").unwrap();
        assert!(std::fs::metadata(&device).unwrap().file_type().is_char_device());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), usize::from(made));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
