//! A lease offer: one shared word between the node and one session's worker, so that a session
//! that has the device to itself takes its next lease without a round trip to the node.
//!
//! The node's launch queue grants the device one session at a time (a *lease*), over the
//! worker's control socket: an `Acquire` before the first launch after the worker went idle,
//! a `Done` when it goes idle again. For a session alone on its device that is two round trips
//! per synchronize (measured 75-104 us on the simulated driver, `gpufuse-bench sim`, where the
//! synchronize itself costs 5 us). So when a session ends a lease and nobody else waits, the
//! node *offers* it the next one in this word; the worker *takes* it with one compare-and-swap
//! when it next launches, and tells the node nothing until that lease ends (`Done`). Before the
//! node grants the device to anyone else it *revokes* every offer on the device: a revoke that
//! finds the offer taken learns that the session is running, and the other session waits for
//! its `Done`.
//!
//! A lease taken from an offer need not be reported when it ends either: the worker *parks*
//! it, offering it back to itself (`TAKEN -> OFFERED`) and adding the device time it used to
//! the page's charge counter, which the node reads (and zeroes) whenever it revokes or hears
//! from the session. So a session alone on its device synchronizes with no word to the node.
//!
//! States, in the word: [`NONE`] (no offer), [`OFFERED`], [`TAKEN`]. The node moves
//! `NONE -> OFFERED` and `OFFERED -> NONE` and resets `TAKEN -> NONE` when it learns of the
//! lease; the worker moves `OFFERED -> TAKEN` and `TAKEN -> OFFERED`. The quantum of an offered
//! lease is the second word, the charges not yet reported the third, the number of leases
//! parked since the node last looked the fourth. A one-page sealed memfd the node creates, mapped by both; the worker checks
//! its size, and a worker without one (`--lease-fd` absent) always asks.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};

/// No offer.
pub const NONE: u64 = 0;
/// The next lease is the session's for the taking.
pub const OFFERED: u64 = 1;
/// The worker took the offered lease; the node has not heard of it yet.
pub const TAKEN: u64 = 2;

const LEN: usize = 4096;

/// What a revoke found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// There was no offer.
    Nothing,
    /// The offer was withdrawn before the worker took it.
    Withdrawn,
    /// The worker had taken it: the session holds the device.
    Taken,
}

#[derive(Debug)]
pub struct LeaseOffer {
    map: memmap2::MmapRaw,
    memfd: OwnedFd,
}

impl LeaseOffer {
    /// A new offer word (the node's side), with no offer.
    pub fn create() -> io::Result<Self> {
        let memfd = rustix::fs::memfd_create(
            "gpufuse-lease",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&memfd, LEN as u64)?;
        rustix::fs::fcntl_add_seals(
            &memfd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )?;
        Self::map(memfd)
    }

    /// The worker's side: the memfd the node passed, checked (sealed, one page).
    pub fn adopt(memfd: OwnedFd) -> io::Result<Self> {
        let seals = rustix::fs::fcntl_get_seals(&memfd).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the lease offer is not a sealed memfd: {e}"),
            )
        })?;
        let len = rustix::fs::fstat(&memfd)?.st_size;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) || len != LEN as i64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the lease offer is not a sealed one-page memfd ({len} bytes)"),
            ));
        }
        Self::map(memfd)
    }

    fn map(memfd: OwnedFd) -> io::Result<Self> {
        let map = memmap2::MmapOptions::new().len(LEN).map_raw(&memfd)?;
        Ok(Self { map, memfd })
    }

    /// The descriptor to hand the worker.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: the mapping is a page, page-aligned, live as long as `self`; words 0 and 1
        // are only ever accessed atomically, by this type, in both processes.
        unsafe { &*self.map.as_mut_ptr().cast::<AtomicU64>().add(i) }
    }

    /// The state: [`NONE`], [`OFFERED`] or [`TAKEN`] (anything else reads as [`NONE`]).
    pub fn state(&self) -> u64 {
        match self.word(0).load(Ordering::Acquire) {
            s @ (OFFERED | TAKEN) => s,
            _ => NONE,
        }
    }

    /// The node: offers the next lease, of `quantum_us`. Nothing changes if the worker still
    /// holds one it took.
    pub fn offer(&self, quantum_us: u64) {
        self.word(1).store(quantum_us, Ordering::Relaxed);
        let _ = self
            .word(0)
            .compare_exchange(NONE, OFFERED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The node: withdraws the offer, or learns that it was taken (the word is then left
    /// [`TAKEN`] until [`LeaseOffer::settle`]).
    pub fn revoke(&self) -> Revoked {
        match self
            .word(0)
            .compare_exchange(OFFERED, NONE, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Revoked::Withdrawn,
            Err(TAKEN) => Revoked::Taken,
            Err(_) => Revoked::Nothing,
        }
    }

    /// The node: the session's taken lease is now known (it asked, or ended it); whether it
    /// had been taken. An outstanding offer is withdrawn too.
    pub fn settle(&self) -> bool {
        self.word(0).swap(NONE, Ordering::AcqRel) == TAKEN
    }

    /// The worker: ends a lease it took, keeping the offer (nobody revoked it) and leaving the
    /// device time it used, `micros`, for the node to charge. `false` when the node has learned
    /// of the lease meanwhile (the worker then reports it with `Done`).
    pub fn park(&self, micros: u64) -> bool {
        let parked = self
            .word(0)
            .compare_exchange(TAKEN, OFFERED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if parked {
            self.word(2).fetch_add(micros, Ordering::AcqRel);
            self.word(3).fetch_add(1, Ordering::AcqRel);
        }
        parked
    }

    /// The node: the device time parked leases used that it has not charged yet (zeroed).
    pub fn take_charges(&self) -> u64 {
        self.word(2).swap(0, Ordering::AcqRel)
    }

    /// The node: how many leases were parked since it last asked (zeroed).
    pub fn take_parked(&self) -> u64 {
        self.word(3).swap(0, Ordering::AcqRel)
    }

    /// The worker: takes the offered lease; its quantum, or `None` (ask the node).
    pub fn take(&self) -> Option<u64> {
        self.word(0)
            .compare_exchange(OFFERED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| self.word(1).load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_is_taken_once_and_a_revoke_says_what_it_found() {
        let node = LeaseOffer::create().unwrap();
        let worker = LeaseOffer::adopt(node.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(worker.take(), None, "nothing offered");
        node.offer(1000);
        assert_eq!(node.revoke(), Revoked::Withdrawn);
        assert_eq!(worker.take(), None, "withdrawn before it was taken");
        node.offer(1000);
        assert_eq!(worker.take(), Some(1000));
        assert_eq!(worker.take(), None, "taken once");
        node.offer(2000);
        assert_eq!(node.state(), TAKEN, "an offer does not undo a taken lease");
        assert_eq!(node.revoke(), Revoked::Taken);
        assert!(node.settle());
        assert_eq!(node.revoke(), Revoked::Nothing);
        assert!(!node.settle());
        // Parking: the worker ends a taken lease without a word; the node finds the charges.
        node.offer(1000);
        assert_eq!(worker.take(), Some(1000));
        assert!(worker.park(40));
        assert_eq!(worker.take(), Some(1000), "parked: offered again");
        assert!(worker.park(2));
        assert_eq!(node.revoke(), Revoked::Withdrawn);
        assert_eq!(node.take_charges(), 42);
        assert_eq!(node.take_charges(), 0);
        assert_eq!(node.take_parked(), 2);
        assert_eq!(node.take_parked(), 0);
        assert!(!worker.park(5), "revoked: the worker reports with Done");
    }

    #[test]
    fn a_worker_refuses_anything_but_a_sealed_page() {
        let fd = rustix::fs::memfd_create("x", MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        assert!(LeaseOffer::adopt(fd).is_err());
        let unsealed = rustix::fs::memfd_create("y", MemfdFlags::empty()).unwrap();
        rustix::fs::ftruncate(&unsealed, LEN as u64).unwrap();
        assert!(LeaseOffer::adopt(unsealed).is_err());
    }
}
