//! Page-locked host memory: `cuMemHostAlloc` hands out zeroed, page-aligned memory of this
//! process (or, with `CU_MEMHOSTALLOC_DEVICEMAP`, managed-like memory the device reaches at the
//! same address), and `cuMemHostRegister` records the application's own. Asynchronous copies
//! to page-locked memory are filled at the next synchronization; to pageable memory they
//! complete before returning.
//!
//! On the shared-memory transport, `cuMemHostAlloc` carves its blocks from the session's host
//! arena ([`gpufuse_transport::arena`]), which the worker maps too, and which the emulated GPU
//! reaches at the same addresses (`MapHostArena`): kernels dereference page-locked memory as
//! they do under unified addressing on a GPU, whatever the flags it was allocated with. Over a
//! socket (or on a real GPU) only `CU_MEMHOSTALLOC_DEVICEMAP` memory is reachable by kernels.
//! Copies between arena blocks and the device name arena offsets (`MemcpyHtoDHost`, `MemcpyDtoHHost`) and move no bytes through the
//! rings (`copy.rs`). Registered memory (`cuMemHostRegister`) is the application's own: its
//! whole pages are moved into the arena in place, at the same addresses (`registered.rs`), so
//! copies naming them move no bytes either; what cannot move (the partial pages at its ends,
//! memory that is not private anonymous read-write, a full arena) travels through the rings
//! as pageable memory's bytes do.

use std::alloc::Layout;
use std::sync::{Arc, Mutex};

use gpufuse_transport::arena::HostArena;

use gpufuse_proto::ReplyBody;
use gpufuse_proto::Request;

use crate::error::ClientError;
use crate::registered::ArenaSpan;
use crate::state::{HostAllocation, Inner};
use crate::status::{
    CUresult, HOST_MEMORY_ALREADY_REGISTERED, HOST_MEMORY_NOT_REGISTERED, INVALID_VALUE,
    NOT_SUPPORTED, OUT_OF_MEMORY, UNKNOWN,
};

const HOST_ALIGN: usize = 4096;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
pub const HOST_ALLOC_DEVICEMAP: u32 = 0x02;

/// Every host arena this process made, while blocks of it are handed out or a connection
/// holds it: the application keeps pointers into an arena past its session's connection (a
/// reconnect, a refused attach), so the mapping lives as long as this process needs it.
static ARENAS: Mutex<Vec<Arc<HostArena>>> = Mutex::new(Vec::new());

fn arenas() -> std::sync::MutexGuard<'static, Vec<Arc<HostArena>>> {
    ARENAS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new host arena for a session moving to the shared-memory transport
/// ([`gpufuse_transport::arena::default_size`]; `None` when turned off or when the system
/// refuses the mapping: pinned memory is then ordinary host memory).
pub(crate) fn new_arena() -> Option<Arc<HostArena>> {
    let size = gpufuse_transport::arena::default_size();
    if size == 0 {
        return None;
    }
    let arena = Arc::new(HostArena::create(size).ok()?);
    let mut all = arenas();
    // Arenas no connection holds and with nothing handed out are unmapped.
    all.retain(|a| Arc::strong_count(a) > 1 || a.in_use() > 0);
    all.push(arena.clone());
    Some(arena)
}

/// The arena of this process that `p` lies in.
fn arena_of(p: usize) -> Option<Arc<HostArena>> {
    arenas()
        .iter()
        .find(|a| a.offset_of(p, 1).is_some())
        .cloned()
}

/// Host-to-device copies from the arena at least this large use it when synchronous (a round
/// trip tells that the worker has read them); smaller ones are cheaper copied into the rings.
pub const ARENA_SYNC_HTOD_MIN: usize = 256 * 1024;

impl Inner {
    /// The arena offset of `[p, p+len)` when it lies in page-locked memory of the connection's
    /// host arena (so the worker reaches it).
    pub(crate) fn arena_offset(&self, p: usize, len: usize) -> Option<u64> {
        let arena = self.conn.host_arena()?;
        let off = arena.offset_of(p, len)?;
        let (base, h) = self.find_host(p)?;
        (!h.registered && !h.device_mapped && p + len <= base + h.size).then_some(off)
    }

    /// Where the worker finds `[p, p+len)` (`len` > 0): all of it in the connection's arena
    /// (a `cuMemHostAlloc` block), or its part in a registration moved into the arena, with
    /// the rest (`head` bytes before, the remainder after) the application's own memory.
    /// `None` when no part of it is in the arena.
    pub(crate) fn arena_span(&self, p: usize, len: usize) -> Option<ArenaSpan> {
        if let Some(offset) = self.arena_offset(p, len) {
            return Some(ArenaSpan {
                head: 0,
                offset,
                mid: len,
            });
        }
        if self.aliases.is_empty() {
            return None;
        }
        self.aliases.span(self.conn.host_arena()?, p, len)
    }

    /// Bytes that crossed the shared-memory rings so far (sent, received), with every queued
    /// request sent first; `None` on a socket.
    pub fn ring_bytes(&mut self) -> Result<Option<(u64, u64)>, ClientError> {
        self.drain_lanes();
        self.conn.flush()?;
        Ok(self.conn.ring_bytes())
    }

    /// Notes that quiet copies naming the arena may still be queued for the worker.
    pub(crate) fn arena_copies_queued(&self) {
        if let Some(a) = self.conn.host_arena() {
            a.reads_queued(true);
        }
    }

    /// `cuMemHostAlloc`: `size` bytes of page-locked memory.
    pub fn host_alloc(&mut self, size: usize, flags: u32) -> Result<*mut u8, ClientError> {
        let size = size.max(1);
        // Where the device reaches the arena at its address (`MapHostArena`), every block of
        // it is mapped pinned memory already: the flag asks for nothing more.
        let arena_reached = self.conn.device_mapped_arena().is_some();
        if flags & HOST_ALLOC_DEVICEMAP != 0 && !arena_reached {
            // Kernels reach it through the same pointer (unified addressing): a device
            // allocation with host pages at its address, moved like managed memory.
            let p = self.alloc_managed(size as u64)?;
            self.host.insert(
                p as usize,
                HostAllocation {
                    size,
                    flags,
                    registered: false,
                    device_mapped: true,
                },
            );
            return Ok(p as usize as *mut u8);
        }
        if let Some(p) = self.conn.host_arena().and_then(|a| a.alloc(size)) {
            self.host.insert(
                p as usize,
                HostAllocation {
                    size,
                    flags,
                    registered: false,
                    device_mapped: false,
                },
            );
            return Ok(p);
        }
        let layout = Layout::from_size_align(size, HOST_ALIGN)
            .map_err(|_| ClientError::Cuda(OUT_OF_MEMORY))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(OUT_OF_MEMORY.into());
        }
        self.host.insert(
            p as usize,
            HostAllocation {
                size,
                flags,
                registered: false,
                device_mapped: false,
            },
        );
        Ok(p)
    }

    /// The address kernels reach page-locked memory at `p` by (`cuMemHostGetDevicePointer`):
    /// the same address, for mapped pinned memory and for every block of an arena the device
    /// maps (unified addressing). `Err(NOT_SUPPORTED)` for registered memory;
    /// `Err(INVALID_VALUE)` for blocks the device cannot reach and for memory that is not
    /// page-locked.
    pub fn host_device_pointer(&self, p: usize) -> Result<u64, CUresult> {
        let (base, h) = self.find_host(p).ok_or(INVALID_VALUE)?;
        if h.device_mapped {
            return Ok(p as u64);
        }
        if h.registered {
            return Err(NOT_SUPPORTED);
        }
        match self.conn.device_mapped_arena() {
            Some(a) if a.offset_of(base, h.size).is_some() => Ok(p as u64),
            // As NVIDIA's driver answers for memory allocated without the flag.
            _ => Err(INVALID_VALUE),
        }
    }

    /// `cuMemFreeHost` of memory [`Inner::host_alloc`] handed out.
    pub fn host_free(&mut self, p: usize) -> Result<(), ClientError> {
        match self.host.get(&p).copied() {
            Some(h) if h.device_mapped => {
                self.host.remove(&p);
                self.free(p as u64)
            }
            Some(h) if !h.registered => {
                // Copies still queued into or out of it (quiet arena copies, staged
                // asynchronous ones) finish first: one round trip, after which the worker has
                // run them and their data has landed, so nothing touches the block once it is
                // given back. A lost connection is reported by the next call; the memory is
                // freed all the same.
                let queued = arena_of(p).is_some_and(|a| a.reads_queued(false));
                if queued || self.conn.has_pending_copies() {
                    let _ = self.conn.call_raw(&Request::Ping);
                }
                self.host.remove(&p);
                if let Some(arena) = arena_of(p) {
                    return if arena.free(p as *mut u8, h.size) {
                        Ok(())
                    } else {
                        Err(INVALID_VALUE.into())
                    };
                }
                let layout = Layout::from_size_align(h.size, HOST_ALIGN)
                    .map_err(|_| ClientError::Cuda(INVALID_VALUE))?;
                // SAFETY: `p` was returned by `alloc_zeroed` with this layout in `host_alloc`
                // and is removed from the table, so it is freed once.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                Ok(())
            }
            _ => Err(INVALID_VALUE.into()),
        }
    }

    /// `cuMemHostRegister`. On the shared-memory transport its whole pages move into the host
    /// arena in place when they can (`registered.rs`); otherwise they stay where they are and
    /// copies carry their bytes.
    pub fn host_register(&mut self, p: usize, size: usize, flags: u32) -> Result<(), ClientError> {
        let end = p.checked_add(size).ok_or(INVALID_VALUE)?;
        if p == 0 || size == 0 {
            return Err(INVALID_VALUE.into());
        }
        // Any overlap with memory already page-locked (registered or allocated), as the
        // driver answers.
        let overlaps = self.find_host(p).is_some() || self.host.range(p..end).next().is_some();
        if overlaps {
            return Err(HOST_MEMORY_ALREADY_REGISTERED.into());
        }
        if let Some(arena) = self.conn.host_arena().cloned() {
            self.aliases.alias(&arena, p, size, flags);
        }
        self.host.insert(
            p,
            HostAllocation {
                size,
                flags,
                registered: true,
                device_mapped: false,
            },
        );
        Ok(())
    }

    /// `cuMemHostUnregister`.
    pub fn host_unregister(&mut self, p: usize) -> Result<(), ClientError> {
        match self.host.get(&p) {
            Some(h) if h.registered => {
                // Staged asynchronous copies into it, and quiet copies naming its pages in
                // the arena, land first: the application may free the memory once this
                // returns.
                let queued = self
                    .conn
                    .host_arena()
                    .is_some_and(|a| a.reads_queued(false));
                if queued || self.conn.has_pending_copies() {
                    let _ = self.conn.call_raw(&Request::Ping);
                }
                if let Some(h) = self.host.remove(&p) {
                    // Private memory again, with the bytes the worker's copies left there.
                    self.aliases.restore(p, h.size);
                }
                Ok(())
            }
            _ => Err(HOST_MEMORY_NOT_REGISTERED.into()),
        }
    }

    /// `cuMemGetInfo` of the current device: (free, total).
    pub fn mem_info(&mut self) -> Result<(u64, u64), ClientError> {
        let (_, device) = self.current()?;
        match self.conn.call(&Request::MemGetInfo { device })? {
            ReplyBody::MemInfo { free, total } => Ok((free, total)),
            _ => Err(UNKNOWN.into()),
        }
    }
}
