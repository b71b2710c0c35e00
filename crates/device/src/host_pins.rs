//! Which parts of a client's host arena a GPU backend has page-locked with its driver.
//!
//! The arena is large and sparse (32 GiB reserved, only touched pages cost memory), so it is
//! never locked whole: each large copy locks the 2 MiB chunks it touches that are not locked
//! yet, as one run per gap, and they stay locked until the device goes away. What a lock costs
//! is at most one chunk of memory the client has not touched at each end of a copy. A refusal
//! (the system's locked-memory limit) stops further locking; copies then go through the
//! driver's staging buffers, only slower.

use std::collections::BTreeSet;

/// The locking granularity.
pub const CHUNK: u64 = 2 << 20;
/// Copies smaller than this are not worth a lock.
pub const MIN_COPY: u64 = 1 << 20;

/// The arena `[base, base + len)` and its locked chunks (indices from `base`).
#[derive(Debug, Default)]
pub struct HostPins {
    arena: Option<(u64, u64)>,
    locked: BTreeSet<u64>,
    /// Every run locked, as (address, bytes), to unlock at the end.
    runs: Vec<(u64, u64)>,
    refused: bool,
}

impl HostPins {
    /// A new arena: what was locked in the old one is returned, to unlock.
    pub fn set_arena(&mut self, base: u64, len: u64) -> Vec<(u64, u64)> {
        self.arena = Some((base, len));
        self.locked.clear();
        self.refused = false;
        std::mem::take(&mut self.runs)
    }

    /// The runs to lock (address, bytes) before a copy of `[addr, addr + len)`: none for a
    /// small copy, one outside the arena, or after a refusal. Each run returned is then either
    /// [`HostPins::locked`] or [`HostPins::refused`].
    pub fn runs_for(&self, addr: u64, len: u64) -> Vec<(u64, u64)> {
        let Some((base, size)) = self.arena else {
            return Vec::new();
        };
        let end = addr.saturating_add(len);
        if self.refused || len < MIN_COPY || addr < base || end > base + size {
            return Vec::new();
        }
        let first = (addr - base) / CHUNK;
        let last = (end - base - 1) / CHUNK;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for c in (first..=last).filter(|c| !self.locked.contains(c)) {
            let start = base + c * CHUNK;
            let bytes = CHUNK.min(base + size - start);
            match runs.last_mut() {
                Some((s, n)) if *s + *n == start => *n += bytes,
                _ => runs.push((start, bytes)),
            }
        }
        runs
    }

    /// `run` (from [`HostPins::runs_for`]) is locked.
    pub fn locked(&mut self, run: (u64, u64)) {
        if let Some((base, _)) = self.arena {
            let first = (run.0 - base) / CHUNK;
            let count = run.1.div_ceil(CHUNK);
            self.locked.extend(first..first + count);
            self.runs.push(run);
        }
    }

    /// The driver refused a lock: no more are tried in this arena.
    pub fn refused(&mut self) {
        self.refused = true;
    }

    /// Every run locked, to unlock at the end.
    pub fn take_runs(&mut self) -> Vec<(u64, u64)> {
        self.locked.clear();
        std::mem::take(&mut self.runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 1 << 40;

    #[test]
    fn large_copies_lock_the_chunks_they_touch_once() {
        let mut p = HostPins::default();
        assert!(p.set_arena(BASE, 64 * CHUNK).is_empty());
        // 3 MiB starting 1 MiB in: chunks 0 and 1, one run.
        let runs = p.runs_for(BASE + (1 << 20), 3 << 20);
        assert_eq!(runs, [(BASE, 2 * CHUNK)]);
        p.locked(runs[0]);
        assert!(p.runs_for(BASE, 2 * CHUNK).is_empty());
        // Chunks 1..=3: only 2 and 3 are new.
        assert_eq!(
            p.runs_for(BASE + CHUNK, 3 * CHUNK),
            [(BASE + 2 * CHUNK, 2 * CHUNK)]
        );
    }

    #[test]
    fn gaps_become_separate_runs() {
        let mut p = HostPins::default();
        p.set_arena(BASE, 64 * CHUNK);
        p.locked((BASE + CHUNK, CHUNK));
        assert_eq!(
            p.runs_for(BASE, 3 * CHUNK),
            [(BASE, CHUNK), (BASE + 2 * CHUNK, CHUNK)]
        );
    }

    #[test]
    fn small_outside_and_refused_copies_lock_nothing() {
        let mut p = HostPins::default();
        assert!(p.runs_for(BASE, 8 << 20).is_empty(), "no arena yet");
        p.set_arena(BASE, 64 * CHUNK);
        assert!(p.runs_for(BASE, MIN_COPY - 1).is_empty());
        assert!(p.runs_for(BASE - 4096, 8 << 20).is_empty());
        assert!(
            p.runs_for(BASE + 63 * CHUNK, 2 * CHUNK).is_empty(),
            "past the end"
        );
        p.refused();
        assert!(p.runs_for(BASE, 8 << 20).is_empty());
    }

    #[test]
    fn the_last_chunk_is_cut_at_the_arena_end_and_runs_come_back_to_unlock() {
        let mut p = HostPins::default();
        p.set_arena(BASE, CHUNK + 4096);
        let runs = p.runs_for(BASE, CHUNK + 4096);
        assert_eq!(runs, [(BASE, CHUNK + 4096)]);
        p.locked(runs[0]);
        assert_eq!(p.set_arena(BASE, 8 * CHUNK), runs);
        assert!(p.take_runs().is_empty());
    }
}
