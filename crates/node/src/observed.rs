//! What the node shows over `--http` (`gpufuse_observe`): its state as a
//! [`PoolSnapshot`], and the few figures only the node sees as they happen (how long placing
//! a session took, refusals and why, when each session started).
//!
//! A standalone `gpufuse serve` is a pool of one node: it reports its placements, its
//! sessions by state (those waiting in its embedded controller's queue as `pending`) as the
//! controller's series (`gpufuse_pool_*`, `gpufuse_nodes`). A node run under a controller
//! leaves those to the controller (`pool_of_one: false`).
//!
//! Every control request of every worker (ledger, launch queue) takes the node's lock, so a
//! scrape holds it only to copy the figures it needs ([`Figures::copy`]); the launch queues'
//! figures, the image cache's directory and the embedded controller's queue are read after
//! the lock is released ([`Figures::build`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufuse_observe::{
    ControllerSnapshot, DeviceSnapshot, Histogram, NodeSnapshot, PendingSnapshot, PoolSnapshot,
    PoolSource, SessionSnapshot,
};
use gpufuse_proto::PoolPendingView;

use crate::agent::LocalController;
use crate::image_cache::ImageCacheBooks;
use crate::launch_policy::WAIT_BOUNDS_US;
use crate::{lock, DeviceQueue, DeviceState, NodeState, Shared};

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
    /// `gpufuse serve`'s embedded controller: the sessions waiting in its queue are shown as
    /// pending.
    pub local: Option<Arc<dyn LocalController>>,
}

impl PoolSource for NodeSource {
    fn snapshot(&self) -> PoolSnapshot {
        let figures = Figures::copy(&self.state);
        // The embedded controller has its own lock: asked with the node's released.
        let waiting = self.local.as_ref().map(|l| l.pending()).unwrap_or_default();
        figures.build(self.pool_of_one, &waiting)
    }
}

/// The node's devices and sessions now (without an embedded controller's queue).
pub fn snapshot(state: &Shared, pool_of_one: bool) -> PoolSnapshot {
    Figures::copy(state).build(pool_of_one, &[])
}

/// One session's figures, copied under the node's lock.
struct SessionFigures {
    id: u64,
    device: u32,
    tenant: String,
    qos: &'static str,
    program: String,
    pid: u32,
    used: u64,
    limit: Option<u64>,
    compute: Option<u32>,
    swapped: u64,
    age: Duration,
}

/// What a snapshot needs from the node's state, copied under its lock. It owns everything it
/// holds (the launch queues are shared handles with their own locks), so the snapshot is
/// built from it with the node's lock released.
pub struct Figures {
    host: String,
    compute_policy: &'static str,
    devices: Vec<DeviceState>,
    queues: Vec<Arc<DeviceQueue>>,
    sessions: Vec<SessionFigures>,
    refused: Vec<(Duration, String, String, String)>,
    placement: Histogram,
    image_cache: ImageCacheBooks,
}

impl Figures {
    /// Copies the figures, holding the node's lock only for the copy: no directory is read,
    /// no launch queue locked.
    pub fn copy(state: &Shared) -> Self {
        let mut guard = lock(state);
        let NodeState {
            devices,
            queues,
            compute_policy,
            sessions,
            observed,
            image_cache,
            ..
        } = &mut *guard;
        observed.started.retain(|id, _| sessions.contains_key(id));
        let sessions = sessions
            .iter()
            .map(|(&id, r)| SessionFigures {
                id,
                device: r.device,
                tenant: r.subject.clone().unwrap_or_else(|| "-".into()),
                qos: r.qos.name(),
                program: r.program.clone(),
                pid: r.pid,
                used: r.used,
                limit: r.limit,
                compute: r.compute,
                swapped: r.elastic.swapped_host + r.elastic.swapped_disk,
                age: observed
                    .started
                    .get(&id)
                    .map_or(Duration::ZERO, |t| t.elapsed()),
            })
            .collect();
        Figures {
            host: observed.host.clone(),
            compute_policy: compute_policy.name(),
            devices: devices.clone(),
            queues: queues.clone(),
            sessions,
            refused: observed
                .refused
                .iter()
                .map(|(t, what, tenant, reason)| {
                    (t.elapsed(), what.clone(), tenant.clone(), reason.clone())
                })
                .collect(),
            placement: observed.placement.histogram(),
            image_cache: image_cache.clone(),
        }
    }

    /// The snapshot: the launch queues' figures (each queue's own lock, briefly) and the
    /// image cache's directory are read now. `waiting`: the sessions in an embedded
    /// controller's queue (`gpufuse serve`).
    pub fn build(self, pool_of_one: bool, waiting: &[PoolPendingView]) -> PoolSnapshot {
        let host = self.host;
        let bounds: Vec<f64> = WAIT_BOUNDS_US.iter().map(|&b| b as f64 / 1e6).collect();
        let mut sessions: Vec<SessionSnapshot> = self
            .sessions
            .into_iter()
            .map(|r| {
                let queue = self.queues.get(r.device as usize);
                let (usage, on_device) = queue.map(|q| q.usage(r.id)).unwrap_or_default();
                let recent = usage.last_second_us > 0;
                SessionSnapshot {
                    id: r.id,
                    node: host.clone(),
                    device: r.device,
                    tenant: r.tenant,
                    qos: r.qos.to_string(),
                    program: r.program,
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
                    swapped_bytes: Some(r.swapped),
                    resident_bytes: Some(r.used),
                    age_seconds: r.age.as_secs_f64(),
                }
            })
            .collect();
        sessions.sort_by_key(|x| x.id);
        let devices = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (busy, promised_percent) = self.queues.get(i).map_or((0, 0), |q| {
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
        // Waiting sessions first (oldest first within each QoS, as the queue retries them),
        // then the refusals of the last hour, newest first.
        let mut pending: Vec<PendingSnapshot> = waiting.iter().map(pending_of).collect();
        pending.extend(
            self.refused
                .into_iter()
                .filter(|(age, ..)| *age < REFUSAL_AGE)
                .rev()
                .map(|(age, what, tenant, reason)| PendingSnapshot {
                    what,
                    tenant,
                    reason,
                    age_seconds: age.as_secs_f64(),
                    state: "refused".into(),
                }),
        );
        let controller = pool_of_one.then(|| ControllerSnapshot {
            sessions_by_state: vec![
                ("running".into(), sessions.len() as u64),
                ("pending".into(), waiting.len() as u64),
            ],
            placement: self.placement,
            nodes: vec![NodeSnapshot {
                name: host.clone(),
                state: "ready".into(),
                address: String::new(),
            }],
        });
        PoolSnapshot {
            role: "node".into(),
            host,
            compute_policy: self.compute_policy.into(),
            devices,
            sessions,
            pending,
            controller,
            image_cache: image_cache(&self.image_cache),
        }
    }
}

/// A session waiting in the embedded controller's queue, as the dashboard shows it (as a
/// controller's own `--http` does: `crates/controller/src/observed.rs`).
fn pending_of(p: &PoolPendingView) -> PendingSnapshot {
    PendingSnapshot {
        what: format!("session {}", p.id),
        tenant: p.tenant.clone(),
        reason: p.reason.clone(),
        age_seconds: p.waiting_ms as f64 / 1000.0,
        state: "pending".into(),
    }
}

/// The image cache's figures, when the node has a cache (its directory is read now).
fn image_cache(books: &ImageCacheBooks) -> Option<gpufuse_observe::ImageCacheSnapshot> {
    let c = books.status();
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

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Mutex};

    use gpufuse_proto::{ClientHello, ComputePolicy, DeviceKind, ResourceRequest, SessionKind};

    use super::*;

    fn node_with_a_session_and_a_cached_image(dir: &std::path::Path) -> (Shared, u64) {
        let device = DeviceState {
            name: "emu".into(),
            kind: DeviceKind::Emulated,
            total: 1 << 30,
            used: 0,
            promised: 0,
            uuid: [0; 16],
            pci: (0, 0, 0),
            peak_tflops: 100.0,
            compute_capability: (10, 0),
        };
        let mut node = NodeState::new(vec![device], vec![], ComputePolicy::Elastic);
        let cache = gpufuse_image_cache::ImageCache::open(dir, 1 << 20).unwrap();
        cache.put(&[7; 32], b"an image").unwrap();
        node.image_cache = ImageCacheBooks::new(Some(cache));
        let hello = ClientHello {
            protocol_version: gpufuse_proto::PROTOCOL_VERSION,
            kind: SessionKind::Cuda,
            token: String::new(),
            pid: 42,
            program: "observed-test".into(),
            resources: ResourceRequest::default(),
        };
        let id = node.admit(&hello, Some(64 << 20)).unwrap().id;
        (Arc::new(Mutex::new(node)), id)
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("gpufuse-observed-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Every worker's control request takes the node's lock: the snapshot's slow part (the
    /// image cache's directory, the launch queues) is built while another thread holds it.
    #[test]
    fn the_snapshot_is_built_with_the_node_lock_released() {
        let dir = temp_dir("lock");
        let (state, id) = node_with_a_session_and_a_cached_image(&dir);
        let figures = Figures::copy(&state);
        let held = lock(&state);
        let waiting = vec![PoolPendingView {
            id: gpufuse_proto::SessionId(9),
            tenant: "bob".into(),
            vram_bytes: Some(2 << 30),
            compute_percent: None,
            qos: "medium".into(),
            reason: "no device has 2 GiB free".into(),
            waiting_ms: 1500,
        }];
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(figures.build(true, &waiting));
        });
        let snap = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("building the snapshot waited for the node's lock");
        drop(held);
        let cache = snap.image_cache.expect("the node has a cache");
        assert_eq!((cache.entries, cache.bytes), (1, 8));
        assert_eq!(snap.sessions.len(), 1);
        let s = &snap.sessions[0];
        assert_eq!((s.id, s.pid, s.program.as_str()), (id, 42, "observed-test"));
        assert_eq!(s.memory_limit_bytes, Some(64 << 20));
        assert_eq!(s.state, "idle");
        assert_eq!(snap.devices[0].sessions, 1);
        assert_eq!(snap.devices[0].memory_promised_bytes, 64 << 20);
        // The embedded controller's queue is the pool of one's pending sessions.
        let p = &snap.pending[0];
        assert_eq!(
            (p.what.as_str(), p.tenant.as_str(), p.state.as_str()),
            ("session 9", "bob", "pending")
        );
        assert_eq!(p.reason, "no device has 2 GiB free");
        assert_eq!(p.age_seconds, 1.5);
        let c = snap.controller.expect("a pool of one");
        assert_eq!(
            c.sessions_by_state,
            [("running".to_string(), 1), ("pending".to_string(), 1)]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `gpufuse status` reads the image cache's directory too, after the lock is released;
    /// what is read under the lock leaves the directory alone.
    #[test]
    fn status_under_the_lock_leaves_the_image_cache_directory_to_node_status() {
        let dir = temp_dir("status");
        let (state, _) = node_with_a_session_and_a_cached_image(&dir);
        let under_lock = lock(&state).status().image_cache;
        assert_eq!((under_lock.entries, under_lock.bytes), (0, 0));
        assert_eq!(under_lock.dir, Some(dir.display().to_string()));
        let full = crate::node_status(&state).image_cache;
        assert_eq!((full.entries, full.bytes), (1, 8));
        assert_eq!(full.limit_bytes, 1 << 20);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
