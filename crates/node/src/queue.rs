//! A device's launch queue as the node's threads use it: the [`Scheduler`] behind a mutex,
//! a condition variable for the sessions waiting their turn, and the clock.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpufuse_proto::ComputePolicy;

use crate::scheduler::{Poll, Scheduler, Usage};

/// The longest a waiting session sleeps before it looks at the queue again, whatever happens.
const MAX_WAIT: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub struct DeviceQueue {
    sched: Mutex<Scheduler>,
    turn: Condvar,
    epoch: Instant,
}

impl DeviceQueue {
    pub fn new(policy: ComputePolicy) -> Self {
        Self {
            sched: Mutex::new(Scheduler::new(policy)),
            turn: Condvar::new(),
            epoch: Instant::now(),
        }
    }

    /// Microseconds since the queue was made: the scheduler's clock.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    pub fn lock(&self) -> MutexGuard<'_, Scheduler> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until session `id` holds the device; returns its quantum in microseconds.
    pub fn acquire(&self, id: u64) -> u64 {
        self.wait_turn(self.lock(), id)
    }

    /// Session `id` ends its lease after `used_us` and queues again at once; blocks until it
    /// holds the device again.
    pub fn renew(&self, id: u64, used_us: u64) -> u64 {
        let mut s = self.lock();
        s.requeue(id, used_us, self.now());
        self.turn.notify_all();
        self.wait_turn(s, id)
    }

    fn wait_turn(&self, mut s: MutexGuard<'_, Scheduler>, id: u64) -> u64 {
        loop {
            let now = self.now();
            match s.poll(id, now) {
                Poll::Granted { quantum_us } => return quantum_us,
                Poll::Wait { until } => {
                    let wait = until.map_or(MAX_WAIT, |u| {
                        Duration::from_micros(u.saturating_sub(now).max(1)).min(MAX_WAIT)
                    });
                    s = self
                        .turn
                        .wait_timeout(s, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Session `id` ends its lease after `used_us` of measured device time.
    pub fn done(&self, id: u64, used_us: u64) {
        let now = self.now();
        self.lock().done(id, used_us, now);
        self.turn.notify_all();
    }

    /// Session `id` is gone: it leaves the queue, and the device if it held it.
    pub fn remove(&self, id: u64) {
        self.lock().remove(id);
        self.turn.notify_all();
    }

    /// What session `id` has used, and whether it holds the device now.
    pub fn usage(&self, id: u64) -> (Usage, bool) {
        let now = self.now();
        let s = self.lock();
        (s.usage(id, now), s.running() == Some(id))
    }
}
