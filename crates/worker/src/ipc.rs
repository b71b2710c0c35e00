//! CUDA IPC between sessions of one host (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`,
//! `cuIpcCloseMemHandle`): device memory one session exports and another maps.
//!
//! Each session has its own worker process, so memory two sessions share must live outside
//! both: exporting an allocation moves it into a sealed memfd of the exporter's worker
//! (`Device::share`, contents and address kept), and the handle says where that memfd is. An
//! opener's worker opens the exporter's descriptor through `/proc/PID/fd/N` and maps the same
//! pages into its own device (`Device::alloc_shared`), so both sessions' kernels, copies and
//! atomics touch the same words (one coherence domain, as the shared managed memory of
//! `memory.rs`). The memfd's name carries a random secret the handle repeats, checked on what
//! was actually opened: a handle is a capability, as NVIDIA's are, and a forged or stale one
//! (its memfd freed, its worker gone, another host's) is `CUDA_ERROR_INVALID_VALUE`.
//!
//! The exporter's slice stays charged for the memory; an opener is charged nothing. Memory an
//! exporter frees while another session has it open lives on in that session's mapping until
//! it closes it (NVIDIA calls using it then undefined). Shared memory is never evicted and a
//! session holding any cannot be captured (moved), as for shared managed memory.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

use gpufuse_device::status as st;
use gpufuse_proto::{DevicePtr, ReplyBody};
use gpufuse_transport::arena::{HostArena, PAGE};

use crate::{Session, R};

/// The size of a `CUipcMemHandle`.
pub(crate) const HANDLE_LEN: usize = 64;
/// What a gpufuse memory handle starts with.
const MAGIC: &[u8; 8] = b"GFIPCMEM";
/// The memfd names' prefix; the secret follows in hex.
const NAME: &str = "gpufuse-ipc-";

/// A handle's fields: `MAGIC`, the exporting worker's pid and the memfd's descriptor there
/// (u32, little-endian), the secret, the allocation's size (u64); the rest zero.
struct Handle {
    pid: u32,
    fd: u32,
    secret: [u8; 16],
    size: u64,
}

impl Handle {
    fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HANDLE_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&self.pid.to_le_bytes());
        h[12..16].copy_from_slice(&self.fd.to_le_bytes());
        h[16..32].copy_from_slice(&self.secret);
        h[32..40].copy_from_slice(&self.size.to_le_bytes());
        h
    }

    fn decode(h: &[u8]) -> Option<Handle> {
        if h.len() != HANDLE_LEN || &h[..8] != MAGIC || h[40..].iter().any(|&b| b != 0) {
            return None;
        }
        Some(Handle {
            pid: u32::from_le_bytes(h[8..12].try_into().ok()?),
            fd: u32::from_le_bytes(h[12..16].try_into().ok()?),
            secret: h[16..32].try_into().ok()?,
            size: u64::from_le_bytes(h[32..40].try_into().ok()?),
        })
    }

    /// The memfd name the secret gives.
    fn name(secret: &[u8; 16]) -> String {
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        format!("{NAME}{hex}")
    }
}

/// An exported allocation: the memfd its memory is now, and its handle.
struct Export {
    /// The memfd and its mapping: the allocation's words are its pages.
    _memory: HostArena,
    handle: Vec<u8>,
}

/// What a session exported and what it opened.
#[derive(Default)]
pub(crate) struct IpcBooks {
    /// Allocations this session exported, by base address.
    exports: HashMap<u64, Export>,
    /// Other sessions' memory this session opened, by the address it has here.
    opened: HashMap<u64, HostArena>,
}

impl Session<'_> {
    /// `IpcGetMemHandle`: the allocation at `ptr` moves into a memfd other sessions may open.
    pub(crate) fn ipc_get_mem_handle(&mut self, ptr: u64) -> R<ReplyBody> {
        if let Some(e) = self.ipc.exports.get(&ptr) {
            return Ok(ReplyBody::Data(e.handle.clone()));
        }
        let size = *self.memory.allocations.get(&ptr).ok_or(st::INVALID_VALUE)?;
        let len = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(PAGE))
            .ok_or(st::INVALID_VALUE)?;
        let mut secret = [0u8; 16];
        rustix::rand::getrandom(&mut secret, rustix::rand::GetRandomFlags::empty())
            .map_err(|_| st::OPERATING_SYSTEM)?;
        let memory = HostArena::create_named(&Handle::name(&secret), len).map_err(|e| {
            tracing::warn!(size, "no memfd for an IPC export: {e}");
            st::OUT_OF_MEMORY
        })?;
        // SAFETY: the span is the memfd's whole mapping, which `memory` keeps until the export
        // is dropped, after the allocation is freed (`Session::free`, `release_ipc`).
        let span = unsafe { gpufuse_device::HostSpan::new(memory.base(), len) };
        self.device.share(ptr, span)?;
        let handle = Handle {
            pid: std::process::id(),
            fd: memory.fd().as_raw_fd() as u32,
            secret,
            size,
        }
        .encode();
        tracing::debug!(ptr, size, "device memory exported for IPC");
        self.ipc.exports.insert(
            ptr,
            Export {
                _memory: memory,
                handle: handle.clone(),
            },
        );
        Ok(ReplyBody::Data(handle))
    }

    /// `IpcOpenMemHandle`: maps another session's export into this session's device.
    pub(crate) fn ipc_open_mem_handle(&mut self, handle: &[u8]) -> R<ReplyBody> {
        let h = Handle::decode(handle).ok_or(st::INVALID_VALUE)?;
        if h.pid == std::process::id() {
            // NVIDIA's driver refuses a process its own handles.
            return Err(st::INVALID_CONTEXT);
        }
        let fd = open_export(&h).ok_or(st::INVALID_VALUE)?;
        let memory = HostArena::adopt(fd).map_err(|e| {
            tracing::warn!("an IPC handle's memory cannot be mapped: {e}");
            st::INVALID_VALUE
        })?;
        // SAFETY: the span is the memfd's whole mapping, which `memory` keeps until the
        // mapping is closed and freed from the device (`ipc_close_mem_handle`, `release_ipc`).
        let span = unsafe { gpufuse_device::HostSpan::new(memory.base(), memory.len()) };
        let ptr = self.device.alloc_shared(h.size, span)?;
        tracing::debug!(ptr, size = h.size, pid = h.pid, "IPC memory opened");
        self.ipc.opened.insert(ptr, memory);
        Ok(ReplyBody::Opened {
            ptr: DevicePtr(ptr),
            size: h.size,
        })
    }

    /// `IpcCloseMemHandle`.
    pub(crate) fn ipc_close_mem_handle(&mut self, ptr: u64) -> R<()> {
        if !self.ipc.opened.contains_key(&ptr) {
            return Err(st::INVALID_VALUE);
        }
        self.device.free(ptr)?;
        self.ipc.opened.remove(&ptr);
        Ok(())
    }

    /// After `ptr` was freed from the device: its export, if any, goes (openers keep theirs).
    pub(crate) fn ipc_freed(&mut self, ptr: u64) {
        self.ipc.exports.remove(&ptr);
    }

    /// Closes everything the session opened and drops its exports (their allocations are
    /// freed already: `release_memory`).
    pub(crate) fn release_ipc(&mut self) {
        for (ptr, _) in std::mem::take(&mut self.ipc.opened) {
            let _ = self.device.free(ptr);
        }
        self.ipc.exports.clear();
    }
}

/// Opens the memfd a handle names, if it is still the export the handle was made for: its
/// name must carry the handle's secret, looked at before opening (nothing else is opened) and
/// again on the opened descriptor (a descriptor number reused in between is refused).
fn open_export(h: &Handle) -> Option<OwnedFd> {
    let want = format!("/memfd:{}", Handle::name(&h.secret));
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

    #[test]
    fn a_handle_round_trips_and_anything_else_is_refused() {
        let h = Handle {
            pid: 4242,
            fd: 17,
            secret: [7; 16],
            size: 1 << 26,
        };
        let bytes = h.encode();
        assert_eq!(bytes.len(), HANDLE_LEN);
        let back = Handle::decode(&bytes).unwrap();
        assert_eq!(
            (back.pid, back.fd, back.secret, back.size),
            (4242, 17, [7; 16], 1 << 26)
        );
        assert!(Handle::decode(&bytes[..63]).is_none());
        let mut other = bytes.clone();
        other[0] ^= 1;
        assert!(Handle::decode(&other).is_none(), "another magic");
        let mut tail = bytes;
        tail[63] = 1;
        assert!(Handle::decode(&tail).is_none(), "a tail that is not zero");
    }

    #[test]
    fn only_the_memfd_with_the_handles_secret_opens() {
        let secret = [0x5a; 16];
        let memory = HostArena::create_named(&Handle::name(&secret), PAGE).unwrap();
        let mut h = Handle {
            pid: std::process::id(),
            fd: memory.fd().as_raw_fd() as u32,
            secret,
            size: 8,
        };
        assert!(open_export(&h).is_some());
        h.secret[0] ^= 1;
        assert!(open_export(&h).is_none(), "a wrong secret");
        h.secret = secret;
        h.fd = 0;
        assert!(open_export(&h).is_none(), "another descriptor");
        h.fd = memory.fd().as_raw_fd() as u32;
        drop(memory);
        assert!(open_export(&h).is_none(), "a closed export");
    }
}
