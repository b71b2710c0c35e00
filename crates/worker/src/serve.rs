//! The session's connection: the hello answer, then requests read, run and answered until the
//! client leaves. Large host-to-device copies are received straight into device memory and
//! large device-to-host replies sent from it in place.

use gpufuse_device::Device;
use gpufuse_proto::{
    decode_borrowed, decode_request, encode_frame, encode_frame_head, FrameKind, ReplyBody,
    Request, ServerHello,
};
use gpufuse_transport::{Conn, TransportError};

use crate::migrate::{Dirt, PreCopy};
use crate::remote::{Leaving, RemoteTarget};
use crate::{heartbeat, DeviceOpener, ElasticConfig, HtodTarget, Ledger, Session, WorkerError};
use gpufuse_proto::SessionId;
use gpufuse_proto::{DevicePtr, StreamHandle};

/// What an elastic session has beyond a plain one: its TTLs and swap directory, the node's
/// command socket (evict, migrate) and a way to open another device of the node.
#[derive(Default)]
pub struct Elastic {
    pub config: ElasticConfig,
    pub commands: Option<std::os::unix::net::UnixStream>,
    pub open_device: Option<DeviceOpener>,
}

/// Copies at least this large are received straight into device memory.
const DIRECT_HTOD: u32 = 1 << 20;
/// A copy's message is a few dozen bytes; anything longer is not one to take the direct path.
const MAX_DIRECT_HEAD: u32 = 256;

/// Serves one session on `conn` until the client leaves, then frees everything it held.
/// Sends the hello answer first.
pub fn serve(
    conn: Conn,
    session_id: u64,
    device: &mut dyn Device,
    ledger: &mut dyn Ledger,
    limit: Option<u64>,
) -> Result<(), WorkerError> {
    serve_elastic(conn, session_id, device, ledger, limit, Elastic::default())
}

/// [`serve`], for a session whose memory may leave the device and that may move.
pub fn serve_elastic(
    mut conn: Conn,
    session_id: u64,
    device: &mut dyn Device,
    ledger: &mut dyn Ledger,
    limit: Option<u64>,
    elastic: Elastic,
) -> Result<(), WorkerError> {
    let info = device.info(limit);
    greet(&mut conn, session_id, &info)?;
    let session = Session::new(device, ledger, limit).with_elastic(elastic.config, session_id);
    let commands = elastic
        .commands
        .map(|s| Conn::new(gpufuse_transport::Stream::Unix(s)));
    serve_session(conn, session, commands, elastic.open_device)
}

/// Answers a hello: the session is accepted, on `info`'s device.
pub(crate) fn greet(
    conn: &mut Conn,
    session_id: u64,
    info: &gpufuse_proto::DeviceInfo,
) -> Result<(), WorkerError> {
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Accepted {
            session_id: SessionId(session_id),
            devices: vec![info.clone()],
        },
    );
    conn.send(&out).map_err(TransportError::from)?;
    // A local client may send its shared mapping's descriptors (`ShmAttach`).
    conn.accept_fds();
    Ok(())
}

/// Serves `session` on `conn` (its hello answered) until the client leaves or the session
/// moves to another node, then frees everything it held here.
pub(crate) fn serve_session(
    mut conn: Conn,
    mut session: Session,
    commands: Option<Conn>,
    open_device: Option<DeviceOpener>,
) -> Result<(), WorkerError> {
    let mut out = Vec::new();
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut beat = heartbeat::Heartbeat::start(
        conn.stream().try_clone().map_err(TransportError::from)?,
        cancel.clone(),
    )
    .map_err(TransportError::from)?;
    session.set_cancel(cancel);
    let mut node = Commands {
        conn: commands,
        open_device,
        out: Vec::new(),
        moving: None,
        leaving: None,
        moved_away: false,
        forwarding: None,
        last_step: std::time::Instant::now(),
    };
    let result = run(&mut conn, &mut session, &mut out, &mut beat, &mut node);
    session.release_all();
    if node.moved_away {
        // The client was told where its session went; it hangs up once it has read that.
        beat.busy(false);
        let _ = conn.wait_readable(None, Some(MOVED_HANGUP_WAIT));
        return Ok(());
    }
    match result {
        Err(WorkerError::Transport(TransportError::Closed)) => Ok(()),
        other => other,
    }
}

/// How long a worker whose session moved to another node waits for its client to hang up.
const MOVED_HANGUP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Answers the hello with a refusal (the worker could not open its device).
pub fn refuse(mut conn: Conn, reason: String) -> Result<(), WorkerError> {
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Refused { reason },
    );
    conn.send(&out).map_err(TransportError::from)?;
    Ok(())
}

/// How often, at most, the worker looks whether its client is gone while launches arrive.
const HANGUP_CHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// The coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the kernel's last tick, a few
/// milliseconds' resolution), cheap enough to read before every request, which the precise
/// clock is not at millions of requests a second.
fn coarse_now() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn run(
    conn: &mut Conn,
    session: &mut Session,
    out: &mut Vec<u8>,
    beat: &mut heartbeat::Heartbeat,
    node: &mut Commands,
) -> Result<(), WorkerError> {
    let mut last_check = coarse_now();
    loop {
        // A move in progress copies a bounded step between requests (`migrate.rs`).
        node.gap(session);
        // A client that keeps sending quiet requests is not waited for: the stop comes
        // between two of them.
        if node.leaving_ready_for(QUIET_STOP_BUSY) {
            node.stop_quietly(session, beat);
        }
        if !conn.has_frame() && node.forwarding.is_none() {
            beat.busy(false);
            node.wait_for_client(conn, session, beat)?;
        }
        if let Some((target, key)) = node.forwarding.take() {
            return crate::forward::forward(conn, session, target, key, beat);
        }
        // A client that died with launches still queued in the socket: its work is dropped at
        // once instead of holding the device for the others (CUDA abandons a dead process's
        // work too). Looked at once a millisecond at most, so request rates do not pay for it.
        let now = coarse_now();
        if now.saturating_sub(last_check) >= HANGUP_CHECK {
            last_check = now;
            if conn.peer_hung_up() {
                tracing::info!("the client is gone: dropping its queued work");
                return Err(WorkerError::Transport(TransportError::Closed));
            }
            // A client that never pauses still hears the node's commands (a move).
            node.poll(session);
        }
        // Idle while waiting for the client (no heartbeats), busy from its next frame on.
        beat.busy(conn.has_frame());
        let header = conn.peek_header()?;
        beat.busy(true);
        // A large host-to-device copy: its data (the frame's tail) is received straight into
        // device memory.
        if header.kind == FrameKind::Request
            && header.is_quiet()
            && header.tail >= DIRECT_HTOD
            && header.message_len() <= MAX_DIRECT_HEAD
        {
            let head = header.message_len() as usize;
            if let Ok(Request::MemcpyHtoD {
                dst: DevicePtr(dst),
                stream: StreamHandle(stream),
                data,
            }) = decode_borrowed::<Request>(conn.peek_body(head)?)
            {
                if data.is_empty() {
                    match session.htod_target(dst, stream, u64::from(header.tail)) {
                        HtodTarget::Write(bytes) => {
                            conn.recv_tail_into(head, bytes)?;
                            node.note(
                                session,
                                Dirt::Range {
                                    start: dst,
                                    len: u64::from(header.tail),
                                },
                            );
                            continue;
                        }
                        HtodTarget::Discard => {
                            conn.skip_frame()?;
                            continue;
                        }
                        HtodTarget::Unsupported => {}
                    }
                }
            }
        }
        // A move to another node stops at a synchronous request (the client then waits and
        // sends nothing more): the request is answered by where the session went, and runs
        // there.
        if header.kind == FrameKind::Request && !header.is_quiet() && node.leaving_ready() {
            let head = header.message_len() as usize;
            let attach = matches!(
                decode_borrowed::<Request>(conn.peek_body(head)?),
                Ok(Request::ShmAttach { .. })
            );
            if !attach && node.leave(session, conn, header.request_id, beat)? {
                return Ok(());
            }
        }
        let (header, body) = conn.recv()?;
        if header.kind != FrameKind::Request {
            return Err(WorkerError::UnexpectedFrame(header.kind));
        }
        let quiet = header.is_quiet();
        let id = header.request_id;
        let req: Request = decode_request(&header, body)?;

        if tracing::enabled!(tracing::Level::TRACE) {
            let mut text = format!("{req:?}");
            text.truncate(200);
            tracing::trace!(quiet, "request {text}");
        }
        let shm_offer = match req {
            Request::ShmAttach {
                request_ring,
                reply_ring,
            } if !quiet => Some((request_ring, reply_ring)),
            _ => None,
        };
        let dirt = node.is_moving().then(|| Dirt::of(&req));
        let reply = session.dispatch(req, quiet);
        if let Some(dirt) = dirt {
            node.note(session, dirt);
        }
        let attach = shm_offer.map(|(req_ring, reply_ring)| adopt_shm(conn, req_ring, reply_ring));
        if session.holds_lease() && !conn.poll_frame() {
            // Nothing more has arrived: do not hold the device while waiting for the client.
            session.end_lease();
        }
        if let Some(attach) = attach {
            // The answer goes over the socket; from the next request on, both sides use the
            // rings (the client sends nothing more until it has read this answer).
            let mut reply = reply.expect("a synchronous request is answered");
            if attach.is_ok() {
                reply.status = 0;
            }
            out.clear();
            encode_frame(out, FrameKind::Reply, 0, id, &reply);
            {
                let _writing = beat.writing();
                conn.send(out).map_err(TransportError::from)?;
            }
            match attach {
                Ok((stream, arena)) => {
                    if let Some(arena) = arena {
                        session.set_host_arena(arena);
                    }
                    let clone = stream.clone();
                    if conn
                        .replace_stream(gpufuse_transport::Stream::Shm(stream))
                        .is_err()
                    {
                        return Err(WorkerError::Transport(TransportError::Io(
                            std::io::Error::new(
                                std::io::ErrorKind::InvalidData,
                                "the client sent requests after ShmAttach before its answer",
                            ),
                        )));
                    }
                    *beat = heartbeat::Heartbeat::start(
                        gpufuse_transport::Stream::Shm(clone),
                        beat.cancel_flag(),
                    )
                    .map_err(TransportError::from)?;
                    tracing::info!("the session moved to the shared-memory transport");
                }
                Err(why) => tracing::warn!("shared-memory transport refused: {why}"),
            }
            continue;
        }
        if let Some(mut reply) = reply {
            let _writing = beat.writing();
            out.clear();
            if let Some((src, size)) = session.view.take() {
                if reply.status == 0 {
                    encode_frame_head(out, FrameKind::Reply, 0, id, &reply, size as usize);
                    conn.send(out).map_err(TransportError::from)?;
                    let data = session
                        .device
                        .view(src, size)
                        .expect("checked when the request ran");
                    conn.send(data).map_err(TransportError::from)?;
                    continue;
                }
            }
            match &mut reply.body {
                // Bulk data goes out from its own buffer, not copied into the frame.
                ReplyBody::Data(d) if d.len() >= 64 * 1024 => {
                    let data = std::mem::take(d);
                    encode_frame_head(out, FrameKind::Reply, 0, id, &reply, data.len());
                    conn.send(out).map_err(TransportError::from)?;
                    conn.send(&data).map_err(TransportError::from)?;
                    session.scratch = data;
                }
                _ => {
                    encode_frame(out, FrameKind::Reply, 0, id, &reply);
                    conn.send(out).map_err(TransportError::from)?;
                }
            }
            if out.capacity() > 1 << 20 {
                *out = Vec::new();
            }
        }
    }
}

/// The node's side of an elastic session: its command socket and the device opener.
struct Commands {
    conn: Option<Conn>,
    open_device: Option<DeviceOpener>,
    out: Vec<u8>,
    /// A move with pre-copy in progress; answered when it ends.
    moving: Option<Move>,
    /// A move to another node in progress.
    leaving: Option<Leave>,
    /// The session was handed to another node.
    moved_away: bool,
    /// Handed over while the client was not waiting for an answer: the target and the key
    /// the client resumes with; its quiet requests are forwarded until it next waits
    /// (`forward.rs`).
    forwarding: Option<(RemoteTarget, u64)>,
    /// When the last pre-copy step ended (steps are spaced while requests arrive).
    last_step: std::time::Instant,
}

/// A move the node asked for, in progress.
struct Move {
    /// The command's id, for its answer.
    id: u64,
    device: u32,
    /// Answer with a [`gpufuse_proto::MoveOutcome`] (else a `ControlAnswer`).
    with_figures: bool,
    precopy: PreCopy,
}

/// A move to another node the node asked for, in progress.
struct Leave {
    id: u64,
    precopy: PreCopy<RemoteTarget>,
    /// When the rounds ended: the stop waits for a synchronous request from then on.
    ready_since: Option<std::time::Instant>,
}

/// How long a move to another node, its rounds done, waits for a pause in its client's
/// requests (or a synchronous one) before it stops between two quiet ones.
const QUIET_STOP_BUSY: std::time::Duration = std::time::Duration::from_secs(1);

/// While requests keep arriving, pre-copy steps are at least this far apart, so that the
/// session's own requests get most of the time.
const STEP_GAP: std::time::Duration = std::time::Duration::from_millis(2);

/// What woke a worker waiting for its client.
enum Woken {
    Client,
    Command,
    Timeout,
}

impl Commands {
    /// Waits until the client sends something, answering the node's commands and running the
    /// idle steps (scale to zero) meanwhile. Without commands or TTLs it returns at once: the
    /// caller's read waits.
    fn wait_for_client(
        &mut self,
        client: &mut Conn,
        session: &mut Session,
        beat: &heartbeat::Heartbeat,
    ) -> Result<(), WorkerError> {
        loop {
            let timeout = if self.leaving_ready() {
                // Waiting for the client's next synchronous request; a deadline to look at.
                Some(std::time::Duration::from_millis(50))
            } else if self.is_moving() {
                // Copy on while the client is quiet; no idle steps during a move.
                Some(std::time::Duration::ZERO)
            } else {
                session.idle_tick()
            };
            if self.conn.is_none() && timeout.is_none() {
                return Ok(());
            }
            let command = self.conn.as_ref().is_some_and(|c| c.has_frame())
                || match wait(client, self.conn.as_ref(), timeout) {
                    Woken::Client => return Ok(()),
                    Woken::Command => true,
                    Woken::Timeout if self.leaving_ready() => {
                        // The client is quiet: stop now, forward what it sends meanwhile.
                        if self.stop_quietly(session, beat) {
                            return Ok(());
                        }
                        false
                    }
                    Woken::Timeout => false,
                };
            if command {
                // A client that sends a request meanwhile hears heartbeats, not silence.
                beat.busy(true);
                self.answer(session);
                beat.busy(false);
            }
            if self.is_moving() {
                beat.busy(true);
                self.advance(session);
                beat.busy(false);
            }
        }
    }

    /// Whether a move (to another device or node) is in progress.
    fn is_moving(&self) -> bool {
        self.moving.is_some() || self.leaving.is_some()
    }

    /// Whether a move to another node has copied what it can while the session runs: it
    /// stops at the next synchronous request.
    fn leaving_ready(&self) -> bool {
        self.leaving.as_ref().is_some_and(|l| l.precopy.ready())
    }

    /// Whether a move to another node has been ready to stop for `d` or longer.
    fn leaving_ready_for(&self, d: std::time::Duration) -> bool {
        self.leaving
            .as_ref()
            .and_then(|l| l.ready_since)
            .is_some_and(|since| since.elapsed() >= d)
    }

    /// Answers a command that arrived while requests keep coming.
    fn poll(&mut self, session: &mut Session) {
        if self
            .conn
            .as_ref()
            .is_some_and(|c| c.has_frame() || ready_now(c))
        {
            self.answer(session);
        }
    }

    /// Records what the request that just ran could have written, for a move in progress.
    fn note(&mut self, session: &Session, dirt: Dirt) {
        if let Some(m) = self.moving.as_mut() {
            session.precopy_note(&mut m.precopy, dirt);
        }
        if let Some(l) = self.leaving.as_mut() {
            session.precopy_note(&mut l.precopy, dirt);
        }
    }

    /// Between requests: one pre-copy step, if the last one was long enough ago.
    fn gap(&mut self, session: &mut Session) {
        if self.is_moving() && self.last_step.elapsed() >= STEP_GAP {
            self.advance(session);
        }
    }

    /// One pre-copy step, or the stop once the rounds are over; answers the node when the
    /// move ends (moved, or refused with nothing changed).
    fn advance(&mut self, session: &mut Session) {
        if self.leaving.is_some() {
            return self.advance_leaving(session);
        }
        let Some(mut m) = self.moving.take() else {
            return;
        };
        let device = m.device;
        let opener = &mut self.open_device;
        let mut open = |t: &mut Box<dyn Device>| -> Result<(), String> {
            *t = match opener.as_mut() {
                Some(o) => o(device)?,
                None => return Err("this worker cannot open another device".to_string()),
            };
            Ok(())
        };
        let ended = if m.precopy.ready() {
            Some(
                session
                    .precopy_finish(m.precopy, &mut open)
                    .map(|(figures, target)| {
                        session.switch_to(target);
                        figures
                    }),
            )
        } else {
            match session.precopy_step(&mut m.precopy, &mut open) {
                Ok(()) => {
                    self.moving = Some(m);
                    self.last_step = std::time::Instant::now();
                    return;
                }
                Err(why) => Some(Err(why)),
            }
        };
        if let Some(result) = ended {
            self.answer_move(m.id, m.with_figures, device, result);
        }
    }

    /// One pre-copy step of a move to another node; once its rounds are done, the move waits
    /// for its stop ([`Commands::leave`], [`Commands::stop_quietly`]).
    fn advance_leaving(&mut self, session: &mut Session) {
        let Some(mut l) = self.leaving.take() else {
            return;
        };
        if l.precopy.ready() {
            // The stop comes at the client's next synchronous request, when it goes quiet,
            // or between its requests after [`QUIET_STOP_BUSY`].
            l.ready_since.get_or_insert_with(std::time::Instant::now);
            self.leaving = Some(l);
            return;
        }
        // A remote target starts over by itself at the next layout.
        match session.precopy_step(&mut l.precopy, &mut |_| Ok(())) {
            Ok(()) => {
                self.leaving = Some(l);
                self.last_step = std::time::Instant::now();
            }
            Err(why) => {
                tracing::warn!("the session cannot move to the other node: {why}");
                self.answer_outcome(l.id, gpufuse_proto::MoveOutcome::Refused { reason: why });
            }
        }
    }

    /// The stop of a move to another node: the dirty remainder and the books go over; once
    /// the target holds the session, its memory here is freed and the node is answered. The
    /// target and the client's key, or `None`: the session stays here, untouched.
    fn hand_over(
        &mut self,
        session: &mut Session,
        beat: &heartbeat::Heartbeat,
    ) -> Option<(RemoteTarget, u64)> {
        use gpufuse_proto::MoveOutcome;
        let l = self.leaving.take()?;
        let stopped = std::time::Instant::now();
        beat.busy(true);
        let handed =
            session
                .precopy_finish(l.precopy, &mut |_| Ok(()))
                .and_then(|(figures, mut target)| {
                    let books = session.books_for_move().encode();
                    match target.commit(books) {
                        Ok(key) => Ok((figures, target, key)),
                        Err(why) => {
                            target.abort(&why);
                            Err(why)
                        }
                    }
                });
        let (mut figures, target, key) = match handed {
            Ok(h) => h,
            Err(why) => {
                tracing::warn!("the session cannot move to the other node: {why}");
                self.answer_outcome(l.id, MoveOutcome::Refused { reason: why });
                return None;
            }
        };
        session.forget_moved();
        self.moved_away = true;
        figures.stop_us = u64::try_from(stopped.elapsed().as_micros()).unwrap_or(u64::MAX);
        tracing::info!(
            to = %target.address,
            session = target.session,
            stop_us = figures.stop_us,
            rounds = figures.rounds,
            stop_bytes = figures.stop_bytes,
            "the session moved to another node"
        );
        self.answer_outcome(
            l.id,
            MoveOutcome::MovedAway {
                session: SessionId(target.session),
                figures,
            },
        );
        Some((target, key))
    }

    /// The stop at synchronous request `id` of the client: after the hand-over the client is
    /// told where its session went (the request runs there). `Ok(true)`: the session left;
    /// `false`: it stays here, untouched, and the request runs here.
    fn leave(
        &mut self,
        session: &mut Session,
        client: &mut Conn,
        id: u64,
        beat: &heartbeat::Heartbeat,
    ) -> Result<bool, WorkerError> {
        let Some((target, key)) = self.hand_over(session, beat) else {
            return Ok(false);
        };
        crate::forward::send_on(client, target, key, id, beat)?;
        Ok(true)
    }

    /// The stop while the client is not waiting for an answer (it may be sending quiet
    /// requests meanwhile): after the hand-over, what it sends is forwarded until it waits.
    /// Whether the session left.
    fn stop_quietly(&mut self, session: &mut Session, beat: &heartbeat::Heartbeat) -> bool {
        match self.hand_over(session, beat) {
            Some(h) => {
                self.forwarding = Some(h);
                true
            }
            None => false,
        }
    }

    /// Answers the node's move command `id`.
    fn answer_outcome(&mut self, id: u64, outcome: gpufuse_proto::MoveOutcome) {
        self.out.clear();
        encode_frame(&mut self.out, FrameKind::ControlReply, 0, id, &outcome);
        if let Some(conn) = self.conn.as_mut() {
            if conn.send(&self.out).is_err() {
                self.conn = None;
            }
        }
    }

    fn answer_move(
        &mut self,
        id: u64,
        with_figures: bool,
        device: u32,
        result: Result<gpufuse_proto::MoveFigures, String>,
    ) {
        use gpufuse_proto::{ControlAnswer, MoveOutcome};
        if let Err(why) = &result {
            tracing::warn!(device, "the session cannot move: {why}");
        }
        self.out.clear();
        if with_figures {
            let outcome = match result {
                Ok(f) => MoveOutcome::Moved(f),
                Err(reason) => MoveOutcome::Refused { reason },
            };
            encode_frame(&mut self.out, FrameKind::ControlReply, 0, id, &outcome);
        } else {
            let answer = match result {
                Ok(f) => ControlAnswer {
                    ok: true,
                    value: f.stop_us,
                },
                Err(_) => ControlAnswer {
                    ok: false,
                    value: 0,
                },
            };
            encode_frame(&mut self.out, FrameKind::ControlReply, 0, id, &answer);
        }
        if let Some(conn) = self.conn.as_mut() {
            if conn.send(&self.out).is_err() {
                self.conn = None;
            }
        }
    }

    /// Reads one command and answers it; a node that hung up or sent nonsense is dropped (the
    /// session goes on; the worker's own watch ends it if the node is gone).
    fn answer(&mut self, session: &mut Session) {
        use gpufuse_proto::{ControlAnswer, NodeCommand};
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let (id, cmd) = match conn.recv() {
            Ok((h, body)) if h.kind == FrameKind::Control => {
                match gpufuse_proto::decode_owned::<NodeCommand>(body) {
                    Ok(c) => (h.request_id, c),
                    Err(e) => {
                        tracing::warn!("malformed node command: {e}");
                        self.conn = None;
                        return;
                    }
                }
            }
            _ => {
                self.conn = None;
                return;
            }
        };
        let answer = match cmd {
            // A session being moved keeps its memory where the move copies it from.
            NodeCommand::Evict { .. } if self.moving.is_some() || self.leaving.is_some() => {
                ControlAnswer {
                    ok: false,
                    value: 0,
                }
            }
            NodeCommand::Evict { bytes, to_disk } => ControlAnswer {
                ok: true,
                value: session.evict(bytes, to_disk),
            },
            NodeCommand::Migrate { device } | NodeCommand::MigrateWithFigures { device } => {
                let with_figures = matches!(cmd, NodeCommand::MigrateWithFigures { .. });
                let begun = if self.is_moving() {
                    Err("the session is being moved already".to_string())
                } else {
                    match self.open_device.as_mut() {
                        None => Err("this worker cannot open another device".to_string()),
                        Some(open) => open(device).and_then(|d| session.precopy_begin(d)),
                    }
                };
                match begun {
                    Ok(precopy) => {
                        // Answered when the move ends (`advance`).
                        self.moving = Some(Move {
                            id,
                            device,
                            with_figures,
                            precopy,
                        });
                        self.last_step = std::time::Instant::now()
                            .checked_sub(STEP_GAP)
                            .unwrap_or_else(std::time::Instant::now);
                    }
                    Err(why) => self.answer_move(id, with_figures, device, Err(why)),
                }
                return;
            }
            NodeCommand::MigrateOut {
                address,
                token,
                device,
                resources,
                pid,
                program,
            } => {
                let begun = if self.is_moving() {
                    Err("the session is being moved already".to_string())
                } else {
                    let to = Leaving {
                        address: &address,
                        token: &token,
                        device,
                        resources,
                        pid,
                        program: &program,
                        session: session.session_id(),
                        bytes: session.used(),
                    };
                    session
                        .identity()
                        .and_then(|(base, info)| RemoteTarget::connect(&to, base, &info))
                        .and_then(|t| session.precopy_begin(t))
                };
                match begun {
                    Ok(precopy) => {
                        tracing::info!(to = %address, device, "moving the session to another node");
                        self.leaving = Some(Leave {
                            id,
                            precopy,
                            ready_since: None,
                        });
                        self.last_step = std::time::Instant::now()
                            .checked_sub(STEP_GAP)
                            .unwrap_or_else(std::time::Instant::now);
                    }
                    Err(reason) => {
                        tracing::warn!(to = %address, "the session cannot move: {reason}");
                        self.answer_outcome(id, gpufuse_proto::MoveOutcome::Refused { reason });
                    }
                }
                return;
            }
            // Only an incoming session's worker is handed a client.
            NodeCommand::Adopt { .. } => ControlAnswer {
                ok: false,
                value: 0,
            },
        };
        self.out.clear();
        encode_frame(&mut self.out, FrameKind::ControlReply, 0, id, &answer);
        if conn.send(&self.out).is_err() {
            self.conn = None;
        }
    }
}

/// Waits for the client (socket or shared-memory rings) and the node's command socket, for at
/// most `timeout` (ever without).
fn wait(client: &Conn, commands: Option<&Conn>, timeout: Option<std::time::Duration>) -> Woken {
    let other = commands.map(|c| c.stream().as_fd());
    match client.wait_readable(other, timeout) {
        Ok(true) | Err(_) => Woken::Client,
        Ok(false) if commands.is_some_and(ready_now) => Woken::Command,
        Ok(false) => Woken::Timeout,
    }
}

/// Whether the node's command socket has something to read now.
fn ready_now(c: &Conn) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        c.stream(),
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
}

/// The rings a client offered with `ShmAttach` (its descriptors came with the request's bytes),
/// and its host arena if it sent one, checked and mapped. Only over a unix socket: a client
/// elsewhere has nothing to share.
fn adopt_shm(
    conn: &mut Conn,
    request_ring: u64,
    reply_ring: u64,
) -> Result<
    (
        gpufuse_transport::shm::ShmStream,
        Option<gpufuse_transport::arena::HostArena>,
    ),
    String,
> {
    use gpufuse_transport::shm::{ShmRegion, Side, DESCRIPTORS};
    let mut fds = conn.take_fds();
    let gpufuse_transport::Stream::Unix(sock) = conn.stream() else {
        return Err("the session's connection is not a unix socket".into());
    };
    let sock = sock.try_clone().map_err(|e| e.to_string())?;
    // A sixth descriptor: the client's host arena (its page-locked memory).
    let arena = match fds.len() {
        n if n == DESCRIPTORS + 1 => Some(fds.pop().expect("counted")),
        _ => None,
    };
    let region = ShmRegion::adopt(fds, request_ring, reply_ring).map_err(|e| e.to_string())?;
    let arena = arena
        .map(gpufuse_transport::arena::HostArena::adopt)
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok((region.into_stream(sock, Side::Worker), arena))
}
