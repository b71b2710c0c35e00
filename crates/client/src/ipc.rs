//! CUDA IPC (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`,
//! `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): memory and events shared between processes
//! of one host, each its own session.
//!
//! Memory: the worker makes the allocation memory other sessions may map and answers the
//! 64-byte handle (`gpufuse_worker`'s `ipc.rs` says how); another process's session opens it
//! at an address of its own, as [`MemoryKind::Opened`], until `cuIpcCloseMemHandle`.
//!
//! Physical memory as a POSIX file descriptor (`cuMemExportToShareableHandle`,
//! `cuMemImportFromShareableHandle`): the worker moves the memory into a memfd and answers its
//! handle; this process opens that memfd (`gpufuse_transport::ipc::open`) and the application
//! gets the descriptor, which it may send to another process. Importing names a descriptor of
//! this process (its pid and number, and the secret the memfd's name carries) for the worker
//! to open. Both need the worker on this host, under the same user.
//!
//! Events: each session's worker runs its work in order, and a record of an interprocess
//! event (`CU_EVENT_INTERPROCESS`) returns only once the work before it is done (the client
//! synchronizes on it, [`Inner::record_event`]). Every record anyone has made of it is then
//! complete when a process that waited for the record (through shared memory, a pipe, a
//! barrier) goes on, so opening the handle needs no shared state: the opened event is a local
//! event whose waits, queries and synchronizes never wait, which is what they would find on a
//! GPU by then. The cost: a record of an interprocess event waits for the stream's work.

use std::os::fd::{OwnedFd, RawFd};

use gpufuse_proto::{DevicePtr, PhysicalHandle, ReplyBody, Request};
use gpufuse_transport::ipc::IpcHandle;

use crate::error::ClientError;
use crate::handles::{self, Kind};
use crate::memory::MemoryKind;
use crate::state::Inner;
use crate::status::{
    INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, OPERATING_SYSTEM, UNKNOWN,
};

/// The size of `CUipcMemHandle` and `CUipcEventHandle`.
pub const HANDLE_LEN: usize = 64;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_INTERPROCESS`.
pub const EVENT_INTERPROCESS: u32 = 0x4;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the only flag `cuIpcOpenMemHandle` takes.
const LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;
/// Where a pool pointer's export data carries its pool's secret (after the IPC handle's 40
/// bytes of content).
const POOL_SECRET: std::ops::Range<usize> = 40..56;
/// What a gpufuse event handle starts with; the exporting process's pid and the event follow.
const EVENT_MAGIC: &[u8; 8] = b"GFIPCEVT";

/// A new exportable pool's secret.
pub fn pool_secret() -> Result<[u8; 16], ClientError> {
    gpufuse_transport::ipc::secret().map_err(|_| OPERATING_SYSTEM.into())
}

impl Inner {
    /// `cuIpcGetMemHandle`: `ptr` must be the base of a `cuMemAlloc` allocation.
    pub fn ipc_get_mem_handle(&mut self, ptr: u64) -> Result<[u8; HANDLE_LEN], ClientError> {
        match self.allocation(ptr) {
            Some(a) if a.kind == MemoryKind::Device => {}
            _ => return Err(INVALID_VALUE.into()),
        }
        self.export_allocation(ptr)
    }

    /// The worker's IPC handle of the allocation at `ptr` (a checked base).
    fn export_allocation(&mut self, ptr: u64) -> Result<[u8; HANDLE_LEN], ClientError> {
        let ReplyBody::Data(handle) = self.conn.call(&Request::IpcGetMemHandle {
            ptr: DevicePtr(ptr),
        })?
        else {
            return Err(UNKNOWN.into());
        };
        let handle: [u8; HANDLE_LEN] = handle.try_into().map_err(|_| UNKNOWN)?;
        self.ipc_exports.insert(ptr);
        Ok(handle)
    }

    /// `cuIpcOpenMemHandle`: another process's memory, at an address of this session.
    pub fn ipc_open_mem_handle(
        &mut self,
        handle: &[u8; HANDLE_LEN],
        flags: u32,
    ) -> Result<u64, ClientError> {
        if flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(INVALID_VALUE.into());
        }
        if let Some((&ptr, (_, opens))) = self.ipc_opened.iter_mut().find(|(_, (h, _))| h == handle)
        {
            // Opened already: the same pointer, one more open to close.
            *opens += 1;
            return Ok(ptr);
        }
        let (_, device) = self.current()?;
        let ReplyBody::Opened {
            ptr: DevicePtr(ptr),
            size,
        } = self
            .conn
            .call(&Request::IpcOpenMemHandle { device, handle })?
        else {
            return Err(UNKNOWN.into());
        };
        self.note_placed(ptr, size, device, MemoryKind::Opened { pool: None });
        self.ipc_opened.insert(ptr, (*handle, 1));
        Ok(ptr)
    }

    /// `cuIpcCloseMemHandle`: `ptr` must be what [`Inner::ipc_open_mem_handle`] gave.
    pub fn ipc_close_mem_handle(&mut self, ptr: u64) -> Result<(), ClientError> {
        match self.allocation(ptr) {
            Some(a) if a.kind == (MemoryKind::Opened { pool: None }) => {}
            _ => return Err(INVALID_VALUE.into()),
        }
        self.close_opened(ptr)
    }

    /// Closes one open of the memory at `ptr` (a checked base), unmapping it with the last.
    pub(crate) fn close_opened(&mut self, ptr: u64) -> Result<(), ClientError> {
        if let Some((_, opens)) = self.ipc_opened.get_mut(&ptr) {
            *opens -= 1;
            if *opens > 0 {
                return Ok(());
            }
        }
        self.ipc_opened.remove(&ptr);
        self.allocations.remove(&ptr);
        self.conn
            .call(&Request::IpcCloseMemHandle {
                ptr: DevicePtr(ptr),
            })
            .map(drop)
    }

    /// `cuMemExportToShareableHandle` of a POSIX file descriptor: a descriptor of the memfd
    /// the physical memory `handle` now is (the application owns it).
    pub fn export_physical_fd(&mut self, handle: u64) -> Result<OwnedFd, ClientError> {
        if !self.physical.contains_key(&handle) {
            return Err(INVALID_VALUE.into());
        }
        let ReplyBody::Data(bytes) = self.conn.call(&Request::IpcExportPhysical {
            handle: PhysicalHandle(handle),
        })?
        else {
            return Err(UNKNOWN.into());
        };
        let h = IpcHandle::decode(&bytes).ok_or(UNKNOWN)?;
        // A worker on another host (or under another user): no descriptor can reach it here.
        gpufuse_transport::ipc::open(&h).ok_or_else(|| NOT_SUPPORTED.into())
    }

    /// `cuMemImportFromShareableHandle` of a POSIX file descriptor: physical memory of the
    /// current device whose memory is the memfd `fd` (another process's export).
    pub fn import_physical_fd(&mut self, fd: RawFd) -> Result<u64, ClientError> {
        let h = IpcHandle::of_own_fd(fd).ok_or(INVALID_VALUE)?;
        let (_, device) = self.current()?;
        let handle = handles::mint(Kind::Physical);
        self.conn.call(&Request::IpcImportPhysical {
            handle: PhysicalHandle(handle),
            shared: &h.encode(),
        })?;
        self.physical.insert(handle, (h.size, device, false));
        Ok(handle)
    }

    /// Whether the session shares memory with other processes (exported or opened): such a
    /// session cannot be carried to a new worker.
    pub fn has_ipc_memory(&self) -> bool {
        !self.ipc_exports.is_empty() || !self.ipc_opened.is_empty()
    }

    /// `cuIpcGetEventHandle`: the event must be interprocess (and so without timing).
    pub fn ipc_get_event_handle(&mut self, event: u64) -> Result<[u8; HANDLE_LEN], ClientError> {
        let ev = self.event_id(event)?;
        if self.events[&ev].flags & EVENT_INTERPROCESS == 0 {
            return Err(INVALID_HANDLE.into());
        }
        let mut h = [0u8; HANDLE_LEN];
        h[..8].copy_from_slice(EVENT_MAGIC);
        h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        h[12..20].copy_from_slice(&ev.to_le_bytes());
        Ok(h)
    }

    /// `cuIpcOpenEventHandle`: a local interprocess event (see the module's documentation).
    pub fn ipc_open_event_handle(&mut self, handle: &[u8; HANDLE_LEN]) -> Result<u64, ClientError> {
        if &handle[..8] != EVENT_MAGIC || handle[20..].iter().any(|&b| b != 0) {
            return Err(INVALID_VALUE.into());
        }
        if handle[8..12] == std::process::id().to_le_bytes() {
            // NVIDIA's driver refuses a process its own handles.
            return Err(INVALID_CONTEXT.into());
        }
        self.create_event(EVENT_DISABLE_TIMING | EVENT_INTERPROCESS)
    }

    /// `cuMemPoolExportToShareableHandle` of a POSIX file descriptor: a new descriptor that
    /// stands for the pool (an empty memfd named after its secret).
    pub fn export_pool_fd(&mut self, pool: u64) -> Result<OwnedFd, ClientError> {
        let stats = self.pools.get(&pool).ok_or(INVALID_VALUE)?;
        match (stats.shareable, stats.imported) {
            (Some(secret), false) => {
                gpufuse_transport::ipc::pool_fd(&secret).map_err(|_| OPERATING_SYSTEM.into())
            }
            _ => Err(INVALID_VALUE.into()),
        }
    }

    /// `cuMemPoolImportFromShareableHandle`: the pool another process's descriptor `fd`
    /// stands for, on the current device; it gives out that process's exported pointers.
    pub fn import_pool_fd(&mut self, fd: RawFd) -> Result<u64, ClientError> {
        let secret = gpufuse_transport::ipc::pool_secret_of_own_fd(fd).ok_or(INVALID_VALUE)?;
        let (_, device) = self.current()?;
        let pool = self.create_pool(device, 0, Some(secret));
        if let Some(stats) = self.pools.get_mut(&pool) {
            stats.imported = true;
        }
        Ok(pool)
    }

    /// `cuMemPoolExportPointer`: 64 bytes another process imports from the pool: the
    /// allocation's IPC handle (its first 40 bytes) and the pool's secret after it.
    pub fn export_pool_pointer(&mut self, ptr: u64) -> Result<[u8; HANDLE_LEN], ClientError> {
        let secret = match self.allocation(ptr).map(|a| a.kind) {
            Some(MemoryKind::Pooled { pool }) => self
                .pools
                .get(&pool)
                .filter(|s| !s.imported)
                .and_then(|s| s.shareable),
            _ => None,
        }
        .ok_or(INVALID_VALUE)?;
        let mut data = self.export_allocation(ptr)?;
        if data[POOL_SECRET].iter().any(|&b| b != 0) {
            return Err(UNKNOWN.into());
        }
        data[POOL_SECRET].copy_from_slice(&secret);
        Ok(data)
    }

    /// `cuMemPoolImportPointer`: the pointer `data` names, which must come from `pool`'s
    /// exporter.
    pub fn import_pool_pointer(
        &mut self,
        pool: u64,
        data: &[u8; HANDLE_LEN],
    ) -> Result<u64, ClientError> {
        let stats = self.pools.get(&pool).ok_or(INVALID_VALUE)?;
        let secret = stats
            .shareable
            .filter(|_| stats.imported)
            .ok_or(INVALID_VALUE)?;
        if data[POOL_SECRET] != secret {
            return Err(INVALID_VALUE.into());
        }
        let mut handle = *data;
        handle[POOL_SECRET].fill(0);
        let ptr = self.ipc_open_mem_handle(&handle, 0)?;
        if let Some(a) = self.allocations.get_mut(&ptr) {
            a.kind = MemoryKind::Opened { pool: Some(pool) };
        }
        Ok(ptr)
    }
}
