//! Moving a session to another node (`docs/migration.md`, "Between nodes").
//!
//! The leaving worker says hello to the target node with a `MoveIn` hello; that node admits
//! the session (its slice and share, on the device asked) and starts a worker for it at the
//! same address window, whose connection is this one. Over it the leaving worker runs the
//! pre-copy rounds of `migrate.rs` ([`RemoteTarget`] is their target): the layout, then chunks
//! of contents while the session keeps running, what device work dirtied again. The stop comes
//! at the client's next synchronous request (the client then waits and sends nothing more):
//! the dirty remainder and the session's books (`books.rs`) go over, the receiving worker
//! answers with a one-time key, and the client's request is answered with a `Moved` frame
//! naming the target's address and the key instead of running. The client says hello there
//! (`Resume { key }`), the node hands its connection to the receiving worker
//! ([`serve_incoming`]), and the client sends its request again. Until the key is answered
//! nothing changed where the session was: any failure before it leaves the session running on
//! its old node, and the receiving worker (whose connection closes) frees what it built.

use std::time::{Duration, Instant};

use gpufuse_device::{Device, DeviceImage};
use gpufuse_proto::{
    decode_owned, decode_request, encode_frame, encode_frame_head, ClientHello, ControlAnswer,
    DeviceInfo, FrameHeader, FrameKind, MoveAck, MoveMessage, NodeCommand, ResourceRequest,
    ServerHello, SessionKind, HEADER_LEN, PROTOCOL_VERSION,
};
use gpufuse_transport::{Address, Conn, Stream, TransportError};

use crate::books::SessionBooks;
use crate::migrate::{MoveTarget, CHUNK};
use crate::serve::{greet, serve_session};
use crate::{DeviceSlot, Elastic, Ledger, Session, WorkerError};
use gpufuse_proto::SessionId;

/// How long the leaving worker waits for the receiving one to take the session over (its
/// answer to the books).
const COMMIT_WAIT: Duration = Duration::from_secs(60);
/// How long a receiving worker waits for its client to resume the session before it ends it,
/// as a dead client's session ends.
const RESUME_WAIT: Duration = Duration::from_secs(120);
/// The largest piece of a layout in one frame.
const LAYOUT_PART: usize = 32 << 20;

fn lost(e: impl std::fmt::Display) -> String {
    format!("the connection to the target node failed: {e}")
}

/// The worker on another node that a leaving session is copied to.
pub(crate) struct RemoteTarget {
    conn: Conn,
    out: Vec<u8>,
    /// The target node's address, as the client is to reach it.
    pub(crate) address: String,
    /// The session's id on the target node.
    pub(crate) session: u64,
}

/// Who the session is, for the target node's hello.
pub(crate) struct Leaving<'a> {
    pub(crate) address: &'a str,
    pub(crate) token: &'a str,
    pub(crate) device: u32,
    pub(crate) resources: ResourceRequest,
    pub(crate) pid: u32,
    pub(crate) program: &'a str,
    pub(crate) session: u64,
    /// Bytes the session holds.
    pub(crate) bytes: u64,
}

impl RemoteTarget {
    /// Says hello to the target node as the leaving session (`window_base`: its address
    /// window; `own`: its device as the client sees it, which the target's must match).
    pub(crate) fn connect(
        to: &Leaving<'_>,
        window_base: u64,
        own: &DeviceInfo,
    ) -> Result<Self, String> {
        let addr: Address = to
            .address
            .parse()
            .map_err(|e| format!("bad target address {:?}: {e}", to.address))?;
        if matches!(addr, Address::Shm(_)) {
            return Err("name the target node by its unix: or tcp: address".into());
        }
        let stream = addr
            .connect()
            .map_err(|e| format!("cannot reach the target node at {addr}: {e}"))?;
        // A target that stops reading must not stall the session forever.
        let _ = stream.set_write_timeout(Some(COMMIT_WAIT));
        let mut conn = Conn::new(stream);
        let hello = ClientHello {
            protocol_version: PROTOCOL_VERSION,
            kind: SessionKind::MoveIn {
                session: SessionId(to.session),
                device: to.device,
                window_base,
                bytes: to.bytes,
            },
            token: to.token.to_string(),
            pid: to.pid,
            program: to.program.to_string(),
            resources: to.resources.clone(),
        };
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::Hello, 0, 0, &hello);
        conn.send(&out).map_err(lost)?;
        let _ = conn.stream().set_read_timeout(Some(COMMIT_WAIT));
        let (h, body) = conn.recv().map_err(lost)?;
        if h.kind != FrameKind::HelloReply {
            return Err(format!("the target node answered a {:?} frame", h.kind));
        }
        let (session, devices) = match decode_owned::<ServerHello>(body).map_err(lost)? {
            ServerHello::Accepted {
                session_id,
                devices,
            } => (session_id.get(), devices),
            ServerHello::Refused { reason } => {
                return Err(format!("the target node refused the session: {reason}"))
            }
            other => return Err(format!("the target node answered {other:?}")),
        };
        let Some(theirs) = devices.first() else {
            return Err("the target node offered no device".into());
        };
        // The client keeps what it knows of its device: the target must be the same model.
        if theirs.name != own.name || theirs.attributes != own.attributes {
            return Err(format!(
                "device {} of the target node is a {}; the session runs on a {}",
                to.device, theirs.name, own.name
            ));
        }
        Ok(Self {
            conn,
            out,
            address: to.address.to_string(),
            session,
        })
    }

    fn send(&mut self, msg: &MoveMessage) -> Result<(), String> {
        self.out.clear();
        encode_frame(&mut self.out, FrameKind::Move, 0, 0, msg);
        self.conn.send(&self.out).map_err(lost)
    }

    /// Sends the books; returns the key the client resumes with, once the target holds the
    /// session.
    pub(crate) fn commit(&mut self, books: Vec<u8>) -> Result<u64, String> {
        self.send(&MoveMessage::Commit(books))?;
        let _ = self.conn.stream().set_read_timeout(Some(COMMIT_WAIT));
        let (h, body) = self.conn.recv().map_err(lost)?;
        if h.kind != FrameKind::MoveReply {
            return Err(format!("the target worker answered a {:?} frame", h.kind));
        }
        match decode_owned::<MoveAck>(body).map_err(lost)? {
            MoveAck::Ready { key } => Ok(key),
            MoveAck::Refused { reason } => Err(format!("the target refused the session: {reason}")),
        }
    }

    /// After the commit: a quiet request frame the client sent here, to run there.
    pub(crate) fn forward(&mut self, frame: Vec<u8>) -> Result<(), String> {
        self.send(&MoveMessage::Forward(frame))
    }

    /// After the commit: the client is still quiet (a keepalive for the new worker).
    pub(crate) fn still_waiting(&mut self) -> Result<(), String> {
        self.send(&MoveMessage::Waiting)
    }

    /// After the commit: nothing more is forwarded (the client is told where to go next).
    pub(crate) fn end_forwarding(&mut self) -> Result<(), String> {
        self.send(&MoveMessage::Forwarded)
    }

    /// Tells the target the move is off (it frees what it built); best effort, since a
    /// closed connection says the same.
    pub(crate) fn abort(mut self, reason: &str) {
        let _ = self.send(&MoveMessage::Abort {
            reason: reason.to_string(),
        });
    }
}

impl MoveTarget for RemoteTarget {
    fn rebuild(&mut self, image: &DeviceImage) -> Result<(), String> {
        let layout = DeviceImage {
            window: image.window,
            allocations: image
                .allocations
                .iter()
                .map(|a| gpufuse_device::capture::AllocationImage {
                    addr: a.addr,
                    size: a.size,
                    contents: Vec::new(),
                })
                .collect(),
            physical: image.physical.clone(),
            next_physical: image.next_physical,
            reserved: image.reserved.clone(),
            modules: image.modules.clone(),
            next_module: image.next_module,
            textures: image.textures.clone(),
            workspace: image.workspace,
        };
        let bytes = layout.encode();
        let total = bytes.len() as u64;
        for part in bytes.chunks(LAYOUT_PART) {
            self.send(&MoveMessage::Layout {
                total,
                data: part.to_vec(),
            })?;
        }
        for a in &image.allocations {
            for (k, chunk) in a.contents.chunks(CHUNK as usize).enumerate() {
                self.write(a.addr + k as u64 * CHUNK, chunk)?;
            }
        }
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        self.out.clear();
        encode_frame_head(
            &mut self.out,
            FrameKind::Move,
            0,
            0,
            &MoveMessage::Chunk {
                addr,
                data: Vec::new(),
            },
            data.len(),
        );
        self.conn.send(&self.out).map_err(lost)?;
        self.conn.send(data).map_err(lost)
    }
}

impl Session<'_> {
    /// The session's address window start and its device as the client sees it.
    pub(crate) fn identity(&mut self) -> Result<(u64, DeviceInfo), String> {
        let layout = self.device.capture_layout().map_err(|e| e.to_string())?;
        Ok((layout.window.0, self.device.info(self.memory.limit)))
    }
}

/// Serves a session moving here from another node: `from` is the leaving worker's connection
/// (answered like a client's hello), which brings the session's state; then the session's
/// client resumes it here (its connection comes from the node on the command socket) and
/// the session is served as any other. `key` is what the client resumes with.
#[allow(clippy::too_many_arguments)]
pub fn serve_incoming(
    mut from: Conn,
    session_id: u64,
    device_index: u32,
    device: &mut dyn Device,
    ledger: &mut dyn Ledger,
    limit: Option<u64>,
    mut elastic: Elastic,
    key: u64,
) -> Result<(), WorkerError> {
    let info = device.info(limit);
    greet(&mut from, session_id, &info)?;
    // A leaving worker that goes silent (it sends at least every pre-copy step, and waits at
    // most 30 s for the stop) ends the move here instead of holding the slice forever.
    let _ = from.stream().set_read_timeout(Some(COMMIT_WAIT));
    let config = elastic.config.clone();
    let mut session = Session::new(device, ledger, limit).with_elastic(config, session_id);
    let started = Instant::now();
    if !receive(&mut from, &mut session, device_index, &mut elastic, key)? {
        session.release_all();
        return Ok(());
    }
    // The client may have sent the old worker quiet requests since the stop (an idle
    // session stops at any moment): they come forwarded, in order, before it resumes here.
    // The old worker stays as long as its client is quiet and says so every 10 s; silent for
    // three times that, it is gone and the session with it.
    let _ = from
        .stream()
        .set_read_timeout(Some(crate::forward::KEEPALIVE * 3));
    if !run_forwarded(&mut from, &mut session)? {
        session.release_all();
        return Ok(());
    }
    drop(from);
    tracing::info!(
        took = ?started.elapsed(),
        "the session's state arrived; waiting for its client"
    );
    let Some(commands) = elastic.commands.take() else {
        tracing::warn!("no command socket: the session's client cannot be handed over");
        session.release_all();
        return Ok(());
    };
    let mut commands = Conn::new(Stream::Unix(commands));
    let client = match adopt_client(&mut commands) {
        Ok(c) => c,
        Err(why) => {
            tracing::warn!("the moved session ends: {why}");
            session.release_all();
            return Ok(());
        }
    };
    let mut client = client;
    greet(&mut client, session_id, &info)?;
    tracing::info!("the moved session's client resumed it here");
    serve_session(client, session, Some(commands), elastic.open_device)
}

/// Receives the state; `Ok(true)` once the session is taken over (the key answered).
fn receive(
    from: &mut Conn,
    session: &mut Session,
    device_index: u32,
    elastic: &mut Elastic,
    key: u64,
) -> Result<bool, WorkerError> {
    let mut layout = Vec::new();
    let mut built = false;
    let mut out = Vec::new();
    let mut refuse = |from: &mut Conn, reason: String| -> Result<bool, WorkerError> {
        tracing::warn!("refusing the incoming session: {reason}");
        out.clear();
        encode_frame(
            &mut out,
            FrameKind::MoveReply,
            0,
            0,
            &MoveAck::Refused { reason },
        );
        from.send(&out).map_err(TransportError::from)?;
        Ok(false)
    };
    loop {
        let (h, body) = match from.recv() {
            Ok(f) => f,
            Err(TransportError::Closed) => {
                tracing::info!("the leaving worker went away before the session was handed over");
                return Ok(false);
            }
            Err(TransportError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                tracing::warn!("the leaving worker went silent: the move is off");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        };
        if h.kind != FrameKind::Move {
            return Err(WorkerError::UnexpectedFrame(h.kind));
        }
        let head = h.message_len() as usize;
        let msg: MoveMessage = decode_owned(&body[..head])?;
        match msg {
            MoveMessage::Layout { total, data } => {
                layout.extend_from_slice(&data);
                if layout.len() as u64 > total {
                    return refuse(from, "a layout longer than it said".into());
                }
                if layout.len() as u64 == total {
                    let image = match DeviceImage::decode(&layout) {
                        Ok(i) => i,
                        Err(e) => return refuse(from, e.to_string()),
                    };
                    layout.clear();
                    if built {
                        // Starting over: a fresh device of the same window.
                        let fresh = match elastic.open_device.as_mut() {
                            Some(open) => open(device_index),
                            None => Err("this worker cannot open a fresh device".into()),
                        };
                        match fresh {
                            Ok(d) => session.device = DeviceSlot::Moved(d),
                            Err(why) => return refuse(from, why),
                        }
                    }
                    if let Err(e) = session.device.rebuild(&image) {
                        return refuse(from, e.to_string());
                    }
                    built = true;
                }
            }
            MoveMessage::Chunk { addr, data } => {
                let bytes = if data.is_empty() {
                    &body[head..]
                } else {
                    &data
                };
                let written = session.device.write(addr, bytes).map_err(|s| {
                    format!(
                        "{} bytes at {addr:#x} do not fit the layout (CUDA status {s})",
                        bytes.len()
                    )
                });
                if let Err(why) = written {
                    return refuse(from, why);
                }
            }
            MoveMessage::Commit(books) => {
                if !built {
                    return refuse(from, "books before a layout".into());
                }
                let taken = SessionBooks::decode(&books).and_then(|b| session.adopt_books(b));
                if let Err(why) = taken {
                    return refuse(from, why);
                }
                out.clear();
                encode_frame(
                    &mut out,
                    FrameKind::MoveReply,
                    0,
                    0,
                    &MoveAck::Ready { key },
                );
                from.send(&out).map_err(TransportError::from)?;
                return Ok(true);
            }
            MoveMessage::Abort { reason } => {
                tracing::info!("the move was called off: {reason}");
                return Ok(false);
            }
            MoveMessage::Forward(_) | MoveMessage::Forwarded | MoveMessage::Waiting => {
                return refuse(from, "forwarded requests before the books".into());
            }
        }
    }
}

/// Runs the requests the old worker forwards until it says the client comes; `Ok(false)`:
/// the old worker went away first (its client ended), so the session ends.
fn run_forwarded(from: &mut Conn, session: &mut Session) -> Result<bool, WorkerError> {
    session.await_host_arena();
    let mut forwarded = 0u64;
    loop {
        let (h, body) = match from.recv() {
            Ok(f) => f,
            Err(TransportError::Closed) => {
                tracing::info!(forwarded, "the old worker ended before the client came");
                return Ok(false);
            }
            Err(TransportError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                tracing::warn!(forwarded, "the old worker went silent: the session ends");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        };
        if h.kind != FrameKind::Move {
            return Err(WorkerError::UnexpectedFrame(h.kind));
        }
        match decode_owned::<MoveMessage>(body)? {
            MoveMessage::Forward(frame) => {
                let (head, rest) = frame
                    .split_first_chunk::<HEADER_LEN>()
                    .ok_or(WorkerError::UnexpectedFrame(FrameKind::Move))?;
                let header = FrameHeader::decode(head)?;
                if header.kind != FrameKind::Request || !header.is_quiet() {
                    return Err(WorkerError::UnexpectedFrame(header.kind));
                }
                let req = decode_request(&header, rest)?;
                // Quiet: an error is deferred to the client's next synchronous call, here.
                let _ = session.dispatch(req, true);
                if session.holds_lease() && !from.has_frame() {
                    session.end_lease();
                }
                forwarded += 1;
            }
            MoveMessage::Waiting => {}
            MoveMessage::Forwarded => {
                if forwarded > 0 {
                    tracing::info!(forwarded, "ran the requests the old worker forwarded");
                }
                return Ok(true);
            }
            other => {
                tracing::warn!("unexpected after the commit: {other:?}");
                return Err(WorkerError::UnexpectedFrame(FrameKind::Move));
            }
        }
    }
}

/// Waits on the node's command socket for the client's connection (`Adopt`, its descriptor
/// attached); other commands are answered "nothing done" meanwhile.
fn adopt_client(commands: &mut Conn) -> Result<Conn, String> {
    let deadline = Instant::now() + RESUME_WAIT;
    commands.accept_fds();
    let mut out = Vec::new();
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .ok_or("its client did not resume it in time")?;
        let _ = commands.stream().set_read_timeout(Some(left));
        let (h, body) = commands
            .recv()
            .map_err(|e| format!("the node's command socket: {e}"))?;
        let id = h.request_id;
        let cmd: NodeCommand = decode_owned(body).map_err(|e| format!("a bad command: {e}"))?;
        let adopted = match cmd {
            NodeCommand::Adopt { tcp } => {
                let mut fds = commands.take_fds();
                fds.pop().map(|fd| Conn::new(Stream::from_fd(fd, tcp)))
            }
            _ => None,
        };
        out.clear();
        encode_frame(
            &mut out,
            FrameKind::ControlReply,
            0,
            id,
            &ControlAnswer {
                ok: adopted.is_some(),
                value: 0,
            },
        );
        commands
            .send(&out)
            .map_err(|e| format!("the node's command socket: {e}"))?;
        if let Some(client) = adopted {
            let _ = commands.stream().set_read_timeout(None);
            let _ = client.stream().set_read_timeout(None);
            return Ok(client);
        }
    }
}
