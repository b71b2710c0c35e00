//! The pool's messages: what a node's agent tells the controller, what the controller tells
//! clients (a redirect to the node that serves them, with a grant), and the pool view
//! `gpufuse status` shows.
//!
//! ```text
//!  node agent                               controller
//!    | Hello{kind: NodeAgent, token} -------> |   (token checked like a session's)
//!    | <---- HelloReply PoolAgent{grant_key, heartbeat_ms}
//!    | Control NodeReport (registration) ---> |   devices, labels, sessions: the node is the truth
//!    | <-------------- ControlReply AgentAnswer
//!    | Control NodeReport (heartbeat) ------> |   every heartbeat_ms, and when sessions change
//!    | <-------------- ControlReply AgentAnswer
//!
//!  client                                   controller                       node
//!    | Hello{kind: Cuda, token, resources} -> |  quota, filters, policy
//!    |                                        |  (waits in the pending queue while nothing fits)
//!    | <--- HelloReply Redirect{address, grant}
//!    | Hello{kind: Cuda, token: grant, resources} ---------------------------> |  grant verified
//!    | <------------------------------------------------ HelloReply Accepted  |  (device pinned)
//! ```
//!
//! A grant is signed with a key the controller hands the node at registration (HMAC-SHA256,
//! `gpufuse_auth::seal`), names the node, the device, the slice, the tenant and the pool's
//! session id, and expires within seconds: a client can neither pick its own device nor skip
//! the controller's quotas. The controller ends a preempted session through the node's own
//! `End` hello, with a signed [`EndOrder`] as the token.
//!
//! The agent's link uses `Control`/`ControlReply` frames, whose bodies there are
//! [`NodeReport`] and [`AgentAnswer`] (on a worker's control socket they are
//! `ControlRequest`/`ControlAnswer`): the frame kind says "a message between daemons", the
//! connection says which.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::SessionId;
use crate::Qos;

/// One device as a node reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDeviceReport {
    pub index: u32,
    pub model: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub memory_promised_bytes: u64,
    pub compute_capability: (u32, u32),
    /// FP32 peak in thousandths of a TFLOPS (modelled for an emulated device).
    pub capacity_mtflops: u64,
    pub utilization_percent: u32,
    pub uuid: [u8; 16],
}

/// One session as a node reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSessionReport {
    /// The pool's id, from the session's grant.
    pub pool_session: Option<SessionId>,
    /// The node's id (what `gpufuse kill` on that node takes).
    pub node_session: SessionId,
    pub tenant: Option<String>,
    pub device: u32,
    pub vram_limit_bytes: Option<u64>,
    pub compute_percent: Option<u32>,
    pub qos: Qos,
    pub memory_used_bytes: u64,
    /// The Kubernetes claim (its UID) whose token the node admitted the session with, on the
    /// claim's allocated device and without a grant (protocol 12). Such a session is bound
    /// to its device (the pool never moves it) and is charged to its namespace's quota
    /// through its claim, which the operator charges at allocation.
    pub claim: Option<String>,
}

/// A node's registration (the first report on a link) or heartbeat (every later one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub name: String,
    /// Where clients reach the node.
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub devices: Vec<PoolDeviceReport>,
    pub sessions: Vec<PoolSessionReport>,
}

/// The controller's answer to a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentAnswer {
    Ack,
    /// The report is not accepted (another live node has that name): the link closes.
    Refused {
        reason: String,
    },
}

/// What a grant lets its bearer do on one node: start session `session` on `device` with
/// these limits. Signed by the controller with the node's grant key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub session: SessionId,
    pub node: String,
    pub device: u32,
    pub vram_bytes: Option<u64>,
    pub compute_percent: Option<u32>,
    pub qos: Qos,
    pub tenant: String,
    /// Unix seconds after which the node refuses it.
    pub expires: u64,
}

/// The controller's order to end a node's session (preemption), signed like a grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndOrder {
    pub node: String,
    pub node_session: SessionId,
    pub expires: u64,
}

/// The signed-token kinds of the pool (`gpufuse_auth::seal`'s `kind`).
pub const GRANT_KIND: &str = "gfg1";
pub const END_ORDER_KIND: &str = "gfe1";

/// The pool as `gpufuse status --server CONTROLLER` shows it (and `--json` prints it; the
/// schema is documented in `docs/pool.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// `binpack`, `spread` or `balanced`.
    pub policy: String,
    pub nodes: Vec<PoolNodeView>,
    /// Placed sessions (`starting`, `running`, `lost`) and waiting ones (`pending`).
    pub sessions: Vec<PoolSessionView>,
    pub pending: Vec<PoolPendingView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolNodeView {
    pub name: String,
    pub address: String,
    /// `ready` or `lost`.
    pub state: String,
    /// Nothing new is placed here (`gpufuse node cordon`, `gpufuse node drain`).
    pub cordoned: bool,
    pub labels: BTreeMap<String, String>,
    /// Milliseconds since its last report.
    pub last_heard_ms: u64,
    pub devices: Vec<PoolDeviceView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDeviceView {
    pub index: u32,
    pub model: String,
    pub compute_capability: (u32, u32),
    pub memory_total_bytes: u64,
    /// Charged to sessions: slices, or measured use of sessions without one.
    pub memory_promised_bytes: u64,
    /// Measured by the node.
    pub memory_used_bytes: u64,
    pub compute_promised_percent: u32,
    pub utilization_percent: u32,
    /// Sessions placed on it.
    pub sessions: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSessionView {
    pub id: SessionId,
    pub tenant: String,
    /// `None` while pending.
    pub node: Option<String>,
    pub device: Option<u32>,
    /// `pending`, `starting`, `running`, `moving` (to another device; `node` and `device`
    /// say where it runs until the move lands) or `lost`.
    pub state: String,
    pub vram_limit_bytes: Option<u64>,
    pub compute_percent: Option<u32>,
    /// `low`, `medium`, `high` or `critical`.
    pub qos: String,
    pub memory_used_bytes: u64,
    /// The node's id of the session (for `gpufuse kill --server NODE`).
    pub node_session: Option<SessionId>,
    /// The Kubernetes claim (UID) it runs under: its node admitted it on the claim's token,
    /// and it stays on the claim's device (protocol 12).
    pub claim: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolPendingView {
    pub id: SessionId,
    pub tenant: String,
    pub vram_bytes: Option<u64>,
    pub compute_percent: Option<u32>,
    pub qos: String,
    /// Why it does not fit now.
    pub reason: String,
    pub waiting_ms: u64,
}
