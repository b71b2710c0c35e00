//! Memory shared between processes of one host for CUDA IPC: a sealed memfd ([`HostArena`])
//! whose name carries a random secret, and the 64-byte handle that finds it again from another
//! process (`/proc/PID/fd/N`) and proves the finder was given it (the secret).
//!
//! gpufuse's worker makes such memfds of the memory a session exports (`cuIpcGetMemHandle`,
//! `cuMemExportToShareableHandle`); another session's worker, or an application's own process
//! (a POSIX file descriptor handed out for `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), opens
//! them with [`open`]. The secret is checked on the name behind `/proc/PID/fd/N` before opening
//! (nothing else is ever opened) and again on the descriptor opened (a descriptor number reused
//! in between is refused).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::arena::HostArena;

/// The size of `CUipcMemHandle` (and of this handle).
pub const HANDLE_LEN: usize = 64;
/// What a gpufuse memory handle starts with.
const MAGIC: &[u8; 8] = b"GFIPCMEM";
/// The memfds' name prefix; the secret follows in hex.
const NAME: &str = "gpufuse-ipc-";
/// An exportable memory pool's descriptors' name prefix (empty memfds); its secret follows.
const POOL_NAME: &str = "gpufuse-pool-";

/// Where shared memory is: a process and its descriptor of the memfd, the memfd's secret, and
/// the shared allocation's size. Encoded: `MAGIC`, pid and descriptor (u32, little-endian),
/// the secret, the size (u64); the rest zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcHandle {
    pub pid: u32,
    pub fd: u32,
    pub secret: [u8; 16],
    pub size: u64,
}

impl IpcHandle {
    pub fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HANDLE_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&self.pid.to_le_bytes());
        h[12..16].copy_from_slice(&self.fd.to_le_bytes());
        h[16..32].copy_from_slice(&self.secret);
        h[32..40].copy_from_slice(&self.size.to_le_bytes());
        h
    }

    /// `None` for anything that is not a handle's encoding.
    pub fn decode(h: &[u8]) -> Option<IpcHandle> {
        if h.len() != HANDLE_LEN || &h[..8] != MAGIC || h[40..].iter().any(|&b| b != 0) {
            return None;
        }
        Some(IpcHandle {
            pid: u32::from_le_bytes(h[8..12].try_into().ok()?),
            fd: u32::from_le_bytes(h[12..16].try_into().ok()?),
            secret: h[16..32].try_into().ok()?,
            size: u64::from_le_bytes(h[32..40].try_into().ok()?),
        })
    }

    /// The handle of `fd`, a descriptor of this process: `None` unless it is a shared memfd
    /// of this kind (another process's export, received or opened). The size is the memfd's.
    pub fn of_own_fd(fd: RawFd) -> Option<IpcHandle> {
        let secret = secret_of_own_fd(fd, NAME)?;
        let size = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?.len();
        Some(IpcHandle {
            pid: std::process::id(),
            fd: u32::try_from(fd).ok()?,
            secret,
            size,
        })
    }
}

/// The secret in the name of the memfd behind `fd`, a descriptor of this process, if it is
/// named `prefix` and a secret.
fn secret_of_own_fd(fd: RawFd, prefix: &str) -> Option<[u8; 16]> {
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let target = target.to_str()?;
    let name = target.strip_prefix("/memfd:")?;
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    let hex = name.strip_prefix(prefix)?;
    if hex.len() != 32 {
        return None;
    }
    let mut secret = [0u8; 16];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(secret)
}

/// A random secret.
pub fn secret() -> io::Result<[u8; 16]> {
    let mut secret = [0u8; 16];
    rustix::rand::getrandom(&mut secret, rustix::rand::GetRandomFlags::empty())?;
    Ok(secret)
}

/// A new shared memfd of `len` bytes (whole pages) and the secret its name carries.
pub fn create(len: usize) -> io::Result<(HostArena, [u8; 16])> {
    let secret = secret()?;
    Ok((HostArena::create_named(&name(NAME, &secret), len)?, secret))
}

/// A memfd name: `prefix` and the secret in hex.
fn name(prefix: &str, secret: &[u8; 16]) -> String {
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// A descriptor that stands for an exportable memory pool (`cuMemPoolExportToShareableHandle`
/// of a POSIX file descriptor): an empty memfd named after the pool's secret.
pub fn pool_fd(secret: &[u8; 16]) -> io::Result<OwnedFd> {
    Ok(rustix::fs::memfd_create(
        name(POOL_NAME, secret),
        rustix::fs::MemfdFlags::CLOEXEC,
    )?)
}

/// The pool secret of `fd`, a descriptor of this process made by [`pool_fd`] (here or in
/// another process that sent it).
pub fn pool_secret_of_own_fd(fd: RawFd) -> Option<[u8; 16]> {
    secret_of_own_fd(fd, POOL_NAME)
}

/// Opens the memfd `h` names, if it is still the one the handle was made for (its name
/// carries the handle's secret), read-write.
pub fn open(h: &IpcHandle) -> Option<OwnedFd> {
    let want = format!("/memfd:{}", name(NAME, &h.secret));
    let is_export = |link: &str| {
        std::fs::read_link(link).is_ok_and(|target| {
            target
                .to_str()
                .is_some_and(|t| t == want || t.strip_prefix(want.as_str()) == Some(" (deleted)"))
        })
    };
    let path = format!("/proc/{}/fd/{}", h.pid, h.fd);
    if !is_export(&path) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .ok()?;
    let fd = OwnedFd::from(file);
    is_export(&format!("/proc/self/fd/{}", fd.as_raw_fd())).then_some(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::PAGE;

    #[test]
    fn a_handle_round_trips_and_anything_else_is_refused() {
        let h = IpcHandle {
            pid: 4242,
            fd: 17,
            secret: [7; 16],
            size: 1 << 26,
        };
        let bytes = h.encode();
        assert_eq!(bytes.len(), HANDLE_LEN);
        assert_eq!(IpcHandle::decode(&bytes), Some(h));
        assert!(IpcHandle::decode(&bytes[..63]).is_none());
        let mut other = bytes.clone();
        other[0] ^= 1;
        assert!(IpcHandle::decode(&other).is_none(), "another magic");
        let mut tail = bytes;
        tail[63] = 1;
        assert!(
            IpcHandle::decode(&tail).is_none(),
            "a tail that is not zero"
        );
    }

    #[test]
    fn only_the_memfd_with_the_handles_secret_opens() {
        let (memory, secret) = create(PAGE).unwrap();
        let mut h = IpcHandle {
            pid: std::process::id(),
            fd: memory.fd().as_raw_fd() as u32,
            secret,
            size: 8,
        };
        let opened = open(&h).unwrap();
        assert_eq!(
            IpcHandle::of_own_fd(opened.as_raw_fd()).map(|o| (o.secret, o.size)),
            Some((secret, PAGE as u64)),
            "a descriptor of the memfd names it"
        );
        assert!(IpcHandle::of_own_fd(0).is_none());
        let pool = pool_fd(&[9; 16]).unwrap();
        assert_eq!(pool_secret_of_own_fd(pool.as_raw_fd()), Some([9; 16]));
        assert!(
            IpcHandle::of_own_fd(pool.as_raw_fd()).is_none(),
            "a pool is no memory"
        );
        assert!(pool_secret_of_own_fd(opened.as_raw_fd()).is_none());
        h.secret[0] ^= 1;
        assert!(open(&h).is_none(), "a wrong secret");
        h.secret = secret;
        h.fd = 0;
        assert!(open(&h).is_none(), "another descriptor");
        h.fd = memory.fd().as_raw_fd() as u32;
        drop(memory);
        drop(opened);
        assert!(open(&h).is_none(), "a closed export");
    }
}
