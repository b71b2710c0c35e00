//! Kernel launches: the device lease from the node's launch queue, the diagnostic launch log,
//! the device time charged to the session's compute share, and the fault that poisons a
//! session until a device reset.
//!
//! Kernels run under a *lease* ([`crate::Ledger::acquire`]): the worker asks before a launch,
//! keeps the lease while launches follow one another (already received) within the quantum,
//! and ends it with the measured device time they took.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufuse_device::KernelLaunch;
use gpufuse_proto::LaunchRecord;

use crate::{Session, R};

/// How many launches the diagnostic launch log keeps.
const LAUNCH_LOG: usize = 1024;

/// A lease on the device: its quantum, when it began and the device time charged to it so far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    quantum: Duration,
    started: Instant,
    used: Duration,
}

#[derive(Default)]
pub(crate) struct LaunchBooks {
    /// The last launches received (diagnostics); records are reused, so logging allocates
    /// nothing once the log is full.
    pub(crate) log: VecDeque<LaunchRecord>,
    /// Device time the session's kernels have used (on every device it ran on).
    pub(crate) device_time: Duration,
    /// The device's own count ([`gpufuse_device::Device::device_time`]) when it was last read.
    pub(crate) seen: Duration,
    /// The launch queue's lease, while this session holds the device.
    pub(crate) lease: Option<Lease>,
    /// Device time measured while no lease was held (work that completed after its lease
    /// ended): charged with the next lease.
    pub(crate) unbilled: Duration,
    /// Set when the client is gone (`heartbeat.rs`): the kernel running now stops.
    pub(crate) cancel: Option<Arc<AtomicBool>>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Session<'_> {
    /// Reads the device's measured time: what was measured since the last read is added to
    /// the session's and to its lease's.
    fn account(&mut self) {
        let now = self.device.device_time();
        let new = now.saturating_sub(self.launch.seen);
        self.launch.seen = now;
        self.launch.device_time += new;
        match self.launch.lease.as_mut() {
            Some(l) => l.used += new,
            None => self.launch.unbilled += new,
        }
    }

    /// The device the session runs on changed (a move): its time count starts again.
    pub(crate) fn device_changed(&mut self) {
        self.launch.seen = Duration::ZERO;
    }

    /// Whether the lease's quantum is spent: by measured device time, or, while work is in
    /// flight (an asynchronous device measures it only once it completes), by the time the
    /// lease has lasted, which bounds the work a session may put in flight under one lease.
    fn lease_spent(&mut self) -> bool {
        self.account();
        let Some(l) = self.launch.lease else {
            return true;
        };
        l.used >= l.quantum || (l.started.elapsed() >= l.quantum && self.device.busy())
    }

    /// Before a launch: waits for the device unless this session holds it, and renews a lease
    /// whose quantum is spent: the work in flight completes first (so the next holder's time
    /// is its own), its time is charged, and the session queues again, in one request.
    pub(crate) fn lease_for_launch(&mut self) {
        let held = self.launch.lease.is_some();
        if held && !self.lease_spent() {
            return;
        }
        let quantum = match held {
            true => {
                let _ = self.device.settle();
                self.account();
                let used = self.launch.lease.map_or(Duration::ZERO, |l| l.used);
                self.ledger.renew(micros(used))
            }
            false => self.ledger.acquire(),
        };
        self.launch.lease = Some(Lease {
            quantum: Duration::from_micros(quantum),
            started: Instant::now(),
            used: std::mem::take(&mut self.launch.unbilled),
        });
    }

    /// Launches stop early once `flag` is set (the session's client is gone).
    pub fn set_cancel(&mut self, flag: Arc<AtomicBool>) {
        self.launch.cancel = Some(flag);
    }

    /// Whether this session holds the device now.
    pub fn holds_lease(&self) -> bool {
        self.launch.lease.is_some()
    }

    /// Gives the device back, charging what the lease's launches used as far as the device
    /// has measured it: work still in flight is charged to a later lease, when it has
    /// completed (the worker does not wait for the GPU here).
    pub fn end_lease(&mut self) {
        if self.launch.lease.is_none() {
            return;
        }
        self.device.flush_timing();
        self.account();
        if let Some(l) = self.launch.lease.take() {
            self.ledger.done(micros(l.used));
        }
    }

    /// Device time this session's kernels have run, as far as the device has measured it.
    pub fn device_time(&mut self) -> Duration {
        self.account();
        self.launch.device_time
    }

    fn log_launch(&mut self, name: &str, l: &gpufuse_proto::Launch<'_>) {
        let mut record = if self.launch.log.len() == LAUNCH_LOG {
            self.launch.log.pop_front().unwrap_or_default()
        } else {
            LaunchRecord::default()
        };
        if *record.function_name != *name {
            record.function_name.clear();
            record.function_name.push_str(name);
        }
        record.grid = l.grid;
        record.block = l.block;
        record.shared_mem = l.shared_mem;
        record.stream = l.stream;
        record.params.clear();
        record.params.extend_from_slice(l.params);
        self.launch.log.push_back(record);
    }

    pub(crate) fn launch_kernel(&mut self, l: &gpufuse_proto::Launch<'_>) -> R<()> {
        self.check_stream(l.stream.get())?;
        let (id, name) = self.kernel(l.function.get())?;
        self.log_launch(&name, l);
        tracing::debug!(
            kernel = %name,
            grid = ?l.grid,
            block = ?l.block,
            shared = l.shared_mem,
            params = %hex(l.params),
            "launch"
        );
        self.lease_for_launch();
        let k = KernelLaunch {
            module: id,
            function: &name,
            grid: l.grid,
            block: l.block,
            shared_mem: l.shared_mem,
            params: l.params,
            stream: l.stream.get(),
            // CU_LAUNCH_ATTRIBUTE_COOPERATIVE (2), nonzero.
            cooperative: l
                .attributes
                .iter()
                .any(|&(id, v)| id == 2 && v[0] as u32 != 0),
            cancel: self.launch.cancel.as_deref(),
        };
        let result = self.device.launch(&k);
        self.launched(&name, result)
    }

    /// After enqueueing a kernel or a graph: the time the device measured is read, and a
    /// failure is logged (a fault poisons the session as it does a GPU context).
    pub(crate) fn launched(
        &mut self,
        what: &dyn std::fmt::Display,
        result: Result<(), gpufuse_device::DeviceError>,
    ) -> R<()> {
        self.account();
        result.map_err(|failure| {
            let e = failure.status;
            tracing::warn!(kernel = %what, status = e, "launch failed: {}", failure.detail());
            if crate::streams::is_fault(e) {
                // Like a GPU context after a fault: every later call fails until reset.
                self.sticky = Some(e);
            }
            e
        })
    }

    pub(crate) fn launch_log(&self, max: u32) -> Vec<LaunchRecord> {
        let n = self.launch.log.len().saturating_sub(max as usize);
        self.launch.log.iter().skip(n).cloned().collect()
    }
}

/// Lower-case hex of `bytes`, for logs.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
