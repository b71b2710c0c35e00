//! Device memory of one allocation, kept as 64-bit words so that a launch can share it between
//! the host threads that run its blocks.
//!
//! Outside a launch the device reads and writes the bytes of its own words in place (copies,
//! memsets, replies sent from device memory without a copy). A launch borrows every allocation
//! mutably and views its words as `AtomicU64` for the launch's duration; the interpreter then
//! touches them only with atomic operations (`gpufuse_ptx`'s `memory.rs`), so blocks on
//! different threads never race in Rust's sense.
//!
//! Words may also live in memory another process maps and writes at any time ([`Words::shared`]:
//! managed memory of a same-host client, a block of its host arena). Those are never viewed as
//! bytes: copies into and out of them are atomic word operations ([`Words::read_at`],
//! [`Words::write_at`]), and a launch's atomics are the very atomics the other process's
//! atomics touch. This file holds the crate's only `unsafe` code: the reinterpreting casts that
//! std offers only on nightly (`AtomicU64::from_mut_slice`) or through a crate, and the words
//! of a shared mapping.

#![allow(unsafe_code)]

use std::ptr::NonNull;

use crate::HostSpan;
use std::sync::atomic::{AtomicU64, Ordering};

// The casts below need `AtomicU64` to be laid out exactly like `u64`: same size (documented by
// std) and same alignment (true on every 64-bit target; checked here).
const _: () = assert!(std::mem::align_of::<AtomicU64>() == std::mem::align_of::<u64>());
const _: () = assert!(std::mem::size_of::<AtomicU64>() == std::mem::size_of::<u64>());
// Byte `k` of an allocation is byte `k % 8` of word `k / 8` in memory order, which the
// interpreter reads as little-endian.
#[cfg(target_endian = "big")]
compile_error!("the emulated device keeps memory as little-endian words");

/// Where the words are.
enum Store {
    /// This process's own memory.
    Own(Box<[u64]>),
    /// `n` words at `at` in a mapping another process shares ([`Words::shared`]), valid while
    /// the words live (the span's contract).
    Shared { at: NonNull<AtomicU64>, n: usize },
}

/// `len` bytes, zeroed, in whole words.
pub struct Words {
    store: Store,
    len: usize,
}

// SAFETY: `Own` is a box of plain words. `Shared` names memory that stays mapped in the whole
// process for the words' life (`Words::shared`'s contract) and is only ever accessed through
// atomic operations, which any thread may do.
unsafe impl Send for Words {}

impl Words {
    /// Zeroed memory of `len` bytes, or `None` when the host has no room. The words come
    /// zeroed from the allocator (fresh pages for a large range, touched only when first
    /// written), so a large allocation costs nothing until it is used.
    pub fn zeroed(len: usize) -> Option<Words> {
        let n = len.div_ceil(8);
        if n == 0 {
            return Some(Words {
                store: Store::Own(Box::new([])),
                len,
            });
        }
        let layout = std::alloc::Layout::array::<u64>(n).ok()?;
        // SAFETY: the layout has a nonzero size (n > 0); a null result is handled.
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` was allocated by the global allocator with the layout of `[u64; n]`,
        // and its `n` words are initialized (zeroed); the box takes ownership of it.
        let words = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) };
        Some(Words {
            store: Store::Own(words),
            len,
        })
    }

    /// A copy of `bytes`, or `None` when the host has no room: zeroed words
    /// ([`Words::zeroed`], not written twice), then the bytes copied in once.
    pub fn from_bytes(bytes: &[u8]) -> Option<Words> {
        let mut w = Words::zeroed(bytes.len())?;
        w.write_at(0, bytes);
        Some(w)
    }

    /// `len` bytes of words in `span`, memory that another process maps and may read and
    /// write at any time (managed memory a same-host client uses at once with the device).
    /// `None` when the span is not 8-byte aligned or is short of whole words covering `len`.
    /// The span's own contract ([`HostSpan::new`]: valid for as long as it is used) covers the
    /// words' life, and this process touches the memory only through them, atomically.
    pub fn shared(span: HostSpan, len: usize) -> Option<Words> {
        let n = len.div_ceil(8);
        let at = span.addr();
        if !(at as usize).is_multiple_of(8) || n.checked_mul(8)? > span.len() {
            return None;
        }
        let at = NonNull::new(at.cast::<AtomicU64>())?;
        Some(Words {
            store: Store::Shared { at, n },
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the words live in memory another process shares ([`Words::shared`]).
    pub fn is_shared(&self) -> bool {
        matches!(self.store, Store::Shared { .. })
    }

    /// The bytes in place; `None` for shared words, which another process may write at the
    /// same time (viewing them as bytes would be a data race).
    pub fn bytes(&self) -> Option<&[u8]> {
        let Store::Own(words) = &self.store else {
            return None;
        };
        let p = words.as_ptr().cast::<u8>();
        // SAFETY: the words own `8 * words.len() >= len` initialized bytes at `p`; any bit
        // pattern is a valid u8, u8 needs no alignment, and the shared borrow of `self` keeps
        // the memory alive and unmodified for the returned lifetime.
        Some(unsafe { std::slice::from_raw_parts(p, self.len) })
    }

    /// The bytes in place to write; `None` for shared words (as [`Words::bytes`]).
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let len = self.len;
        let Store::Own(words) = &mut self.store else {
            return None;
        };
        let p = words.as_mut_ptr().cast::<u8>();
        // SAFETY: as in `bytes`; the exclusive borrow of `self` makes the returned slice the
        // only access to the memory for its lifetime.
        Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// The words as atomics, for a launch.
    pub fn atomic(&mut self) -> &[AtomicU64] {
        match &mut self.store {
            Store::Own(words) => {
                let (p, n) = (words.as_mut_ptr().cast::<AtomicU64>(), words.len());
                // SAFETY: `AtomicU64` has the size, alignment (checked above) and bit validity
                // of `u64`, so the words are valid atomics in place. The exclusive borrow of
                // `self` lasts as long as the returned slice, so for that time every access to
                // the words goes through it, and it only allows atomic accesses (this is std's
                // `AtomicU64::from_mut_slice`).
                unsafe { std::slice::from_raw_parts(p, n) }
            }
            Store::Shared { at, n } => shared_words(*at, *n),
        }
    }

    /// Copies `out.len()` bytes from byte `off` into `out` (the range must lie inside the
    /// words: callers check it). Shared words are read one atomic word at a time.
    pub fn read_at(&self, off: usize, out: &mut [u8]) {
        match &self.store {
            Store::Own(_) => {
                if let Some(b) = self.bytes() {
                    out.copy_from_slice(&b[off..off + out.len()]);
                }
            }
            Store::Shared { at, n } => {
                let words = shared_words(*at, *n);
                let mut pos = off;
                let mut rest = out;
                while !rest.is_empty() {
                    let (w, k) = (pos / 8, pos % 8);
                    let take = (8 - k).min(rest.len());
                    let (here, after) = rest.split_at_mut(take);
                    let v = words[w].load(Ordering::Acquire).to_le_bytes();
                    here.copy_from_slice(&v[k..k + take]);
                    pos += take;
                    rest = after;
                }
            }
        }
    }

    /// Copies `data` to byte `off` (the range must lie inside the words: callers check it).
    /// Into shared words, whole words are stored atomically and a partial word's bytes are
    /// merged into it with one compare-and-swap loop, so the other bytes of that word, which
    /// the other process may be updating, keep its updates.
    pub fn write_at(&mut self, off: usize, data: &[u8]) {
        match &mut self.store {
            Store::Own(_) => {
                if let Some(b) = self.bytes_mut() {
                    b[off..off + data.len()].copy_from_slice(data);
                }
            }
            Store::Shared { at, n } => {
                let words = shared_words(*at, *n);
                let mut pos = off;
                let mut rest = data;
                while !rest.is_empty() {
                    let (w, k) = (pos / 8, pos % 8);
                    let take = (8 - k).min(rest.len());
                    let (here, after) = rest.split_at(take);
                    if take == 8 {
                        let v = u64::from_le_bytes(here.try_into().unwrap_or([0; 8]));
                        words[w].store(v, Ordering::Release);
                    } else {
                        let _ = words[w].fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                            let mut b = old.to_le_bytes();
                            b[k..k + take].copy_from_slice(here);
                            Some(u64::from_le_bytes(b))
                        });
                    }
                    pos += take;
                    rest = after;
                }
            }
        }
    }

    /// The whole contents, copied out (a capture, an eviction).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.read_at(0, &mut out);
        out
    }
}

/// The atomics of shared words.
fn shared_words<'a>(at: NonNull<AtomicU64>, n: usize) -> &'a [AtomicU64] {
    // SAFETY: `Words::shared`'s span contract: `n` aligned words at `at` stay mapped while the
    // `Words` lives, which outlives every borrow its methods hand out (callers tie the lifetime
    // to `&self`/`&mut self`); atomics may be shared by any number of readers and writers.
    unsafe { std::slice::from_raw_parts(at.as_ptr(), n) }
}

/// A span over a buffer of the test's own, standing for another process's mapping: the
/// buffer must outlive every use of the span.
#[cfg(test)]
pub(crate) fn test_span(buf: &[AtomicU64]) -> HostSpan {
    // SAFETY: the callers keep `buf` alive past the span's uses and touch it only atomically.
    unsafe { HostSpan::new(buf.as_ptr().cast_mut().cast(), std::mem::size_of_val(buf)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared word store over a buffer this test owns, standing for another process's
    /// mapping.
    fn over(buf: &mut [u64], len: usize) -> Words {
        // SAFETY: the buffer outlives the words in each test and is touched only through them
        // or atomically.
        let span = unsafe { HostSpan::new(buf.as_mut_ptr().cast(), buf.len() * 8) };
        Words::shared(span, len).unwrap()
    }

    #[test]
    fn shared_words_copy_by_words_and_keep_neighbouring_bytes() {
        let mut buf = [0u64; 4];
        let mut w = over(&mut buf, 30);
        assert!(w.is_shared() && w.bytes().is_none() && w.bytes_mut().is_none());
        let data: Vec<u8> = (1..=21).collect();
        w.write_at(3, &data);
        let mut out = vec![0u8; 30];
        w.read_at(0, &mut out);
        assert_eq!(&out[..3], &[0, 0, 0]);
        assert_eq!(&out[3..24], &data[..]);
        assert_eq!(&out[24..], &[0; 6]);
        // The atomics a launch sees are the same words.
        w.atomic()[0].fetch_add(1, Ordering::SeqCst);
        let mut first = [0u8; 1];
        w.read_at(0, &mut first);
        assert_eq!(first, [1]);
        assert_eq!(
            w.to_vec(),
            out.iter()
                .enumerate()
                .map(|(i, &b)| if i == 0 { 1 } else { b })
                .collect::<Vec<_>>()
        );
        drop(w);
        assert_eq!(buf[0] & 0xff, 1, "the words were the buffer's own");
    }

    #[test]
    fn shared_words_need_alignment_and_room() {
        let mut buf = [0u64; 2];
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: as in `over`; the refused ones never touch the buffer.
        let span = |off: usize, len: usize| unsafe { HostSpan::new(p.add(off), len) };
        assert!(Words::shared(span(1, 15), 8).is_none(), "misaligned");
        assert!(
            Words::shared(span(0, 16), 17).is_none(),
            "longer than the span"
        );
        assert!(Words::shared(span(0, 16), 16).is_some());
    }

    #[test]
    fn partial_word_writes_keep_concurrent_atomic_updates() {
        // Another thread keeps adding to the high half of word 0 while byte 0 is written
        // again and again: no update is lost.
        let mut buf = [0u64; 1];
        let mut w = over(&mut buf, 8);
        let words = w.atomic() as *const [AtomicU64];
        // SAFETY: `words` points into `buf`, alive until the end of this test; only atomics
        // touch it from the other thread.
        let words: &[AtomicU64] = unsafe { &*words };
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..10_000 {
                    words[0].fetch_add(1 << 32, Ordering::SeqCst);
                }
            });
            for i in 0..10_000u32 {
                w.write_at(0, &[i as u8]);
            }
        });
        assert_eq!(words[0].load(Ordering::SeqCst) >> 32, 10_000);
    }
}
