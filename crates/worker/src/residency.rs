//! Where the session's device memory is: resident on the device, or away in host memory or on
//! disk (oversubscription: the node asks an idle session to make room; scale to zero: a
//! session idle for its TTL gives its memory back by itself). Contents leave whole ranges at a
//! time ([`gpufuse_device::Device::evict`]) and come back at the same addresses before the
//! session's next device work ([`Session::ensure_resident`]), so the application never sees
//! the difference. What was evicted is released from the node's ledger and reserved again
//! before it comes back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpufuse_device::status as st;

use crate::{Session, R};

/// When and where a session's memory may go (`gpufuse serve --idle-ttl`, `--idle-disk-ttl`,
/// `--swap-dir`).
#[derive(Clone, Debug, Default)]
pub struct ElasticConfig {
    /// Idle this long (no request), the session moves all its device memory to host memory.
    pub idle_ttl: Option<Duration>,
    /// Idle this long, what is in host memory moves on to disk (needs `swap_dir`).
    pub idle_disk_ttl: Option<Duration>,
    /// Where evicted contents go on disk; without one, contents stay in host memory.
    pub swap_dir: Option<PathBuf>,
    /// The node oversubscribes its device: a session that finds no room moves its own memory
    /// out and waits for room, holding nothing (so that two waiting sessions never hold what
    /// the other needs).
    pub oversubscribed: bool,
}

/// Contents away from the device.
enum Away {
    Host(Vec<u8>),
    Disk { path: PathBuf, len: u64 },
}

pub(crate) struct Residency {
    pub(crate) config: ElasticConfig,
    /// Session id, for swap file names.
    pub(crate) session: u64,
    away: BTreeMap<u64, Away>,
    host: u64,
    disk: u64,
    /// Bytes released from the node's ledger by evictions (reserved again on the way back).
    released: u64,
    /// The end of the last request (idle time starts there), as of the last idle look.
    last_active: Instant,
    /// A request ran since then: the next idle look starts idle time anew. A flag per
    /// request instead of a clock read, since the idle look comes when the worker runs out of
    /// requests, which is when the last one ended.
    active: bool,
}

impl Residency {
    pub(crate) fn new(config: ElasticConfig, session: u64) -> Self {
        Self {
            config,
            session,
            away: BTreeMap::new(),
            host: 0,
            disk: 0,
            released: 0,
            last_active: Instant::now(),
            active: false,
        }
    }

    /// A request ran (idle time starts again).
    pub(crate) fn touch(&mut self) {
        self.active = true;
    }

    /// How long the session has been idle: since the last idle look that followed a request.
    fn idle(&mut self) -> Duration {
        if std::mem::take(&mut self.active) {
            self.last_active = Instant::now();
        }
        self.last_active.elapsed()
    }

    /// Keeps the ledger's releases within what the session holds (`used` after a free):
    /// returns how much of the last free evictions had released already.
    pub(crate) fn unreleased(&mut self, used: u64) -> u64 {
        let excess = self.released.saturating_sub(used);
        self.released -= excess;
        excess
    }

    pub(crate) fn is_resident(&self) -> bool {
        self.away.is_empty()
    }

    /// Bytes in host memory and on disk.
    pub(crate) fn swapped(&self) -> (u64, u64) {
        (self.host, self.disk)
    }

    fn swap_path(&self, ptr: u64) -> Option<PathBuf> {
        let dir = self.config.swap_dir.as_ref()?;
        Some(dir.join(format!(
            "gpufuse-{}-s{}-{ptr:x}.swap",
            std::process::id(),
            self.session
        )))
    }

    /// Writes what is in host memory to disk; false if there is no swap directory or a write
    /// failed (the contents then stay in host memory).
    pub(crate) fn move_to_disk(&mut self) -> bool {
        let ptrs: Vec<u64> = self
            .away
            .iter()
            .filter(|(_, a)| matches!(a, Away::Host(_)))
            .map(|(&p, _)| p)
            .collect();
        for ptr in ptrs {
            let Some(path) = self.swap_path(ptr) else {
                return false;
            };
            let Some(Away::Host(bytes)) = self.away.get(&ptr) else {
                continue;
            };
            if let Err(e) = std::fs::write(&path, bytes) {
                tracing::warn!("cannot swap to {}: {e}", path.display());
                let _ = std::fs::remove_file(&path);
                return false;
            }
            let len = bytes.len() as u64;
            self.away.insert(ptr, Away::Disk { path, len });
            self.host -= len;
            self.disk += len;
        }
        true
    }

    /// Forgets the contents away (their memory is being freed: a reset, the session's end);
    /// swap files are removed. What evictions released from the ledger stays counted, so
    /// that the frees that follow do not release it twice.
    pub(crate) fn forget_away(&mut self) {
        for (_, a) in std::mem::take(&mut self.away) {
            if let Away::Disk { path, .. } = a {
                let _ = std::fs::remove_file(path);
            }
        }
        self.host = 0;
        self.disk = 0;
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        self.forget_away();
    }
}

impl Session<'_> {
    /// Moves at least `bytes` of device memory out (all of it for `u64::MAX`), largest ranges
    /// first, to host memory (then to disk if `to_disk`); releases them from the ledger.
    /// Returns the bytes released.
    pub fn evict(&mut self, bytes: u64, to_disk: bool) -> u64 {
        self.end_lease();
        let mut ranges = self.device.resident();
        ranges.sort_by_key(|&(p, len)| (std::cmp::Reverse(len), p));
        let mut moved = 0u64;
        for (ptr, len) in ranges {
            if moved >= bytes {
                break;
            }
            match self.device.evict(ptr) {
                Ok(contents) => {
                    self.residency.host += contents.len() as u64;
                    self.residency.away.insert(ptr, Away::Host(contents));
                    moved += len;
                }
                Err(e) => {
                    tracing::debug!(ptr, status = e, "range not evicted");
                }
            }
        }
        if to_disk {
            self.residency.move_to_disk();
        }
        // The ledger holds what the session was charged; ranges the device made for itself
        // (heap, workspace) were never charged, so never release more than that.
        let release = moved.min(self.memory.used.saturating_sub(self.residency.released));
        if release > 0 {
            self.ledger.release(release);
            self.residency.released += release;
        }
        self.report_swapped();
        if moved > 0 {
            tracing::info!(
                moved,
                host = self.residency.host,
                disk = self.residency.disk,
                "device memory evicted"
            );
        }
        release
    }

    fn report_swapped(&mut self) {
        let (host, disk) = self.residency.swapped();
        self.ledger.swapped(host, disk);
    }

    /// Reserves `bytes` on the device's ledger. On an oversubscribed node a session that finds
    /// no room moves its own resident memory out first and then waits for room holding
    /// nothing; what it moved out comes back before its next device work. Returns whether
    /// the bytes were reserved (what was moved out is then included when it comes back).
    pub(crate) fn reserve_room(&mut self, bytes: u64, bringing_back: bool) -> bool {
        if self.ledger.reserve(bytes) {
            return true;
        }
        if !self.residency.config.oversubscribed {
            return false;
        }
        self.evict(u64::MAX, false);
        // Bringing back: what is away now, including what just left.
        let want = if bringing_back {
            self.residency.released
        } else {
            bytes
        };
        self.ledger.reserve_waiting(want)
    }

    /// Brings every evicted range back to the device at its address: before device work.
    /// Fails with `CUDA_ERROR_OUT_OF_MEMORY` only if the device cannot make room.
    pub fn ensure_resident(&mut self) -> R<()> {
        if self.residency.is_resident() {
            return Ok(());
        }
        let need = self.residency.released;
        if need > 0 && !self.reserve_room(need, true) {
            tracing::warn!(need, "no room on the device to bring the session back");
            return Err(st::OUT_OF_MEMORY);
        }
        self.residency.released = 0;
        let started = Instant::now();
        let away = std::mem::take(&mut self.residency.away);
        let mut failed = None;
        for (ptr, a) in away {
            let contents = match a {
                Away::Host(bytes) => {
                    self.residency.host -= bytes.len() as u64;
                    Ok(bytes)
                }
                Away::Disk { path, len } => {
                    self.residency.disk -= len;
                    let read = std::fs::read(&path);
                    let _ = std::fs::remove_file(&path);
                    read
                }
            };
            let back = match contents {
                Ok(bytes) => self.device.bring_back(ptr, &bytes),
                Err(e) => {
                    tracing::error!(ptr, "swapped contents cannot be read back: {e}");
                    Err(st::ILLEGAL_ADDRESS)
                }
            };
            if let Err(e) = back {
                failed.get_or_insert(e);
            }
        }
        self.report_swapped();
        tracing::debug!(elapsed = ?started.elapsed(), "device memory brought back");
        match failed {
            // Contents that cannot come back are lost: the session is poisoned, as a GPU
            // context is after a fault.
            Some(e) => {
                self.sticky = Some(st::ILLEGAL_ADDRESS);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// What an idle session does when its TTLs pass: all memory to host memory after
    /// `idle_ttl`, to disk after `idle_disk_ttl`. Returns how long until the next step is due.
    pub fn idle_tick(&mut self) -> Option<Duration> {
        let idle = self.residency.idle();
        let cfg = &self.residency.config;
        let (host_ttl, disk_ttl) = (
            cfg.idle_ttl,
            cfg.idle_disk_ttl.filter(|_| cfg.swap_dir.is_some()),
        );
        let mut next: Option<Duration> = None;
        let mut due = |ttl: Duration| {
            if idle >= ttl {
                true
            } else {
                next = Some(next.map_or(ttl - idle, |n: Duration| n.min(ttl - idle)));
                false
            }
        };
        let to_host = host_ttl.is_some_and(&mut due);
        let to_disk = disk_ttl.is_some_and(&mut due);
        if !to_host && !to_disk {
            return next;
        }
        let resident = !self.device.resident().is_empty();
        if to_disk {
            if resident {
                self.evict(u64::MAX, true);
            } else if self.residency.host > 0 {
                self.residency.move_to_disk();
                self.report_swapped();
            }
        } else if to_host && resident {
            self.evict(u64::MAX, false);
        }
        next
    }

    /// Bytes of this session's memory in host memory and on disk.
    pub fn swapped(&self) -> (u64, u64) {
        self.residency.swapped()
    }
}

/// Whether a request may touch device memory (its session's memory must be resident first).
pub(crate) fn touches_memory(req: &gpufuse_proto::Request) -> bool {
    use gpufuse_proto::Request::*;
    !matches!(
        req,
        Ping | CtxCreate { .. }
            | CtxDestroy { .. }
            | CtxSynchronize { .. }
            | MemGetInfo { .. }
            | StreamCreate { .. }
            | StreamDestroy { .. }
            | StreamSynchronize { .. }
            | StreamQuery { .. }
            | StreamWaitEvent { .. }
            | EventCreate { .. }
            | EventDestroy { .. }
            | EventRecord { .. }
            | EventQuery { .. }
            | EventSynchronize { .. }
            | EventElapsedTime { .. }
            | DebugLaunchLog { .. }
            | ModuleImagePart { .. }
            | ShmAttach { .. }
            | GraphDefine { .. }
            | GraphDestroy { .. }
    )
}
