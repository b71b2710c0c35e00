//! The node lock: a restarted node must not hand out device memory that a worker of an
//! earlier node still holds.
//!
//! For each unix socket it listens on, the node takes an exclusive `flock` on `PATH.lock` and
//! every worker inherits that lock's descriptor (`spawn.rs`). A lock belongs to the open file
//! and lasts until its last holder exits, so while any worker of an earlier node on the same
//! socket lives (an orphan whose parent-death signal and control-socket watch both failed,
//! or a worker of a node started before workers died with their node), a new node refuses to
//! start and names the processes that hold it. The lock file is left in place: unlinking it
//! would let a second node lock a new file of the same name while the old one is still held.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The lock files' descriptors, inherited by every worker.
static HELD: OnceLock<Vec<File>> = OnceLock::new();

/// The lock file beside a unix socket.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Takes the lock for each socket path (after binding it), or says who holds one.
pub fn lock_sockets(sockets: &[PathBuf]) -> std::io::Result<()> {
    let mut held = Vec::new();
    for socket in sockets {
        held.push(lock_one(socket)?);
    }
    let _ = HELD.set(held);
    Ok(())
}

/// How long a starting node waits for an earlier node's workers to let go of its lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

fn lock_one(socket: &Path) -> std::io::Result<File> {
    let path = lock_path(socket);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    // Workers of a node that was just killed are ending (their parent-death signal), but a
    // process lets go of its descriptors only when its last thread has exited: a restart right
    // after the kill waits a moment for them instead of refusing at once.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(std::io::Error::new(
                err.kind(),
                format!("cannot lock {}: {err}", path.display()),
            ));
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The socket was bound first (a live server there is refused by `Address::bind`), so the
    // holders are workers of a node that is gone.
    let holders = holders(&path);
    let pids = if holders.is_empty() {
        "pids unknown".to_owned()
    } else {
        let v: Vec<String> = holders.iter().map(u32::to_string).collect();
        format!("pid {}", v.join(", "))
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!(
            "workers of an earlier server on {} are still running ({pids}; they hold {}) and \
             may hold device memory; they end when their clients exit, or end them (kill) \
             before starting a new server",
            socket.display(),
            path.display()
        ),
    ))
}

/// Processes with `path` open (read from /proc; those of other users are not visible).
fn holders(path: &Path) -> Vec<u32> {
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == target))
        {
            pids.push(pid);
        }
    }
    pids
}

/// The descriptors a worker must inherit (their close-on-exec flag is cleared in the child).
pub fn inherited_fds() -> Vec<RawFd> {
    HELD.get()
        .map(|v| v.iter().map(AsRawFd::as_raw_fd).collect())
        .unwrap_or_default()
}
