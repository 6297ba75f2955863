//! One permitd per `--dir`: an exclusive `flock` on `<dir>/LOCK`, held while the process runs.
//! A second process on the same folder would load it, write a new generation and remove the
//! first one's files under it (in cluster mode, write the same Raft log). The kernel drops the
//! lock with the process, however it ends (`kill -9` included), so there is nothing to clean
//! up. The holder's pid is written in the file for the refusal to name.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

/// The lock file's name in `--dir`.
pub const LOCK_FILE: &str = "LOCK";

/// The lock on a data directory: released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes `dir`'s lock (creating `dir` if needed), or says who holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock(2) on a descriptor this function owns; it touches no memory.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("{}: cannot lock it: {e}", path.display()));
        }
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = match holder.trim() {
            "" => "pid unknown".to_string(),
            pid => format!("pid {pid}"),
        };
        return Err(format!(
            "--dir {} is in use by another permitd ({holder}); one directory serves one \
             process: stop that one first, or give this one another --dir",
            dir.display()
        ));
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(DirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_folder_is_refused_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("permitd-lock-{}", std::process::id()));
        let first = lock_dir(&dir).unwrap();
        // flock locks an open file description: a second open in this process conflicts as
        // another process's would.
        let e = lock_dir(&dir).unwrap_err();
        let pid = std::process::id();
        assert!(
            e.contains(&format!("is in use by another permitd (pid {pid})")),
            "{e}"
        );
        drop(first);
        drop(lock_dir(&dir).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
