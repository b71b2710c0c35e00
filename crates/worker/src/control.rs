//! The worker's line to its node: the device's memory ledger and its launch queue live in the
//! node, because several sessions (worker processes) share one device. Fixed 9-byte requests
//! (`op`, `u64`) and 9-byte answers (`ok`, `u64`) over a socketpair.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// What the worker asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Reserve bytes on the device; answer ok=1 if granted.
    Reserve = 1,
    /// Return bytes.
    Release = 2,
    /// How many bytes the device has in use across all sessions.
    DeviceUsed = 3,
    /// Wait for the device (the launch queue); the answer is the lease's quantum in
    /// microseconds: launches may go on without asking again until they have used it.
    Acquire = 5,
    /// End the lease, reporting the device time its launches took, in microseconds: what the
    /// session's compute share is charged.
    Done = 6,
    /// `Done`, then `Acquire`, as one request: the session has more launches waiting, so it
    /// never looks idle between two leases.
    Renew = 7,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Op::Reserve,
            2 => Op::Release,
            3 => Op::DeviceUsed,
            5 => Op::Acquire,
            6 => Op::Done,
            7 => Op::Renew,
            _ => return None,
        })
    }
}

/// The device memory ledger as a worker sees it.
pub trait Ledger {
    /// Reserves `bytes`; false if the device cannot hold them.
    fn reserve(&mut self, bytes: u64) -> bool;
    fn release(&mut self, bytes: u64);
    /// Bytes in use on the device by every session.
    fn device_used(&mut self) -> u64;
    /// Waits until this session may launch on the device; returns the lease's quantum in
    /// microseconds. A device nobody else uses is always free.
    fn acquire(&mut self) -> u64 {
        u64::MAX
    }
    /// Ends the lease; its launches ran for `micros` of device time.
    fn done(&mut self, _micros: u64) {}
    /// Ends the lease and waits for the next one; returns its quantum.
    fn renew(&mut self, micros: u64) -> u64 {
        self.done(micros);
        self.acquire()
    }
}

/// The ledger in the node, reached over the control socket.
pub struct ControlLedger(pub UnixStream);

impl ControlLedger {
    fn ask(&mut self, op: Op, arg: u64) -> Option<(bool, u64)> {
        let mut req = [0u8; 9];
        req[0] = op as u8;
        req[1..].copy_from_slice(&arg.to_le_bytes());
        self.0.write_all(&req).ok()?;
        let mut ans = [0u8; 9];
        self.0.read_exact(&mut ans).ok()?;
        Some((ans[0] == 1, u64::from_le_bytes(ans[1..].try_into().ok()?)))
    }
}

impl Ledger for ControlLedger {
    fn reserve(&mut self, bytes: u64) -> bool {
        self.ask(Op::Reserve, bytes).is_some_and(|(ok, _)| ok)
    }
    fn release(&mut self, bytes: u64) {
        let _ = self.ask(Op::Release, bytes);
    }
    fn device_used(&mut self) -> u64 {
        self.ask(Op::DeviceUsed, 0).map_or(0, |(_, v)| v)
    }
    fn acquire(&mut self) -> u64 {
        // Without a node there is nobody to share with: run.
        self.ask(Op::Acquire, 0).map_or(u64::MAX, |(_, q)| q)
    }
    fn done(&mut self, micros: u64) {
        let _ = self.ask(Op::Done, micros);
    }
    fn renew(&mut self, micros: u64) -> u64 {
        self.ask(Op::Renew, micros).map_or(u64::MAX, |(_, q)| q)
    }
}

/// A ledger for a device nobody else uses (component tests, single-session runs).
#[derive(Debug)]
pub struct LocalLedger {
    pub total: u64,
    pub used: u64,
}

impl Ledger for LocalLedger {
    fn reserve(&mut self, bytes: u64) -> bool {
        match self.used.checked_add(bytes) {
            Some(u) if u <= self.total => {
                self.used = u;
                true
            }
            _ => false,
        }
    }
    fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
    fn device_used(&mut self) -> u64 {
        self.used
    }
}
