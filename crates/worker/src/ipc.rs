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
//!
//! Physical memory (`cuMemCreate`) exported as a POSIX file descriptor
//! (`cuMemExportToShareableHandle`) moves into a memfd the same way (`Device::share_physical`,
//! `IpcExportPhysical`); the client opens it and hands the application a descriptor of it. A
//! process that receives that descriptor (over a unix socket, as NVIDIA's memMapIPCDrv sends
//! it) imports it (`cuMemImportFromShareableHandle`): its client names the descriptor (its own
//! pid and number, the secret read from the memfd's name) and its worker opens it and makes it
//! physical memory (`Device::create_physical_shared`, `IpcImportPhysical`). The handle format
//! and the opening are `gpufuse_transport::ipc`'s.

use std::collections::HashMap;
use std::os::fd::AsRawFd;

use gpufuse_device::status as st;
use gpufuse_proto::{DevicePtr, ReplyBody};
use gpufuse_transport::arena::{HostArena, PAGE};
use gpufuse_transport::ipc::IpcHandle;

use crate::{Session, R};

/// Exported memory: the memfd it is now, and its handle.
struct Export {
    /// The memfd and its mapping: the memory's words are its pages.
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
    /// Physical memory (`cuMemCreate`) exported as a POSIX file descriptor, by the client's
    /// handle; kept until the session ends (it may stay mapped after its release).
    physical_exports: HashMap<u64, Export>,
    /// Physical memory imported from a file descriptor, by the client's handle (not charged
    /// to this session), and the memfds, kept until the session ends.
    imported_handles: std::collections::HashSet<u64>,
    physical_imports: Vec<HostArena>,
}

/// An export of `size` bytes: a new memfd of its whole pages, which `share` makes the
/// memory's home (given the span of the memfd's mapping), and its handle.
fn export(size: u64, share: impl FnOnce(gpufuse_device::HostSpan) -> R<()>) -> R<Export> {
    let len = usize::try_from(size)
        .ok()
        .and_then(|s| s.checked_next_multiple_of(PAGE))
        .ok_or(st::INVALID_VALUE)?;
    let (memory, secret) = gpufuse_transport::ipc::create(len).map_err(|e| {
        tracing::warn!(size, "no memfd for an IPC export: {e}");
        st::OUT_OF_MEMORY
    })?;
    // SAFETY: the span is the memfd's whole mapping, which the export keeps (in `IpcBooks`)
    // for as long as the device may use it.
    share(unsafe { gpufuse_device::HostSpan::new(memory.base(), len) })?;
    let handle = IpcHandle {
        pid: std::process::id(),
        fd: memory.fd().as_raw_fd() as u32,
        secret,
        size,
    }
    .encode();
    Ok(Export {
        _memory: memory,
        handle,
    })
}

/// Opens and maps the memory a handle names; the span of its whole mapping.
fn open_shared(h: &IpcHandle) -> R<(HostArena, gpufuse_device::HostSpan)> {
    let fd = gpufuse_transport::ipc::open(h).ok_or(st::INVALID_VALUE)?;
    let memory = HostArena::adopt(fd).map_err(|e| {
        tracing::warn!("an IPC handle's memory cannot be mapped: {e}");
        st::INVALID_VALUE
    })?;
    // SAFETY: the span is the memfd's whole mapping, which the caller keeps (in `IpcBooks`)
    // for as long as the device may use it.
    let span = unsafe { gpufuse_device::HostSpan::new(memory.base(), memory.len()) };
    Ok((memory, span))
}

impl Session<'_> {
    /// `IpcGetMemHandle`: the allocation at `ptr` moves into a memfd other sessions may open.
    pub(crate) fn ipc_get_mem_handle(&mut self, ptr: u64) -> R<ReplyBody> {
        if let Some(e) = self.ipc.exports.get(&ptr) {
            return Ok(ReplyBody::Data(e.handle.clone()));
        }
        let size = *self.memory.allocations.get(&ptr).ok_or(st::INVALID_VALUE)?;
        // The memfd stays mapped until the export is dropped, after the allocation is freed
        // (`Session::free`, `release_ipc`).
        let e = export(size, |span| self.device.share(ptr, span))?;
        tracing::debug!(ptr, size, "device memory exported for IPC");
        let handle = e.handle.clone();
        self.ipc.exports.insert(ptr, e);
        Ok(ReplyBody::Data(handle))
    }

    /// `IpcOpenMemHandle`: maps another session's export into this session's device.
    pub(crate) fn ipc_open_mem_handle(&mut self, handle: &[u8]) -> R<ReplyBody> {
        let h = IpcHandle::decode(handle).ok_or(st::INVALID_VALUE)?;
        if h.pid == std::process::id() {
            // NVIDIA's driver refuses a process its own handles.
            return Err(st::INVALID_CONTEXT);
        }
        // Kept until the mapping is closed and freed from the device.
        let (memory, span) = open_shared(&h)?;
        let ptr = self.device.alloc_shared(h.size, span)?;
        tracing::debug!(ptr, size = h.size, pid = h.pid, "IPC memory opened");
        self.ipc.opened.insert(ptr, memory);
        Ok(ReplyBody::Opened {
            ptr: DevicePtr(ptr),
            size: h.size,
        })
    }

    /// `IpcExportPhysical`: physical memory (`cuMemCreate`'s `handle`) moves into a memfd the
    /// client hands the application as a POSIX file descriptor.
    pub(crate) fn ipc_export_physical(&mut self, handle: u64) -> R<ReplyBody> {
        if let Some(e) = self.ipc.physical_exports.get(&handle) {
            return Ok(ReplyBody::Data(e.handle.clone()));
        }
        let (id, size) = *self
            .memory
            .vmm
            .physical
            .get(&handle)
            .ok_or(st::INVALID_VALUE)?;
        let e = export(size, |span| self.device.share_physical(id, span))?;
        tracing::debug!(size, "physical memory exported as a file descriptor");
        let bytes = e.handle.clone();
        self.ipc.physical_exports.insert(handle, e);
        Ok(ReplyBody::Data(bytes))
    }

    /// `IpcImportPhysical`: the memfd a handle names becomes physical memory of this session
    /// under the client's `handle` (not charged: its exporter is).
    pub(crate) fn ipc_import_physical(&mut self, handle: u64, shared: &[u8]) -> R<()> {
        if self.memory.vmm.physical.contains_key(&handle) {
            return Err(st::INVALID_VALUE);
        }
        let h = IpcHandle::decode(shared).ok_or(st::INVALID_VALUE)?;
        let (memory, span) = open_shared(&h)?;
        let id = self
            .device
            .create_physical_shared(memory.len() as u64, span)?;
        self.memory
            .vmm
            .physical
            .insert(handle, (id, memory.len() as u64));
        self.ipc.imported_handles.insert(handle);
        self.ipc.physical_imports.push(memory);
        Ok(())
    }

    /// What releasing physical memory `handle` of `size` bytes gives back to the session's
    /// charge: nothing for imported memory (its exporter is charged).
    pub(crate) fn charged_physical(&mut self, handle: u64, size: u64) -> u64 {
        if self.ipc.imported_handles.remove(&handle) {
            0
        } else {
            size
        }
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

    /// Closes everything the session opened and drops every memfd it held (`release_memory`,
    /// once its allocations and physical memory are gone).
    pub(crate) fn release_ipc(&mut self) {
        for (ptr, _) in std::mem::take(&mut self.ipc.opened) {
            let _ = self.device.free(ptr);
        }
        self.ipc = IpcBooks::default();
    }
}
