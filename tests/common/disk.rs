//! Disks that fill up or fail under a server: a file system mounted on its data directory
//! (a small tmpfs that fills, an ext4 image that can be shut down to fail every I/O with
//! `EIO`). Mounting needs root, as CI runs; anyone else gets a failure saying so, not a silent
//! skip.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A file system mounted on a directory, unmounted when dropped (also when the test fails).
pub struct Mount(PathBuf);

impl Mount {
    /// Mounts `source` of type `fs` (with `options`) on `at`.
    pub fn new(fs: &str, options: &str, source: &Path, at: &Path) -> Mount {
        // SAFETY: geteuid reads the process's user id and touches no memory.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "tests/disk_full.rs mounts file systems and must run as root (CI does)"
        );
        let status = Command::new("mount")
            .args(["-t", fs, "-o", options])
            .arg(source)
            .arg(at)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount {fs} on {}", at.display());
        Mount(at.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazily: the server may still have its files open.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with a file of zeros; returns the file.
pub fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = File::create(&path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("fill {}: {e}", path.display()),
        }
    }
    path
}

/// `EXT4_IOC_SHUTDOWN`, `_IOR('X', 125, __u32)`: every later I/O of the file system fails with
/// `EIO`, as on a failed device.
const EXT4_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587d;
/// Its flag to stop at once, without flushing the journal.
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

/// A fresh 32 MiB ext4 image beside `dir`, to mount there.
pub fn ext4_image(dir: &Path) -> PathBuf {
    let image = dir.with_extension("ext4");
    File::create(&image).unwrap().set_len(32 << 20).unwrap();
    let made = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&image)
        .status()
        .expect("run mkfs.ext4");
    assert!(made.success());
    image
}

/// Shuts the ext4 file system of `dir` down: every later I/O there fails with `EIO`.
pub fn shut_down(dir: &Path) {
    let dir = File::open(dir).unwrap();
    let flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
    // SAFETY: the ioctl reads one u32 from `flags`, which outlives the call.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&dir),
            EXT4_IOC_SHUTDOWN,
            &flags,
        )
    };
    assert_eq!(r, 0, "shut ext4 down: {}", std::io::Error::last_os_error());
}
