//! `gpufuse serve`: the node daemon.
//!
//! It listens on every address it is given, reads each connection's hello (with a deadline),
//! checks the protocol version and the session token, answers status queries itself, admits
//! CUDA sessions against the device's memory, and hands each admitted connection to its own
//! worker process (`gpufuse worker`, the connection as its stdin, a control socket as its
//! stdout). The device ledgers live here: workers reserve and release memory through the
//! control socket, and when a worker exits for any reason (its client left, was killed, or the
//! worker itself crashed) everything its session held is released. Other sessions never notice.
//! `gpufuse node` is the same daemon as a member of a pool.
//!
//! # Modules
//!
//! - Admission: `ledger.rs`, the device and session ledgers. The controller chooses the device
//!   (`gpufuse serve`'s own, in process, through [`agent`]'s `LocalController`), and the ledger
//!   admits only what it can honour. [`claims`]: Kubernetes claims' tokens, honoured only while
//!   their claim's CDI spec is in `--cdi-dir` and only on the allocated device (a pool node
//!   admits them without a grant), and `EndClaim` (the DRA plugin's unprepare).
//! - One worker process per session: `spawn.rs` (its control socket and command socket),
//!   [`elastic`] (oversubscription, eviction requests, `gpufuse migrate`), `relay.rs` (the TLS
//!   relay), [`image_cache`] (the image cache's settings for the workers, and their reports),
//!   [`lifecycle`] (the node lock).
//! - The launch queue of each device: [`launch_policy`], the pure policy (who runs next, shares,
//!   QoS, holding), and [`queue`], the node's threads' side of it (lease offers included).
//! - [`observed`]: the node as a `PoolSource` for `--http`. [`agent`]: a pool node's link to its
//!   controller (registration, heartbeats, grants, end orders; claims' sessions reported with
//!   their claim). [`admin`]: the admission check `gpufuse run` makes before it starts a
//!   program, ending a session (`gpufuse kill`), the per-session log lines. `devices.rs`:
//!   `--devices`.

pub mod admin;
pub mod agent;
pub mod claims;
mod devices;
pub mod elastic;
pub mod image_cache;
pub mod launch_policy;
mod ledger;
pub mod lifecycle;
pub mod observed;
pub mod queue;
mod relay;
mod spawn;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpufuse_proto::SessionId;
use gpufuse_proto::{
    decode_owned, encode_frame, ClientHello, ComputePolicy, DeviceStatus, FrameKind, NodeStatus,
    ProtoError, Qos, ServerHello, SessionKind, SessionStatus, PROTOCOL_VERSION, SUPPORTED_VERSIONS,
};
use gpufuse_transport::{Address, Conn, Stream, TransportError};

pub use devices::{parse_size, DeviceSpec, DeviceSpecError, SIZE_FORMS};
pub use elastic::ElasticOptions;
pub use ledger::{Admitted, WINDOW};
pub use queue::DeviceQueue;

/// How a node decides whether a session may start.
#[derive(Clone)]
pub enum TokenPolicy {
    /// Any hello is accepted (a single-user machine).
    Open,
    /// Tokens must verify against this secret (`gpufuse token`).
    Verify(Vec<u8>),
}

/// What `gpufuse serve` was asked for.
#[derive(Clone)]
pub struct NodeConfig {
    pub listen: Vec<Address>,
    pub devices: DeviceSpec,
    pub tokens: TokenPolicy,
    /// The `gpufuse` binary that runs workers (`gpufuse worker ...`).
    pub worker_exe: std::path::PathBuf,
    /// Whether compute shares are caps (hard) or divide only a busy device (elastic).
    pub compute_policy: ComputePolicy,
    /// The identity `tcp+tls:` listeners serve with (`--tls-cert`, `--tls-key`,
    /// `--tls-client-ca`).
    pub tls: Option<gpufuse_transport::ServerTls>,
    /// Whether `tls` requires client certificates.
    pub client_certs: bool,
    /// A pool node's link to its controller (`gpufuse node`); `None` for `gpufuse serve`.
    pub pool: Option<Arc<agent::PoolLink>>,
    /// Serve metrics, health checks and the dashboard over HTTP here (`--http`).
    pub http: Option<gpufuse_observe::HttpConfig>,
    /// Oversubscription, swap and idle TTLs (`elastic.rs`).
    pub elastic: ElasticOptions,
    /// The node's image cache on disk, shared by its workers (`image_cache.rs`).
    pub image_cache: Option<gpufuse_image_cache::ImageCache>,
    /// Where the DRA plugin's CDI specs are (`--cdi-dir`): Kubernetes claims' tokens are
    /// honoured while their claim is prepared (`claims.rs`).
    pub cdi_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Devices(#[from] DeviceSpecError),
    #[error(transparent)]
    Http(#[from] gpufuse_observe::ObserveError),
}

/// One device's ledger.
#[derive(Debug, Clone)]
pub struct DeviceState {
    pub name: String,
    pub kind: gpufuse_proto::DeviceKind,
    pub total: u64,
    pub used: u64,
    /// Memory promised to sessions that asked for a slice.
    pub promised: u64,
    pub uuid: [u8; 16],
    pub pci: (u32, u32, u32),
    /// Peak FP32 TFLOPS: what a `--tflops` request is a share of.
    pub peak_tflops: f64,
    /// The compute capability the device reports (an emulated device's model).
    pub compute_capability: (u32, u32),
}

/// One live session.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub pid: u32,
    pub program: String,
    pub worker_pid: u32,
    pub device: u32,
    pub used: u64,
    pub limit: Option<u64>,
    pub qos: Qos,
    /// The session's compute share in percent.
    pub compute: Option<u32>,
    /// The subject of the session's token (its tenant), on a node that checks tokens.
    pub subject: Option<String>,
    /// The Kubernetes claim (UID) whose token opened the session (`claims.rs`).
    pub claim: Option<String>,
    /// Swapped bytes, command socket, activity (`elastic.rs`).
    pub elastic: elastic::SessionElastic,
}

/// The node's shared state. Lock order: this state, then a device queue; never the reverse.
#[derive(Debug)]
pub struct NodeState {
    pub devices: Vec<DeviceState>,
    /// Each device's launch queue (same index as `devices`).
    pub queues: Vec<Arc<DeviceQueue>>,
    pub compute_policy: ComputePolicy,
    pub sessions: HashMap<u64, SessionRecord>,
    pub next_session: u64,
    pub notes: Vec<String>,
    /// Placement times, refusals and session start times, for `--http`.
    pub observed: observed::Observed,
    /// Oversubscription and swap settings (`elastic.rs`).
    pub elastic: ElasticOptions,
    /// The image cache and what the workers reported of it (`image_cache.rs`).
    pub image_cache: image_cache::ImageCacheBooks,
}

impl NodeState {
    /// The node's status, read under its lock: everything but the image cache's size on
    /// disk (`image_cache` has the workers' counts, its `entries` and `bytes` are 0), which
    /// [`node_status`] reads after the lock is released.
    pub fn status(&self) -> NodeStatus {
        let percent_of_second = |us: u64| (us.min(1_000_000) / 10_000) as u32;
        NodeStatus {
            compute_policy: self.compute_policy,
            devices: self
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| DeviceStatus {
                    index: i as u32,
                    name: d.name.clone(),
                    kind: d.kind,
                    total_bytes: d.total,
                    used_bytes: d.used,
                    uuid: d.uuid,
                    compute_capability: d.compute_capability,
                    pci: d.pci,
                    utilization_percent: self.queues.get(i).map_or(0, |q| {
                        let now = q.now();
                        percent_of_second(q.lock().busy_last_second(now))
                    }),
                })
                .collect(),
            sessions: {
                let mut v: Vec<_> = self
                    .sessions
                    .iter()
                    .map(|(&id, s)| {
                        let (usage, on_device) = self
                            .queues
                            .get(s.device as usize)
                            .map(|q| q.usage(id))
                            .unwrap_or_default();
                        SessionStatus {
                            id: SessionId(id),
                            pid: s.pid,
                            program: s.program.clone(),
                            subject: s.subject.clone(),
                            worker_pid: s.worker_pid,
                            device: s.device,
                            used_bytes: s.used,
                            limit_bytes: s.limit,
                            utilization_percent: percent_of_second(usage.last_second_us),
                            qos: s.qos,
                            compute_percent: s.compute,
                            device_time_us: usage.device_time_us,
                            queue_p50_us: usage.queue_p50_us,
                            queue_p99_us: usage.queue_p99_us,
                            on_device,
                            swapped_host_bytes: s.elastic.swapped_host,
                            swapped_disk_bytes: s.elastic.swapped_disk,
                        }
                    })
                    .collect();
                v.sort_by_key(|s| s.id);
                v
            },
            notes: self.notes.clone(),
            pending: Vec::new(),
            image_cache: self.image_cache.counted(),
        }
    }
}

/// The node's status as `gpufuse status` shows it: [`NodeState::status`] under the node's
/// lock, then the image cache's directory (listed and every entry's size read) with the lock
/// released, so that workers' control requests do not wait on the disk.
pub fn node_status(state: &Shared) -> NodeStatus {
    let (mut status, books) = {
        let s = lock(state);
        (s.status(), s.image_cache.clone())
    };
    status.image_cache = books.status();
    status
}

pub type Shared = Arc<Mutex<NodeState>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, NodeState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// Binds every address, then serves until the process is stopped.
pub fn serve(config: NodeConfig) -> Result<(), NodeError> {
    let (devices, notes) = config.devices.resolve()?;
    for n in &notes {
        tracing::info!("{n}");
    }
    tracing::info!("compute policy: {}", config.compute_policy.name());
    let mut node = NodeState::new(devices, notes, config.compute_policy);
    node.elastic = config.elastic.clone();
    node.image_cache = image_cache::ImageCacheBooks::new(config.image_cache.clone());
    if let Some(c) = &config.image_cache {
        tracing::info!(
            "image cache: {} (at most {} bytes)",
            c.dir().display(),
            c.limit()
        );
    }
    let state: Shared = Arc::new(Mutex::new(node));
    let mut listeners = Vec::new();
    for addr in &config.listen {
        let l = addr
            .bind_with(config.tls.as_ref())
            .map_err(|source| NodeError::Listen {
                addr: addr.to_string(),
                source,
            })?;
        tracing::info!(
            "listening on {}",
            l.local_address().map(|a| a.to_string()).unwrap_or_default()
        );
        listeners.push(l);
    }
    admin::warn_if_open_tcp(&config.tokens, config.client_certs, &listeners);
    if let Some(http) = &config.http {
        let source = observed::NodeSource {
            state: state.clone(),
            // A node under a controller leaves the pool's series to the controller.
            pool_of_one: config.pool.as_ref().is_none_or(|l| l.local.is_some()),
            local: config.pool.as_ref().and_then(|l| l.local.clone()),
        };
        gpufuse_observe::serve(http.addr, Arc::new(source), http.options.clone())?;
    }
    // After binding (which refuses a live socket and anything that is not a socket): no
    // worker of an earlier node on these sockets may still be running.
    let sockets: Vec<std::path::PathBuf> = listeners
        .iter()
        .filter_map(|l| match l {
            gpufuse_transport::Listener::Unix(_, p) => Some(p.clone()),
            gpufuse_transport::Listener::Tcp(_) | gpufuse_transport::Listener::Tls(..) => None,
        })
        .collect();
    lifecycle::lock_sockets(&sockets).map_err(|source| NodeError::Listen {
        addr: sockets
            .iter()
            .map(|p| format!("unix:{}", p.display()))
            .collect::<Vec<_>>()
            .join(", "),
        source,
    })?;
    shutdown_on_signals(&listeners, &state)?;
    if let Some(link) = &config.pool {
        agent::start(link.clone(), state.clone());
    }
    let config = Arc::new(config);
    let handshakes = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for l in listeners {
        let (state, config, handshakes) = (state.clone(), config.clone(), handshakes.clone());
        threads.push(std::thread::spawn(move || loop {
            match l.accept() {
                Ok(stream) => {
                    // Connections that have not sent their hello yet are bounded (each has a
                    // thread until its hello or its deadline): idle connections cannot use up
                    // the node's threads.
                    let Some(slot) = HandshakeSlot::take(&handshakes) else {
                        tracing::warn!(
                            "{MAX_HANDSHAKES} connections are already waiting to send their \
                             hello; closing a new one"
                        );
                        continue;
                    };
                    let (state, config) = (state.clone(), config.clone());
                    std::thread::spawn(move || handle_connection(stream, slot, &state, &config));
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn answer(conn: &mut Conn, hello: &ServerHello) {
    let mut out = Vec::new();
    encode_frame(&mut out, FrameKind::HelloReply, 0, 0, hello);
    let _ = conn.send(&out);
}

fn refuse(conn: &mut Conn, reason: String) {
    tracing::info!("refused a session: {reason}");
    answer(conn, &ServerHello::Refused { reason });
}

/// Refuses a client whose protocol version this node does not speak. The answer's header
/// carries the older of the two versions: the frame header and `ServerHello::Refused` keep
/// their layout across versions, so an older client reads the reason instead of failing on
/// the header.
fn refuse_version(conn: &mut Conn, theirs: u16) {
    let reason = format!(
        "protocol version mismatch: the client speaks {theirs}, this server speaks {}..={} (upgrade the {})",
        SUPPORTED_VERSIONS.start(),
        SUPPORTED_VERSIONS.end(),
        if theirs < *SUPPORTED_VERSIONS.start() { "client" } else { "server" }
    );
    tracing::info!("refused a session: {reason}");
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Refused { reason },
    );
    gpufuse_proto::set_frame_version(&mut out, theirs.min(PROTOCOL_VERSION));
    let _ = conn.send(&out);
}

fn set_timeout(stream: &Stream, t: Option<Duration>) {
    let _ = stream.set_read_timeout(t);
}

/// Most connections that may be waiting for their hello at once.
pub const MAX_HANDSHAKES: usize = 64;
/// How long a connection has to send its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One of the [`MAX_HANDSHAKES`] places for a connection that has not sent its hello yet.
struct HandshakeSlot(Arc<AtomicUsize>);

impl HandshakeSlot {
    fn take(count: &Arc<AtomicUsize>) -> Option<Self> {
        let taken = count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_HANDSHAKES).then_some(n + 1)
            })
            .is_ok();
        taken.then(|| HandshakeSlot(count.clone()))
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// SIGTERM and SIGINT end the node cleanly: it says so, removes its unix sockets and exits;
/// its workers die with it (each is started with a parent-death signal, `spawn.rs`).
fn shutdown_on_signals(
    listeners: &[gpufuse_transport::Listener],
    state: &Shared,
) -> Result<(), NodeError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let sockets: Vec<std::path::PathBuf> = listeners
        .iter()
        .filter_map(|l| match l {
            gpufuse_transport::Listener::Unix(_, p) => Some(p.clone()),
            gpufuse_transport::Listener::Tcp(_) | gpufuse_transport::Listener::Tls(..) => None,
        })
        .collect();
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).map_err(|source| {
        NodeError::Listen {
            addr: "signal handlers".into(),
            source,
        }
    })?;
    let state = state.clone();
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
            let workers: Vec<u32> = lock(&state)
                .sessions
                .values()
                .map(|s| s.worker_pid)
                .filter(|&p| p != 0)
                .collect();
            tracing::info!("{name}: shutting down; ending {} session(s)", workers.len());
            for p in &sockets {
                let _ = std::fs::remove_file(p);
            }
            // Sessions end now, not only when the parent-death signal reaches their workers:
            // each worker is told to stop, and its session is released as it exits.
            for &pid in &workers {
                // SAFETY: sending a signal has no memory-safety preconditions; the pid is a
                // worker this node started and has not reaped (its control thread waits on it).
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while !lock(&state).sessions.is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            tracing::info!("{name}: stopped");
            std::process::exit(0);
        }
    });
    Ok(())
}

fn handle_connection(stream: Stream, slot: HandshakeSlot, state: &Shared, config: &NodeConfig) {
    set_timeout(&stream, Some(HELLO_TIMEOUT));
    let stream = match stream.plain_client_on_tls() {
        Ok(plain) => {
            let mut conn = Conn::new(plain);
            return refuse(
                &mut conn,
                "this listener speaks TLS: connect with tcp+tls:HOST:PORT (and --tls-ca)".into(),
            );
        }
        Err(stream) => stream,
    };
    let tcp = stream.is_tcp();
    let tls = stream.is_tls();
    let mut conn = Conn::new(stream);
    let hello: Result<(gpufuse_proto::FrameHeader, &[u8]), TransportError> = conn.recv();
    drop(slot);
    let mut hello: ClientHello = match hello {
        Ok((h, body)) if h.kind == FrameKind::Hello => match decode_owned(body) {
            Ok(hello) => hello,
            Err(e) => return tracing::warn!("malformed hello: {e}"),
        },
        Ok((h, _)) => {
            return refuse(
                &mut conn,
                format!("expected a hello, got a {:?} frame", h.kind),
            )
        }
        Err(TransportError::Proto(ProtoError::VersionMismatch { theirs, .. })) => {
            return refuse_version(&mut conn, theirs);
        }
        Err(TransportError::Io(e)) if tls => {
            return tracing::warn!("TLS connection failed before its hello: {e}")
        }
        Err(e) => return tracing::debug!("connection closed before its hello: {e}"),
    };
    if !SUPPORTED_VERSIONS.contains(&hello.protocol_version) {
        return refuse_version(&mut conn, hello.protocol_version);
    }
    // A client whose session moved here: its one-time key is its authority.
    if let SessionKind::Resume { key } = hello.kind {
        return spawn::resume(conn, key, state);
    }
    // A Kubernetes claim's token: only while the claim is prepared here, only on its device.
    let pinned = match hello.kind {
        SessionKind::Cuda | SessionKind::Check => {
            match claims::check_hello(state, config, &hello) {
                Ok(p) => p,
                Err(reason) => return refuse(&mut conn, reason),
            }
        }
        _ => None,
    };
    let allowed = |d: u32| pinned.is_none_or(|p| p == d);
    if let Some(link) = config
        .pool
        .as_ref()
        .filter(|l| agent::intercepts(l, &hello) && !claims::admitted_by_node(config, l, &hello))
    {
        return agent::serve_hello(link, conn, hello, tcp, state, config);
    }
    let claims = match &config.tokens {
        TokenPolicy::Open => None,
        TokenPolicy::Verify(secret) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            match gpufuse_auth::verify(secret, &hello.token, now) {
                Ok(c) => Some(c),
                Err(e) => return refuse(&mut conn, format!("authentication failed: {e}")),
            }
        }
    };
    match hello.kind {
        SessionKind::Status => {
            let mut status = node_status(state);
            if let Some(local) = config.pool.as_ref().and_then(|l| l.local.as_ref()) {
                status.pending = local.pending();
            }
            answer(&mut conn, &ServerHello::Status(status));
        }
        SessionKind::Check => {
            let bounded = admin::bound_compute(&mut hello, claims.as_ref());
            let reply = match bounded.and_then(|()| admin::slice_limit(&hello, claims.as_ref())) {
                Ok(limit) => admin::check(state, &hello, limit, allowed),
                Err(reason) => ServerHello::Refused { reason },
            };
            answer(&mut conn, &reply);
        }
        SessionKind::End {
            session: SessionId(session),
        } => {
            let reply = admin::end(state, config, session, claims.as_ref(), &hello);
            answer(&mut conn, &reply);
        }
        SessionKind::NodeAgent => refuse(
            &mut conn,
            "this is a gpufuse node, not a controller (gpufuse node --controller ADDR)".into(),
        ),
        SessionKind::Drain { .. } | SessionKind::Cordon { .. } => refuse(
            &mut conn,
            "nodes are cordoned and drained by their pool's controller: gpufuse node drain \
             NODE --server CONTROLLER"
                .into(),
        ),
        SessionKind::Migrate {
            session: SessionId(session),
            device,
        } => {
            let reply = match elastic::may_manage(state, config, session, claims.as_ref()) {
                Ok(()) => elastic::migrate(state, session, device),
                Err(reason) => ServerHello::Refused { reason },
            };
            answer(&mut conn, &reply);
        }
        SessionKind::MigrateTo {
            session: SessionId(session),
            ref node,
            device,
            ref token,
        } => {
            let reply = match elastic::may_manage(state, config, session, claims.as_ref()) {
                Ok(()) => elastic::migrate_out(state, session, node, device, token),
                Err(reason) => ServerHello::Refused { reason },
            };
            answer(&mut conn, &reply);
        }
        // Answered above.
        SessionKind::Resume { .. } => {}
        SessionKind::EndClaim => {
            let reply = claims::end_claim(state, config, claims.as_ref(), &hello);
            answer(&mut conn, &reply);
        }
        SessionKind::Cuda | SessionKind::MoveIn { .. } => {
            let incoming = match hello.kind {
                SessionKind::MoveIn {
                    session,
                    device,
                    window_base,
                    bytes,
                } => {
                    tracing::info!(
                        from_session = session.get(),
                        device,
                        bytes,
                        "a session moves in"
                    );
                    if let Err(reason) = spawn::room_for_incoming(state, device, bytes) {
                        return refuse(&mut conn, reason);
                    }
                    Some((device, spawn::Incoming::new(window_base)))
                }
                _ => None,
            };
            let allowed = |d: u32| allowed(d) && incoming.is_none_or(|(want, _)| want == d);
            if let Err(reason) = admin::bound_compute(&mut hello, claims.as_ref()) {
                return refuse(&mut conn, reason);
            }
            let limit = match admin::slice_limit(&hello, claims.as_ref()) {
                Ok(l) => l,
                Err(reason) => return refuse(&mut conn, reason),
            };
            let admitted = {
                let mut s = lock(state);
                let started = std::time::Instant::now();
                let admitted = s.admit_where(&hello, limit, allowed);
                let tenant = claims.as_ref().map(|c| c.subject.as_str());
                let outcome = admitted.as_ref().map(|a| a.id).map_err(|r| r.as_str());
                s.observed.placed(
                    started.elapsed(),
                    outcome,
                    &hello.program,
                    hello.pid,
                    tenant,
                );
                admitted
            };
            let a = match admitted {
                Ok(a) => a,
                Err(reason) => return refuse(&mut conn, reason),
            };
            admin::set_subject(state, a.id, claims.as_ref());
            set_timeout(conn.stream(), None);
            let incoming = incoming.map(|(_, i)| i);
            spawn::run_worker(conn, tcp, a, limit, state, config, incoming);
        }
    }
}
