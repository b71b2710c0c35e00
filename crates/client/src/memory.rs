//! Device memory the session owns: what kind each allocation is (one enum), allocating and
//! freeing it, and managed memory's hand-over between host and device.
//!
//! Managed memory (`cuMemAllocManaged`, and mapped pinned memory) for a device in another
//! process is a device allocation plus an anonymous mapping of the same size at the same address
//! here, so that one pointer works on the host and in kernels. The two copies follow the rule
//! CUDA applies where the device does not report concurrent managed access
//! (`CONCURRENT_MANAGED_ACCESS` is 0, as the client reports it): the host may touch managed
//! memory only while no device work is outstanding. Ownership moves at two points, and only
//! here: before the first device work after the host had the memory
//! ([`Inner::device_work`](crate::state::Inner::device_work) and its siblings, the one way work
//! reaches the device), and when a synchronizing call returns after device work
//! ([`Inner::synchronize`](crate::state::Inner::synchronize)). Whole allocations move each time
//! (no dirty-page tracking yet): correct, and cheap for the small managed buffers programs
//! usually have.
//!
//! On a same-host session whose device keeps its memory in host memory (the shared-memory
//! transport with a host arena, an emulated GPU), managed memory is shared instead
//! ([`MemoryKind::SharedManaged`]): a block of the host arena, which the worker makes the
//! allocation's memory (`MemAllocShared`) and this process maps at the allocation's address,
//! so the host and the device use the same words at the same time (host atomics and the
//! device's system-scope atomics are one coherence domain). Nothing moves for it, and the
//! device reports `CONCURRENT_MANAGED_ACCESS` 1 ([`Inner::shares_managed`]).

use gpufuse_proto::{ReplyBody, Request, MAX_COPY_CHUNK};

use crate::error::ClientError;
use crate::state::Inner;
use crate::status::{INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, UNKNOWN};
use gpufuse_proto::{DevicePtr, StreamHandle};

/// What kind of device memory an allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// `cuMemAlloc`, `cuMemAllocPitch`, a module's global: freed with `cuMemFree`.
    Device,
    /// Stream-ordered memory from the pool with this handle (`cuMemAllocAsync`,
    /// `cuMemAllocFromPoolAsync`); the pool's books are charged.
    Pooled { pool: u64 },
    /// Managed memory or mapped pinned memory: the same address is mapped in this process and
    /// the contents move between the two. `offset`: how far into the server's allocation the
    /// pointer starts (it is page-aligned inside a larger one); the server frees by its start.
    Managed { offset: u64 },
    /// Managed memory shared with the device: the host arena's block at `arena_offset`,
    /// mapped here at the allocation's address and in the worker as its memory (nothing
    /// moves; see the module's documentation).
    SharedManaged { arena_offset: u64 },
    /// Physical memory mapped with `cuMemMap`: unmapped, never freed with `cuMemFree`.
    Mapped,
    /// A module's global variable (`cuModuleGetGlobal`): placed by the module's load.
    Global { module: u64 },
    /// Another process's memory opened with `cuIpcOpenMemHandle` (`crate::ipc`): closed with
    /// `cuIpcCloseMemHandle`, never freed with `cuMemFree`; or imported from another
    /// process's pool (`cuMemPoolImportPointer`, `pool` the imported pool): closed by
    /// `cuMemFree`/`cuMemFreeAsync`, as CUDA has such pointers freed.
    Opened { pool: Option<u64> },
}

/// A device allocation the client made.
#[derive(Debug, Clone, Copy)]
pub struct Allocation {
    pub size: u64,
    pub device: u32,
    pub kind: MemoryKind,
    /// When the server placed it, among everything that takes device address space
    /// (allocations and module loads): a reconnected session places them again in this order.
    pub(crate) order: u64,
}

impl Allocation {
    /// Managed memory of either kind (moved or shared).
    pub fn is_managed(&self) -> bool {
        matches!(
            self.kind,
            MemoryKind::Managed { .. } | MemoryKind::SharedManaged { .. }
        )
    }

    /// Managed memory whose contents move between host and device.
    pub fn is_moved_managed(&self) -> bool {
        matches!(self.kind, MemoryKind::Managed { .. })
    }

    /// Managed memory shared with the device.
    pub fn is_shared_managed(&self) -> bool {
        matches!(self.kind, MemoryKind::SharedManaged { .. })
    }

    pub fn is_mapped(&self) -> bool {
        self.kind == MemoryKind::Mapped
    }

    /// The pool it came from, if stream-ordered.
    pub fn pool(&self) -> Option<u64> {
        match self.kind {
            MemoryKind::Pooled { pool } => Some(pool),
            _ => None,
        }
    }

    /// The address the server knows this allocation by, given the one the client hands out.
    pub(crate) fn server_ptr(&self, ptr: u64) -> u64 {
        match self.kind {
            MemoryKind::Managed { offset } => ptr - offset,
            _ => ptr,
        }
    }
}

pub(crate) fn page() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
}

pub(crate) fn page_len(size: u64) -> usize {
    size.div_ceil(page()).saturating_mul(page()) as usize
}

/// Maps `size` bytes at exactly `addr` in this process, or fails without touching anything
/// already mapped there: anonymous private memory, or (`shared`) `fd` from `offset`, shared
/// with every other mapping of it (the worker's).
fn map_fixed(addr: u64, size: u64, shared: Option<(std::os::fd::BorrowedFd<'_>, u64)>) -> bool {
    use std::os::fd::AsRawFd;
    let len = page_len(size);
    let (flags, fd, off) = match shared {
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0),
        Some((fd, offset)) => {
            let Ok(off) = libc::off_t::try_from(offset) else {
                return false;
            };
            (libc::MAP_SHARED, fd.as_raw_fd(), off)
        }
    };
    // SAFETY: a mapping with MAP_FIXED_NOREPLACE never replaces an existing mapping; the
    // result is checked before the memory is used.
    let got = unsafe {
        libc::mmap(
            addr as usize as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED_NOREPLACE,
            fd,
            off,
        )
    };
    if got == libc::MAP_FAILED {
        return false;
    }
    if got as usize as u64 != addr {
        // A kernel without MAP_FIXED_NOREPLACE placed it elsewhere.
        // SAFETY: `got` is the mapping just made, of `len` bytes.
        unsafe { libc::munmap(got, len) };
        return false;
    }
    true
}

/// Removes the host mapping of a managed allocation.
fn unmap(addr: u64, size: u64) {
    // SAFETY: the range is the mapping `map_fixed` made for this allocation, which the session
    // no longer hands out.
    unsafe { libc::munmap(addr as usize as *mut libc::c_void, page_len(size)) };
}

impl Inner {
    /// The allocation containing `[ptr, ptr+len)`, as (base, allocation).
    pub fn find_allocation(&self, ptr: u64, len: u64) -> Option<(u64, Allocation)> {
        let (&base, &a) = self.allocations.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len)?;
        (end <= base + a.size.max(1) && ptr < base + a.size.max(1)).then_some((base, a))
    }

    /// Checks that `[ptr, ptr+len)` lies in one of the session's allocations, or in mappings
    /// (`cuMemMap`) that follow each other without a gap, as PyTorch's expandable segments
    /// place tensors across them (an empty range always does).
    pub fn check_device_range(&self, ptr: u64, len: u64) -> Result<(), ClientError> {
        if len == 0 || self.find_allocation(ptr, len).is_some() || self.in_mappings(ptr, len) {
            Ok(())
        } else {
            Err(INVALID_VALUE.into())
        }
    }

    /// Whether `[ptr, ptr+len)` is covered by adjacent mappings, each starting where the last
    /// ended.
    fn in_mappings(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let Some((&base, a)) = self.allocations.range(..=ptr).next_back() else {
            return false;
        };
        if !a.is_mapped() || ptr >= base + a.size {
            return false;
        }
        let mut covered = base + a.size;
        while covered < end {
            match self.allocations.get(&covered) {
                Some(next) if next.is_mapped() && next.size > 0 => covered += next.size,
                _ => return false,
            }
        }
        true
    }

    /// The allocation that starts at `ptr`.
    pub fn allocation(&self, ptr: u64) -> Option<&Allocation> {
        self.allocations.get(&ptr)
    }

    /// Allocates `size` bytes on the current context's device.
    pub fn alloc(&mut self, size: u64) -> Result<u64, ClientError> {
        if size == 0 {
            return Err(INVALID_VALUE.into());
        }
        let (_, device) = self.current()?;
        let ReplyBody::Ptr(DevicePtr(p)) = self.conn.call(&Request::MemAlloc { device, size })?
        else {
            return Err(UNKNOWN.into());
        };
        self.note_placed(p, size, device, MemoryKind::Device);
        Ok(p)
    }

    /// The next placement's place in the order the server saw them.
    pub(crate) fn next_order(&mut self) -> u64 {
        self.placements += 1;
        self.placements
    }

    /// Records memory the server just placed at `ptr` (the next placement in order).
    pub(crate) fn note_placed(&mut self, ptr: u64, size: u64, device: u32, kind: MemoryKind) {
        let order = self.next_order();
        self.allocations.insert(
            ptr,
            Allocation {
                size,
                device,
                kind,
                order,
            },
        );
    }

    /// Allocates `height` rows of `width` bytes on the current device: (pointer, pitch).
    pub fn alloc_pitch(
        &mut self,
        width: u64,
        height: u64,
        elem_size: u32,
    ) -> Result<(u64, u64), ClientError> {
        if width == 0 || height == 0 || !matches!(elem_size, 4 | 8 | 16) {
            return Err(INVALID_VALUE.into());
        }
        let (_, device) = self.current()?;
        let req = Request::MemAllocPitch {
            device,
            width,
            height,
            elem_size,
        };
        let ReplyBody::Pitch {
            ptr: DevicePtr(ptr),
            pitch,
        } = self.conn.call(&req)?
        else {
            return Err(UNKNOWN.into());
        };
        self.note_placed(
            ptr,
            pitch.saturating_mul(height),
            device,
            MemoryKind::Device,
        );
        Ok((ptr, pitch))
    }

    /// A device allocation of `size` bytes with host pages at the same address, moved like
    /// managed memory (managed memory, and mapped pinned memory: `CU_MEMHOSTALLOC_DEVICEMAP`).
    pub fn alloc_managed(&mut self, size: u64) -> Result<u64, ClientError> {
        if size == 0 {
            return Err(INVALID_VALUE.into());
        }
        let (_, device) = self.current()?;
        if self.shares_managed(device) {
            if let Some(p) = self.alloc_shared_managed(device, size)? {
                return Ok(p);
            }
        }
        // Host pages must start at the device address: the server's allocation gets a page
        // more, and the managed pointer is its first page boundary (what the slice is charged
        // for includes that page and the rounding up to whole pages).
        let server_size = (page_len(size) as u64)
            .checked_add(page())
            .ok_or(ClientError::Cuda(OUT_OF_MEMORY))?;
        let ReplyBody::Ptr(DevicePtr(base)) = self.conn.call(&Request::MemAlloc {
            device,
            size: server_size,
        })?
        else {
            return Err(UNKNOWN.into());
        };
        let p = base.div_ceil(page()) * page();
        if !map_fixed(p, size, None) {
            self.conn.quiet(&Request::MemFree {
                ptr: DevicePtr(base),
            })?;
            return Err(OUT_OF_MEMORY.into());
        }
        // The new device memory must not be overwritten by a stale host copy, nor the zeroed
        // host copy by the device's: both are zero, and the next device work copies the
        // host's over.
        let order = self.next_order();
        self.allocations.insert(
            p,
            Allocation {
                size,
                device,
                kind: MemoryKind::Managed { offset: p - base },
                order,
            },
        );
        self.managed_count += 1;
        self.managed_on_device = false;
        self.lanes_changed();
        Ok(p)
    }

    /// Whether managed memory on `device` is shared with it (the session's devices that
    /// report `CONCURRENT_MANAGED_ACCESS` 1), and the connection still has a host arena.
    pub fn shares_managed(&self, device: u32) -> bool {
        self.shared_managed
            .get(device as usize)
            .copied()
            .unwrap_or(false)
            && self.conn.host_arena().is_some()
    }

    /// Managed memory shared with the device: a block of the host arena that the worker makes
    /// an allocation of (`MemAllocShared`) and this process maps at its address. `None` when
    /// the device keeps its memory elsewhere (it refuses with `CUDA_ERROR_NOT_SUPPORTED`): the
    /// caller then makes moved managed memory. A full arena (`GPUFUSE_PINNED_ARENA`, which
    /// pinned memory shares) is `CUDA_ERROR_OUT_OF_MEMORY`.
    fn alloc_shared_managed(&mut self, device: u32, size: u64) -> Result<Option<u64>, ClientError> {
        let Some(arena) = self.conn.host_arena().cloned() else {
            return Ok(None);
        };
        let len = page_len(size);
        // Out of arena room is out of memory: moved managed memory instead would break the
        // concurrent access the device reports.
        let block = arena.alloc(len).ok_or(ClientError::Cuda(OUT_OF_MEMORY))?;
        let offset = block as usize as u64 - arena.base() as usize as u64;
        let req = Request::MemAllocShared {
            device,
            size,
            offset,
        };
        let p = match self.conn.call(&req) {
            Ok(ReplyBody::Ptr(DevicePtr(p))) => p,
            Ok(_) => {
                arena.free(block, len);
                return Err(UNKNOWN.into());
            }
            Err(ClientError::Cuda(NOT_SUPPORTED)) => {
                arena.free(block, len);
                return Ok(None);
            }
            Err(e) => {
                arena.free(block, len);
                return Err(e);
            }
        };
        if !p.is_multiple_of(page()) || !map_fixed(p, size, Some((arena.fd(), offset))) {
            self.conn.quiet(&Request::MemFree { ptr: DevicePtr(p) })?;
            self.conn.call(&Request::Ping)?;
            arena.free(block, len);
            return Err(OUT_OF_MEMORY.into());
        }
        let order = self.next_order();
        self.allocations.insert(
            p,
            Allocation {
                size,
                device,
                kind: MemoryKind::SharedManaged {
                    arena_offset: offset,
                },
                order,
            },
        );
        self.shared_count += 1;
        self.lanes_changed();
        Ok(Some(p))
    }

    /// Gives back what a shared managed allocation at `p` held: its mapping here, then (once
    /// the worker has freed it, so no device work can touch it) its arena block.
    fn release_shared_managed(&mut self, p: u64, a: &Allocation) -> Result<(), ClientError> {
        let MemoryKind::SharedManaged { arena_offset } = a.kind else {
            return Ok(());
        };
        unmap(p, a.size);
        self.conn.quiet(&Request::MemFree { ptr: DevicePtr(p) })?;
        // The worker runs the session's work in order: once this answers, the free is done.
        self.conn.call(&Request::Ping)?;
        if let Some(arena) = self.conn.host_arena() {
            if let Some(block) = arena.checked(arena_offset, page_len(a.size) as u64) {
                arena.free(block, page_len(a.size));
            }
        }
        Ok(())
    }

    /// Records memory the server placed without an allocation of ours: module `module`'s
    /// global (kept if already known).
    pub(crate) fn note_global(&mut self, ptr: u64, size: u64, device: u32, module: u64) {
        let order = self.modules.get(&module).map_or(0, |m| m.order);
        self.allocations.entry(ptr).or_insert(Allocation {
            size,
            device,
            kind: MemoryKind::Global { module },
            order,
        });
    }

    /// Records physical memory mapped at `ptr` (`cuMemMap`).
    pub fn note_mapping(&mut self, ptr: u64, size: u64, device: u32) {
        self.allocations.insert(
            ptr,
            Allocation {
                size,
                device,
                kind: MemoryKind::Mapped,
                order: 0,
            },
        );
    }

    /// Forgets a mapping recorded with [`Inner::note_mapping`].
    pub fn forget_mapping(&mut self, ptr: u64) -> Option<Allocation> {
        match self.allocations.get(&ptr) {
            Some(a) if a.is_mapped() => self.allocations.remove(&ptr),
            _ => None,
        }
    }

    /// Frees the allocation at `ptr` (`cuMemFree`; NULL does nothing, as the driver does). A
    /// graph's allocation that a launch made live ends its life, as `cuMemFreeAsync` outside
    /// the graph does (NVIDIA's graphMemoryNodes sample frees it so); its memory stays reserved
    /// for the graph, freed with it. Mapped memory is freed only by unmapping.
    pub fn free(&mut self, ptr: u64) -> Result<(), ClientError> {
        if ptr == 0 {
            return Ok(());
        }
        if let Some(a) = self.graphs.allocations.get_mut(&ptr) {
            if !a.live {
                return Err(INVALID_VALUE.into());
            }
            a.live = false;
            return Ok(());
        }
        match self.allocations.get(&ptr) {
            Some(a) if matches!(a.kind, MemoryKind::Opened { pool: Some(_) }) => {
                return self.close_opened(ptr);
            }
            Some(a)
                if !a.is_mapped()
                    && !matches!(a.kind, MemoryKind::Opened { .. })
                    && !self.graphs.allocations.contains_key(&ptr) => {}
            _ => return Err(INVALID_VALUE.into()),
        }
        let a = self.allocations.remove(&ptr).ok_or(INVALID_VALUE)?;
        if self.ipc_exports.remove(&ptr) {
            // Other processes may open its handle: once this returns, they must find it gone
            // (the worker has freed it when it answers the ping).
            self.conn.quiet(&Request::MemFree {
                ptr: DevicePtr(ptr),
            })?;
            return self.conn.call(&Request::Ping).map(drop);
        }
        if a.is_shared_managed() {
            self.shared_count -= 1;
            self.lanes_changed();
            return self.release_shared_managed(ptr, &a);
        }
        if a.is_moved_managed() {
            unmap(ptr, a.size);
            self.managed_count -= 1;
        }
        if let Some(pool) = a.pool().and_then(|h| self.pools.get_mut(&h)) {
            pool.used = pool.used.saturating_sub(a.size);
        }
        self.conn.quiet(&Request::MemFree {
            ptr: DevicePtr(a.server_ptr(ptr)),
        })
    }

    /// Whether `[ptr, ptr+len)` lies in one managed allocation.
    pub fn is_managed_range(&self, ptr: u64, len: u64) -> bool {
        self.find_allocation(ptr, len)
            .is_some_and(|(_, a)| a.is_managed())
    }

    /// Forgets every allocation on `device` (after a device reset freed them on the server),
    /// and what lived in them.
    pub(crate) fn forget_device_memory(&mut self, device: u32) {
        for (&p, a) in self
            .allocations
            .iter()
            .filter(|(_, a)| a.device == device && a.is_managed())
        {
            unmap(p, a.size);
            // The reset freed the worker's allocation first: the arena block is free to reuse.
            if let (MemoryKind::SharedManaged { arena_offset }, Some(arena)) =
                (a.kind, self.conn.host_arena())
            {
                if let Some(block) = arena.checked(arena_offset, page_len(a.size) as u64) {
                    arena.free(block, page_len(a.size));
                }
            }
        }
        self.allocations.retain(|_, a| a.device != device);
        let allocations = &self.allocations;
        self.ipc_exports.retain(|p| allocations.contains_key(p));
        self.ipc_opened.retain(|p, _| allocations.contains_key(p));
        self.managed_count = self
            .allocations
            .values()
            .filter(|a| a.is_moved_managed())
            .count();
        self.shared_count = self
            .allocations
            .values()
            .filter(|a| a.is_shared_managed())
            .count();
        self.physical.retain(|_, (_, dev, _)| *dev != device);
        let allocations = &self.allocations;
        self.mappings.retain(|p, _| allocations.contains_key(p));
        self.arrays.retain(|_, a| allocations.contains_key(&a.ptr));
        self.textures.retain(|_, t| {
            allocations
                .range(..=t.ptr)
                .next_back()
                .is_some_and(|(&base, a)| t.ptr < base + a.size.max(1))
        });
    }

    /// Managed memory that moves (shared managed memory never does).
    fn managed_ranges(&self) -> Vec<(u64, u64)> {
        self.allocations
            .iter()
            .filter(|(_, a)| a.is_moved_managed())
            .map(|(&p, a)| (p, a.size))
            .collect()
    }

    /// Before device work: the device gets the host's copy of managed memory, if the host had
    /// it. Called only from the device-work entry points in `work.rs`.
    pub(crate) fn managed_to_device(&mut self) -> Result<(), ClientError> {
        if self.managed_on_device || self.managed_count == 0 {
            return Ok(());
        }
        self.managed_on_device = true;
        for (p, size) in self.managed_ranges() {
            // SAFETY: `[p, p+size)` is this allocation's host mapping (`map_fixed`), alive until
            // the allocation is freed, which needs the session lock held here.
            let host =
                unsafe { std::slice::from_raw_parts(p as usize as *const u8, size as usize) };
            for (i, chunk) in host.chunks(MAX_COPY_CHUNK).enumerate() {
                let req = Request::MemcpyHtoD {
                    dst: DevicePtr(p + (i * MAX_COPY_CHUNK) as u64),
                    stream: StreamHandle(0),
                    data: chunk,
                };
                self.conn.quiet(&req)?;
            }
        }
        Ok(())
    }

    /// After a synchronizing call: the host gets the device's copy back, if device work ran.
    pub(crate) fn managed_to_host(&mut self) -> Result<(), ClientError> {
        if !self.managed_on_device || self.managed_count == 0 {
            return Ok(());
        }
        self.managed_on_device = false;
        for (p, size) in self.managed_ranges() {
            // SAFETY: as in `managed_to_device`; the host does not touch managed memory while
            // device work is outstanding (CONCURRENT_MANAGED_ACCESS is 0), and this runs after
            // a synchronize.
            let host =
                unsafe { std::slice::from_raw_parts_mut(p as usize as *mut u8, size as usize) };
            self.read_device(p, host)?;
        }
        Ok(())
    }

    /// Reads `dst.len()` bytes of device memory at `src` on the default stream, in frame-sized
    /// parts, with nothing else around it (no managed hand-over, no asynchronous error).
    pub(crate) fn read_device(&mut self, src: u64, dst: &mut [u8]) -> Result<(), ClientError> {
        for (i, chunk) in dst.chunks_mut(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyDtoH {
                src: DevicePtr(src + (i * MAX_COPY_CHUNK) as u64),
                size: chunk.len() as u64,
                stream: StreamHandle(0),
            };
            self.conn.call_read_into(&req, chunk)?;
        }
        Ok(())
    }
}
