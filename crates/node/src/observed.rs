//! What the node shows over `--http` (`gpufuse_observe`): its state as a
//! [`PoolSnapshot`], and the few figures only the node sees as they happen (how long placing
//! a session took, refusals and why, when each session started).
//!
//! A standalone `gpufuse serve` is a pool of one node: it reports its placements and its
//! sessions by state as the controller's series (`gpufuse_pool_*`, `gpufuse_nodes`). A node
//! run under a controller leaves those to the controller (`pool_of_one: false`).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use gpufuse_observe::{
    ControllerSnapshot, DeviceSnapshot, Histogram, NodeSnapshot, PendingSnapshot, PoolSnapshot,
    PoolSource, SessionSnapshot,
};

use crate::scheduler::WAIT_BOUNDS_US;
use crate::{lock, Shared};

/// Refusals kept for the dashboard.
const REFUSALS: usize = 32;
/// Refusals older than this are not shown.
const REFUSAL_AGE: Duration = Duration::from_secs(3600);

/// The node's own observations (part of [`crate::NodeState`]).
#[derive(Debug)]
pub struct Observed {
    placement: gpufuse_observe::snapshot::Recorder,
    refused: VecDeque<(Instant, String, String, String)>,
    started: HashMap<u64, Instant>,
    host: String,
}

impl Default for Observed {
    fn default() -> Self {
        Self {
            placement: gpufuse_observe::snapshot::Recorder::new(
                &gpufuse_observe::snapshot::PLACEMENT_BOUNDS,
            ),
            refused: VecDeque::new(),
            started: HashMap::new(),
            host: gpufuse_observe::snapshot::host_name(),
        }
    }
}

impl Observed {
    /// A placement decision took `took`; it admitted `session`, or was refused for `reason`.
    pub fn placed(
        &mut self,
        took: Duration,
        outcome: Result<u64, &str>,
        program: &str,
        pid: u32,
        tenant: Option<&str>,
    ) {
        self.placement.observe(took.as_secs_f64());
        match outcome {
            Ok(id) => {
                self.started.insert(id, Instant::now());
            }
            Err(reason) => {
                if self.refused.len() == REFUSALS {
                    self.refused.pop_front();
                }
                self.refused.push_back((
                    Instant::now(),
                    format!("{program} (pid {pid})"),
                    tenant.unwrap_or("-").to_string(),
                    reason.to_string(),
                ));
            }
        }
    }

    pub fn host(&self) -> &str {
        &self.host
    }
}

/// The node's state as the observer's source.
pub struct NodeSource {
    pub state: Shared,
    /// Whether to report the `gpufuse_pool_*` series as a pool of one (`gpufuse serve`).
    pub pool_of_one: bool,
}

impl PoolSource for NodeSource {
    fn snapshot(&self) -> PoolSnapshot {
        snapshot(&self.state, self.pool_of_one)
    }
}

/// The node's devices and sessions now.
pub fn snapshot(state: &Shared, pool_of_one: bool) -> PoolSnapshot {
    let mut s = lock(state);
    let live: Vec<u64> = s.sessions.keys().copied().collect();
    s.observed.started.retain(|id, _| live.contains(id));
    let host = s.observed.host.clone();
    let bounds: Vec<f64> = WAIT_BOUNDS_US.iter().map(|&b| b as f64 / 1e6).collect();
    let mut sessions: Vec<SessionSnapshot> = s
        .sessions
        .iter()
        .map(|(&id, r)| {
            let queue = s.queues.get(r.device as usize);
            let (usage, on_device) = queue.map(|q| q.usage(id)).unwrap_or_default();
            let recent = usage.last_second_us > 0;
            SessionSnapshot {
                id,
                node: host.clone(),
                device: r.device,
                tenant: r.subject.clone().unwrap_or_else(|| "-".into()),
                qos: r.qos.name().to_string(),
                program: r.program.clone(),
                pid: r.pid,
                memory_used_bytes: r.used,
                memory_limit_bytes: r.limit,
                compute_share: r.compute.map(|c| f64::from(c) / 100.0),
                device_seconds: usage.device_time_us as f64 / 1e6,
                busy_ratio: (usage.last_second_us as f64 / 1e6).min(1.0),
                queue_wait: Histogram::from_counts(
                    &bounds,
                    &usage.queue_wait.counts,
                    usage.queue_wait.sum_us as f64 / 1e6,
                ),
                queue_p50_seconds: usage.queue_p50_us as f64 / 1e6,
                queue_p99_seconds: usage.queue_p99_us as f64 / 1e6,
                throttled_seconds: usage.throttled_us as f64 / 1e6,
                state: gpufuse_observe::snapshot::session_state(on_device, recent).into(),
                // Elastic sessions: what is on the device now, and what waits in host
                // memory or on disk (`--vram-oversubscribe`, `--idle-ttl`).
                swapped_bytes: Some(r.elastic.swapped_host + r.elastic.swapped_disk),
                resident_bytes: Some(r.used),
                age_seconds: s
                    .observed
                    .started
                    .get(&id)
                    .map_or(0.0, |t| t.elapsed().as_secs_f64()),
            }
        })
        .collect();
    sessions.sort_by_key(|x| x.id);
    let devices = s
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (busy, promised_percent) = s.queues.get(i).map_or((0, 0), |q| {
                let now = q.now();
                let sched = q.lock();
                (sched.busy_last_second(now), sched.promised_percent())
            });
            DeviceSnapshot {
                node: host.clone(),
                index: i as u32,
                uuid: gpufuse_observe::snapshot::uuid_string(&d.uuid),
                model: d.name.clone(),
                kind: match d.kind {
                    gpufuse_proto::DeviceKind::Cuda => "cuda",
                    gpufuse_proto::DeviceKind::Emulated => "emu",
                }
                .into(),
                memory_total_bytes: d.total,
                memory_used_bytes: d.used,
                memory_promised_bytes: d.promised,
                busy_ratio: (busy as f64 / 1e6).min(1.0),
                sessions: sessions.iter().filter(|x| x.device == i as u32).count() as u32,
                compute_promised_percent: promised_percent,
            }
        })
        .collect();
    let pending: Vec<PendingSnapshot> = s
        .observed
        .refused
        .iter()
        .filter(|(t, ..)| t.elapsed() < REFUSAL_AGE)
        .rev()
        .map(|(t, what, tenant, reason)| PendingSnapshot {
            what: what.clone(),
            tenant: tenant.clone(),
            reason: reason.clone(),
            age_seconds: t.elapsed().as_secs_f64(),
            state: "refused".into(),
        })
        .collect();
    let controller = pool_of_one.then(|| ControllerSnapshot {
        sessions_by_state: vec![
            ("running".into(), sessions.len() as u64),
            ("pending".into(), 0),
        ],
        placement: s.observed.placement.histogram(),
        nodes: vec![NodeSnapshot {
            name: host.clone(),
            state: "ready".into(),
            address: String::new(),
        }],
    });
    PoolSnapshot {
        role: "node".into(),
        host,
        compute_policy: s.compute_policy.name().into(),
        devices,
        sessions,
        pending,
        controller,
        image_cache: image_cache(&s),
    }
}

/// The image cache's figures, when the node has a cache.
fn image_cache(s: &crate::NodeState) -> Option<gpufuse_observe::ImageCacheSnapshot> {
    let c = s.image_cache.status();
    c.dir.as_ref()?;
    Some(gpufuse_observe::ImageCacheSnapshot {
        entries: c.entries,
        bytes: c.bytes,
        limit_bytes: c.limit_bytes,
        received: c.counts.received,
        received_bytes: c.counts.received_bytes,
        hits: c.counts.hits,
        hit_bytes: c.counts.hit_bytes,
        corrupt: c.counts.corrupt,
    })
}
