//! Placement for a gpufuse pool: which GPU of which node serves a new session.
//!
//! This crate is the controller's brain and nothing else: no sockets, no threads, no clock.
//! Time is a number of milliseconds the caller passes in ([`Millis`]), so tests drive it with
//! a simulated clock and the simulator ([`sim`]) replays a day of arrivals in a second. The
//! controller (`gpufuse-controller`) feeds it what nodes report and carries out its
//! decisions; the Kubernetes operator reuses it the same way (a GPUPool is a [`NodeGroup`]
//! with its policy, a GPUQuota a tenant of the [`QuotaFile`]).
//!
//! # The model
//! - A [`Pool`] holds nodes ([`NodeSpec`]: name, address, labels, devices), each `ready` or
//!   `lost` ([`NodeState`]); every device has a ledger of what is *charged* to it: a
//!   session's VRAM slice (or, for a session without one, the memory it was measured using)
//!   and its compute share. A device's free memory is its total less its charges; the
//!   policies rank devices by it, and by measured utilization, never by guesses.
//! - A [`Request`] asks for a slice (VRAM, compute percent), a QoS, node labels
//!   (`--selector K=V`) and a GPU model. [`Pool::submit`] checks the tenant's quota
//!   ([`QuotaFile`]), filters the devices, and places the session by the pool's [`Policy`]:
//!   `binpack` (the fullest device that fits: frees whole GPUs), `spread` (the emptiest:
//!   least interference) or `balanced` (the fullest node, the emptiest device inside it).
//!   Node groups ([`NodeGroup`], [`Pool::set_group`]: a Kubernetes `GPUPool`) have a policy
//!   of their own: each group's policy picks among its nodes, and the pool's policy picks
//!   among the groups' picks (and the nodes in no group).
//! - A request that fits nowhere waits in the pending queue with its reason
//!   ([`Pool::pending`]); [`Pool::retry_pending`] places what fits after capacity frees (one
//!   waiting past [`AGING_MS`] keeps the device it needs from younger requests). A
//!   `high` or `critical` request that fits nowhere may instead preempt `low` sessions: the
//!   device needing the fewest victims is found by simulating their release
//!   ([`Pool::plan_preemption`]).
//! - Nodes report their sessions; the node is the truth: [`Pool::register_node`] reconciles
//!   the pool with a node's report (after a node came back, or after the controller
//!   restarted and lost everything it knew).
//!
//! - Tenant quotas come from a TOML file ([`QuotaFile`]). Slices placed outside the pool count
//!   against them too: a Kubernetes claim the cluster's scheduler allocated is charged to its
//!   tenant's quota ([`ClaimCharge`]) and charges no device.
//!
//! Placement uses ordered indexes over devices and nodes, so one decision costs a few tree
//! lookups, not a scan of every GPU: 10,000 sessions on 8,000 GPUs place in milliseconds
//! (`gpufuse simulate`, `docs/pool.md`).
//!
//! Besides `pool.rs` (the ledger, filters, policies, the pending queue, preemption) and
//! `quota.rs`: `defrag.rs`, moving sessions between devices (moves in the ledger, charged on
//! both devices until they land; cordons; where a session may move; drain and defragmentation
//! plans), and [`sim`], synthetic traces and their replay (`gpufuse simulate`).

#![forbid(unsafe_code)]

mod defrag;
mod pool;
mod quota;
pub mod sim;

pub use defrag::{DrainPlan, InFlight, Move, MoveEnd};
pub use gpufuse_proto::Qos;
pub use pool::{
    ClaimCharge, Decision, DeviceLoad, NodeGroup, Pending, Placement, Pool, PoolDevice, PoolNode,
    PreemptionPlan, Rejected, Session, SessionReport, SessionState, Victim, AGED_FENCES_MAX,
    AGING_MS, START_TIMEOUT_MS,
};
pub use quota::{human_bytes, parse_size, QuotaError, QuotaFile, TenantQuota, TenantUsage};

use std::collections::BTreeMap;

/// Milliseconds on the caller's clock (monotonic; any origin).
pub type Millis = u64;

/// The pool's id of a session (assigned by [`Pool::submit`], or reported by a node).
pub type SessionId = u64;

/// How devices are chosen among those that fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// The device with the least free memory that fits (best fit), on the fullest node:
    /// sessions pack onto few GPUs and whole GPUs stay free for big requests.
    Binpack,
    /// The device with the most free memory, the least busy among equals: sessions see the
    /// least interference.
    Spread,
    /// Binpack nodes, spread inside a node: the fullest node that has a device that fits,
    /// and on it the emptiest device. Frees whole nodes while neighbours on one node share
    /// the load. The default.
    #[default]
    Balanced,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Binpack, Policy::Spread, Policy::Balanced];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Balanced => "balanced",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "binpack" => Ok(Policy::Binpack),
            "spread" => Ok(Policy::Spread),
            "balanced" => Ok(Policy::Balanced),
            _ => Err(format!(
                "bad policy {s:?}: expected binpack, spread or balanced"
            )),
        }
    }
}

/// One GPU as its node describes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSpec {
    /// The device's index on its node (what the session's client sees as device 0).
    pub index: u32,
    /// The model's name (e.g. "NVIDIA B200 (gpufuse emulated)"); `--gpu-model` matches a
    /// case-insensitive substring of it.
    pub model: String,
    pub memory_total: u64,
    pub compute_capability: (u32, u32),
    /// Measured or modelled FP32 peak, in thousandths of a TFLOPS.
    pub capacity_mtflops: u64,
    /// NVIDIA's text form (`GPU-...`); empty when the node did not say.
    #[serde(default)]
    pub uuid: String,
}

/// A node as it registers: the same node (by name) registering again replaces what the pool
/// knew about it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeSpec {
    pub name: String,
    /// Where clients reach the node (`unix:PATH`, `tcp:HOST:PORT`, `tcp+tls:HOST:PORT`).
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub devices: Vec<DeviceSpec>,
}

/// Whether a node may receive sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Heartbeating: sessions may be placed on it.
    Ready,
    /// Silent for longer than the heartbeat timeout (or its link closed): nothing is placed
    /// there, and its sessions are shown lost until it reports them again.
    Lost,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Ready => "ready",
            NodeState::Lost => "lost",
        }
    }
}

/// What a new session asks of the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// Who is charged ([`DEFAULT_TENANT`] when nobody is named).
    pub tenant: String,
    /// The VRAM slice; `None` asks for no slice (the session may use what is free, and is
    /// charged what it is measured using).
    pub vram_bytes: Option<u64>,
    /// The compute share in percent of one device.
    pub compute_percent: Option<u32>,
    /// The compute share as FP32 TFLOPS instead (`--tflops`): on each device it is the
    /// percentage of that device's measured capacity, so it fits a big GPU where it would not
    /// fit a small one. At most one of `compute_percent` and `tflops`.
    #[serde(default)]
    pub tflops: Option<u32>,
    pub qos: Qos,
    /// Node labels that must all match (`--selector K=V`).
    pub selector: BTreeMap<String, String>,
    /// A case-insensitive substring of the device model's name (`--gpu-model`).
    pub gpu_model: Option<String>,
    /// The one device (its UUID) the session may run on: a Kubernetes claim's allocated
    /// device, from its token.
    #[serde(default)]
    pub device_uuid: Option<String>,
}

/// The tenant of a session whose client named none.
pub const DEFAULT_TENANT: &str = "default";
