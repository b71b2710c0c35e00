//! Device memory as one session holds it: what it is charged (its slice and the node's
//! ledger), its allocations, copies and memsets checked against them, and its virtual-memory
//! books (physical memory, reserved and mapped ranges).

use std::collections::HashMap;

use gpufuse_device::status as st;
use gpufuse_proto::{Rect, ReplyBody};
use gpufuse_transport::arena::HostArena;

use crate::{Session, R};
use gpufuse_proto::DevicePtr;

/// A session's virtual-memory books: client handle -> (device physical id, size), reserved
/// ranges and mapped ranges (start -> size).
#[derive(Default)]
pub(crate) struct VmmBooks {
    pub(crate) physical: HashMap<u64, (u64, u64)>,
    pub(crate) reserved: HashMap<u64, u64>,
    pub(crate) mapped: HashMap<u64, u64>,
}

/// What the session holds of its device's memory.
pub(crate) struct MemoryBooks {
    /// The session's slice, if it has one.
    pub(crate) limit: Option<u64>,
    /// Bytes charged: allocations, physical memory, module variables.
    pub(crate) used: u64,
    /// Allocations by address: their sizes.
    pub(crate) allocations: HashMap<u64, u64>,
    pub(crate) vmm: VmmBooks,
    /// The client's host arena (its page-locked memory), on the shared-memory transport.
    pub(crate) arena: Option<HostArena>,
    /// Arenas the client attached before its current one, kept mapped while the device lives:
    /// shared allocations ([`Session::alloc_shared`]) may still be made of their pages.
    pub(crate) retired_arenas: Vec<HostArena>,
    /// A session moved here whose client has not attached its arena yet: copies into the
    /// arena that requests forwarded by the old worker made (arena offset, bytes read at the
    /// time), written into the arena when the client attaches it.
    pub(crate) arena_backlog: Option<Vec<(u64, Vec<u8>)>>,
    /// Copies into or out of the arena that may still be in flight on the device: the next
    /// reply waits for them, because the protocol promises the bytes in place (or read) by
    /// then. Each is an event (`ARENA_EVENTS`) recorded on the copy's stream after it, so the
    /// wait covers that stream up to the copy, not the whole device; `arena_all`: a record
    /// failed, wait for everything.
    pub(crate) arena_pending: std::collections::HashSet<u64>,
    pub(crate) arena_events: std::collections::HashSet<u64>,
    pub(crate) arena_all: bool,
    /// The device `malloc` heap's size (`CU_LIMIT_MALLOC_HEAP_SIZE`): what it asks beyond
    /// CUDA's default ([`DEFAULT_HEAP`], which the device keeps outside the ledger) is charged.
    pub(crate) heap_size: u64,
}

/// The worker's own event ids (arena copies' completion, one per stream): the top 16 bits
/// set, which no client handle has (handles are `kind << 48 | counter`, kinds below 16).
pub(crate) const ARENA_EVENTS: u64 = 0xffff << 48;

/// CUDA's default device `malloc` heap (`CU_LIMIT_MALLOC_HEAP_SIZE`), 8 MiB.
pub(crate) const DEFAULT_HEAP: u64 = 8 << 20;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
const LIMIT_MALLOC_HEAP_SIZE: u32 = 2;

impl MemoryBooks {
    pub(crate) fn new(limit: Option<u64>) -> Self {
        Self {
            limit,
            used: 0,
            allocations: HashMap::new(),
            vmm: VmmBooks::default(),
            arena: None,
            retired_arenas: Vec::new(),
            arena_pending: Default::default(),
            arena_events: Default::default(),
            arena_all: false,
            arena_backlog: None,
            heap_size: DEFAULT_HEAP,
        }
    }
}

impl Session<'_> {
    /// What a host-to-device copy of `len` bytes to `dst` on `stream` must pass.
    pub(crate) fn check_htod(&self, dst: u64, stream: u64, len: u64) -> R<()> {
        self.check_stream(stream)?;
        self.check_range(dst, len)
    }

    /// `[ptr, ptr+len)` must be inside one of this session's allocations.
    pub(crate) fn check_range(&self, ptr: u64, len: u64) -> R<()> {
        if len == 0 || self.device.contains(ptr, len) {
            Ok(())
        } else {
            Err(st::INVALID_VALUE)
        }
    }

    /// Counts `size` bytes against the session's limit and the device's ledger.
    pub(crate) fn charge(&mut self, size: u64) -> R<()> {
        if size == 0 {
            return Ok(());
        }
        let m = &self.memory;
        if m.limit
            .is_some_and(|l| m.used.checked_add(size).is_none_or(|u| u > l))
            || !self.reserve_room(size, false)
        {
            return Err(st::OUT_OF_MEMORY);
        }
        self.memory.used += size;
        Ok(())
    }

    pub(crate) fn uncharge(&mut self, size: u64) {
        self.memory.used -= size;
        // Bytes an eviction released from the ledger are not released twice: what it released
        // beyond what the session still holds was part of this size.
        let already = self.residency.unreleased(self.memory.used).min(size);
        self.ledger.release(size - already);
    }

    pub(crate) fn alloc(&mut self, size: u64) -> R<u64> {
        if size == 0 {
            return Err(st::INVALID_VALUE);
        }
        self.charge(size)?;
        match self.device.alloc(size) {
            Ok(p) => {
                self.memory.allocations.insert(p, size);
                Ok(p)
            }
            Err(e) => {
                self.uncharge(size);
                Err(e)
            }
        }
    }

    /// `MemAllocShared`: `size` bytes whose memory is the client's host arena at `offset`
    /// (managed memory the client uses at the same time as the device), charged like any
    /// allocation. The range comes from the client: it must start on a page and lie inside the
    /// arena, whole words.
    pub(crate) fn alloc_shared(&mut self, size: u64, offset: u64) -> R<u64> {
        if size == 0 || !offset.is_multiple_of(gpufuse_transport::arena::PAGE as u64) {
            return Err(st::INVALID_VALUE);
        }
        let arena = self.memory.arena.as_ref().ok_or(st::INVALID_VALUE)?;
        // The device keeps whole words: the block (whole pages) covers the last one.
        let words = size.checked_next_multiple_of(8).ok_or(st::INVALID_VALUE)?;
        let at = arena.checked(offset, words).ok_or(st::INVALID_VALUE)?;
        // SAFETY: `[at, at+words)` lies inside the arena's mapping (checked), which the
        // session keeps mapped for as long as its device lives: an arena attached later
        // retires this one into `retired_arenas` instead of unmapping it.
        let span = unsafe { gpufuse_device::HostSpan::new(at, words as usize) };
        self.charge(size)?;
        match self.device.alloc_shared(size, span) {
            Ok(p) => {
                self.memory.allocations.insert(p, size);
                Ok(p)
            }
            Err(e) => {
                self.uncharge(size);
                Err(e)
            }
        }
    }

    pub(crate) fn free(&mut self, ptr: u64) -> R<()> {
        let size = self
            .memory
            .allocations
            .remove(&ptr)
            .ok_or(st::INVALID_VALUE)?;
        self.device.free(ptr)?;
        self.ipc_freed(ptr);
        self.uncharge(size);
        Ok(())
    }

    /// Frees every allocation and every piece of VMM memory (reset, end of session).
    pub(crate) fn release_memory(&mut self) {
        let ptrs: Vec<u64> = self.memory.allocations.keys().copied().collect();
        for p in ptrs {
            let _ = self.free(p);
        }
        let mapped: Vec<(u64, u64)> = self.memory.vmm.mapped.drain().collect();
        for (ptr, size) in mapped {
            let _ = self.device.unmap(ptr, size);
        }
        let physical: Vec<(u64, (u64, u64))> = self.memory.vmm.physical.drain().collect();
        for (handle, (id, size)) in physical {
            let _ = self.device.release_physical(id);
            let charged = self.charged_physical(handle, size);
            self.uncharge(charged);
        }
        let reserved: Vec<(u64, u64)> = self.memory.vmm.reserved.drain().collect();
        for (ptr, size) in reserved {
            let _ = self.device.unreserve(ptr, size);
        }
        self.release_ipc();
    }

    /// Checks `height` rows of `width` bytes at `r` against the session; returns the bytes
    /// they hold (`width * height`, checked: both come from the wire).
    pub(crate) fn rows(&mut self, r: Rect, width: u64, height: u64) -> R<u64> {
        if width > r.pitch && height > 1 {
            return Err(st::INVALID_VALUE);
        }
        let span = r
            .pitch
            .checked_mul(height.saturating_sub(1))
            .and_then(|s| s.checked_add(width))
            .ok_or(st::INVALID_VALUE)?;
        self.check_range(r.ptr.get(), span)?;
        width.checked_mul(height).ok_or(st::INVALID_VALUE)
    }

    pub(crate) fn mem_alloc_pitch(
        &mut self,
        width: u64,
        height: u64,
        elem_size: u32,
    ) -> R<ReplyBody> {
        if width == 0 || height == 0 || !matches!(elem_size, 4 | 8 | 16) {
            return Err(st::INVALID_VALUE);
        }
        // `width` comes from the wire: rounding it up to the pitch must not wrap.
        let pitch = width
            .checked_next_multiple_of(512)
            .ok_or(st::INVALID_VALUE)?;
        let ptr = self.alloc(pitch.checked_mul(height).ok_or(st::OUT_OF_MEMORY)?)?;
        Ok(ReplyBody::Pitch {
            ptr: DevicePtr(ptr),
            pitch,
        })
    }

    pub(crate) fn mem_get_info(&mut self) -> ReplyBody {
        let total = self.device.info(self.memory.limit).total_mem;
        let free = match self.memory.limit {
            Some(_) => total.saturating_sub(self.memory.used),
            None => total.saturating_sub(self.ledger.device_used()),
        };
        ReplyBody::MemInfo { free, total }
    }

    pub(crate) fn memcpy_dtoh(&mut self, src: u64, size: u64, stream: u64) -> R<ReplyBody> {
        self.check_stream(stream)?;
        self.check_range(src, size)?;
        if size >= 64 * 1024 && self.device.view(src, size).is_some() {
            // Sent straight from device memory by `run`.
            self.view = Some((src, size));
            return Ok(ReplyBody::Data(Vec::new()));
        }
        // The buffer of the last large reply is reused: no fresh pages per copy.
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        out.resize(size as usize, 0);
        self.device.read_on(src, &mut out, stream)?;
        Ok(ReplyBody::Data(out))
    }

    /// From now on, copies may name offsets in `arena`, the client's page-locked memory.
    pub fn set_host_arena(&mut self, arena: HostArena) {
        for (offset, bytes) in self.memory.arena_backlog.take().unwrap_or_default() {
            if arena.checked(offset, bytes.len() as u64).is_some() {
                arena.write(offset, &bytes);
            } else {
                tracing::warn!(offset, "a forwarded copy does not fit the client's arena");
            }
        }
        // SAFETY: the whole mapping, which the session keeps (and so maps) for as long as
        // its device lives: a later arena retires this one into `retired_arenas`, and the
        // device is told of the new one here.
        let whole = unsafe { gpufuse_device::HostSpan::new(arena.base(), arena.len()) };
        // SAFETY: the pin map's bytes lie inside the same mapping.
        let pin_map = arena
            .pin_map()
            .map(|(p, len)| unsafe { gpufuse_device::HostSpan::new(p, len) });
        if let Err(status) = self.device.host_arena(whole, pin_map) {
            tracing::info!(
                status,
                bytes = arena.len(),
                "the device did not take the host arena: its copies go through a buffer"
            );
        }
        if let Some(old) = self.memory.arena.replace(arena) {
            self.memory.retired_arenas.push(old);
        }
    }

    /// `SetLimit`: a limit the device applies. A device `malloc` heap larger than CUDA's
    /// default is charged to the session for what it adds (it is device memory a kernel
    /// fills), when it is asked for: a slice that cannot hold it refuses with
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub(crate) fn set_limit(&mut self, limit: u32, value: u64) -> R<()> {
        if limit != LIMIT_MALLOC_HEAP_SIZE {
            return self.device.set_limit(limit, value);
        }
        // The device says first whether the heap may still change (not once a kernel has it).
        self.device.set_limit(limit, value)?;
        let extra = value.saturating_sub(DEFAULT_HEAP);
        let old = self.memory.heap_size.saturating_sub(DEFAULT_HEAP);
        if extra > old {
            if let Err(e) = self.charge(extra - old) {
                // Back to the size that is charged (the device still has no heap).
                let _ = self.device.set_limit(limit, self.memory.heap_size);
                return Err(e);
            }
        } else {
            self.uncharge(old - extra);
        }
        self.memory.heap_size = value;
        Ok(())
    }

    /// `MapHostArena`: kernels reach the client's host arena at `base`, where the client maps
    /// it (page-locked memory under unified addressing; not charged: it is host memory).
    pub(crate) fn map_host_arena(&mut self, base: u64) -> R<()> {
        if self.memory.arena.is_none() {
            return Err(st::INVALID_VALUE);
        }
        self.device.map_host_arena(base)?;
        tracing::debug!(base, "page-locked memory reachable by kernels");
        Ok(())
    }

    /// From now on until the client attaches its arena, copies into the arena are kept
    /// (forwarded requests of a session that moved here; [`Session::set_host_arena`]).
    pub(crate) fn await_host_arena(&mut self) {
        self.memory.arena_backlog.get_or_insert_with(Vec::new);
    }

    /// Reads `size` bytes of the client's arena at `offset` (a forwarded copy from it).
    pub(crate) fn arena_bytes(&self, offset: u64, size: u64) -> Option<Vec<u8>> {
        let arena = self.memory.arena.as_ref()?;
        arena.checked(offset, size)?;
        let mut data = vec![0u8; size as usize];
        arena.read(offset, &mut data);
        Some(data)
    }

    /// `MemcpyHtoDHost`: one copy from the client's arena into device memory. The arena range
    /// comes from the client and is checked against the arena's size.
    pub(crate) fn memcpy_htod_host(
        &mut self,
        dst: u64,
        stream: u64,
        offset: u64,
        size: u64,
    ) -> R<()> {
        self.check_htod(dst, stream, size)?;
        let arena = self.memory.arena.as_ref().ok_or(st::INVALID_VALUE)?;
        arena.checked(offset, size).ok_or(st::INVALID_VALUE)?;
        if size == 0 {
            return Ok(());
        }
        match self.device.view_mut(dst, size) {
            Some(bytes) => {
                arena.read(offset, bytes);
                Ok(())
            }
            None => {
                let span = arena_span(arena, offset, size)?;
                self.device.write_span(dst, span, stream)?;
                self.arena_copy_enqueued(stream);
                Ok(())
            }
        }
    }

    /// An arena copy was enqueued on `stream`: the worker's own event for that stream is
    /// recorded after it, for the next reply to wait on.
    fn arena_copy_enqueued(&mut self, stream: u64) {
        let ev = ARENA_EVENTS | (stream & !ARENA_EVENTS);
        if !self.memory.arena_events.contains(&ev) {
            // CU_EVENT_DISABLE_TIMING: only ever waited on.
            if self.device.create_event(ev, 2).is_err() {
                self.memory.arena_all = true;
                return;
            }
            self.memory.arena_events.insert(ev);
        }
        match self.device.record(ev, stream) {
            Ok(()) => {
                self.memory.arena_pending.insert(ev);
            }
            Err(_) => self.memory.arena_all = true,
        }
    }

    /// Before a reply: waits for the arena copies in flight (see `arena_pending`).
    pub(crate) fn wait_arena_copies(&mut self) -> R<()> {
        let pending: Vec<u64> = self.memory.arena_pending.drain().collect();
        let mut r = Ok(());
        if std::mem::take(&mut self.memory.arena_all) {
            r = self.device.synchronize();
        } else {
            for ev in pending {
                if let Err(e) = self.device.sync_event(ev) {
                    r = Err(e);
                }
            }
        }
        self.waited(r)
    }

    /// The worker's own arena events leave the device (a reset, the end, a move).
    pub(crate) fn forget_arena_events(&mut self) {
        self.memory.arena_pending.clear();
        for ev in std::mem::take(&mut self.memory.arena_events) {
            let _ = self.device.destroy_event(ev);
        }
    }

    /// `MemcpyDtoHHost`: one copy from device memory into the client's arena (checked as
    /// [`Session::memcpy_htod_host`]'s).
    pub(crate) fn memcpy_dtoh_host(
        &mut self,
        src: u64,
        stream: u64,
        offset: u64,
        size: u64,
    ) -> R<()> {
        self.check_stream(stream)?;
        self.check_range(src, size)?;
        if self.memory.arena.is_none() {
            if let Some(backlog) = self.memory.arena_backlog.as_mut() {
                let mut data = vec![0u8; size as usize];
                self.device.read_on(src, &mut data, stream)?;
                backlog.push((offset, data));
                return Ok(());
            }
        }
        let arena = self.memory.arena.as_ref().ok_or(st::INVALID_VALUE)?;
        arena.checked(offset, size).ok_or(st::INVALID_VALUE)?;
        if size == 0 {
            return Ok(());
        }
        match self.device.view(src, size) {
            Some(bytes) => {
                arena.write(offset, bytes);
                Ok(())
            }
            None => {
                let span = arena_span(arena, offset, size)?;
                self.device.read_span(src, span, stream)?;
                self.arena_copy_enqueued(stream);
                Ok(())
            }
        }
    }

    pub(crate) fn memcpy_dtoh_async(
        &mut self,
        src: u64,
        size: u64,
        stream: u64,
        tag: u64,
    ) -> R<()> {
        self.check_stream(stream)?;
        self.check_range(src, size)?;
        let mut data = vec![0u8; size as usize];
        self.device.read_on(src, &mut data, stream)?;
        self.staged.push(gpufuse_proto::StagedCopy { tag, data });
        Ok(())
    }

    pub(crate) fn memcpy_dtod(&mut self, dst: u64, src: u64, size: u64, stream: u64) -> R<()> {
        self.check_stream(stream)?;
        self.check_range(dst, size)?;
        self.check_range(src, size)?;
        self.device.copy(dst, src, size, stream)
    }

    pub(crate) fn memcpy_2d_dtod(
        &mut self,
        dst: Rect,
        src: Rect,
        width: u64,
        height: u64,
        stream: u64,
    ) -> R<()> {
        self.check_stream(stream)?;
        self.rows(dst, width, height)?;
        self.rows(src, width, height)?;
        for row in 0..height {
            self.device.copy(
                dst.ptr.get() + row * dst.pitch,
                src.ptr.get() + row * src.pitch,
                width,
                stream,
            )?;
        }
        Ok(())
    }

    pub(crate) fn memcpy_2d_htod(
        &mut self,
        dst: Rect,
        width: u64,
        height: u64,
        stream: u64,
        data: &[u8],
    ) -> R<()> {
        self.check_stream(stream)?;
        let total = self.rows(dst, width, height)?;
        if data.len() as u64 != total {
            return Err(st::INVALID_VALUE);
        }
        // Zero-width rows copy nothing (and `chunks(0)` would panic).
        if total > 0 {
            for (row, chunk) in data.chunks(width as usize).enumerate() {
                self.device
                    .write_on(dst.ptr.get() + row as u64 * dst.pitch, chunk, stream)?;
            }
        }
        Ok(())
    }

    pub(crate) fn memcpy_2d_dtoh(
        &mut self,
        src: Rect,
        width: u64,
        height: u64,
        stream: u64,
    ) -> R<ReplyBody> {
        self.check_stream(stream)?;
        let total = self.rows(src, width, height)?;
        let mut out = vec![0u8; usize::try_from(total).map_err(|_| st::INVALID_VALUE)?];
        if total > 0 {
            for (row, chunk) in out.chunks_mut(width as usize).enumerate() {
                self.device
                    .read_on(src.ptr.get() + row as u64 * src.pitch, chunk, stream)?;
            }
        }
        Ok(ReplyBody::Data(out))
    }

    pub(crate) fn memset(
        &mut self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: u64,
    ) -> R<()> {
        self.check_stream(stream)?;
        self.check_range(dst, count.saturating_mul(elem_size as u64))?;
        self.device.memset(dst, value, elem_size, count, stream)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn memset_2d(
        &mut self,
        dst: Rect,
        value: u32,
        elem_size: u8,
        width: u64,
        height: u64,
        stream: u64,
    ) -> R<()> {
        self.check_stream(stream)?;
        let row_bytes = width
            .checked_mul(elem_size as u64)
            .ok_or(st::INVALID_VALUE)?;
        self.rows(dst, row_bytes, height)?;
        for row in 0..height {
            self.device.memset(
                dst.ptr.get() + row * dst.pitch,
                value,
                elem_size,
                width,
                stream,
            )?;
        }
        Ok(())
    }

    pub(crate) fn mem_create(&mut self, handle: u64, size: u64) -> R<()> {
        if self.memory.vmm.physical.contains_key(&handle) {
            return Err(st::INVALID_VALUE);
        }
        self.charge(size)?;
        match self.device.create_physical(size) {
            Ok(id) => {
                self.memory.vmm.physical.insert(handle, (id, size));
                Ok(())
            }
            Err(e) => {
                self.uncharge(size);
                Err(e)
            }
        }
    }

    pub(crate) fn mem_release(&mut self, handle: u64) -> R<()> {
        let (id, size) = self
            .memory
            .vmm
            .physical
            .remove(&handle)
            .ok_or(st::INVALID_VALUE)?;
        self.device.release_physical(id)?;
        let charged = self.charged_physical(handle, size);
        self.uncharge(charged);
        Ok(())
    }

    pub(crate) fn mem_address_reserve(&mut self, size: u64, align: u64) -> R<ReplyBody> {
        let ptr = self.device.reserve(size, align)?;
        self.memory.vmm.reserved.insert(ptr, size);
        Ok(ReplyBody::Ptr(DevicePtr(ptr)))
    }

    pub(crate) fn mem_address_free(&mut self, ptr: u64, size: u64) -> R<()> {
        self.device.unreserve(ptr, size)?;
        self.memory.vmm.reserved.remove(&ptr);
        Ok(())
    }

    pub(crate) fn mem_map(&mut self, ptr: u64, size: u64, handle: u64) -> R<()> {
        let &(id, psize) = self
            .memory
            .vmm
            .physical
            .get(&handle)
            .ok_or(st::INVALID_VALUE)?;
        if size != psize {
            // Part of a physical allocation, or several: not supported yet.
            return Err(st::NOT_SUPPORTED);
        }
        self.device.map(ptr, id)?;
        self.memory.vmm.mapped.insert(ptr, size);
        Ok(())
    }

    pub(crate) fn mem_unmap(&mut self, ptr: u64, size: u64) -> R<()> {
        self.device.unmap(ptr, size)?;
        let end = ptr.saturating_add(size);
        self.memory.vmm.mapped.retain(|&p, _| p < ptr || p >= end);
        Ok(())
    }
}

/// `size` bytes of the client's arena at `offset`, checked, for the device to copy from or
/// to in place.
fn arena_span(arena: &HostArena, offset: u64, size: u64) -> R<gpufuse_device::HostSpan> {
    let p = arena.checked(offset, size).ok_or(st::INVALID_VALUE)?;
    // SAFETY: `checked` returned the start of `size` mapped bytes of the arena, which stays
    // mapped for the session's life; the span is used within this request only.
    Ok(unsafe { gpufuse_device::HostSpan::new(p, size as usize) })
}
