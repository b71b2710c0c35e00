//! `gpufuse controller`: the pool's control plane. It holds no GPU and never carries a
//! session's data.
//!
//! - Nodes (`gpufuse node --controller ADDR`) open a link, register their devices, labels and
//!   sessions, and report every heartbeat ([`link`]). A node silent for the node timeout
//!   (4.8 s by default: marked lost within 5 s) or whose link closes is lost: nothing is
//!   placed there and its sessions show as lost until it reports again. The node is the
//!   truth for its own sessions, so a restarted controller learns every running session
//!   from the nodes' registrations.
//! - A client's `Cuda` hello is placed by the scheduler (`gpufuse-scheduler`: quotas,
//!   filters, policy) and answered with a redirect to the node and a signed grant
//!   ([`place`]); the client says hello again there and from then on talks to the node
//!   only. A session that fits nowhere waits in the pending queue (visible in the status)
//!   until capacity frees, its wait ends or its client hangs up. A `high`/`critical` session
//!   may preempt `low` ones: the controller ends them through their node, as `gpufuse kill`
//!   does, before it redirects.
//! - A `Status` hello gets the pool view ([`Controller::snapshot`]); an `End` hello (`gpufuse
//!   kill --server CONTROLLER ID`) ends pool session `ID` through its node.
//!
//! - Preemption ends victims through their nodes' `End`, or moves the victims that fit
//!   elsewhere. Moves (`moves.rs`): an operator's move, `gpufuse node drain`/`cordon`,
//!   `--defrag` rounds and preemption's victims; the move is charged in the scheduler, an
//!   order and a grant are signed, and the session's node is asked to carry it out
//!   (`docs/migration.md`).
//!
//! Also here: `gpufuse serve`'s controller, run in process (`embedded.rs`); `claims.rs`,
//! GPUQuotas as tenant quotas and ResourceClaims charged to them, for the Kubernetes
//! operator; [`ask`], the tenant, selector, model and wait a token carries; `quota_file.rs`,
//! the quota file re-read when it changes and on SIGHUP; [`observed`], the pool as `--http`
//! shows it.
//!
//! A controller outage stops new placements only: running sessions talk to their nodes.

#![forbid(unsafe_code)]

pub mod ask;
mod claims;
mod embedded;
mod link;
mod moves;
pub mod observed;
mod place;
mod quota_file;
mod view;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpufuse_proto::{
    decode_owned, encode_frame, ClientHello, FrameKind, PoolStatus, ProtoError, ServerHello,
    SessionKind, SUPPORTED_VERSIONS,
};
use gpufuse_scheduler::{Millis, Placement, Policy, Pool, QuotaFile, SessionId};
use gpufuse_transport::{Address, Conn, Stream, TransportError};

pub use ask::PlacementAsk;
pub use quota_file::QUOTA_POLL;

/// What `gpufuse controller` was asked for.
#[derive(Clone)]
pub struct ControllerConfig {
    pub listen: Vec<Address>,
    pub policy: Policy,
    pub quotas: QuotaFile,
    /// Clients and nodes must present tokens signed with this secret (`gpufuse token`).
    pub token_secret: Option<Vec<u8>>,
    /// How often nodes report.
    pub heartbeat: Duration,
    /// Silence after which a node is lost (4.8 s: with the ticker's [`TICK`], within 5 s).
    pub node_timeout: Duration,
    /// How long a session may wait for capacity when its client names no wait
    /// (`gpufuse run --wait`): a little under the client's default hello timeout (10 s).
    pub default_wait: Duration,
    pub tls: Option<gpufuse_transport::ServerTls>,
    /// Defragmentation (`--defrag PCT`): devices under PCT% promised are emptied into
    /// others when all their sessions fit there, freeing whole GPUs. Off (`None`) by default.
    pub defrag: Option<u32>,
    /// How often a defragmentation round runs (sooner while sessions wait for capacity).
    pub defrag_interval: Duration,
}

impl ControllerConfig {
    /// A controller on `listen` with the defaults: balanced, no quotas, open, 1 s
    /// heartbeats, nodes lost within 5 s of their last report, 8 s waits.
    pub fn new(listen: Vec<Address>) -> Self {
        Self {
            listen,
            policy: Policy::default(),
            quotas: QuotaFile::default(),
            token_secret: None,
            heartbeat: Duration::from_secs(1),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            default_wait: Duration::from_secs(8),
            tls: None,
            defrag: None,
            defrag_interval: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// The pool and what waits on it.
struct Books {
    pool: Pool,
    /// Pending requests the queue has since placed (or preempted for), by id, until their
    /// waiting client takes them.
    placed: HashMap<SessionId, Placement>,
    /// Which link speaks for each node (a newer link replaces an older one).
    links: HashMap<String, u64>,
    /// How long placement decisions took (`gpufuse_pool_placement_seconds`).
    placement: gpufuse_observe::snapshot::Recorder,
    /// The quota file's limits as last read (`--quota-file`; reloaded when it changes).
    file_quotas: QuotaFile,
    /// Tenants whose quota the Kubernetes operator set (a `GPUQuota`): they override the
    /// file's entry for that tenant, across reloads of the file.
    quota_overrides: std::collections::BTreeMap<String, gpufuse_scheduler::TenantQuota>,
}

struct Inner {
    config: ControllerConfig,
    books: Mutex<Books>,
    /// Signalled whenever placements may have changed.
    changed: Condvar,
    epoch: Instant,
    /// Signs grants and end orders; nodes learn it when they register.
    grant_key: [u8; 32],
    next_link: AtomicU64,
}

/// A running controller (cheap to clone).
#[derive(Clone)]
pub struct Controller(Arc<Inner>);

/// The default node timeout: a node is marked lost at the first tick after it, so within
/// `DEFAULT_NODE_TIMEOUT + TICK` (4.9 s) of its last report.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(4_800);
/// How often the ticker looks for lost nodes, expired starts and what the queue now fits.
pub const TICK: Duration = Duration::from_millis(100);
/// How soon a defragmentation round follows the last one while sessions wait for capacity.
pub const DEFRAG_PENDING_GAP: Duration = Duration::from_secs(2);
/// The token subject of the pool's operator: on a controller that checks tokens, only its
/// tokens may cordon and drain nodes, or move another tenant's sessions.
pub const ADMIN_SUBJECT: &str = "admin";
/// Most connections the controller serves at once (waiting clients hold one each).
const MAX_CONNECTIONS: usize = 1024;
/// How long a connection has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

impl Controller {
    pub fn new(config: ControllerConfig) -> Self {
        let pool = Pool::new(config.policy, config.quotas.clone());
        let file_quotas = config.quotas.clone();
        Controller(Arc::new(Inner {
            config,
            books: Mutex::new(Books {
                pool,
                placed: HashMap::new(),
                links: HashMap::new(),
                placement: gpufuse_observe::snapshot::Recorder::new(
                    &gpufuse_observe::snapshot::PLACEMENT_BOUNDS,
                ),
                file_quotas,
                quota_overrides: Default::default(),
            }),
            changed: Condvar::new(),
            epoch: Instant::now(),
            grant_key: gpufuse_auth::new_secret(),
            next_link: AtomicU64::new(1),
        }))
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        self.0.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Millis {
        self.0.epoch.elapsed().as_millis() as Millis
    }

    /// The pool as `gpufuse status` shows it: a serde value (postcard on the wire, JSON for
    /// `--json`, and what metrics exporters read).
    /// How long placement decisions took, for `--http`.
    pub fn placement_times(&self) -> gpufuse_observe::snapshot::Histogram {
        self.books().placement.histogram()
    }

    pub fn snapshot(&self) -> PoolStatus {
        let now = self.now();
        view::snapshot(&self.books().pool, now)
    }

    /// Places what the queue now fits, marks silent nodes lost and forgets sessions that never
    /// started, then wakes the waiting clients.
    fn reschedule(&self, books: &mut Books) {
        let now = self.now();
        let timeout = self.0.config.node_timeout.as_millis() as Millis;
        for n in books.pool.expire(now, timeout) {
            tracing::warn!("node {n} is lost: no report for {timeout} ms; nothing is placed there until it reports again");
        }
        for p in books.pool.retry_pending(now) {
            books.placed.insert(p.session, p);
        }
        self.0.changed.notify_all();
    }

    /// The ticker: lost nodes, expired starts, the queue, every [`TICK`].
    fn start_ticker(&self) {
        let ticker = self.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(TICK);
            let mut b = ticker.books();
            ticker.reschedule(&mut b);
        });
    }

    /// The defragmenter (`--defrag`): a round every `defrag_interval`, or every
    /// [`DEFRAG_PENDING_GAP`] while sessions wait for capacity; each round's moves are carried
    /// out one at a time (`docs/pool.md`, "Defragmentation").
    fn start_defragmenter(&self) {
        let Some(threshold) = self.0.config.defrag else {
            return;
        };
        let me = self.clone();
        std::thread::spawn(move || {
            let mut last = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let waiting = !me.books().pool.pending().is_empty();
                let gap = if waiting {
                    DEFRAG_PENDING_GAP.min(me.0.config.defrag_interval)
                } else {
                    me.0.config.defrag_interval
                };
                if last.elapsed() < gap {
                    continue;
                }
                me.defragment(threshold);
                last = Instant::now();
            }
        });
    }

    /// One defragmentation round; the number of sessions moved.
    pub fn defragment(&self, threshold: u32) -> usize {
        let plan = self.books().pool.plan_defrag(threshold);
        if plan.is_empty() {
            return 0;
        }
        tracing::info!(
            "defragmentation: {} move(s) to empty device(s) under {threshold}% promised",
            plan.len()
        );
        let mut moved = 0;
        for m in plan {
            let begun = self
                .books()
                .pool
                .begin_move(m.session, &m.to_node, m.to_device, true);
            if let Err(reason) = begun {
                tracing::info!("defragmentation: session {} stays: {reason}", m.session);
                continue;
            }
            if moves::carry_out(self, m.session, gpufuse_scheduler::MoveEnd::Stayed).is_ok() {
                moved += 1;
            }
        }
        moved
    }

    /// Binds every address, then serves until the process ends.
    pub fn serve(&self) -> Result<(), ControllerError> {
        let cfg = &self.0.config;
        let mut listeners = Vec::new();
        for addr in &cfg.listen {
            let l = addr
                .bind_with(cfg.tls.as_ref())
                .map_err(|source| ControllerError::Listen {
                    addr: addr.to_string(),
                    source,
                })?;
            tracing::info!(
                "controller listening on {} (policy {})",
                l.local_address().map(|a| a.to_string()).unwrap_or_default(),
                cfg.policy.name()
            );
            listeners.push(l);
        }
        self.start_ticker();
        self.start_defragmenter();
        let open = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for l in listeners {
            let (me, open) = (self.clone(), open.clone());
            threads.push(std::thread::spawn(move || loop {
                match l.accept() {
                    Ok(stream) => {
                        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                            open.fetch_sub(1, Ordering::AcqRel);
                            tracing::warn!(
                                "{MAX_CONNECTIONS} connections are open; closing a new one"
                            );
                            continue;
                        }
                        let (me, open) = (me.clone(), open.clone());
                        std::thread::spawn(move || {
                            me.handle(stream);
                            open.fetch_sub(1, Ordering::AcqRel);
                        });
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

    fn handle(&self, stream: Stream) {
        let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
        let mut conn = Conn::new(stream);
        let hello: ClientHello = match conn.recv() {
            Ok((h, body)) if h.kind == FrameKind::Hello => match decode_owned(body) {
                Ok(hello) => hello,
                Err(e) => return tracing::warn!("malformed hello: {e}"),
            },
            Ok((h, _)) => {
                return answer(
                    &mut conn,
                    &refused(format!("expected a hello, got a {:?} frame", h.kind)),
                )
            }
            Err(TransportError::Proto(ProtoError::VersionMismatch { theirs, .. })) => {
                return refuse_version(&mut conn, theirs);
            }
            Err(e) => return tracing::debug!("connection closed before its hello: {e}"),
        };
        if !SUPPORTED_VERSIONS.contains(&hello.protocol_version) {
            return refuse_version(&mut conn, hello.protocol_version);
        }
        match hello.kind {
            SessionKind::Status => {
                if let Err(reason) = self.authenticate(&hello.token) {
                    return answer(&mut conn, &refused(reason));
                }
                answer(&mut conn, &ServerHello::PoolStatus(self.snapshot()));
            }
            SessionKind::NodeAgent => link::serve(self, conn, &hello),
            SessionKind::Cuda => place::serve(self, conn, &hello),
            SessionKind::Check => {
                let reply = place::check(self, &hello);
                answer(&mut conn, &reply);
            }
            SessionKind::End { session } => {
                let reply = place::end(self, &hello, session.get());
                answer(&mut conn, &reply);
            }
            // Moves within a node are the node's (`gpufuse migrate --server NODE`).
            SessionKind::Migrate { .. } => answer(
                &mut conn,
                &refused(
                    "through a controller, name the node too: gpufuse migrate ID --to \
                     NODE:DEVICE (or ask the session's node: --server NODE_ADDR)"
                        .into(),
                ),
            ),
            SessionKind::MigrateTo {
                session,
                ref node,
                device,
                ..
            } => {
                let reply = moves::migrate(self, &hello, session.get(), node, device);
                answer(&mut conn, &reply);
            }
            SessionKind::Drain { ref node } => {
                let reply = moves::drain(self, &hello, node);
                answer(&mut conn, &reply);
            }
            SessionKind::Cordon { ref node, cordoned } => {
                let reply = moves::cordon(self, &hello, node, cordoned);
                answer(&mut conn, &reply);
            }
            SessionKind::MoveIn { .. } | SessionKind::Resume { .. } => answer(
                &mut conn,
                &refused("this is a gpufuse controller: sessions move between nodes".into()),
            ),
            SessionKind::EndClaim => answer(
                &mut conn,
                &refused(
                    "a claim's sessions are ended by the node that prepared it (the DRA plugin's --server)"
                        .into(),
                ),
            ),
        }
    }

    /// Whether `token` may cordon and drain nodes: anyone on an open controller; on one that
    /// checks tokens, a token for [`ADMIN_SUBJECT`].
    fn authorize_admin(&self, token: &str) -> Result<(), String> {
        match self.authenticate(token)? {
            Some(c) if c.subject != ADMIN_SUBJECT => Err(format!(
                "a token for {:?} may not cordon or drain nodes; that takes a token for {ADMIN_SUBJECT:?} (gpufuse token issue --subject {ADMIN_SUBJECT})",
                c.subject
            )),
            _ => Ok(()),
        }
    }

    /// Verifies a token when the controller requires them; the token's claims.
    fn authenticate(&self, token: &str) -> Result<Option<gpufuse_auth::Claims>, String> {
        let Some(secret) = &self.0.config.token_secret else {
            return Ok(None);
        };
        gpufuse_auth::verify(secret, token, unix_now())
            .map(Some)
            .map_err(|e| format!("authentication failed: {e}"))
    }
}

/// Refuses a client of another protocol version in the older of the two versions, as the
/// node does: the frame header and `ServerHello::Refused` keep their layout across versions,
/// so an older client reads the reason instead of failing on the header.
fn refuse_version(conn: &mut Conn, theirs: u16) {
    let reason = format!(
        "protocol version mismatch: the client speaks {theirs}, this controller speaks {}..={} (upgrade the {})",
        SUPPORTED_VERSIONS.start(),
        SUPPORTED_VERSIONS.end(),
        if theirs < *SUPPORTED_VERSIONS.start() { "client" } else { "controller" }
    );
    let mut out = Vec::new();
    encode_frame(&mut out, FrameKind::HelloReply, 0, 0, &refused(reason));
    gpufuse_proto::set_frame_version(&mut out, theirs.min(gpufuse_proto::PROTOCOL_VERSION));
    let _ = conn.send(&out);
}

fn refused(reason: String) -> ServerHello {
    ServerHello::Refused { reason }
}

fn answer(conn: &mut Conn, hello: &ServerHello) {
    let mut out = Vec::new();
    encode_frame(&mut out, FrameKind::HelloReply, 0, 0, hello);
    let _ = conn.send(&out);
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
