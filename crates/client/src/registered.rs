//! `cuMemHostRegister`ed memory without copies on the shared-memory transport: the
//! registration's page-aligned interior is moved into the session's host arena *in place*.
//!
//! - **How.** On registration, arena space the size of the interior is carved
//!   ([`HostArena::alloc`]), the interior's current bytes are copied into it through a second
//!   mapping of those arena pages, and that mapping is moved over the interior
//!   (`mremap(MREMAP_FIXED)`, which replaces what was there in one step). The application's
//!   pointers now reach memory the worker maps too, so copies naming it become
//!   `MemcpyHtoDHost`/`MemcpyDtoHHost` at an arena offset and move no bytes through the
//!   rings; the unaligned head and tail (less than a page each) stay the application's own
//!   pages and travel as pageable memory's bytes do ([`Aliases::span`] splits a copy).
//! - **Back.** On unregistration, and when the session's state goes away in this process, the
//!   interior becomes private anonymous memory again with its current bytes (a fresh private
//!   mapping is filled and moved over it the same way), and the arena space is given back.
//!   In a forked child a `pthread_atfork` handler does the same for every alias at once
//!   (the child must not share the parent's pages, as it would through a shared mapping):
//!   only system calls and a copy, no lock and no allocation, reading a fixed table of
//!   [`MAX_ALIASES`] slots.
//! - **When not.** Registration never fails because of this: the memory keeps the transport
//!   path when the session has no arena (a socket or TCP session), the arena has no room,
//!   every slot is taken, the flags ask for I/O memory, the interior is empty (less than a
//!   page), or the interior is anything but private anonymous read-write memory
//!   (`/proc/self/maps`: a file mapping, a read-only page (a `READ_ONLY` registration of
//!   constant data), the stack, or shared memory keep their own semantics).
//! - **Lifetime.** An alias holds its arena ([`Arc`]), so the arena stays mapped while any
//!   alias lives, across reconnects; a copy uses the alias only while the connection's arena is
//!   the alias's (a session moved to another node on this host keeps its arena, so offsets
//!   stay valid; a new arena after a reconnect sends the bytes instead).
//! - **Limits.** The application must not write the memory from another thread while it is
//!   being registered or unregistered (bytes written between the copy and the switch would be
//!   lost), and must unregister before it frees the memory, as CUDA requires.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};

use gpufuse_transport::arena::{HostArena, PAGE};

/// `CU_MEMHOSTREGISTER_IOMEMORY`: the range is a device's I/O memory, never moved.
const REGISTER_IOMEMORY: u32 = 0x04;

/// How many registrations may be aliased into an arena at once (the fork handler's table).
pub const MAX_ALIASES: usize = 256;

/// A registration's interior as the fork handler sees it; `len` 0 is a free slot.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
}

/// A slot being filled in (claimed, its start not yet written).
const CLAIMED: usize = usize::MAX;

#[allow(clippy::declare_interior_mutable_const)]
const FREE_SLOT: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
};
static SLOTS: [Slot; MAX_ALIASES] = [FREE_SLOT; MAX_ALIASES];

/// One registration's interior, living in the arena.
#[derive(Debug)]
struct Alias {
    len: usize,
    arena: Arc<HostArena>,
    /// The arena offset of the interior's first byte.
    offset: u64,
    /// The process that made it (a forked child's copy of the table is not its own).
    pid: u32,
    slot: usize,
}

/// Where a host range's bytes are for the worker: `head` bytes of the application's own memory
/// (they travel through the transport), then `mid` bytes in the arena at `offset`, then the
/// rest of the range through the transport again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSpan {
    pub head: usize,
    pub offset: u64,
    pub mid: usize,
}

/// The session's aliased registrations, by interior start.
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    by_start: BTreeMap<usize, Alias>,
}

impl Aliases {
    /// Tries to move the interior of the registration `[p, p+size)` into `arena`; `false`
    /// leaves the memory as it was (see the module documentation for when).
    pub(crate) fn alias(
        &mut self,
        arena: &Arc<HostArena>,
        p: usize,
        size: usize,
        flags: u32,
    ) -> bool {
        if flags & REGISTER_IOMEMORY != 0 {
            return false;
        }
        let Some((start, len)) = interior(p, size) else {
            return false;
        };
        if !private_anonymous_read_write(start, start + len) {
            return false;
        }
        let Some(slot) = claim_slot() else {
            return false;
        };
        let Some(block) = arena.alloc(len) else {
            release_slot(slot);
            return false;
        };
        let Some(offset) = arena.offset_of(block as usize, len) else {
            release_slot(slot);
            return false;
        };
        install_fork_handler();
        // The slot names the range before it is shared: a fork in between restores it
        // (harmlessly: it is still private then).
        SLOTS[slot].start.store(start, Ordering::Release);
        SLOTS[slot].len.store(len, Ordering::Release);
        // SAFETY: `[start, start+len)` is private anonymous read-write memory of this process
        // (checked above) that the application registered, so it is ours to replace while the
        // session lock is held; `offset..offset+len` is a block of the arena nobody else uses.
        let moved = unsafe { move_into_shared(start, len, arena, offset) };
        if !moved {
            SLOTS[slot].len.store(0, Ordering::Release);
            arena.free(block, len);
            return false;
        }
        self.by_start.insert(
            start,
            Alias {
                len,
                arena: arena.clone(),
                offset,
                pid: std::process::id(),
                slot,
            },
        );
        true
    }

    /// Puts private memory back under the alias inside `[p, p+size)`, if there is one, and
    /// gives its arena space back. Copies naming it must have run (the caller's round trip).
    pub(crate) fn restore(&mut self, p: usize, size: usize) {
        let Some((start, _)) = interior(p, size) else {
            return;
        };
        if let Some(alias) = self.by_start.remove(&start) {
            alias.restore(start);
        }
    }

    /// How `[p, p+len)` splits around an alias in `arena` (the connection's arena), when it
    /// overlaps one.
    pub fn span(&self, arena: &Arc<HostArena>, p: usize, len: usize) -> Option<ArenaSpan> {
        let end = p.checked_add(len)?;
        let (&start, alias) = self.by_start.range(..end).next_back()?;
        let mid_start = p.max(start);
        let mid_end = end.min(start + alias.len);
        if mid_end <= mid_start || !Arc::ptr_eq(&alias.arena, arena) {
            return None;
        }
        Some(ArenaSpan {
            head: mid_start - p,
            offset: alias.offset + (mid_start - start) as u64,
            mid: mid_end - mid_start,
        })
    }

    /// Whether any registration is aliased.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

impl Alias {
    fn restore(self, start: usize) {
        SLOTS[self.slot].len.store(0, Ordering::Release);
        if self.pid != std::process::id() {
            // A forked child's copy: the fork handler made the memory private, and the arena's
            // blocks are the parent's to give back.
            return;
        }
        // SAFETY: `[start, start+len)` is the alias this table made and still holds.
        if unsafe { replace_with_private_copy(start, self.len) } {
            let block = self.arena.base().wrapping_add(self.offset as usize);
            self.arena.free(block, self.len);
        }
        // Otherwise the memory stays shared (and the arena block in use): its bytes are intact.
    }
}

impl Drop for Aliases {
    fn drop(&mut self) {
        for (start, alias) in std::mem::take(&mut self.by_start) {
            alias.restore(start);
        }
    }
}

/// The whole pages of `[p, p+size)`: (start, length), `None` when there are none.
fn interior(p: usize, size: usize) -> Option<(usize, usize)> {
    let start = p.checked_next_multiple_of(PAGE)?;
    let end = p.checked_add(size)? / PAGE * PAGE;
    (end > start).then(|| (start, end - start))
}

fn claim_slot() -> Option<usize> {
    SLOTS.iter().position(|s| {
        s.len
            .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

fn release_slot(slot: usize) {
    SLOTS[slot].len.store(0, Ordering::Release);
}

/// Whether every page of `[start, end)` is private anonymous read-write memory of this process
/// (an anonymous mapping or the heap), as `/proc/self/maps` lists it.
fn private_anonymous_read_write(start: usize, end: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    covered_by_private_anonymous(&maps, start, end)
}

/// [`private_anonymous_read_write`] over the text of a `maps` file.
fn covered_by_private_anonymous(maps: &str, start: usize, end: usize) -> bool {
    let mut covered = start;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(_), Some(_), Some(inode)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return false;
        };
        let path = fields.next();
        let Some((lo, hi)) = range.split_once('-') else {
            return false;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            return false;
        };
        if hi <= covered {
            continue;
        }
        if lo > covered {
            return false; // a hole
        }
        if perms != "rw-p" || inode != "0" || !matches!(path, None | Some("[heap]")) {
            return false;
        }
        covered = hi;
        if covered >= end {
            return true;
        }
    }
    false
}

/// Copies `[start, start+len)` into the arena at `offset` and moves that arena mapping over it.
///
/// # Safety
/// `[start, start+len)` must be whole pages of read-write memory of this process that nothing
/// else replaces or unmaps meanwhile (bytes written to it by another thread during the call may
/// be lost), and `offset..offset+len` a range of `arena` that nothing else uses.
unsafe fn move_into_shared(start: usize, len: usize, arena: &HostArena, offset: u64) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file_offset) = libc::off_t::try_from(offset) else {
        return false;
    };
    // SAFETY: a new mapping the kernel places; the memfd is the arena's, open.
    let shared = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            arena.fd().as_raw_fd(),
            file_offset,
        )
    };
    if shared == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the source is `len` readable bytes (the caller's contract); the destination the
    // new mapping of `len` bytes, distinct from it.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, shared.cast::<u8>(), len) };
    // SAFETY: moves the new mapping over the caller's range, which it may replace.
    unsafe { move_over(shared, start, len) }
}

/// Makes `[start, start+len)` private anonymous memory with its current bytes. Only system
/// calls and a copy: safe in a forked child's `atfork` handler.
///
/// # Safety
/// `[start, start+len)` must be whole pages of readable memory of this process that nothing
/// else replaces or unmaps meanwhile.
unsafe fn replace_with_private_copy(start: usize, len: usize) -> bool {
    // SAFETY: a new private anonymous mapping the kernel places.
    let private = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if private == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: as in `move_into_shared`.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, private.cast::<u8>(), len) };
    // SAFETY: the caller's contract.
    unsafe { move_over(private, start, len) }
}

/// Moves the mapping at `from` (`len` bytes, this module's own) to `to`, replacing what was
/// there in one step; on failure `from` is unmapped and `to` left as it was.
///
/// # Safety
/// `from` must be a mapping of `len` bytes that nothing else uses; `[to, to+len)` a range of
/// this process that may be replaced.
unsafe fn move_over(from: *mut libc::c_void, to: usize, len: usize) -> bool {
    // SAFETY: the caller's contract.
    let moved = unsafe {
        libc::mremap(
            from,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            to as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        // SAFETY: `from` is still this module's mapping.
        unsafe { libc::munmap(from, len) };
        return false;
    }
    true
}

fn install_fork_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handler only reads atomics and makes system calls (and copies), which a
        // forked child may do; the library is not unloaded while the process can fork.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
}

/// In a forked child: every alias becomes private memory with its bytes, so the child does not
/// write its parent's registered memory (or the other way round).
extern "C" fn forked_child() {
    for slot in &SLOTS {
        let len = slot.len.load(Ordering::Acquire);
        if len == 0 || len == CLAIMED {
            continue;
        }
        let start = slot.start.load(Ordering::Acquire);
        // SAFETY: a slot with a length names an alias this process made and has not restored;
        // the child runs one thread now.
        unsafe { replace_with_private_copy(start, len) };
        slot.len.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interiors_are_the_whole_pages() {
        assert_eq!(interior(PAGE, 2 * PAGE), Some((PAGE, 2 * PAGE)));
        assert_eq!(interior(PAGE + 16, 3 * PAGE), Some((2 * PAGE, 2 * PAGE)));
        assert_eq!(interior(16, PAGE), None);
        assert_eq!(interior(usize::MAX - 8, 4), None);
    }

    #[test]
    fn only_private_anonymous_read_write_memory_moves() {
        let maps = "\
1000-3000 rw-p 00000000 00:00 0 \n\
3000-4000 rw-p 00000000 00:00 0                          [heap]\n\
4000-5000 r--p 00000000 00:00 0 \n\
6000-7000 rw-s 00000000 00:01 17                         /memfd:x (deleted)\n\
8000-9000 rw-p 00000000 08:01 1234                       /usr/lib/libc.so\n\
9000-a000 rw-p 00000000 00:00 0                          [stack]\n";
        assert!(covered_by_private_anonymous(maps, 0x1000, 0x4000));
        assert!(covered_by_private_anonymous(maps, 0x2000, 0x3000));
        assert!(
            !covered_by_private_anonymous(maps, 0x3000, 0x5000),
            "read-only"
        );
        assert!(
            !covered_by_private_anonymous(maps, 0x4000, 0x6000),
            "a hole"
        );
        assert!(
            !covered_by_private_anonymous(maps, 0x6000, 0x7000),
            "shared"
        );
        assert!(
            !covered_by_private_anonymous(maps, 0x8000, 0x9000),
            "a file"
        );
        assert!(
            !covered_by_private_anonymous(maps, 0x9000, 0xa000),
            "the stack"
        );
        assert!(
            !covered_by_private_anonymous(maps, 0xa000, 0xb000),
            "unmapped"
        );
    }

    #[test]
    fn memory_moves_into_the_arena_and_back_with_its_bytes() {
        let arena = Arc::new(HostArena::create(64 * PAGE).unwrap());
        let size = 8 * PAGE;
        // SAFETY: a private anonymous mapping of this test's own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: the mapping above, `size` bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, size) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let mut aliases = Aliases::default();
        // Registered from 16 bytes in: the interior is pages 1..8.
        assert!(aliases.alias(&arena, p + 16, size - 16, 0));
        let span = aliases.span(&arena, p + 16, size - 16).unwrap();
        assert_eq!(span.head, PAGE - 16);
        assert_eq!(span.mid, 7 * PAGE);
        assert_eq!(arena.in_use(), 7 * PAGE);
        let mut seen = vec![0u8; 7 * PAGE];
        assert!(arena.read(span.offset, &mut seen));
        assert_eq!(
            seen,
            bytes[PAGE..],
            "the arena holds the registration's bytes"
        );
        // The application's writes land in the arena (the worker's view), and the other way.
        bytes[PAGE + 5] = 0xee;
        let mut one = [0u8];
        assert!(arena.read(span.offset + 5, &mut one));
        assert_eq!(one[0], 0xee);
        assert!(arena.write(span.offset + 6, &[0xdd]));
        assert_eq!(bytes[PAGE + 6], 0xdd);
        // Another arena is not this alias's.
        let other = Arc::new(HostArena::create(16 * PAGE).unwrap());
        assert!(aliases.span(&other, p, size).is_none());
        aliases.restore(p + 16, size - 16);
        assert!(aliases.is_empty());
        assert_eq!(arena.in_use(), 0);
        assert_eq!(bytes[PAGE + 5], 0xee, "the bytes stay");
        assert_eq!(bytes[PAGE + 6], 0xdd);
        assert_eq!(bytes[3 * PAGE + 1], ((3 * PAGE + 1) % 251) as u8);
        // Private again: the arena no longer sees writes.
        bytes[PAGE + 7] = 0x11;
        assert!(arena.read(span.offset + 7, &mut one));
        assert_eq!(one[0], 0, "the arena block was given back (punched)");
        assert!(!aliases.alias(&arena, p + 16, 100, 0), "less than a page");
        assert!(
            !aliases.alias(&arena, p, size, REGISTER_IOMEMORY),
            "I/O memory"
        );
        let small = Arc::new(HostArena::create(4 * PAGE).unwrap());
        assert!(!aliases.alias(&small, p, size, 0), "the arena has no room");
        assert!(aliases.is_empty());
        assert_eq!(bytes[PAGE + 7], 0x11, "the memory is left as it was");
        // SAFETY: the mapping above, no longer used.
        unsafe { libc::munmap(p as *mut libc::c_void, size) };
    }
}
