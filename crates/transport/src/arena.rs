//! The host arena: page-locked host memory of a local client that its worker maps too, so a
//! copy between it and the device is one `memcpy` in the worker and no bytes on any transport.
//!
//! - **What it is.** A sealed `memfd` (it can neither shrink nor grow, so neither side ever
//!   touches a page that went away) of a large, sparse size ([`default_size`]): pages exist only
//!   once touched. The client creates it with its rings ([`crate::shm`]) and sends its
//!   descriptor as the sixth one of `ShmAttach`; the worker checks and maps it
//!   ([`HostArena::adopt`]). Only sessions on the shared-memory transport have one: over a
//!   socket or TCP, pinned memory is ordinary host memory of the client.
//! - **Who allocates.** The client: `cuMemHostAlloc` carves page-rounded blocks from it
//!   ([`HostArena::alloc`], first fit over a free list of page ranges) and `cuMemFreeHost`
//!   gives them back ([`HostArena::free`]), punching a hole so the pages go back to the system
//!   and a later block starts zeroed. A request that does not fit falls back to the process's
//!   heap (and then travels through the rings as before).
//! - **What crosses.** Copy requests name an offset and a length in the arena
//!   (`MemcpyHtoDHost`, `MemcpyDtoHHost`). The worker trusts nothing of it: it checks each
//!   range against the arena's size ([`HostArena::checked`]) and copies with raw pointers, never
//!   through a reference, since the client may write the same bytes at the same time (which
//!   can garble only that client's own data, as a client writing its own buffer during an
//!   asynchronous copy does on a real GPU).
//!
//! - **Page-locked by the GPU.** A worker on a real GPU registers the arena ranges large copies
//!   use with NVIDIA's driver (`cuMemHostRegister`), so those copies are DMA. A registration
//!   holds the physical pages it found, so a page must never leave the arena while registered
//!   (a punched hole would give the worker's mapping a fresh page the GPU never sees). The
//!   arena's first pages are therefore a *pin map* ([`HostArena::pin_map`]): a magic, then one
//!   byte per [`PIN_CHUNK`] of the arena, which the worker sets *before* it registers anything
//!   in that chunk. [`HostArena::free`] punches only chunks whose byte is clear and zeroes the
//!   rest in place: a block is freed only once no copy of it is queued (the client asks the
//!   worker first), so a chunk the worker starts pinning after the client read its byte holds
//!   none of the freed block's pages (registrations cover the copied pages only). A worker that
//!   finds no magic (an older client) registers nothing.
//!
//! Hand-written because the few lines of first-fit allocation are all it needs: an allocator
//! crate (range-alloc, offset-allocator) would bring its own size classes for what is a list of
//! page ranges. The system calls go through rustix (memfd, seals, fallocate) and the mapping
//! through memmap2.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};

/// Blocks are whole pages.
pub const PAGE: usize = 4096;
/// The largest arena a worker maps.
pub const MAX_ARENA: u64 = 1 << 40;
/// The pin map's granularity: one byte for each of these of the arena.
pub const PIN_CHUNK: usize = 2 << 20;
/// The pin map's first bytes, written by the client that made the arena.
const PIN_MAGIC: &[u8; 16] = b"gpufuse-pinmap-1";

/// The bytes at the arena's start that hold the pin map (whole pages): never handed out.
fn pin_header(len: usize) -> usize {
    (PIN_MAGIC.len() + len.div_ceil(PIN_CHUNK)).next_multiple_of(PAGE)
}

/// The arena a client reserves: `GPUFUSE_PINNED_ARENA` (bytes, or with a `K`, `M`, `G` suffix;
/// `0` turns the arena off), 32 GiB by default. Only touched pages cost memory.
pub fn default_size() -> usize {
    std::env::var("GPUFUSE_PINNED_ARENA")
        .ok()
        .and_then(|v| parse_size(&v))
        .unwrap_or(32 << 30)
        .min(MAX_ARENA as usize)
        / PAGE
        * PAGE
}

fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (num, shift) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 10),
        b'm' | b'M' => (&v[..v.len() - 1], 20),
        b'g' | b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    num.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// A host arena, mapped in this process.
#[derive(Debug)]
pub struct HostArena {
    map: memmap2::MmapRaw,
    memfd: OwnedFd,
    len: usize,
    /// Free page ranges (offset -> length), for the client's allocations.
    free: Mutex<BTreeMap<usize, usize>>,
    /// Set when a quiet copy that reads the arena may still be on its way to the worker: a
    /// block freed then must first be known read ([`HostArena::reads_queued`]).
    reads_queued: AtomicBool,
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl HostArena {
    /// A new arena of `len` bytes (a whole number of pages, at most [`MAX_ARENA`]), all free.
    pub fn create(len: usize) -> io::Result<Self> {
        Self::create_named("gpufuse-pinned", len)
    }

    /// As [`HostArena::create`], its memfd named `name` (what `/proc/PID/fd` shows as
    /// `/memfd:NAME`).
    pub fn create_named(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 || !len.is_multiple_of(PAGE) || len as u64 > MAX_ARENA {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a host arena of {len} bytes: expected whole pages, at most 1 TiB"),
            ));
        }
        let memfd =
            rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&memfd, len as u64)?;
        rustix::fs::fcntl_add_seals(
            &memfd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(&memfd)?;
        let header = pin_header(len);
        let free = match len > header {
            true => BTreeMap::from([(header, len - header)]),
            false => BTreeMap::new(),
        };
        let arena = Self {
            map,
            memfd,
            len,
            free: Mutex::new(free),
            reads_queued: AtomicBool::new(false),
        };
        arena.write(0, PIN_MAGIC);
        Ok(arena)
    }

    /// Checks and maps an arena a client sent: a memfd sealed against shrinking and growing,
    /// of whole pages, at most [`MAX_ARENA`] bytes. Anything else is an error naming it.
    pub fn adopt(memfd: OwnedFd) -> io::Result<Self> {
        let seals = rustix::fs::fcntl_get_seals(&memfd)
            .map_err(|e| invalid(format!("the host arena is not a sealed memfd: {e}")))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(invalid(
                "the host arena is not sealed against shrinking and growing",
            ));
        }
        let len = rustix::fs::fstat(&memfd)?.st_size;
        if len <= 0 || len as u64 > MAX_ARENA || !(len as u64).is_multiple_of(PAGE as u64) {
            return Err(invalid(format!(
                "a host arena of {len} bytes: expected whole pages, at most 1 TiB"
            )));
        }
        let len = len as usize;
        let map = memmap2::MmapOptions::new().len(len).map_raw(&memfd)?;
        Ok(Self {
            map,
            memfd,
            len,
            free: Mutex::new(BTreeMap::new()),
            reads_queued: AtomicBool::new(false),
        })
    }

    /// The descriptor to send to the worker.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The arena's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the arena starts in this process.
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// A block of at least `size` bytes (whole pages, zeroed), or `None` when no free range
    /// is large enough.
    pub fn alloc(&self, size: usize) -> Option<*mut u8> {
        let size = size.max(1).checked_next_multiple_of(PAGE)?;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let (&off, &len) = free.iter().find(|(_, &len)| len >= size)?;
        free.remove(&off);
        if len > size {
            free.insert(off + size, len - size);
        }
        // SAFETY: `off + size <= len` of a range inside the mapping.
        Some(unsafe { self.base().add(off) })
    }

    /// Gives back the block at `p` of `size` bytes (what [`HostArena::alloc`] was asked for):
    /// its pages go back to the system, so the next block there starts zeroed. `false` when
    /// `p` is not the start of a block inside the arena.
    pub fn free(&self, p: *mut u8, size: usize) -> bool {
        let Some(off) = (p as usize).checked_sub(self.base() as usize) else {
            return false;
        };
        let Some(size) = size.max(1).checked_next_multiple_of(PAGE) else {
            return false;
        };
        if !off.is_multiple_of(PAGE)
            || off < pin_header(self.len)
            || off.checked_add(size).is_none_or(|e| e > self.len)
        {
            return false;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let prev = free.range(..off).next_back().map(|(&o, &l)| (o, l));
        let next = free.range(off..).next().map(|(&o, &l)| (o, l));
        if prev.is_some_and(|(o, l)| o + l > off) || next.is_some_and(|(o, _)| o < off + size) {
            return false; // overlaps a free range: not a live block
        }
        self.release(off, size);
        let (mut start, mut len) = (off, size);
        if let Some((o, l)) = prev.filter(|(o, l)| o + l == off) {
            free.remove(&o);
            start = o;
            len += l;
        }
        if let Some((o, l)) = next.filter(|(o, _)| *o == off + size) {
            free.remove(&o);
            len += l;
        }
        free.insert(start, len);
        true
    }

    /// Zeroes `[off, off + size)` (whole pages of a freed block): chunks the worker may have
    /// page-locked keep their pages, zeroed in place; the others' pages go back to the system
    /// (a punched hole reads as zeros). A failed punch only keeps the pages.
    fn release(&self, off: usize, size: usize) {
        let mut at = off;
        while at < off + size {
            let chunk = at / PIN_CHUNK;
            let end = ((chunk + 1) * PIN_CHUNK).min(off + size);
            let mut pinned = [0u8];
            self.read((PIN_MAGIC.len() + chunk) as u64, &mut pinned);
            if pinned[0] != 0 {
                // SAFETY: `[at, end)` lies inside the mapping (checked by `free`), in a block
                // nobody uses any more.
                unsafe { std::ptr::write_bytes(self.base().add(at), 0, end - at) };
            } else {
                let _ = rustix::fs::fallocate(
                    &self.memfd,
                    FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                    at as u64,
                    (end - at) as u64,
                );
            }
            at = end;
        }
    }

    /// For the worker: the pin map's bytes (one per [`PIN_CHUNK`], from the arena's start),
    /// as (address in this process, length), when the client that made the arena keeps one.
    pub fn pin_map(&self) -> Option<(*mut u8, usize)> {
        let mut magic = [0u8; 16];
        if !self.read(0, &mut magic) || &magic != PIN_MAGIC {
            return None;
        }
        let chunks = self.len.div_ceil(PIN_CHUNK);
        if PIN_MAGIC.len() + chunks > pin_header(self.len) {
            return None;
        }
        Some((self.checked(PIN_MAGIC.len() as u64, chunks as u64)?, chunks))
    }

    /// The arena offset of `[p, p+len)` when all of it lies inside the arena.
    pub fn offset_of(&self, p: usize, len: usize) -> Option<u64> {
        let off = p.checked_sub(self.base() as usize)?;
        (off.checked_add(len)? <= self.len).then_some(off as u64)
    }

    /// The arena's bytes `[offset, offset+len)` in this process, when the range lies inside it
    /// (both come from the peer: checked, overflow included).
    pub fn checked(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: `offset + len <= self.len`, inside the mapping.
        Some(unsafe { self.base().add(offset as usize) })
    }

    /// Copies `dst.len()` bytes of the arena from `offset` into `dst`; `false` (nothing
    /// copied) when the range is not inside the arena.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        let Some(src) = self.checked(offset, dst.len() as u64) else {
            return false;
        };
        // SAFETY: `src..src+len` is inside the live mapping (checked) and `dst` is memory of
        // this process the peer cannot see, so the ranges do not overlap. The peer may write
        // the source at the same time, which can change the bytes copied, not the copy.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` into the arena at `offset`; `false` (nothing copied) when the range is not
    /// inside the arena.
    pub fn write(&self, offset: u64, src: &[u8]) -> bool {
        let Some(dst) = self.checked(offset, src.len() as u64) else {
            return false;
        };
        // SAFETY: as in `read`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// Marks (or, once the worker has answered a later call, clears) that a quiet copy
    /// reading the arena may still be queued; returns what it was.
    pub fn reads_queued(&self, queued: bool) -> bool {
        self.reads_queued.swap(queued, Ordering::AcqRel)
    }

    /// Bytes handed out and not given back (the pin map is not counted).
    pub fn in_use(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let header = pin_header(self.len).min(self.len);
        self.len - header - free.values().sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_carved_given_back_and_merged() {
        let a = HostArena::create(17 * PAGE).unwrap();
        let p = a.alloc(1).unwrap();
        let q = a.alloc(PAGE + 1).unwrap();
        assert_eq!(q as usize - p as usize, PAGE);
        assert_eq!(a.in_use(), 3 * PAGE);
        // SAFETY: p is a fresh block of a page.
        unsafe { p.write(7) };
        assert!(a.free(p, 1));
        assert!(!a.free(p, 1), "a block is given back once");
        assert!(a.free(q, PAGE + 1));
        assert_eq!(a.in_use(), 0);
        let whole = a.alloc(16 * PAGE).expect("the ranges merged again");
        assert_eq!(
            a.offset_of(whole as usize, 1),
            Some(PAGE as u64),
            "after the pin map"
        );
        // SAFETY: the block covers the arena; its first page was punched.
        assert_eq!(unsafe { whole.read() }, 0, "a reused block starts zeroed");
        assert!(a.alloc(1).is_none());
    }

    /// A chunk the worker marked keeps its pages when a block in it is freed (zeroed in
    /// place), so a registration of them stays the arena's; unmarked chunks are punched. The
    /// worker sees the map only in an arena that has one.
    #[test]
    fn pinned_chunks_keep_their_pages_and_the_rest_go_back() {
        let len = 3 * PIN_CHUNK;
        let a = HostArena::create(len).unwrap();
        let (map, chunks) = a.pin_map().expect("a client's arena has a pin map");
        assert_eq!(chunks, 3);
        let worker = HostArena::adopt(a.fd().try_clone_to_owned().unwrap()).unwrap();
        let (wmap, _) = worker.pin_map().expect("the worker finds it");
        // The worker marks chunk 1 (as before it registers pages there).
        // SAFETY: `wmap` is the map's first of `chunks` bytes in the worker's mapping.
        unsafe { wmap.add(1).write(1) };
        // SAFETY: the client's mapping of the same byte.
        assert_eq!(unsafe { map.add(1).read() }, 1);
        let block = a.alloc(len - 2 * PAGE).unwrap();
        let off = a.offset_of(block as usize, 1).unwrap() as usize;
        let in_pinned = PIN_CHUNK + 5 * PAGE - off;
        // SAFETY: inside the fresh block.
        unsafe {
            block.write(9);
            block.add(in_pinned).write(7);
        }
        let resident = |a: &HostArena, at: usize| {
            let mut v = [0u8; 1];
            // SAFETY: mincore over one page of the live mapping.
            let r = unsafe {
                libc::mincore(a.base().add(at & !(PAGE - 1)).cast(), PAGE, v.as_mut_ptr())
            };
            r == 0 && v[0] & 1 == 1
        };
        assert!(a.free(block, len - 2 * PAGE));
        // SAFETY: reads inside the mapping.
        unsafe {
            assert_eq!(block.read(), 0);
            assert_eq!(block.add(in_pinned).read(), 0, "zeroed in place");
        }
        assert!(
            resident(&a, off + in_pinned),
            "a marked chunk keeps its page"
        );
        let b = a.alloc(PAGE).unwrap();
        assert_eq!(b, block);
        let old = HostArena::adopt(
            rustix::fs::memfd_create("old", MemfdFlags::ALLOW_SEALING)
                .and_then(|fd| {
                    rustix::fs::ftruncate(&fd, PAGE as u64)?;
                    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
                    Ok(fd)
                })
                .unwrap(),
        )
        .unwrap();
        assert!(
            old.pin_map().is_none(),
            "no magic, no map: nothing is pinned"
        );
    }

    #[test]
    fn ranges_from_the_peer_are_checked() {
        let a = HostArena::create(4 * PAGE).unwrap();
        assert!(a.checked(0, 4 * PAGE as u64).is_some());
        assert!(a.checked(1, 4 * PAGE as u64).is_none());
        assert!(a.checked(u64::MAX, 2).is_none());
        let mut buf = [0u8; 8];
        assert!(!a.read(4 * PAGE as u64 - 4, &mut buf));
        assert!(a.write(8, b"abcdefgh"));
        assert!(a.read(8, &mut buf));
        assert_eq!(&buf, b"abcdefgh");
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("x"), None);
    }
}
