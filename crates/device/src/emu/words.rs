//! Device memory of one allocation, kept as 64-bit words so that a launch can share it between
//! the host threads that run its blocks.
//!
//! Outside a launch the device reads and writes the bytes in place (copies, memsets, replies
//! sent from device memory without a copy). A launch borrows every allocation mutably and views
//! its words as `AtomicU64` for the launch's duration; the interpreter then touches them only
//! with atomic operations (`gpufuse_ptx`'s `memory.rs`), so blocks on different threads never
//! race in Rust's sense. This file holds the crate's only `unsafe` code: the two reinterpreting
//! casts that std offers only on nightly (`AtomicU64::from_mut_slice`) or through a crate.

#![allow(unsafe_code)]

use std::sync::atomic::AtomicU64;

// The casts below need `AtomicU64` to be laid out exactly like `u64`: same size (documented by
// std) and same alignment (true on every 64-bit target; checked here).
const _: () = assert!(std::mem::align_of::<AtomicU64>() == std::mem::align_of::<u64>());
const _: () = assert!(std::mem::size_of::<AtomicU64>() == std::mem::size_of::<u64>());
// Byte `k` of an allocation is byte `k % 8` of word `k / 8` in memory order, which the
// interpreter reads as little-endian.
#[cfg(target_endian = "big")]
compile_error!("the emulated device keeps memory as little-endian words");

/// `len` bytes, zeroed, in whole words.
pub struct Words {
    words: Box<[u64]>,
    len: usize,
}

impl Words {
    /// Zeroed memory of `len` bytes, or `None` when the host has no room. The words come
    /// zeroed from the allocator (fresh pages for a large range, touched only when first
    /// written), so a large allocation costs nothing until it is used.
    pub fn zeroed(len: usize) -> Option<Words> {
        let n = len.div_ceil(8);
        if n == 0 {
            return Some(Words {
                words: Box::new([]),
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
        Some(Words { words, len })
    }

    /// A copy of `bytes`, or `None` when the host has no room: zeroed words
    /// ([`Words::zeroed`], not written twice), then the bytes copied in once.
    pub fn from_bytes(bytes: &[u8]) -> Option<Words> {
        let mut w = Words::zeroed(bytes.len())?;
        w.bytes_mut().copy_from_slice(bytes);
        Some(w)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn bytes(&self) -> &[u8] {
        let p = self.words.as_ptr().cast::<u8>();
        // SAFETY: the words own `8 * words.len() >= len` initialized bytes at `p`; any bit
        // pattern is a valid u8, u8 needs no alignment, and the shared borrow of `self` keeps
        // the memory alive and unmodified for the returned lifetime.
        unsafe { std::slice::from_raw_parts(p, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let p = self.words.as_mut_ptr().cast::<u8>();
        // SAFETY: as in `bytes`; the exclusive borrow of `self` makes the returned slice the
        // only access to the memory for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(p, self.len) }
    }

    /// The words as atomics, for a launch.
    pub fn atomic(&mut self) -> &[AtomicU64] {
        let words: &mut [u64] = &mut self.words;
        let (p, n) = (words.as_mut_ptr().cast::<AtomicU64>(), words.len());
        // SAFETY: `AtomicU64` has the size, alignment (checked above) and bit validity of
        // `u64`, so the words are valid atomics in place. The exclusive borrow of `self` lasts as
        // long as the returned slice, so for that time every access to the words goes through
        // it, and it only allows atomic accesses (this is std's `AtomicU64::from_mut_slice`).
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}
