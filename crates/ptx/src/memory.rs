//! Device memory as words shared by the threads that run a launch's blocks.
//!
//! Global memory is `AtomicU64` words ([`crate::Region`]): every access is an atomic access of
//! the words it touches, so blocks running on different host threads never race in Rust's sense.
//! Plain loads and stores are `Relaxed` (a race between blocks is the kernel's own race, as on a
//! GPU: it sees one value or the other, never a torn word); a store of fewer than 8 bytes
//! replaces its bytes of the word with a compare-and-swap, so it never overwrites a neighbour's
//! concurrent store (when one thread runs the whole launch, a plain load and store do). Atomic
//! instructions are compare-and-swap loops on their word (`SeqCst`), exact under contention.
//! Little-endian: byte `k` of a region is bits `8 * (k % 8)..` of word `k / 8`.
//!
//! Shared, local and parameter memory belong to one block or thread and are plain bytes.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::alu::mask;
use crate::Region;

/// The word and shift of an access of `n` bytes at `addr`, if it lies in `r` and in one word.
#[inline(always)]
fn locate<'r>(r: &Region<'r>, addr: u64, n: u64) -> Option<Placement<'r>> {
    let off = addr.checked_sub(r.start)?;
    if off.checked_add(n)? > r.len || !r.start.is_multiple_of(8) {
        return None;
    }
    let (w, byte) = ((off / 8) as usize, off % 8);
    let first = r.words.get(w)?;
    if byte + n <= 8 {
        Some(Placement::One(first, byte * 8))
    } else {
        Some(Placement::Two(first, r.words.get(w + 1)?, byte * 8))
    }
}

enum Placement<'r> {
    One(&'r AtomicU64, u64),
    Two(&'r AtomicU64, &'r AtomicU64, u64),
}

/// Whether `[addr, addr + n)` lies in `r`.
#[inline(always)]
pub fn contains(r: &Region, addr: u64, n: u64) -> bool {
    addr >= r.start && addr - r.start < r.len && addr - r.start + n <= r.len
}

/// Loads `n` (1, 2, 4 or 8) bytes.
#[inline]
pub fn load(r: &Region, addr: u64, n: u64) -> Option<u64> {
    let m = mask(n as u8);
    Some(match locate(r, addr, n)? {
        Placement::One(w, sh) => (w.load(Ordering::Relaxed) >> sh) & m,
        Placement::Two(a, b, sh) => {
            let x = a.load(Ordering::Relaxed) as u128 | (b.load(Ordering::Relaxed) as u128) << 64;
            (x >> sh) as u64 & m
        }
    })
}

/// Replaces the bits `m << sh` of `w` with `v << sh`.
#[inline(always)]
fn put(w: &AtomicU64, sh: u64, m: u64, v: u64, exclusive: bool) {
    let (m, v) = (m << sh, (v << sh) & (m << sh));
    if m == u64::MAX {
        w.store(v, Ordering::Relaxed);
    } else if exclusive {
        let old = w.load(Ordering::Relaxed);
        w.store((old & !m) | v, Ordering::Relaxed);
    } else {
        let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some((old & !m) | v)
        });
    }
}

/// Stores the low `n` bytes of `v`. `exclusive`: no other thread runs this launch.
#[inline]
pub fn store(r: &Region, addr: u64, n: u64, v: u64, exclusive: bool) -> Option<()> {
    let m = mask(n as u8);
    match locate(r, addr, n)? {
        Placement::One(w, sh) => put(w, sh, m, v, exclusive),
        Placement::Two(a, b, sh) => {
            // Misaligned across two words: each word's part on its own.
            put(a, sh, m & (u64::MAX >> sh), v, exclusive);
            put(b, 0, m >> (64 - sh), v >> (64 - sh), exclusive);
        }
    }
    Some(())
}

/// An atomic read-modify-write of `n` bytes (within one word): `f(old)` is the new value;
/// returns the old one.
#[inline]
pub fn rmw(r: &Region, addr: u64, n: u64, mut f: impl FnMut(u64) -> u64) -> Option<u64> {
    let Placement::One(w, sh) = locate(r, addr, n)? else {
        return None;
    };
    let m = mask(n as u8);
    let mut old = 0;
    let _ = w.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
        old = (word >> sh) & m;
        let new = f(old) & m;
        Some((word & !(m << sh)) | (new << sh))
    });
    Some(old)
}

/// Reads `n` bytes at `off` of a plain byte buffer (shared, local, parameter memory).
#[inline(always)]
pub fn read_bytes(buf: &[u8], off: u64, n: u64) -> Option<u64> {
    let o = usize::try_from(off).ok()?;
    Some(match n {
        4 => u32::from_le_bytes(buf.get(o..o.checked_add(4)?)?.try_into().ok()?) as u64,
        8 => u64::from_le_bytes(buf.get(o..o.checked_add(8)?)?.try_into().ok()?),
        2 => u16::from_le_bytes(buf.get(o..o.checked_add(2)?)?.try_into().ok()?) as u64,
        1 => *buf.get(o)? as u64,
        _ => return None,
    })
}

/// Writes the low `n` bytes of `v` at `off` of a plain byte buffer.
#[inline(always)]
pub fn write_bytes(buf: &mut [u8], off: u64, n: u64, v: u64) -> Option<()> {
    let o = usize::try_from(off).ok()?;
    let n = n as usize;
    buf.get_mut(o..o.checked_add(n)?)?
        .copy_from_slice(v.to_le_bytes().get(..n)?);
    Some(())
}
