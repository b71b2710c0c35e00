//! A pool node's agent (`gpufuse node --controller ADDR`): it registers the node with the
//! controller, reports its devices and sessions every heartbeat (and at once when a session
//! starts or ends), reconnects and registers again whenever the link breaks (a restarted
//! controller learns every running session this way), and admits only the sessions the
//! controller granted: a `Cuda` hello must carry a grant signed with the key the controller
//! gave at registration, naming this node; the session gets the device and slice the grant
//! names. The controller ends preempted sessions with a signed end order. The exception: a
//! Kubernetes claim's token, which the node admits itself (`claims.rs`) and reports with the
//! claim's UID, so the controller counts it on its device and keeps it there.
//!
//! Sessions never depend on the link: a controller outage stops new placements only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpufuse_proto::{
    decode_owned, encode_frame, AgentAnswer, ClientHello, EndOrder, FrameKind, Grant, NodeReport,
    PoolDeviceReport, PoolPendingView, PoolSessionReport, ServerHello, SessionKind, END_ORDER_KIND,
    GRANT_KIND, PROTOCOL_VERSION,
};
use gpufuse_transport::{Address, Conn};

use crate::{answer, lock, refuse, NodeConfig, Shared};
use gpufuse_proto::SessionId;

/// A controller in the node's own process (`gpufuse serve`: a controller and a node in one
/// process). Reports are calls, and the node asks it to place each session its listeners
/// receive instead of redirecting clients to it.
pub trait LocalController: Send + Sync {
    /// The key end orders are signed with.
    fn grant_key(&self) -> Vec<u8>;
    /// The node's report (the first registers it).
    fn report(&self, report: &NodeReport);
    /// Places a session on this node, waiting while nothing fits (until its wait ends or
    /// `hung_up` says its client left); the grant it is admitted with, or why not.
    fn place(
        &self,
        hello: &ClientHello,
        hung_up: &mut dyn FnMut() -> bool,
    ) -> Result<Grant, String>;
    /// A `Check` hello: whether it passes the quotas (`Err` names the limit), and whether the
    /// session would wait for capacity (`true`) rather than be refused when nothing fits.
    fn check(&self, hello: &ClientHello) -> Result<bool, String>;
    /// The sessions waiting for capacity, and why.
    fn pending(&self) -> Vec<PoolPendingView>;
}

/// How the node reaches its controller and how it describes itself.
pub struct PoolLink {
    /// The controller's address (for a [`LocalController`], the node's own, for messages).
    pub controller: Address,
    pub name: String,
    /// Where clients reach this node (given to the controller).
    pub address: String,
    pub labels: BTreeMap<String, String>,
    /// The token the agent presents to a controller that checks tokens.
    pub token: String,
    /// The controller is in this process (`gpufuse serve`).
    pub local: Option<Arc<dyn LocalController>>,
    books: Mutex<AgentBooks>,
}

impl std::fmt::Debug for PoolLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolLink")
            .field("controller", &self.controller)
            .field("name", &self.name)
            .field("address", &self.address)
            .field("labels", &self.labels)
            .field("local", &self.local.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct AgentBooks {
    /// The key grants are signed with (from the controller's answer to the agent's hello).
    grant_key: Option<Vec<u8>>,
    /// The node's sessions that a grant admitted: node id -> (pool id, tenant).
    granted: HashMap<u64, (u64, String)>,
    /// Grants already used (pool id and expiry -> expiry): a grant starts one session. A
    /// session that moves here from another node comes with a grant of its own, for the same
    /// pool id, issued later.
    used: HashMap<(u64, u64), u64>,
}

/// Longest wait between connection attempts to the controller.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often the agent looks whether the node's sessions changed.
const WATCH: Duration = Duration::from_millis(25);

impl PoolLink {
    pub fn new(
        controller: Address,
        name: String,
        address: String,
        labels: BTreeMap<String, String>,
        token: String,
    ) -> Self {
        Self {
            controller,
            name,
            address,
            labels,
            token,
            local: None,
            books: Mutex::new(AgentBooks::default()),
        }
    }

    /// The link of a node whose controller is in the same process, reachable at `address`
    /// (where a preempting controller sends its end orders).
    pub fn in_process(name: String, address: Address, local: Arc<dyn LocalController>) -> Self {
        let mut link = Self::new(
            address.clone(),
            name,
            address.to_string(),
            BTreeMap::new(),
            String::new(),
        );
        link.books().grant_key = Some(local.grant_key());
        link.local = Some(local);
        link
    }

    fn books(&self) -> MutexGuard<'_, AgentBooks> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How often the node reports to a controller in its own process.
const LOCAL_HEARTBEAT: Duration = Duration::from_secs(1);

/// Starts the agent's thread.
pub fn start(link: Arc<PoolLink>, state: Shared) {
    if let Some(local) = link.local.clone() {
        // In process: a report every heartbeat, and at once when the sessions change.
        std::thread::spawn(move || loop {
            let (report, shape) = report(&link, &state);
            local.report(&report);
            let due = Instant::now() + LOCAL_HEARTBEAT;
            while Instant::now() < due && session_shape(&state) == shape {
                std::thread::sleep(WATCH);
            }
        });
        return;
    }
    std::thread::spawn(move || {
        let mut backoff = Duration::from_millis(50);
        loop {
            match run_link(&link, &state) {
                Ok(()) => {}
                Err(e) => tracing::warn!(
                    "controller {}: {e}; retrying in {} ms",
                    link.controller,
                    backoff.as_millis()
                ),
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    });
}

/// One link: hello, registration, heartbeats until it breaks.
fn run_link(link: &PoolLink, state: &Shared) -> Result<(), String> {
    let stream = link
        .controller
        .connect()
        .map_err(|e| format!("cannot connect: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let mut conn = Conn::new(stream);
    let hello = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        kind: SessionKind::NodeAgent,
        token: link.token.clone(),
        pid: std::process::id(),
        program: format!("gpufuse node {}", link.name),
        resources: Default::default(),
    };
    let mut out = Vec::new();
    encode_frame(&mut out, FrameKind::Hello, 0, 0, &hello);
    conn.send(&out).map_err(|e| format!("hello: {e}"))?;
    let (_, body) = conn
        .recv()
        .map_err(|e| format!("no answer to the hello: {e}"))?;
    let heartbeat = match decode_owned::<ServerHello>(body).map_err(|e| e.to_string())? {
        ServerHello::PoolAgent {
            grant_key,
            heartbeat_ms,
        } => {
            link.books().grant_key = Some(grant_key);
            Duration::from_millis(u64::from(heartbeat_ms.max(10)))
        }
        ServerHello::Refused { reason } => return Err(format!("refused: {reason}")),
        other => {
            return Err(format!(
                "unexpected answer {other:?} (is it a gpufuse controller?)"
            ))
        }
    };
    let mut first = true;
    loop {
        let (report, shape) = report(link, state);
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::Control, 0, 0, &report);
        conn.send(&out).map_err(|e| format!("report: {e}"))?;
        let (h, body) = conn
            .recv()
            .map_err(|e| format!("no answer to a report: {e}"))?;
        if h.kind != FrameKind::ControlReply {
            return Err(format!(
                "expected an answer to the report, got a {:?} frame",
                h.kind
            ));
        }
        match decode_owned::<AgentAnswer>(body).map_err(|e| e.to_string())? {
            AgentAnswer::Ack => {}
            AgentAnswer::Refused { reason } => return Err(format!("report refused: {reason}")),
        }
        if first {
            tracing::info!(
                "registered with the controller at {} as {} ({} session(s))",
                link.controller,
                link.name,
                report.sessions.len()
            );
            first = false;
        }
        // Until the next heartbeat, or sooner when the sessions change.
        let due = Instant::now() + heartbeat;
        while Instant::now() < due {
            std::thread::sleep(WATCH.min(heartbeat));
            if session_shape(state) != shape {
                break;
            }
        }
    }
}

/// The set of sessions (with their workers): a change is reported at once.
fn session_shape(state: &Shared) -> Vec<(u64, u32)> {
    let s = lock(state);
    let mut v: Vec<(u64, u32)> = s
        .sessions
        .iter()
        .map(|(&id, r)| (id, r.worker_pid))
        .collect();
    v.sort_unstable();
    v
}

fn report(link: &PoolLink, state: &Shared) -> (NodeReport, Vec<(u64, u32)>) {
    let (status, promised, promisable, capacity, shape, claims) = {
        let s = lock(state);
        // The sessions admitted on a Kubernetes claim's token, and the claim (`claims.rs`).
        let claims: HashMap<u64, String> = s
            .sessions
            .iter()
            .filter_map(|(&id, r)| Some((id, r.claim.clone()?)))
            .collect();
        let promised: Vec<u64> = s.devices.iter().map(|d| d.promised).collect();
        // What the node may promise: with oversubscription (`--vram-oversubscribe`) more than
        // the device holds, the rest waiting in host memory or on disk.
        let promisable: Vec<u64> = s
            .devices
            .iter()
            .map(|d| s.elastic.capacity(d.total))
            .collect();
        let capacity: Vec<u64> = s
            .devices
            .iter()
            .map(|d| (d.peak_tflops * 1000.0) as u64)
            .collect();
        let mut shape: Vec<(u64, u32)> = s
            .sessions
            .iter()
            .map(|(&id, r)| (id, r.worker_pid))
            .collect();
        shape.sort_unstable();
        (s.status(), promised, promisable, capacity, shape, claims)
    };
    let mut books = link.books();
    books
        .granted
        .retain(|id, _| status.sessions.iter().any(|s| s.id == SessionId(*id)));
    let now = unix_now();
    books.used.retain(|_, &mut expires| expires > now);
    let report = NodeReport {
        name: link.name.clone(),
        address: link.address.clone(),
        labels: link.labels.clone(),
        devices: status
            .devices
            .iter()
            .map(|d| PoolDeviceReport {
                index: d.index,
                model: model_name(d),
                memory_total_bytes: promisable
                    .get(d.index as usize)
                    .copied()
                    .unwrap_or(d.total_bytes),
                memory_used_bytes: d.used_bytes,
                memory_promised_bytes: promised.get(d.index as usize).copied().unwrap_or(0),
                compute_capability: d.compute_capability,
                capacity_mtflops: capacity.get(d.index as usize).copied().unwrap_or(0),
                utilization_percent: d.utilization_percent,
                uuid: d.uuid,
            })
            .collect(),
        sessions: status
            .sessions
            .iter()
            .map(|s| {
                let granted = books.granted.get(&s.id.get());
                PoolSessionReport {
                    pool_session: granted.map(|g| SessionId(g.0)),
                    node_session: s.id,
                    tenant: granted.map(|g| g.1.clone()).or_else(|| s.subject.clone()),
                    device: s.device,
                    vram_limit_bytes: s.limit_bytes,
                    compute_percent: s.compute_percent,
                    qos: s.qos,
                    memory_used_bytes: s.used_bytes,
                    claim: claims.get(&s.id.get()).cloned(),
                }
            })
            .collect(),
    };
    (report, shape)
}

/// The model a `--gpu-model` request matches: an emulated device also names the GPU its
/// model is after (`gpufuse emulated GPU (B200-like, sm_100)`).
fn model_name(d: &gpufuse_proto::DeviceStatus) -> String {
    let (major, minor) = d.compute_capability;
    match (d.kind, gpufuse_device::model::by_arch(major * 10 + minor)) {
        (gpufuse_proto::DeviceKind::Emulated, Some(m)) => {
            format!("{} ({}-like, sm_{}{})", d.name, m.like, major, minor)
        }
        _ => d.name.clone(),
    }
}

/// Whether a pool node answers this hello itself (sessions need a grant; a signed end
/// order ends a session); other hellos (status, an operator's `gpufuse kill`) take the
/// node's usual path.
pub fn intercepts(link: &PoolLink, hello: &ClientHello) -> bool {
    match hello.kind {
        SessionKind::Cuda => true,
        SessionKind::Check => link.local.is_some(),
        // The controller's signed order for one session: end it, or move it (a drain, a
        // defragmentation round, a preemption's victim, an operator's move).
        SessionKind::End { .. } | SessionKind::Migrate { .. } | SessionKind::MigrateTo { .. } => {
            hello.token.starts_with(END_ORDER_KIND)
        }
        // A session moving in from another node needs a grant on a pool node; `gpufuse
        // serve`'s own controller lets the node admit it on the device asked.
        SessionKind::MoveIn { .. } => link.local.is_none(),
        _ => false,
    }
}

/// Serves a hello [`intercepts`] took.
pub fn serve_hello(
    link: &PoolLink,
    mut conn: Conn,
    hello: ClientHello,
    tcp: bool,
    state: &Shared,
    config: &NodeConfig,
) {
    let Some(key) = link.books().grant_key.clone() else {
        return refuse(
            &mut conn,
            format!(
                "this node has not registered with its controller at {} yet",
                link.controller
            ),
        );
    };
    match hello.kind {
        SessionKind::End {
            session: SessionId(session),
        }
        | SessionKind::Migrate {
            session: SessionId(session),
            ..
        }
        | SessionKind::MigrateTo {
            session: SessionId(session),
            ..
        } => {
            let order: EndOrder = match gpufuse_auth::open(&key, END_ORDER_KIND, &hello.token) {
                Ok(o) => o,
                Err(e) => return refuse(&mut conn, format!("bad order: {e}")),
            };
            if order.node != link.name
                || order.node_session != SessionId(session)
                || order.expires <= unix_now()
            {
                return refuse(
                    &mut conn,
                    "the controller's order is for another session or expired".into(),
                );
            }
            let reply = match hello.kind {
                SessionKind::Migrate { device, .. } => {
                    tracing::info!("the controller moves session {session} to device {device}");
                    crate::elastic::migrate(state, session, device)
                }
                SessionKind::MigrateTo {
                    ref node,
                    device,
                    ref token,
                    ..
                } => {
                    tracing::info!("the controller moves session {session} to {node}");
                    crate::elastic::migrate_out(state, session, node, device, token)
                }
                _ => {
                    tracing::info!("the controller ends session {session} (preempted)");
                    crate::admin::end(state, config, session, None, &hello)
                }
            };
            answer(&mut conn, &reply);
        }
        SessionKind::Check => {
            let Some(local) = &link.local else {
                return refuse(&mut conn, "a pool node does not check sessions".into());
            };
            let reply = match local.check(&hello) {
                Ok(true) => ServerHello::Admissible { device: 0 },
                // Refused at once when nothing fits: whether something fits now.
                Ok(false) => match crate::admin::slice_limit(&hello, None) {
                    Ok(limit) => crate::admin::check(state, &hello, limit, |_| true),
                    Err(reason) => ServerHello::Refused { reason },
                },
                Err(reason) => ServerHello::Refused { reason },
            };
            answer(&mut conn, &reply);
        }
        _ if link.local.is_some() => {
            let local = link.local.as_ref().expect("checked");
            // The controller's books are exact before it decides: the node reports first.
            local.report(&report(link, state).0);
            let started = Instant::now();
            let placed = local.place(&hello, &mut || conn.peer_hung_up());
            match placed {
                Ok(grant) => {
                    let took = started.elapsed();
                    admit_granted(link, conn, hello, grant, took, tcp, state, config)
                }
                Err(reason) => {
                    // Shown with the node's refusals (`--http`'s pending list).
                    lock(state).observed.placed(
                        started.elapsed(),
                        Err(&reason),
                        &hello.program,
                        hello.pid,
                        None,
                    );
                    refuse(&mut conn, reason)
                }
            }
        }
        _ => {
            let grant: Grant = match gpufuse_auth::open(&key, GRANT_KIND, &hello.token) {
                Ok(g) => g,
                Err(e) => {
                    return refuse(
                        &mut conn,
                        format!(
                            "this node serves sessions its controller places ({e}): set \
                             GPUFUSE_SERVER to the controller, {}",
                            link.controller
                        ),
                    )
                }
            };
            if grant.node != link.name {
                return refuse(&mut conn, format!("the grant is for node {}", grant.node));
            }
            let now = unix_now();
            if grant.expires <= now {
                return refuse(&mut conn, "the grant expired".into());
            }
            {
                let mut b = link.books();
                if b.used
                    .insert((grant.session.get(), grant.expires), grant.expires)
                    .is_some()
                {
                    return refuse(&mut conn, "the grant was used already".into());
                }
            }
            admit_granted(link, conn, hello, grant, Duration::ZERO, tcp, state, config);
        }
    }
}

/// Admits a session as its grant says: on the grant's device, with its slice and share
/// (`took`: how long placing it took, for `--http`).
#[allow(clippy::too_many_arguments)]
fn admit_granted(
    link: &PoolLink,
    mut conn: Conn,
    hello: ClientHello,
    grant: Grant,
    took: Duration,
    tcp: bool,
    state: &Shared,
    config: &NodeConfig,
) {
    if let SessionKind::MoveIn { device, bytes, .. } = hello.kind {
        // A session moving in brings its memory: the device must hold it.
        if let Err(reason) = crate::spawn::room_for_incoming(state, device, bytes) {
            return refuse(&mut conn, reason);
        }
    }
    let mut hello = hello;
    hello.resources.vram_bytes = grant.vram_bytes;
    hello.resources.compute_percent = grant.compute_percent;
    hello.resources.tflops = None;
    hello.resources.qos = grant.qos;
    // In `gpufuse serve` the hello still carries the session's own token.
    let claim = crate::claims::verified(config, &hello.token).and_then(|c| c.claim);
    let admitted = {
        let mut s = lock(state);
        if grant.device as usize >= s.devices.len() {
            Err(format!("this node has no device {}", grant.device))
        } else {
            let admitted = s
                .admit_where(&hello, grant.vram_bytes, |d| d == grant.device)
                .inspect(|a| {
                    if let Some(r) = s.sessions.get_mut(&a.id) {
                        r.subject = Some(grant.tenant.clone());
                        r.claim = claim.clone();
                    }
                });
            let outcome = admitted.as_ref().map(|a| a.id).map_err(|r| r.as_str());
            s.observed.placed(
                took,
                outcome,
                &hello.program,
                hello.pid,
                Some(&grant.tenant),
            );
            admitted
        }
    };
    let a = match admitted {
        Ok(a) => a,
        Err(reason) => return refuse(&mut conn, reason),
    };
    link.books()
        .granted
        .insert(a.id, (grant.session.get(), grant.tenant.clone()));
    let _ = conn.stream().set_read_timeout(None);
    let incoming = match hello.kind {
        SessionKind::MoveIn { window_base, .. } => Some(crate::spawn::Incoming::new(window_base)),
        _ => None,
    };
    crate::spawn::run_worker(conn, tcp, a, grant.vram_bytes, state, config, incoming);
}
