//! The pool's ledger and its placement decisions.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::quota::{human_bytes, QuotaError, QuotaFile, TenantUsage};
use crate::{Millis, NodeSpec, NodeState, Policy, Qos, Request, SessionId, DEFAULT_TENANT};

/// What a node last measured on a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceLoad {
    /// Percent of the last second the device ran kernels.
    pub utilization_percent: u32,
    /// Bytes its sessions hold.
    pub memory_used: u64,
}

/// One GPU and its ledger.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolDevice {
    pub spec: crate::DeviceSpec,
    /// Memory charged to sessions: their slices, or what a session without a slice was
    /// measured using.
    pub charged_memory: u64,
    /// Compute shares promised to sessions, in percent.
    pub charged_compute: u32,
    pub load: DeviceLoad,
    /// The sessions placed here (starting, running or lost).
    pub sessions: Vec<SessionId>,
}

impl PoolDevice {
    /// Memory not charged to any session.
    pub fn free_memory(&self) -> u64 {
        self.spec.memory_total.saturating_sub(self.charged_memory)
    }
    /// Compute share not promised to any session, in percent.
    pub fn free_compute(&self) -> u32 {
        100u32.saturating_sub(self.charged_compute)
    }

    /// Whether session `id` of `bytes` and `compute` percent fits here (on node `node`), or
    /// why not.
    pub(crate) fn room_for(
        &self,
        node: &str,
        id: SessionId,
        bytes: u64,
        compute: u32,
    ) -> Result<(), String> {
        let device = self.spec.index;
        if self.free_memory() < bytes {
            return Err(format!(
                "device {device} of node {node} has {} not promised; session {id} needs {}",
                human_bytes(self.free_memory()),
                human_bytes(bytes)
            ));
        }
        if self.free_compute() < compute {
            return Err(format!(
                "device {device} of node {node} has {}% compute not promised; session {id} \
                 needs {compute}%",
                self.free_compute()
            ));
        }
        Ok(())
    }
}

/// One node: what it registered, whether it is heard from, its devices' ledgers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolNode {
    pub spec: NodeSpec,
    pub state: NodeState,
    /// When the node last reported (the caller's clock).
    pub last_heard: Millis,
    /// Same order as `spec.devices`.
    pub devices: Vec<PoolDevice>,
    /// Nothing new is placed here (`gpufuse node drain`); its sessions keep running until
    /// they move. The controller's own memory: a restarted controller forgets it.
    #[serde(default)]
    pub cordoned: bool,
}

impl PoolNode {
    /// Ready and not cordoned: sessions may be placed (or moved) here.
    pub fn placeable(&self) -> bool {
        self.state == NodeState::Ready && !self.cordoned
    }
    fn free_memory(&self) -> u64 {
        self.devices.iter().map(PoolDevice::free_memory).sum()
    }
    pub(crate) fn position_of(&self, device_index: u32) -> Option<usize> {
        self.position(device_index)
    }
    fn position(&self, device_index: u32) -> Option<usize> {
        self.devices
            .iter()
            .position(|d| d.spec.index == device_index)
    }
}

/// Where a session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    /// Placed; its client has not reached the node yet (or the node has not reported it).
    /// Forgotten at `expires` if the node never reports it.
    Starting { expires: Millis },
    /// Reported by its node.
    Running,
    /// Its node is lost; it may still run there.
    Lost,
}

impl SessionState {
    pub fn name(self) -> &'static str {
        match self {
            SessionState::Starting { .. } => "starting",
            SessionState::Running => "running",
            SessionState::Lost => "lost",
        }
    }
}

/// A placed session.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Session {
    pub id: SessionId,
    pub tenant: String,
    pub node: String,
    /// The device's index on its node.
    pub device: u32,
    pub vram_limit: Option<u64>,
    pub compute_percent: Option<u32>,
    pub qos: Qos,
    pub state: SessionState,
    /// Bytes the node last measured it holding.
    pub memory_used: u64,
    /// The node's own id of the session (what `gpufuse kill` on that node takes), once
    /// reported.
    pub node_session: Option<u64>,
    /// The node labels it asked for (`--selector`): a move keeps to nodes that have them.
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    /// Bound to its device (a Kubernetes claim's allocated device): it never moves.
    #[serde(default)]
    pub pinned: bool,
    /// The Kubernetes claim (UID) its node admitted it under, without the pool (a pod's
    /// session on a pool node): pinned, and charged to the namespace's quota by its claim.
    #[serde(default)]
    pub claim: Option<String>,
}

impl Session {
    pub(crate) fn memory_charge(&self) -> u64 {
        self.vram_limit.unwrap_or(self.memory_used)
    }
    fn usage(&self) -> TenantUsage {
        TenantUsage {
            vram: self.vram_limit.unwrap_or(0),
            compute: self.compute_percent.unwrap_or(0),
            sessions: 1,
        }
    }
}

/// A session a node reports (registration or heartbeat).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionReport {
    /// The pool's id, from the grant the session was admitted with (`None` for a session
    /// the node admitted on its own).
    pub pool_session: Option<SessionId>,
    pub node_session: u64,
    pub tenant: Option<String>,
    pub device: u32,
    pub vram_limit: Option<u64>,
    pub compute_percent: Option<u32>,
    pub qos: Qos,
    pub memory_used: u64,
    /// The Kubernetes claim (UID) whose token admitted it on its node, without the pool: it
    /// is bound to the claim's device.
    pub claim: Option<String>,
}

/// A slice placed outside the pool and charged to a tenant: a Kubernetes `ResourceClaim`
/// the cluster's scheduler allocated (the operator charges it). It counts against the
/// tenant's quota as one session with its VRAM and compute, so claims and sessions share one
/// quota; it charges no device: the session a pod runs under the claim is reported by its
/// node like any other, under the claim's own name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClaimCharge {
    pub tenant: String,
    /// The node it was allocated on (the cluster's name for it).
    pub node: String,
    pub vram_bytes: u64,
    /// In percent of one device (a claim on several devices sums them).
    pub compute_percent: u32,
}

impl ClaimCharge {
    fn usage(&self) -> TenantUsage {
        TenantUsage {
            vram: self.vram_bytes,
            compute: self.compute_percent,
            sessions: 1,
        }
    }
}

/// A request waiting for capacity.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    pub id: SessionId,
    /// The request as it will be charged (quota defaults applied).
    pub request: Request,
    /// Why it does not fit now.
    pub reason: String,
    pub since: Millis,
}

/// Where a session goes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    pub session: SessionId,
    pub tenant: String,
    pub node: String,
    /// Where its client reaches the node.
    pub address: String,
    /// The device's index on the node.
    pub device: u32,
    pub vram_bytes: Option<u64>,
    pub compute_percent: Option<u32>,
    pub qos: Qos,
}

/// A `low` session to move or end so that a `high` or `critical` one fits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Victim {
    pub session: SessionId,
    pub node: String,
    pub address: String,
    pub node_session: u64,
    /// Where it moves instead of ending (node, device): charged there already, until the
    /// move is settled ([`Pool::finish_move`]).
    #[serde(default)]
    pub move_to: Option<(String, u32)>,
}

/// A placement that needs victims moved or ended first (they are out of the device's
/// ledger already: moved ones are charged where they go).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreemptionPlan {
    pub victims: Vec<Victim>,
    pub placement: Placement,
}

/// What [`Pool::submit`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Placed(Placement),
    /// Waiting in the pending queue (its id is the session's id once placed).
    Pending {
        id: SessionId,
        reason: String,
    },
    Preempt(PreemptionPlan),
}

/// A request that can never be placed as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejected {
    #[error(transparent)]
    Quota(#[from] QuotaError),
    #[error("{0}")]
    Invalid(String),
}

/// A device (node, position) and the sessions to end there.
pub type Victims = (u32, usize, Vec<SessionId>);

/// Index key of a device on a ready node: free memory, its node's free memory, node, device
/// position.
type DeviceKey = (u64, u64, u32, u32);

/// How long a placed session may take to show up in its node's reports.
pub const START_TIMEOUT_MS: Millis = 30_000;

/// How long a pending request waits before it holds back younger requests (of its QoS or
/// lower) from the device where it could next fit ([`Pool::retry_pending`]): the queue's
/// bound against starvation. A minute: well past a client's default wait (8 s), so only
/// clients that asked to wait long (`gpufuse run --wait`) ever age.
pub const AGING_MS: Millis = 60_000;

/// Most devices kept for aged requests at once (the oldest of the highest QoS first): bounds
/// the capacity that waits idle for them.
pub const AGED_FENCES_MAX: usize = 16;

/// A device kept for an aged pending request during one placement pass: its free memory and
/// compute are charged to the fence, so nothing else lands there.
#[derive(Debug)]
struct Fence {
    n: u32,
    p: usize,
    memory: u64,
    compute: u32,
    for_id: SessionId,
}

/// The pool: nodes, devices, sessions, pending requests, quotas and the policy.
#[derive(Clone, Debug)]
pub struct Pool {
    policy: Policy,
    quotas: QuotaFile,
    pub(crate) nodes: Vec<PoolNode>,
    by_name: HashMap<String, u32>,
    sessions: BTreeMap<SessionId, Session>,
    pending: Vec<Pending>,
    usage: HashMap<String, TenantUsage>,
    /// Slices placed outside the pool, by the caller's key (a claim's uid).
    claims: BTreeMap<String, ClaimCharge>,
    next_id: SessionId,
    devices_by_free: BTreeSet<DeviceKey>,
    nodes_by_free: BTreeSet<(u64, u32)>,
    /// Node groups with a policy of their own (a Kubernetes `GPUPool`), by name.
    groups: BTreeMap<String, NodeGroup>,
    /// Each node's group (an index into `groups`' order), by node index; empty without groups.
    group_of: Vec<Option<u32>>,
    /// The groups' policies in `groups`' order.
    group_policies: Vec<Policy>,
    /// Sessions on their way to another device ([`Pool::begin_move`]): charged at the target.
    pub(crate) moving: BTreeMap<SessionId, crate::defrag::InFlight>,
}

/// Nodes placed by a policy of their own rather than the pool's: a Kubernetes `GPUPool`
/// (`gpufuse controller --kubernetes`). Inside a group its policy picks the device; between
/// groups, and the nodes in none, the pool's policy picks the better of their picks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeGroup {
    /// The nodes in it, by name: a node not registered yet joins when it registers. A node in
    /// several groups belongs to the first by name.
    pub nodes: BTreeSet<String>,
    pub policy: Policy,
}

impl Pool {
    pub fn new(policy: Policy, quotas: QuotaFile) -> Self {
        Self {
            policy,
            quotas,
            nodes: Vec::new(),
            by_name: HashMap::new(),
            sessions: BTreeMap::new(),
            pending: Vec::new(),
            usage: HashMap::new(),
            claims: BTreeMap::new(),
            next_id: 1,
            devices_by_free: BTreeSet::new(),
            nodes_by_free: BTreeSet::new(),
            groups: BTreeMap::new(),
            group_of: Vec::new(),
            group_policies: Vec::new(),
            moving: BTreeMap::new(),
        }
    }

    /// The pool's policy: for the nodes in no group, and between groups.
    pub fn policy(&self) -> Policy {
        self.policy
    }
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// Places sessions on `group.nodes` by `group.policy` (replacing a group of that name).
    pub fn set_group(&mut self, name: &str, group: NodeGroup) {
        if self.groups.get(name) == Some(&group) {
            return;
        }
        self.groups.insert(name.to_string(), group);
        self.regroup();
    }

    /// Its nodes go back to the pool's policy (or to another group that has them).
    pub fn remove_group(&mut self, name: &str) -> bool {
        let removed = self.groups.remove(name).is_some();
        if removed {
            self.regroup();
        }
        removed
    }

    pub fn groups(&self) -> &BTreeMap<String, NodeGroup> {
        &self.groups
    }

    /// The policy that places sessions on `node`: its group's, else the pool's.
    pub fn policy_of(&self, node: &str) -> Policy {
        self.by_name
            .get(node)
            .and_then(|&n| self.group_of.get(n as usize).copied().flatten())
            .map_or(self.policy, |g| self.group_policies[g as usize])
    }

    /// Recomputes each node's group (after a group or a node came or went).
    fn regroup(&mut self) {
        (self.group_of, self.group_policies) = self.grouping();
    }

    /// Each node's group and the groups' policies, from the groups.
    fn grouping(&self) -> (Vec<Option<u32>>, Vec<Policy>) {
        let policies = self.groups.values().map(|g| g.policy).collect();
        if self.groups.is_empty() {
            return (Vec::new(), policies);
        }
        let of = self
            .nodes
            .iter()
            .map(|n| {
                self.groups
                    .values()
                    .position(|g| g.nodes.contains(&n.spec.name))
                    .map(|g| g as u32)
            })
            .collect();
        (of, policies)
    }

    pub fn quotas(&self) -> &QuotaFile {
        &self.quotas
    }
    /// Replaces the quotas; sessions already placed keep running.
    pub fn set_quotas(&mut self, quotas: QuotaFile) {
        self.quotas = quotas;
    }
    pub fn nodes(&self) -> &[PoolNode] {
        &self.nodes
    }
    pub fn node(&self, name: &str) -> Option<&PoolNode> {
        self.by_name.get(name).map(|&i| &self.nodes[i as usize])
    }
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }
    pub fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }
    /// Requests waiting for capacity, in the order they will be tried.
    pub fn pending(&self) -> &[Pending] {
        &self.pending
    }
    /// What `tenant`'s sessions hold.
    pub fn tenant_usage(&self, tenant: &str) -> TenantUsage {
        self.usage.get(tenant).copied().unwrap_or_default()
    }

    // ---- the indexes -------------------------------------------------------------------

    fn unindex(&mut self, n: u32) {
        let node = &self.nodes[n as usize];
        if !node.placeable() {
            return;
        }
        let nf = node.free_memory();
        self.nodes_by_free.remove(&(nf, n));
        for (p, d) in node.devices.iter().enumerate() {
            self.devices_by_free
                .remove(&(d.free_memory(), nf, n, p as u32));
        }
    }

    fn index(&mut self, n: u32) {
        let node = &self.nodes[n as usize];
        if !node.placeable() {
            return;
        }
        let nf = node.free_memory();
        self.nodes_by_free.insert((nf, n));
        for (p, d) in node.devices.iter().enumerate() {
            self.devices_by_free
                .insert((d.free_memory(), nf, n, p as u32));
        }
    }

    /// Runs `f` on node `n` with the indexes kept right.
    pub(crate) fn with_node<R>(&mut self, n: u32, f: impl FnOnce(&mut PoolNode) -> R) -> R {
        self.unindex(n);
        let r = f(&mut self.nodes[n as usize]);
        self.index(n);
        r
    }

    // ---- sessions in and out of the ledger ---------------------------------------------

    fn add_session(&mut self, s: Session) {
        let Some(&n) = self.by_name.get(&s.node) else {
            return;
        };
        let Some(p) = self.nodes[n as usize].position(s.device) else {
            return;
        };
        let (mem, comp, id) = (s.memory_charge(), s.compute_percent.unwrap_or(0), s.id);
        self.with_node(n, |node| {
            let d = &mut node.devices[p];
            d.charged_memory += mem;
            d.charged_compute += comp;
            d.sessions.push(id);
        });
        self.add_usage(&s.tenant, s.usage());
        self.next_id = self.next_id.max(id + 1);
        self.sessions.insert(id, s);
    }

    fn remove_session(&mut self, id: SessionId) -> Option<Session> {
        let s = self.sessions.remove(&id)?;
        if let Some(&n) = self.by_name.get(&s.node) {
            if let Some(p) = self.nodes[n as usize].position(s.device) {
                let (mem, comp) = (s.memory_charge(), s.compute_percent.unwrap_or(0));
                self.with_node(n, |node| {
                    let d = &mut node.devices[p];
                    d.charged_memory = d.charged_memory.saturating_sub(mem);
                    d.charged_compute = d.charged_compute.saturating_sub(comp);
                    d.sessions.retain(|&x| x != id);
                });
            }
        }
        self.sub_usage(&s.tenant, s.usage());
        Some(s)
    }

    fn add_usage(&mut self, tenant: &str, add: TenantUsage) {
        let u = self.usage.entry(tenant.to_string()).or_default();
        u.vram += add.vram;
        u.compute += add.compute;
        u.sessions += add.sessions;
    }

    fn sub_usage(&mut self, tenant: &str, sub: TenantUsage) {
        if let Some(u) = self.usage.get_mut(tenant) {
            u.vram = u.vram.saturating_sub(sub.vram);
            u.compute = u.compute.saturating_sub(sub.compute);
            u.sessions = u.sessions.saturating_sub(sub.sessions);
            if u.sessions == 0 {
                self.usage.remove(tenant);
            }
        }
    }

    // ---- slices placed outside the pool ------------------------------------------------

    /// Charges a slice placed outside the pool (a claim) to its tenant, under `key`, if the
    /// tenant's quota allows it: the same shape and admission checks, and messages, as a
    /// session's ([`QuotaFile::shape`], [`QuotaFile::admit`]). Charging a key again changes
    /// nothing.
    pub fn charge_claim(&mut self, key: &str, claim: ClaimCharge) -> Result<(), QuotaError> {
        if self.claims.contains_key(key) {
            return Ok(());
        }
        let req = Request {
            tenant: claim.tenant.clone(),
            vram_bytes: Some(claim.vram_bytes).filter(|&v| v > 0),
            compute_percent: Some(claim.compute_percent).filter(|&c| c > 0),
            ..Request::default()
        };
        let req = self.quotas.shape(&req)?;
        self.quotas.admit(&req, self.tenant_usage(&req.tenant))?;
        let charged = ClaimCharge {
            vram_bytes: req.vram_bytes.unwrap_or(0),
            compute_percent: req.compute_percent.unwrap_or(0),
            ..claim
        };
        self.add_usage(&charged.tenant, charged.usage());
        self.claims.insert(key.to_string(), charged);
        Ok(())
    }

    /// Gives back what a claim charged (its key is forgotten).
    pub fn release_claim(&mut self, key: &str) -> Option<ClaimCharge> {
        let c = self.claims.remove(key)?;
        self.sub_usage(&c.tenant, c.usage());
        Some(c)
    }

    /// The claims charged, by key.
    pub fn claims(&self) -> &BTreeMap<String, ClaimCharge> {
        &self.claims
    }

    /// A session ended (its client left, it was killed): its charges go back.
    pub fn end_session(&mut self, id: SessionId) -> Option<Session> {
        if self.moving.contains_key(&id) {
            let s = self.sessions.get(&id).cloned();
            self.finish_move(id, crate::MoveEnd::Ended);
            return s;
        }
        self.remove_session(id)
    }

    /// Records `s` where it says it is, unchecked (replacing its record).
    pub(crate) fn put(&mut self, s: Session) {
        self.remove_session(s.id);
        self.add_session(s);
    }

    /// Node `name`'s index.
    pub(crate) fn node_index(&self, name: &str) -> Result<u32, String> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| format!("there is no node {name} in the pool"))
    }

    /// Devices of placeable nodes with at least `need` bytes unpromised, least free first
    /// (node, device position).
    pub(crate) fn devices_from(&self, need: u64) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.devices_by_free
            .range((need, 0, 0, 0)..)
            .map(|&(_, _, n, p)| (n, p as usize))
    }

    /// A waiting client gave up: its request leaves the queue.
    /// Moves session `id` to device `device` of node `node` in the ledger (a live migration
    /// the caller carried out, or is about to): its slice and share are charged there and no
    /// longer where it was; `node_session` is its id on the new node once known. Refused
    /// with the reason, the ledger unchanged, when the node is not ready or its device
    /// cannot hold the slice or the share.
    pub fn relocate(
        &mut self,
        id: SessionId,
        node: &str,
        device: u32,
        node_session: Option<u64>,
    ) -> Result<(), String> {
        let s = self
            .sessions
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("there is no session {id} in the pool"))?;
        let &n = self
            .by_name
            .get(node)
            .ok_or_else(|| format!("there is no node {node} in the pool"))?;
        let nd = &self.nodes[n as usize];
        if nd.state != NodeState::Ready {
            return Err(format!("node {node} is not ready"));
        }
        if nd.cordoned && nd.spec.name != s.node {
            return Err(format!("node {node} is cordoned"));
        }
        let p = nd
            .position(device)
            .ok_or_else(|| format!("node {node} has no device {device}"))?;
        let d = &nd.devices[p];
        let here = s.node == node && s.device == device;
        if !here {
            d.room_for(node, id, s.memory_charge(), s.compute_percent.unwrap_or(0))?;
        }
        self.remove_session(id);
        self.add_session(Session {
            node: node.to_string(),
            device,
            node_session: node_session.or(if here { s.node_session } else { None }),
            ..s
        });
        Ok(())
    }

    pub fn cancel_pending(&mut self, id: SessionId) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| p.id != id);
        before != self.pending.len()
    }

    // ---- nodes -------------------------------------------------------------------------

    /// A node registers (first time, after it was lost, or after the controller restarted):
    /// its description replaces what the pool knew, it is ready, and its sessions are
    /// reconciled with its report ([`Pool::report`]).
    pub fn register_node(
        &mut self,
        spec: NodeSpec,
        sessions: &[SessionReport],
        loads: &[DeviceLoad],
        now: Millis,
    ) {
        let mut spec = spec;
        spec.devices.sort_by_key(|d| d.index);
        let n = match self.by_name.get(&spec.name) {
            Some(&n) => {
                // Sessions keep their records; the devices' ledgers are rebuilt below.
                let ids: Vec<SessionId> = self
                    .sessions
                    .values()
                    .filter(|s| s.node == spec.name)
                    .map(|s| s.id)
                    .collect();
                let kept: Vec<Session> = ids
                    .iter()
                    .filter_map(|&id| self.remove_session(id))
                    .collect();
                self.unindex(n);
                let node = &mut self.nodes[n as usize];
                node.devices = fresh_devices(&spec);
                node.spec = spec;
                node.state = NodeState::Ready;
                node.last_heard = now;
                self.index(n);
                for s in kept {
                    self.add_session(s);
                }
                self.reserve_moves_to(n);
                n
            }
            None => {
                let n = self.nodes.len() as u32;
                self.by_name.insert(spec.name.clone(), n);
                self.nodes.push(PoolNode {
                    devices: fresh_devices(&spec),
                    spec,
                    state: NodeState::Ready,
                    last_heard: now,
                    cordoned: false,
                });
                self.index(n);
                if !self.groups.is_empty() {
                    self.regroup();
                }
                n
            }
        };
        let name = self.nodes[n as usize].spec.name.clone();
        self.report(&name, sessions, loads, now);
    }

    /// A node's heartbeat: what it measures and the sessions it has. The node is the truth
    /// for its own sessions: a reported session is running there (whatever the pool thought),
    /// a running session it no longer reports has ended; a session placed but not reported
    /// yet is kept until it starts or its start times out. Returns false for a node that
    /// has not registered (it must register first).
    pub fn report(
        &mut self,
        node: &str,
        sessions: &[SessionReport],
        loads: &[DeviceLoad],
        now: Millis,
    ) -> bool {
        let Some(&n) = self.by_name.get(node) else {
            return false;
        };
        self.with_node(n, |nd| {
            nd.state = NodeState::Ready;
            nd.last_heard = now;
            for (d, l) in nd.devices.iter_mut().zip(loads) {
                d.load = *l;
            }
        });
        let mut seen = Vec::with_capacity(sessions.len());
        for r in sessions {
            let id = match r.pool_session {
                Some(id) => id,
                None => self
                    .sessions
                    .values()
                    .find(|s| s.node == node && s.node_session == Some(r.node_session))
                    .map_or(self.next_id, |s| s.id),
            };
            seen.push(id);
            // A session on its way elsewhere: the move's outcome, not this report, settles
            // where it is (its charge waits on the target meanwhile).
            if self.moving.contains_key(&id) {
                if let Some(s) = self.sessions.get_mut(&id).filter(|s| s.node == node) {
                    s.state = SessionState::Running;
                }
                continue;
            }
            let tenant = r
                .tenant
                .clone()
                .or_else(|| self.sessions.get(&id).map(|s| s.tenant.clone()))
                .unwrap_or_else(|| DEFAULT_TENANT.to_string());
            let fresh = Session {
                id,
                tenant,
                node: node.to_string(),
                device: r.device,
                vram_limit: r.vram_limit,
                compute_percent: r.compute_percent,
                qos: r.qos,
                state: SessionState::Running,
                memory_used: r.memory_used,
                node_session: Some(r.node_session),
                selector: self
                    .sessions
                    .get(&id)
                    .map(|s| s.selector.clone())
                    .unwrap_or_default(),
                // A claim's session stays on the claim's device, however it was admitted.
                pinned: r.claim.is_some() || self.sessions.get(&id).is_some_and(|s| s.pinned),
                claim: r
                    .claim
                    .clone()
                    .or_else(|| self.sessions.get(&id).and_then(|s| s.claim.clone())),
            };
            if self.sessions.get(&id) != Some(&fresh) {
                self.remove_session(id);
                self.add_session(fresh);
            }
        }
        let gone: Vec<SessionId> = self
            .sessions
            .values()
            .filter(|s| s.node == node && !seen.contains(&s.id))
            .filter(|s| !self.moving.contains_key(&s.id))
            .filter(|s| !matches!(s.state, SessionState::Starting { expires } if expires > now))
            .map(|s| s.id)
            .collect();
        for id in gone {
            self.remove_session(id);
        }
        true
    }

    /// Marks lost every node not heard from for `timeout` and its sessions; forgets placed
    /// sessions that never started. Returns the nodes newly lost.
    pub fn expire(&mut self, now: Millis, timeout: Millis) -> Vec<String> {
        let mut lost = Vec::new();
        for n in 0..self.nodes.len() as u32 {
            let node = &self.nodes[n as usize];
            if node.state == NodeState::Ready && now.saturating_sub(node.last_heard) > timeout {
                lost.push(node.spec.name.clone());
                self.mark_lost_at(n);
            }
        }
        let stale: Vec<SessionId> = self
            .sessions
            .values()
            .filter(|s| matches!(s.state, SessionState::Starting { expires } if expires <= now))
            .map(|s| s.id)
            .collect();
        for id in stale {
            self.remove_session(id);
        }
        lost
    }

    /// The node's link closed: it is lost now, not after the timeout.
    pub fn mark_lost(&mut self, node: &str) -> bool {
        match self.by_name.get(node) {
            Some(&n) if self.nodes[n as usize].state == NodeState::Ready => {
                self.mark_lost_at(n);
                true
            }
            _ => false,
        }
    }

    fn mark_lost_at(&mut self, n: u32) {
        self.unindex(n);
        self.nodes[n as usize].state = NodeState::Lost;
        let name = self.nodes[n as usize].spec.name.clone();
        for s in self.sessions.values_mut().filter(|s| s.node == name) {
            s.state = SessionState::Lost;
        }
    }

    // ---- placement ---------------------------------------------------------------------

    /// Places a new session, queues it, or plans a preemption. Quota and malformed requests
    /// are errors; a request that does not fit now is never refused: it waits.
    pub fn submit(&mut self, req: &Request, now: Millis) -> Result<Decision, Rejected> {
        let req = self.shape(req)?;
        self.quotas.admit(&req, self.tenant_usage(&req.tenant))?;
        let id = self.next_id;
        self.next_id += 1;
        // Devices kept for requests of this QoS or higher that have waited past AGING_MS.
        let fences = self.fence_aged(req.qos.rank(), now);
        let decision = match self.choose(&req) {
            Ok((n, p)) => Decision::Placed(self.place(id, &req, n, p, now)),
            Err(reason) => {
                let held = self.held_back(&req, &fences);
                let plan = match held {
                    None if req.qos.rank() >= Qos::High.rank() => self.preempt(id, &req, now),
                    _ => None,
                };
                match plan {
                    Some(plan) => Decision::Preempt(plan),
                    None => {
                        let reason = held.unwrap_or(reason);
                        self.pending.push(Pending {
                            id,
                            request: req,
                            reason: reason.clone(),
                            since: now,
                        });
                        self.sort_pending();
                        Decision::Pending { id, reason }
                    }
                }
            }
        };
        self.unfence(fences);
        Ok(decision)
    }

    /// Whether `req` would be accepted (placed now or queued): quota and shape checks only.
    pub fn check(&self, req: &Request) -> Result<Request, Rejected> {
        let req = self.shape(req)?;
        self.quotas.admit(&req, self.tenant_usage(&req.tenant))?;
        Ok(req)
    }

    fn shape(&self, req: &Request) -> Result<Request, Rejected> {
        let mut req = req.clone();
        if req.tenant.is_empty() {
            req.tenant = DEFAULT_TENANT.to_string();
        }
        if let Some(c) = req.compute_percent.filter(|c| !(1..=100).contains(c)) {
            return Err(Rejected::Invalid(format!(
                "a compute share is a percentage (1-100), not {c}"
            )));
        }
        if req.vram_bytes == Some(0) {
            return Err(Rejected::Invalid("a VRAM slice of 0 bytes".into()));
        }
        match (req.compute_percent, req.tflops) {
            (Some(_), Some(_)) => {
                return Err(Rejected::Invalid(
                    "ask for compute as a percentage or in TFLOPS, not both".into(),
                ))
            }
            (None, Some(0)) => return Err(Rejected::Invalid("a share of 0 TFLOPS".into())),
            (None, Some(_)) if self.quotas.limits_compute(&req.tenant) => {
                return Err(Rejected::Invalid(format!(
                    "tenant {:?} has a compute quota in percent: ask with --compute, not --tflops",
                    req.tenant
                )))
            }
            _ => {}
        }
        Ok(self.quotas.shape(&req)?)
    }

    fn sort_pending(&mut self) {
        self.pending
            .sort_by_key(|p| (std::cmp::Reverse(p.request.qos.rank()), p.since, p.id));
    }

    /// Places what now fits of the pending queue, highest QoS first, then oldest. A request
    /// that does not fit does not hold back smaller ones behind it, until it has waited
    /// [`AGING_MS`]: then the device where it could next fit is kept for it, and the requests
    /// behind it (its QoS or lower) are not placed there (nor are new ones, [`Pool::submit`]),
    /// so that device drains until it fits: no stream of small requests starves a big one.
    /// Quotas are checked again, with the quotas in force now ([`Pool::set_quotas`]): a
    /// request now over quota stays queued with that reason.
    pub fn retry_pending(&mut self, now: Millis) -> Vec<Placement> {
        let mut placed = Vec::new();
        let mut fences = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let req = match self.shape(&self.pending[i].request) {
                Ok(r) => r,
                Err(e) => {
                    self.pending[i].reason = e.to_string();
                    i += 1;
                    continue;
                }
            };
            self.pending[i].request = req.clone();
            if let Err(e) = self.quotas.admit(&req, self.tenant_usage(&req.tenant)) {
                self.pending[i].reason = e.to_string();
                i += 1;
                continue;
            }
            match self.choose(&req) {
                Ok((n, p)) => {
                    let pend = self.pending.remove(i);
                    placed.push(self.place(pend.id, &req, n, p, now));
                }
                Err(reason) => {
                    self.pending[i].reason = self.held_back(&req, &fences).unwrap_or(reason);
                    if Self::aged(&self.pending[i], now) && fences.len() < AGED_FENCES_MAX {
                        let id = self.pending[i].id;
                        if let Some(f) = self.fence(id, &req) {
                            fences.push(f);
                        }
                    }
                    i += 1;
                }
            }
        }
        self.unfence(fences);
        placed
    }

    /// Whether pending request `p` has waited long enough to hold back younger ones.
    fn aged(p: &Pending, now: Millis) -> bool {
        now.saturating_sub(p.since) >= AGING_MS
    }

    /// The devices kept for the aged requests waiting with `rank` or higher (at most
    /// [`AGED_FENCES_MAX`], oldest of the highest QoS first): what a new request of that rank
    /// may not take.
    fn fence_aged(&mut self, rank: u8, now: Millis) -> Vec<Fence> {
        let aged: Vec<(SessionId, Request)> = self
            .pending
            .iter()
            .filter(|p| p.request.qos.rank() >= rank && Self::aged(p, now))
            .filter(|p| {
                self.quotas
                    .admit(&p.request, self.tenant_usage(&p.request.tenant))
                    .is_ok()
            })
            .take(AGED_FENCES_MAX)
            .map(|p| (p.id, p.request.clone()))
            .collect();
        aged.into_iter()
            .filter_map(|(id, req)| self.fence(id, &req))
            .collect()
    }

    /// Keeps for request `id` the device where it could next fit: of the ready devices that
    /// pass its filters and could hold it empty, the one with the most memory free (among
    /// equals, on the emptiest node), not kept already. The kept device's free memory only
    /// grows (nothing of the request's QoS or lower lands there), so the most free memory of
    /// any device it could use never shrinks but by higher QoS: it fits once enough ends. Its free memory and compute are charged to the fence
    /// until [`Pool::unfence`], so nothing else is placed there meanwhile.
    fn fence(&mut self, id: SessionId, req: &Request) -> Option<Fence> {
        let need = req.vram_bytes.unwrap_or(1);
        let (n, p) = self
            .devices_by_free
            .iter()
            .rev()
            .take_while(|&&(free, ..)| free > 0)
            .find(|&&(_, _, n, p)| {
                let node = &self.nodes[n as usize];
                let d = &node.devices[p as usize];
                Self::node_matches(node, req)
                    && Self::device_matches(d, req)
                    && d.spec.memory_total >= need
                    && Self::compute_on(d, req).is_some()
            })
            .map(|&(_, _, n, p)| (n, p as usize))?;
        let (memory, compute) = self.with_node(n, |node| {
            let d = &mut node.devices[p];
            let (m, c) = (d.free_memory(), d.free_compute());
            d.charged_memory += m;
            d.charged_compute += c;
            (m, c)
        });
        Some(Fence {
            n,
            p,
            memory,
            compute,
            for_id: id,
        })
    }

    /// Gives back what the fences charged.
    fn unfence(&mut self, fences: Vec<Fence>) {
        for f in fences.into_iter().rev() {
            self.with_node(f.n, |node| {
                let d = &mut node.devices[f.p];
                d.charged_memory = d.charged_memory.saturating_sub(f.memory);
                d.charged_compute = d.charged_compute.saturating_sub(f.compute);
            });
        }
    }

    /// Why `req` waits when it would fit on a device a fence keeps for an aged request.
    fn held_back(&self, req: &Request, fences: &[Fence]) -> Option<String> {
        fences.iter().find_map(|f| {
            let node = &self.nodes[f.n as usize];
            let mut d = node.devices[f.p].clone();
            d.charged_memory = d.charged_memory.saturating_sub(f.memory);
            d.charged_compute = d.charged_compute.saturating_sub(f.compute);
            (Self::node_matches(node, req) && Self::fits(&d, req)).then(|| {
                format!(
                    "held back for request {}, which has waited over {} s: device {} of node {} is kept for it",
                    f.for_id,
                    AGING_MS / 1000,
                    d.spec.index,
                    node.spec.name
                )
            })
        })
    }

    fn place(&mut self, id: SessionId, req: &Request, n: u32, p: usize, now: Millis) -> Placement {
        let node = &self.nodes[n as usize];
        let device = node.devices[p].spec.index;
        let compute_percent = Self::compute_on(&node.devices[p], req).flatten();
        let placement = Placement {
            session: id,
            tenant: req.tenant.clone(),
            node: node.spec.name.clone(),
            address: node.spec.address.clone(),
            device,
            vram_bytes: req.vram_bytes,
            compute_percent,
            qos: req.qos,
        };
        self.add_session(Session {
            id,
            tenant: req.tenant.clone(),
            node: placement.node.clone(),
            device,
            vram_limit: req.vram_bytes,
            compute_percent,
            qos: req.qos,
            state: SessionState::Starting {
                expires: now + START_TIMEOUT_MS,
            },
            memory_used: 0,
            node_session: None,
            selector: req.selector.clone(),
            pinned: req.device_uuid.is_some(),
            claim: None,
        });
        placement
    }

    fn node_matches(node: &PoolNode, req: &Request) -> bool {
        req.selector
            .iter()
            .all(|(k, v)| node.spec.labels.get(k) == Some(v))
    }

    fn device_matches(d: &PoolDevice, req: &Request) -> bool {
        req.gpu_model.as_ref().is_none_or(|m| {
            d.spec
                .model
                .to_ascii_lowercase()
                .contains(&m.to_ascii_lowercase())
        }) && req
            .device_uuid
            .as_ref()
            .is_none_or(|u| d.spec.uuid.eq_ignore_ascii_case(u))
    }

    fn fits(d: &PoolDevice, req: &Request) -> bool {
        d.free_memory() >= req.vram_bytes.unwrap_or(1)
            && Self::compute_on(d, req).is_some_and(|c| d.free_compute() >= c.unwrap_or(0))
            && Self::device_matches(d, req)
    }

    /// The share `req` asks of device `d` in percent (`Some(None)`: no share), or `None` when
    /// its TFLOPS are more than the device has: a TFLOPS request is a percentage of each
    /// device's measured capacity.
    pub fn compute_on(d: &PoolDevice, req: &Request) -> Option<Option<u32>> {
        let Some(t) = req.tflops else {
            return Some(req.compute_percent);
        };
        let cap = d.spec.capacity_mtflops;
        if cap == 0 {
            return None;
        }
        let percent = (u64::from(t) * 100_000).div_ceil(cap);
        (percent <= 100).then_some(Some(percent as u32))
    }

    /// The device the policy picks for `req` (node, device position), or why none fits. With
    /// node groups, each group's policy picks among its nodes (the pool's among the nodes in
    /// none), and the pool's policy picks among those picks.
    fn choose(&self, req: &Request) -> Result<(u32, usize), String> {
        let found = if self.groups.is_empty() {
            self.choose_by(self.policy, req, None)
        } else {
            (0..=self.group_policies.len())
                .filter_map(|g| {
                    let (policy, group) = match self.group_policies.get(g) {
                        Some(&p) => (p, Some(g as u32)),
                        None => (self.policy, None),
                    };
                    self.choose_by(policy, req, Some(group))
                })
                .min_by_key(|&(n, p)| self.preference(n, p))
        };
        found.ok_or_else(|| self.why_not(req))
    }

    /// How the pool's policy ranks device `p` of node `n` against others that fit (less is
    /// better): what each policy looks for first, by the same measures.
    fn preference(&self, n: u32, p: usize) -> (u64, u64, u32, u32) {
        let node = &self.nodes[n as usize];
        let d = &node.devices[p];
        let (free, node_free) = (d.free_memory(), node.free_memory());
        match self.policy {
            Policy::Binpack => (free, node_free, n, p as u32),
            Policy::Spread => (
                u64::MAX - free,
                u64::from(d.load.utilization_percent),
                d.sessions.len() as u32,
                n,
            ),
            Policy::Balanced => (node_free, u64::MAX - free, n, p as u32),
        }
    }

    /// The device `policy` picks for `req`; with `group`, only on the nodes of that group
    /// (`Some(None)`: the nodes in no group).
    fn choose_by(
        &self,
        policy: Policy,
        req: &Request,
        group: Option<Option<u32>>,
    ) -> Option<(u32, usize)> {
        let need = req.vram_bytes.unwrap_or(1);
        let in_group =
            |n: u32| group.is_none_or(|g| self.group_of.get(n as usize).copied().flatten() == g);
        let feasible = |&(_, _, n, p): &DeviceKey| {
            let node = &self.nodes[n as usize];
            in_group(n)
                && Self::fits(&node.devices[p as usize], req)
                && Self::node_matches(node, req)
        };
        match policy {
            Policy::Binpack => self
                .devices_by_free
                .range((need, 0, 0, 0)..)
                .find(|k| feasible(k))
                .map(|&(_, _, n, p)| (n, p as usize)),
            Policy::Spread => {
                let mut best: Option<(DeviceKey, (u32, usize))> = None;
                let mut seen = 0;
                for k in self.devices_by_free.iter().rev() {
                    if k.0 < need || best.as_ref().is_some_and(|(b, _)| k.0 < b.0) || seen >= 16 {
                        break;
                    }
                    if !feasible(k) {
                        continue;
                    }
                    seen += 1;
                    let d = &self.nodes[k.2 as usize].devices[k.3 as usize];
                    let load = (d.load.utilization_percent, d.sessions.len());
                    let better = best.as_ref().is_none_or(|(b, _)| {
                        let bd = &self.nodes[b.2 as usize].devices[b.3 as usize];
                        load < (bd.load.utilization_percent, bd.sessions.len())
                    });
                    if better {
                        best = Some((*k, (k.2, k.3 as usize)));
                    }
                }
                best.map(|(_, at)| at)
            }
            Policy::Balanced => self.nodes_by_free.range((need, 0)..).find_map(|&(_, n)| {
                let node = &self.nodes[n as usize];
                if !in_group(n) || !Self::node_matches(node, req) {
                    return None;
                }
                node.devices
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| Self::fits(d, req))
                    .max_by_key(|(p, d)| {
                        (
                            d.free_memory(),
                            std::cmp::Reverse(d.load.utilization_percent),
                            std::cmp::Reverse(*p),
                        )
                    })
                    .map(|(p, _)| (n, p))
            }),
        }
    }

    /// Why `req` fits on no device now: the first filter that leaves nothing.
    fn why_not(&self, req: &Request) -> String {
        let ready: Vec<&PoolNode> = self.nodes.iter().filter(|n| n.placeable()).collect();
        if ready.is_empty() {
            return if self.nodes.iter().any(|n| n.state == NodeState::Ready) {
                "every ready node is cordoned (gpufuse node uncordon)".into()
            } else {
                "no node is ready".into()
            };
        }
        let labelled: Vec<&PoolNode> = ready
            .into_iter()
            .filter(|n| Self::node_matches(n, req))
            .collect();
        if labelled.is_empty() {
            let sel: Vec<String> = req
                .selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let cordoned = self
                .nodes
                .iter()
                .any(|n| n.state == NodeState::Ready && n.cordoned && Self::node_matches(n, req));
            if cordoned {
                return format!(
                    "the ready nodes with the labels {} are cordoned",
                    sel.join(",")
                );
            }
            return format!("no ready node has the labels {}", sel.join(","));
        }
        let devices: Vec<&PoolDevice> = labelled
            .iter()
            .flat_map(|n| n.devices.iter())
            .filter(|d| Self::device_matches(d, req))
            .collect();
        if devices.is_empty() {
            return format!(
                "no ready device is a {:?}",
                req.gpu_model.as_deref().unwrap_or_default()
            );
        }
        let need = req.vram_bytes.unwrap_or(1);
        let largest = devices.iter().map(|d| d.free_memory()).max().unwrap_or(0);
        if largest < need {
            return format!(
                "no device has {} of VRAM free (the most free on one device is {})",
                human_bytes(need),
                human_bytes(largest)
            );
        }
        if let Some(t) = req.tflops {
            let roomy: Vec<&&PoolDevice> =
                devices.iter().filter(|d| d.free_memory() >= need).collect();
            if roomy.iter().all(|d| Self::compute_on(d, req).is_none()) {
                let peak = roomy
                    .iter()
                    .map(|d| d.spec.capacity_mtflops)
                    .max()
                    .unwrap_or(0);
                return format!(
                    "no device with {} of VRAM free has {t} TFLOPS (the largest has {:.1})",
                    human_bytes(need),
                    peak as f64 / 1000.0
                );
            }
            return format!(
                "no device with {} of VRAM free has {t} TFLOPS of its compute unpromised",
                human_bytes(need)
            );
        }
        let c = req.compute_percent.unwrap_or(0);
        let most = devices
            .iter()
            .filter(|d| d.free_memory() >= need)
            .map(|d| d.free_compute())
            .max()
            .unwrap_or(0);
        match req.vram_bytes {
            Some(_) => format!(
                "no device with {} of VRAM free has {c}% compute free (at most {most}%)",
                human_bytes(need)
            ),
            None => format!("no device has {c}% compute free (at most {most}%)"),
        }
    }

    // ---- preemption --------------------------------------------------------------------

    /// The device where ending the fewest `low` sessions lets `req` fit (fewest bytes
    /// released among equals), found by simulating their release largest first; `None` when
    /// no such device exists. Pure: nothing changes.
    pub fn plan_preemption(&self, req: &Request) -> Option<Victims> {
        let need = req.vram_bytes.unwrap_or(1);
        let mut best: Option<((usize, u64), Victims)> = None;
        for (n, node) in self.nodes.iter().enumerate() {
            if !node.placeable() || !Self::node_matches(node, req) {
                continue;
            }
            for (p, d) in node.devices.iter().enumerate() {
                if !Self::device_matches(d, req) || d.spec.memory_total < need {
                    continue;
                }
                let Some(comp) = Self::compute_on(d, req) else {
                    continue;
                };
                let comp = comp.unwrap_or(0);
                let mut low: Vec<&Session> = d
                    .sessions
                    .iter()
                    .filter_map(|id| self.sessions.get(id))
                    .filter(|s| {
                        // A claim's session is the cluster's allocation, not the pool's to end.
                        s.qos == Qos::Low
                            && s.claim.is_none()
                            && s.state == SessionState::Running
                            && s.node_session.is_some()
                            && !self.moving.contains_key(&s.id)
                    })
                    .collect();
                low.sort_by_key(|s| {
                    (
                        std::cmp::Reverse(s.memory_charge()),
                        std::cmp::Reverse(s.compute_percent.unwrap_or(0)),
                        s.id,
                    )
                });
                let (mut free, mut free_c) = (d.free_memory(), d.free_compute());
                let mut victims = Vec::new();
                let mut released = 0u64;
                for s in low {
                    if free >= need && free_c >= comp {
                        break;
                    }
                    free += s.memory_charge();
                    free_c += s.compute_percent.unwrap_or(0);
                    released += s.memory_charge();
                    victims.push(s.id);
                }
                if victims.is_empty() || free < need || free_c < comp {
                    continue;
                }
                let key = (victims.len(), released);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, (n as u32, p, victims)));
                }
            }
        }
        best.map(|(_, b)| b)
    }

    fn preempt(&mut self, id: SessionId, req: &Request, now: Millis) -> Option<PreemptionPlan> {
        let (n, p, ids) = self.plan_preemption(req)?;
        let (name, address) = {
            let node = &self.nodes[n as usize];
            (node.spec.name.clone(), node.spec.address.clone())
        };
        let mut victims = Vec::new();
        for v in &ids {
            let Some(s) = self.sessions.get(v).cloned() else {
                continue;
            };
            // A victim that fits elsewhere moves there; one that fits nowhere is ended.
            let target = match self.unmovable(&s) {
                None => self.target_for(&s, &|tn, tp| (tn, tp) == (n, p)),
                Some(_) => None,
            };
            let move_to = target.and_then(|(tn, tp)| {
                let m = self.move_of(&s, tn, tp);
                self.begin_move(s.id, &m.to_node, m.to_device, false)
                    .ok()
                    .map(|()| (m.to_node, m.to_device))
            });
            if move_to.is_none() {
                self.remove_session(*v);
            }
            victims.push(Victim {
                session: s.id,
                node: name.clone(),
                address: address.clone(),
                node_session: s.node_session.unwrap_or_default(),
                move_to,
            });
        }
        let placement = self.place(id, req, n, p, now);
        Some(PreemptionPlan { victims, placement })
    }

    // ---- checks ------------------------------------------------------------------------

    /// Recomputes every ledger, index and tenant total from the sessions and compares: the
    /// invariants the property tests hold the pool to.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut devices_by_free = BTreeSet::new();
        let mut nodes_by_free = BTreeSet::new();
        let mut usage: HashMap<String, TenantUsage> = HashMap::new();
        for s in self.sessions.values() {
            let u = usage.entry(s.tenant.clone()).or_default();
            u.vram += s.vram_limit.unwrap_or(0);
            u.compute += s.compute_percent.unwrap_or(0);
            u.sessions += 1;
            let node = self
                .node(&s.node)
                .ok_or_else(|| format!("session {} on unknown node {}", s.id, s.node))?;
            if (node.state == NodeState::Lost) != (s.state == SessionState::Lost) {
                return Err(format!(
                    "session {} is {} on a {} node",
                    s.id,
                    s.state.name(),
                    node.state.name()
                ));
            }
        }
        for c in self.claims.values() {
            let u = usage.entry(c.tenant.clone()).or_default();
            u.vram += c.vram_bytes;
            u.compute += c.compute_percent;
            u.sessions += 1;
        }
        if usage != self.usage {
            return Err(format!("tenant usage {:?} != {:?}", self.usage, usage));
        }
        for (n, node) in self.nodes.iter().enumerate() {
            for d in &node.devices {
                let on: Vec<&Session> = self
                    .sessions
                    .values()
                    .filter(|s| s.node == node.spec.name && s.device == d.spec.index)
                    .collect();
                let (res_mem, res_comp) = self.reserved_on(&node.spec.name, d.spec.index);
                let mem: u64 = on.iter().map(|s| s.memory_charge()).sum::<u64>() + res_mem;
                let comp: u32 = on
                    .iter()
                    .map(|s| s.compute_percent.unwrap_or(0))
                    .sum::<u32>()
                    + res_comp;
                if mem != d.charged_memory || comp != d.charged_compute {
                    return Err(format!(
                        "device {}/{}: charged {} B {}% but sessions hold {mem} B {comp}%",
                        node.spec.name, d.spec.index, d.charged_memory, d.charged_compute
                    ));
                }
                let mut ids: Vec<SessionId> = on.iter().map(|s| s.id).collect();
                let mut listed = d.sessions.clone();
                ids.sort_unstable();
                listed.sort_unstable();
                if ids != listed {
                    return Err(format!(
                        "device {}/{} lists {listed:?}, sessions are {ids:?}",
                        node.spec.name, d.spec.index
                    ));
                }
            }
            if node.placeable() {
                let nf = node.free_memory();
                nodes_by_free.insert((nf, n as u32));
                for (p, d) in node.devices.iter().enumerate() {
                    devices_by_free.insert((d.free_memory(), nf, n as u32, p as u32));
                }
            }
        }
        if devices_by_free != self.devices_by_free || nodes_by_free != self.nodes_by_free {
            return Err("the free-memory indexes are stale".into());
        }
        if self.grouping() != (self.group_of.clone(), self.group_policies.clone()) {
            return Err("the nodes' groups are stale".into());
        }
        for p in &self.pending {
            if self.sessions.contains_key(&p.id) {
                return Err(format!("request {} is both pending and placed", p.id));
            }
        }
        self.check_moves()
    }
}

fn fresh_devices(spec: &NodeSpec) -> Vec<PoolDevice> {
    spec.devices
        .iter()
        .map(|d| PoolDevice {
            spec: d.clone(),
            charged_memory: 0,
            charged_compute: 0,
            load: DeviceLoad::default(),
            sessions: Vec::new(),
        })
        .collect()
}
