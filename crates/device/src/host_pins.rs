//! Which parts of a client's host arena a GPU backend has page-locked with its driver, so that
//! copies between the arena and the GPU run as DMA at the copy engines' speed.
//!
//! The arena is large and sparse (32 GiB reserved, only touched pages cost memory), so it is
//! never locked whole: each large copy locks the pages it touches that are not locked yet, one
//! run per gap, and they stay locked until the device goes away. Only the copied pages are
//! locked: they belong to a block the client holds while the copy is queued.
//!
//! A locked page must stay the arena's: the client gives freed blocks' pages back to the
//! system (a punched hole), after which the worker's mapping would see a fresh page and the
//! GPU the old one. So before locking, the backend marks the [`CHUNK`]s the run touches in the
//! arena's *pin map* (`gpufuse_transport::arena`: one byte per chunk that the client reads
//! before it gives pages back, and keeps, zeroed, the pages of marked chunks). Without a pin
//! map (a client that keeps none) nothing is locked. A refusal (the system's locked-memory
//! limit) stops further locking; copies then go through the driver's staging buffers, only
//! slower.

use std::collections::BTreeMap;

/// The pin map's granularity (`gpufuse_transport::arena::PIN_CHUNK`).
pub const CHUNK: u64 = 2 << 20;
/// Copies smaller than this are not worth a lock.
pub const MIN_COPY: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// The arena `[base, base + len)` and its locked runs.
#[derive(Debug, Default)]
pub struct HostPins {
    arena: Option<(u64, u64)>,
    /// Locked runs: start address -> end address, disjoint; each one registration.
    locked: BTreeMap<u64, u64>,
    refused: bool,
}

impl HostPins {
    /// A new arena: what was locked in the old one is returned, to unlock.
    pub fn set_arena(&mut self, base: u64, len: u64) -> Vec<(u64, u64)> {
        self.arena = Some((base, len));
        self.refused = false;
        self.take_runs()
    }

    /// The runs to lock (address, bytes) before a copy of `[addr, addr + len)`: its pages not
    /// locked yet; none for a small copy, one outside the arena, or after a refusal. Each run
    /// returned is then either [`HostPins::locked`] or [`HostPins::refused`].
    pub fn runs_for(&self, addr: u64, len: u64) -> Vec<(u64, u64)> {
        let Some((base, size)) = self.arena else {
            return Vec::new();
        };
        let end = addr.saturating_add(len);
        if self.refused || len < MIN_COPY || addr < base || end > base + size {
            return Vec::new();
        }
        let mut at = base + (addr - base) / PAGE * PAGE;
        let end = (base + (end - base).div_ceil(PAGE) * PAGE).min(base + size);
        let mut runs = Vec::new();
        // Locked runs that may overlap: the one starting before `at`, and those inside.
        let before = self.locked.range(..=at).next_back();
        let inside = self.locked.range(at + 1..end);
        for (&s, &e) in before.into_iter().chain(inside) {
            if e <= at {
                continue;
            }
            if s > at {
                runs.push((at, s - at));
            }
            at = at.max(e);
        }
        if at < end {
            runs.push((at, end - at));
        }
        runs
    }

    /// The pin map's chunks (indices from the arena's start) that `run` touches.
    pub fn chunks(&self, run: (u64, u64)) -> std::ops::Range<u64> {
        match self.arena {
            Some((base, _)) if run.1 > 0 && run.0 >= base => {
                (run.0 - base) / CHUNK..(run.0 + run.1 - 1 - base) / CHUNK + 1
            }
            _ => 0..0,
        }
    }

    /// `run` (from [`HostPins::runs_for`]) is locked.
    pub fn locked(&mut self, run: (u64, u64)) {
        self.locked.insert(run.0, run.0 + run.1);
    }

    /// The driver refused a lock: no more are tried in this arena.
    pub fn refused(&mut self) {
        self.refused = true;
    }

    /// Every run locked (address, bytes), to unlock at the end.
    pub fn take_runs(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.locked)
            .into_iter()
            .map(|(s, e)| (s, e - s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 1 << 40;

    #[test]
    fn large_copies_lock_the_pages_they_touch_once() {
        let mut p = HostPins::default();
        assert!(p.set_arena(BASE, 64 * CHUNK).is_empty());
        // 3 MiB starting 1 MiB in (page-aligned): exactly those pages.
        let runs = p.runs_for(BASE + (1 << 20), 3 << 20);
        assert_eq!(runs, [(BASE + (1 << 20), 3 << 20)]);
        assert_eq!(p.chunks(runs[0]), 0..2, "chunks 0 and 1 are marked");
        p.locked(runs[0]);
        assert!(p.runs_for(BASE + (1 << 20), 3 << 20).is_empty());
        // An unaligned copy rounds out to its pages; only the new ones.
        assert_eq!(
            p.runs_for(BASE + (3 << 20) + 100, 2 << 20),
            [(BASE + (4 << 20), (1 << 20) + PAGE)]
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
    fn runs_come_back_to_unlock_with_a_new_arena() {
        let mut p = HostPins::default();
        p.set_arena(BASE, CHUNK + 4096);
        let runs = p.runs_for(BASE, CHUNK + 4096);
        assert_eq!(runs, [(BASE, CHUNK + 4096)]);
        p.locked(runs[0]);
        assert_eq!(p.set_arena(BASE, 8 * CHUNK), runs);
        assert!(p.take_runs().is_empty());
    }
}
