//! What a process shows: one consistent picture of its devices, sessions and (for a
//! controller) nodes, taken when asked. Every page, metric and report is computed from these.

use serde::{Deserialize, Serialize};

/// Where the figures come from: a node's state, a controller's pool, a test's fake.
///
/// `snapshot` is called once per scrape, dashboard poll and history sample (once a second),
/// from the observer's own threads: it should copy what it needs under its locks and return.
pub trait PoolSource: Send + Sync + 'static {
    fn snapshot(&self) -> PoolSnapshot;
    /// Whether the process is ready to take sessions (`/readyz`); alive is `/healthz`.
    fn ready(&self) -> bool {
        true
    }
}

impl<F: Fn() -> PoolSnapshot + Send + Sync + 'static> PoolSource for F {
    fn snapshot(&self) -> PoolSnapshot {
        self()
    }
}

/// A histogram's buckets (upper bound in seconds, observations in that bucket alone; the
/// last bound is `f64::MAX`, Prometheus's `+Inf`), sum and count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// Builds one from per-bucket counts over `bounds` plus the overflow bucket, and the sum.
    pub fn from_counts(bounds: &[f64], counts: &[u64], sum: f64) -> Self {
        let mut buckets: Vec<(f64, u64)> =
            bounds.iter().copied().zip(counts.iter().copied()).collect();
        buckets.push((f64::MAX, counts.get(bounds.len()).copied().unwrap_or(0)));
        Self {
            buckets,
            sum,
            count: counts.iter().sum(),
        }
    }
}

/// Placement-time buckets, in seconds.
pub const PLACEMENT_BOUNDS: [f64; 8] = [1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 1e-1];

/// Observations counted into fixed buckets, for a process that keeps its own histogram.
#[derive(Clone, Debug)]
pub struct Recorder {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
}

impl Recorder {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    /// Counts one observation of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        let i = self.bounds.partition_point(|&b| b < seconds);
        self.counts[i] += 1;
        self.sum += seconds;
    }

    pub fn histogram(&self) -> Histogram {
        Histogram::from_counts(self.bounds, &self.counts, self.sum)
    }
}

/// One device, as DCGM names it where the meaning is the same.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// The node (host) the device is on (`Hostname`, `node`).
    pub node: String,
    /// Its index on the node (`gpu`).
    pub index: u32,
    /// `GPU-xxxxxxxx-...` (`UUID`).
    pub uuid: String,
    /// The model (`modelName`), e.g. `NVIDIA H100 80GB HBM3` or the emulated model.
    pub model: String,
    /// `cuda` or `emu`.
    pub kind: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub memory_promised_bytes: u64,
    /// Measured kernel time over the last second, 0..=1.
    pub busy_ratio: f64,
    pub sessions: u32,
    /// Compute percent promised to its sessions.
    pub compute_promised_percent: u32,
}

/// One session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionSnapshot {
    pub id: u64,
    pub node: String,
    pub device: u32,
    /// The token's subject; `-` on a node that does not check tokens.
    pub tenant: String,
    /// `low`, `medium`, `high`, `critical`.
    pub qos: String,
    pub program: String,
    pub pid: u32,
    pub memory_used_bytes: u64,
    /// Its memory slice; `None`: no slice (the device's free memory).
    pub memory_limit_bytes: Option<u64>,
    /// Its promised compute share, 0..=1; `None`: no share (best effort).
    pub compute_share: Option<f64>,
    /// Measured kernel time since it started.
    pub device_seconds: f64,
    /// Measured kernel time over the last second, 0..=1.
    pub busy_ratio: f64,
    /// Time its leases waited for the device.
    pub queue_wait: Histogram,
    pub queue_p50_seconds: f64,
    pub queue_p99_seconds: f64,
    /// Time it waited because its hard share was used up.
    pub throttled_seconds: f64,
    /// `running` (holds the device now), `active`, `idle`, or what an elastic session reports.
    pub state: String,
    /// Swapped-out and resident bytes, once elastic sessions exist.
    pub swapped_bytes: Option<u64>,
    pub resident_bytes: Option<u64>,
    /// Seconds since it started.
    pub age_seconds: f64,
}

/// A session that is not running yet (or was refused recently), and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingSnapshot {
    /// What identifies it: a session id, or the program and pid of a refused client.
    pub what: String,
    pub tenant: String,
    pub reason: String,
    /// Seconds since it asked.
    pub age_seconds: f64,
    /// `pending` (waiting for placement) or `refused`.
    pub state: String,
}

/// One node, as a controller sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSnapshot {
    pub name: String,
    /// One of [`NODE_STATES`].
    pub state: String,
    pub address: String,
}

/// The states a controller's node is in (`gpufuse_scheduler::NodeState`): `ready`
/// (heartbeating; sessions are placed there) or `lost` (silent past the heartbeat timeout, or
/// its link closed). `gpufuse_nodes` has a sample for each, 0 included.
pub const NODE_STATES: [&str; 2] = ["ready", "lost"];

/// A controller's figures: the pool's sessions by state, placement times, nodes by state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControllerSnapshot {
    pub sessions_by_state: Vec<(String, u64)>,
    pub placement: Histogram,
    pub nodes: Vec<NodeSnapshot>,
}

/// Everything one process shows at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// `node` for `gpufuse serve`/`gpufuse node`, `controller` for `gpufuse controller`.
    pub role: String,
    /// This process's host name.
    pub host: String,
    /// `elastic` or `hard`.
    pub compute_policy: String,
    pub devices: Vec<DeviceSnapshot>,
    pub sessions: Vec<SessionSnapshot>,
    pub pending: Vec<PendingSnapshot>,
    pub controller: Option<ControllerSnapshot>,
    /// The node's image cache (`gpufuse serve --image-cache`), when it has one.
    #[serde(default)]
    pub image_cache: Option<ImageCacheSnapshot>,
}

/// A node's module image cache: its size now and what its workers reported since it started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageCacheSnapshot {
    pub entries: u64,
    pub bytes: u64,
    pub limit_bytes: u64,
    /// Images clients sent in full (the cache did not have them).
    pub received: u64,
    pub received_bytes: u64,
    /// Images found in the cache (clients sent only their hash).
    pub hits: u64,
    pub hit_bytes: u64,
    /// Entries found corrupt on read (dropped and sent again).
    pub corrupt: u64,
}

/// A session's state from what a node knows: `running` (holds the device now), `active` (ran
/// kernels in the last second) or `idle`.
pub fn session_state(on_device: bool, ran_last_second: bool) -> &'static str {
    if on_device {
        "running"
    } else if ran_last_second {
        "active"
    } else {
        "idle"
    }
}

/// `GPU-` and the UUID's canonical form, as `nvidia-smi -L` prints it.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// This machine's host name (`/proc/sys/kernel/hostname`, `HOSTNAME`, or `localhost`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}
