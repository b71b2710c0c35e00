//! The node's books: which sessions exist, and every device's memory ledger (total, used,
//! promised slices) with each session's part of it. Workers reserve and release through the
//! control socket; a session's end returns everything it held. Kept free of sockets and
//! processes so that tests can drive it directly.

use std::sync::Arc;

use gpufuse_proto::{ClientHello, ComputePolicy};

use crate::queue::DeviceQueue;
use crate::{DeviceState, NodeState, SessionRecord};

/// Address window of each session: 1 TiB, above the host's usual mappings.
pub const WINDOW: u64 = 1 << 40;
const WINDOW_BASE: u64 = 0x0000_2000_0000_0000;
/// Windows are reused after this many sessions, so that every window lies in the lower 47-bit
/// user address space (32 to 96 TiB): a client maps managed memory at its device address.
/// Sessions are separate worker processes, so two sessions with the same window never see
/// each other's memory.
const WINDOWS: u64 = 64;

/// How much a device is preferred for a new session: more unpromised memory, then fewer
/// sessions.
type Preference = (u64, std::cmp::Reverse<usize>);

/// A session the node admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    pub id: u64,
    pub device: u32,
    /// The start of the session's device address window.
    pub base: u64,
}

impl NodeState {
    pub fn new(devices: Vec<DeviceState>, notes: Vec<String>, policy: ComputePolicy) -> Self {
        Self {
            queues: devices
                .iter()
                .map(|_| Arc::new(DeviceQueue::new(policy)))
                .collect(),
            devices,
            notes,
            compute_policy: policy,
            next_session: 1,
            sessions: Default::default(),
            observed: Default::default(),
            elastic: Default::default(),
            image_cache: Default::default(),
        }
    }

    /// Registers a session on a device that can honour its VRAM slice (`limit`) and its
    /// compute share, spreading sessions: the device with the most memory not promised to
    /// others, then the fewest sessions, then the lowest index. A refusal says why (for the
    /// first device, when none can).
    pub fn admit(&mut self, hello: &ClientHello, limit: Option<u64>) -> Result<Admitted, String> {
        self.admit_where(hello, limit, |_| true)
    }

    /// [`NodeState::admit`] among the devices `allowed` accepts (a pool's grant names one).
    pub fn admit_where(
        &mut self,
        hello: &ClientHello,
        limit: Option<u64>,
        allowed: impl Fn(u32) -> bool,
    ) -> Result<Admitted, String> {
        if self.devices.is_empty() || self.queues.len() != self.devices.len() {
            return Err("the server has no device".into());
        }
        let (percent, tflops) = (hello.resources.compute_percent, hello.resources.tflops);
        if percent.is_some() && tflops.is_some() {
            return Err("ask for compute as a percentage or in TFLOPS, not both".into());
        }
        if let Some(c) = percent.filter(|c| !(1..=100).contains(c)) {
            return Err(format!("a compute share is a percentage (1-100), not {c}"));
        }
        // (device, compute share, preference: unpromised bytes, then fewer sessions)
        let mut best: Option<(u32, Option<u32>, Preference)> = None;
        let mut first_refusal = None;
        for index in 0..self.devices.len() {
            let d = &self.devices[index];
            let device = index as u32;
            if !allowed(device) {
                continue;
            }
            // A TFLOPS request is a share of this device's peak.
            let compute = match tflops {
                Some(t) => {
                    let share = (f64::from(t) * 100.0 / d.peak_tflops).ceil();
                    if !(share > 0.0 && share <= 100.0) {
                        first_refusal.get_or_insert(format!(
                            "cannot grant {t} TFLOPS: device {device} peaks at {:.1} TFLOPS (FP32)",
                            d.peak_tflops
                        ));
                        continue;
                    }
                    Some(share as u32)
                }
                None => percent,
            };
            if let Some(c) = compute {
                let promised = self.queues[index].lock().promised_percent();
                if promised + c > 100 {
                    first_refusal.get_or_insert(format!(
                        "cannot grant {c}% of device {device}'s compute: {promised}% is promised to other sessions"
                    ));
                    continue;
                }
            }
            // With oversubscription a device promises more than it holds: what is not resident
            // waits in host memory or on disk.
            let unpromised = self.elastic.capacity(d.total).saturating_sub(d.promised);
            if let Some(l) = limit {
                if l > unpromised {
                    first_refusal.get_or_insert(format!(
                        "cannot grant {} of VRAM on device {device}: it has {}, of which {} is not promised to other sessions",
                        crate::admin::human_bytes(l),
                        crate::admin::human_bytes(d.total),
                        crate::admin::human_bytes(unpromised)
                    ));
                    continue;
                }
            }
            let sessions = self
                .sessions
                .values()
                .filter(|s| s.device == device)
                .count();
            let key = (unpromised, std::cmp::Reverse(sessions));
            if best.as_ref().is_none_or(|(_, _, k)| key > *k) {
                best = Some((device, compute, key));
            }
        }
        let Some((device, compute, _)) = best else {
            return Err(first_refusal.unwrap_or_else(|| "the server has no device".into()));
        };
        let queue = self.queues[device as usize].clone();
        let mut sched = queue.lock();
        if let Some(l) = limit {
            self.devices[device as usize].promised += l;
        }
        let id = self.next_session;
        self.next_session += 1;
        sched.add(id, hello.resources.qos, compute);
        self.sessions.insert(
            id,
            SessionRecord {
                pid: hello.pid,
                program: hello.program.clone(),
                worker_pid: 0,
                device,
                used: 0,
                limit,
                qos: hello.resources.qos,
                compute,
                subject: None,
                claim: None,
                elastic: Default::default(),
            },
        );
        Ok(Admitted {
            id,
            device,
            base: WINDOW_BASE + (id % WINDOWS) * WINDOW,
        })
    }

    /// Session `id` asks for `bytes` more on its device: granted or not, and the device's use.
    pub fn reserve(&mut self, id: u64, bytes: u64) -> (bool, u64) {
        let Some(rec) = self.sessions.get_mut(&id) else {
            return (false, 0);
        };
        let Some(d) = self.devices.get_mut(rec.device as usize) else {
            return (false, 0);
        };
        match d.used.checked_add(bytes) {
            Some(u) if u <= d.total => {
                d.used = u;
                rec.used += bytes;
                (true, d.used)
            }
            _ => (false, d.used),
        }
    }

    /// Session `id` returns `bytes` (never more than it holds); the device's use after.
    pub fn release(&mut self, id: u64, bytes: u64) -> u64 {
        let Some(rec) = self.sessions.get_mut(&id) else {
            return 0;
        };
        let Some(d) = self.devices.get_mut(rec.device as usize) else {
            return 0;
        };
        let n = bytes.min(rec.used);
        rec.used -= n;
        d.used = d.used.saturating_sub(n);
        d.used
    }

    /// Bytes in use on session `id`'s device by every session.
    pub fn device_used(&self, id: u64) -> u64 {
        self.sessions
            .get(&id)
            .and_then(|r| self.devices.get(r.device as usize))
            .map_or(0, |d| d.used)
    }

    /// Forgets session `id`: its memory, its slice and its place in the launch queue go back.
    pub fn end_session(&mut self, id: u64) {
        if let Some(rec) = self.sessions.remove(&id) {
            if let Some(d) = self.devices.get_mut(rec.device as usize) {
                d.used = d.used.saturating_sub(rec.used);
                if let Some(l) = rec.limit {
                    d.promised = d.promised.saturating_sub(l);
                }
            }
            if let Some(q) = self.queues.get(rec.device as usize) {
                q.remove(id);
            }
        }
    }
}
