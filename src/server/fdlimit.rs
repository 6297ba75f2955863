//! The open-files limit fitted to `--maxclients`, as Redis's `adjustOpenFilesLimit` fits it.
//! Every client is a descriptor: past RLIMIT_NOFILE, accept(2) fails with EMFILE and a client
//! waits in the kernel's queue, connected but never served. At start the soft limit is raised
//! to what `--maxclients` needs plus the server's own descriptors ([`reserved`]), up to the
//! hard limit; under a hard limit too low for that, maxclients is lowered to fit instead, with
//! a warning that says so.

/// Descriptors kept for the server's own besides its shards': listeners, standard streams, the
/// accepting thread's event queue, a cluster node's Raft files and peer connections (as
/// Redis's 32).
const BASE: u64 = 32;
/// Each shard's: its log, a snapshot being written, its thread's event queue and wakers (5
/// measured idle with `ls /proc/PID/fd`).
const PER_SHARD: u64 = 8;

/// The descriptors kept for the server's own with `shards` shards.
fn reserved(shards: usize) -> u64 {
    BASE + PER_SHARD * shards as u64
}

fn nofile() -> std::io::Result<libc::rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct it is given, and nothing else.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } {
        0 => Ok(l),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn set_soft_nofile(soft: u64, hard: u64) -> std::io::Result<()> {
    let l = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit(2) reads the struct it is given, and nothing else.
    match unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Raises the soft open-files limit for `maxclients` clients of a server of `shards` shards,
/// and returns how many clients it allows: `maxclients`, or fewer when the hard limit is lower.
/// An error when the limit leaves no room for a single client.
pub fn fit(maxclients: usize, shards: usize) -> Result<usize, String> {
    let limit = match nofile() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-files limit; leaving it as it is");
            return Ok(maxclients);
        }
    };
    let reserved = reserved(shards);
    let need = (maxclients as u64).saturating_add(reserved);
    let was = limit.rlim_cur;
    if was >= need {
        return Ok(maxclients);
    }
    let mut now = was;
    let raised = need.min(limit.rlim_max);
    if raised > was {
        match set_soft_nofile(raised, limit.rlim_max) {
            Ok(()) => now = raised,
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-files limit to {raised}"),
        }
    }
    if now >= need {
        tracing::info!(
            "Increased maximum number of open files to {now} (it was originally set to {was})"
        );
        return Ok(maxclients);
    }
    if now <= reserved {
        return Err(format!(
            "the open-files limit (ulimit -n) of {now} is not enough for the server to start: \
             raise it to at least {need}"
        ));
    }
    let reduced = (now - reserved) as usize;
    tracing::warn!(
        "You requested maxclients of {maxclients} requiring at least {need} max file \
         descriptors. Current maximum open files is {now}. maxclients has been reduced to \
         {reduced} to compensate for low ulimit. If you need higher maxclients increase \
         'ulimit -n'"
    );
    Ok(reduced)
}
