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
use std::time::Duration;

use gpufuse_device::{status as st, KernelLaunch};
use gpufuse_proto::LaunchRecord;

use crate::{Session, R};

/// How many launches the diagnostic launch log keeps.
const LAUNCH_LOG: usize = 1024;

/// A lease on the device: its quantum and the device time used so far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    quantum: Duration,
    used: Duration,
}

#[derive(Default)]
pub(crate) struct LaunchBooks {
    /// The last launches received (diagnostics); records are reused, so logging allocates
    /// nothing once the log is full.
    pub(crate) log: VecDeque<LaunchRecord>,
    pub(crate) device_time: Duration,
    /// The launch queue's lease, while this session holds the device.
    pub(crate) lease: Option<Lease>,
    /// Set when the client is gone (`heartbeat.rs`): the kernel running now stops.
    pub(crate) cancel: Option<Arc<AtomicBool>>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Session<'_> {
    /// Before a launch: waits for the device unless this session holds it, and renews a lease
    /// whose quantum is used up (it ends and the session queues again, in one request).
    fn lease_for_launch(&mut self) {
        let quantum = match self.launch.lease {
            Some(l) if l.used < l.quantum => return,
            Some(l) => self.ledger.renew(micros(l.used)),
            None => self.ledger.acquire(),
        };
        self.launch.lease = Some(Lease {
            quantum: Duration::from_micros(quantum),
            used: Duration::ZERO,
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

    /// Gives the device back, charging what the lease's launches used.
    pub fn end_lease(&mut self) {
        if let Some(l) = self.launch.lease.take() {
            self.ledger.done(micros(l.used));
        }
    }

    /// Device time this session's kernels have run.
    pub fn device_time(&self) -> Duration {
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
            // CU_LAUNCH_ATTRIBUTE_COOPERATIVE (2), nonzero.
            cooperative: l
                .attributes
                .iter()
                .any(|&(id, v)| id == 2 && v[0] as u32 != 0),
            cancel: self.launch.cancel.as_deref(),
        };
        let result = self.device.launch(&k);
        if let (Ok(t), Some(lease)) = (&result, self.launch.lease.as_mut()) {
            lease.used += *t;
        }
        match result {
            Ok(t) => {
                self.launch.device_time += t;
                Ok(())
            }
            Err(failure) => {
                let e = failure.status;
                tracing::warn!(kernel = %name, status = e, "launch failed: {}", failure.detail());
                if matches!(
                    e,
                    st::ILLEGAL_ADDRESS | st::MISALIGNED_ADDRESS | st::ASSERT | st::LAUNCH_FAILED
                ) {
                    // Like a GPU context after a fault: every later call fails until reset.
                    self.sticky = Some(e);
                }
                Err(e)
            }
        }
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
