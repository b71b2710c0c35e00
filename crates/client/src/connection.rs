//! One session's connection: quiet calls are batched, synchronous calls flush the batch and
//! wait for their reply, and device-to-host data staged by the worker is written where the
//! application asked for it.
//!
//! A session reached over a unix socket moves to the shared-memory transport right after its
//! hello ([`Connection::upgrade_to_shm`]) unless told not to ([`Transport`]).

use std::collections::HashMap;

use gpufuse_proto::{
    decode_owned, decode_reply, encode_frame, ClientHello, FrameKind, Reply, Request, ServerHello,
    FLAG_QUIET, PROTOCOL_VERSION,
};
use gpufuse_transport::{Address, Conn};

use crate::error::ClientError;
use crate::status::CUresult;

/// Quiet calls are sent once this many bytes are waiting.
const FLUSH_BYTES: usize = 256 * 1024;
/// Replies of at least this much data are received straight into the caller's buffer...
const DIRECT_READ: usize = 64 * 1024;
/// ...when everything before the data (the reply and its staged copies) is this small.
const MAX_DIRECT_HEAD: usize = 4096;

/// Where a quiet device-to-host copy's data goes when it arrives.
#[derive(Debug, Clone, Copy)]
struct PendingCopy {
    dst: usize,
    len: usize,
}

/// What an accepted hello told the client.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub session_id: u64,
    pub devices: Vec<gpufuse_proto::DeviceInfo>,
}

/// How long a hello may wait for the node's answer: `GPUFUSE_HELLO_TIMEOUT` seconds, 10 by
/// default. A peer that accepts and never answers (a stopped server, an unrelated listener)
/// becomes a clear error instead of a hang.
fn hello_timeout() -> std::time::Duration {
    seconds_from_env("GPUFUSE_HELLO_TIMEOUT", 10)
}

/// How long a session's call may go without hearing from its worker before it fails:
/// `GPUFUSE_CALL_TIMEOUT` seconds, 30 by default. Not a deadline for the call: a worker that
/// is busy (a long kernel, a wait for the device) sends a heartbeat every 250 ms, so only a
/// stopped or wedged worker (or node on its way) is given up on.
fn call_timeout() -> std::time::Duration {
    seconds_from_env("GPUFUSE_CALL_TIMEOUT", 30)
}

fn seconds_from_env(name: &str, default: u64) -> std::time::Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(std::time::Duration::from_secs(default), |s| {
            std::time::Duration::from_secs_f64(s.min(86_400.0))
        })
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn no_answer(e: gpufuse_transport::TransportError, timeout: std::time::Duration) -> ClientError {
    match &e {
        gpufuse_transport::TransportError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::NoAnswer {
                secs: timeout.as_secs_f64(),
            }
        }
        _ => ClientError::Lost(e),
    }
}

/// Which transport a session over a unix socket uses: `GPUFUSE_TRANSPORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `auto` (the default): the shared-memory rings when the node is reached over a unix
    /// socket (so it is on this host) and accepts them, else the socket.
    Auto,
    /// `shm`: every session over a unix socket uses the rings, or fails (sessions over TCP
    /// keep it). A `shm:PATH` address requires them of its session.
    Shm,
    /// `socket`: never the rings.
    Socket,
}

impl Transport {
    /// From `GPUFUSE_TRANSPORT`; a value it does not know is an error naming it.
    pub fn from_env() -> Result<Self, ClientError> {
        match std::env::var("GPUFUSE_TRANSPORT").ok().as_deref() {
            None | Some("" | "auto") => Ok(Transport::Auto),
            Some("shm") => Ok(Transport::Shm),
            Some("socket") => Ok(Transport::Socket),
            Some(other) => Err(ClientError::Shm(format!(
                "GPUFUSE_TRANSPORT={other:?}: expected auto, shm or socket"
            ))),
        }
    }
}

/// A session's connection to its worker.
#[derive(Debug)]
pub struct Connection {
    conn: Conn,
    out: Vec<u8>,
    next_id: u64,
    pending_copies: HashMap<u64, PendingCopy>,
    next_tag: u64,
    /// The first failure of a quiet call, reported by the next synchronizing call.
    async_error: Option<CUresult>,
    /// How long a call may go without hearing from the worker ([`call_timeout`]).
    silence: std::time::Duration,
    /// The host arena the worker maps too (shared-memory sessions only: `host.rs`).
    arena: Option<std::sync::Arc<gpufuse_transport::arena::HostArena>>,
    /// Whether the session's device reaches the arena at its address here (`MapHostArena`):
    /// kernels may then dereference page-locked memory, as under unified addressing.
    arena_mapped: bool,
    /// The hello this session was opened with: a session that moves to another node says
    /// hello there again (`Resume`).
    hello: Option<ClientHello>,
    /// The frame of the last synchronous request: sent again to the node a session moved to,
    /// when the move answered it instead of running it ([`FrameKind::Moved`]).
    last_sync: Vec<u8>,
    /// Whether the session asked for the shared-memory transport (it asks again after a move).
    transport: Transport,
    /// The protocol version the node answered the hello with (`GraphDefine` from 17 on).
    peer_version: u16,
    /// Executable graphs as this connection's worker knows them: `true` defined there
    /// (`GraphDefine`), `false` not definable (replayed request by request). A new worker (a
    /// move, a reconnect) knows none.
    graphs: HashMap<u64, bool>,
}

impl Connection {
    /// The protocol version the node speaks with this client.
    pub fn peer_version(&self) -> u16 {
        self.peer_version
    }

    /// What this connection's worker knows of executable graph `exec` (see `graphs`).
    pub fn graph_state(&self, exec: u64) -> Option<bool> {
        self.graphs.get(&exec).copied()
    }

    /// Notes what the worker knows of executable graph `exec` (`None`: nothing).
    pub fn set_graph_state(&mut self, exec: u64, state: Option<bool>) {
        match state {
            Some(s) => self.graphs.insert(exec, s),
            None => self.graphs.remove(&exec),
        };
    }

    /// Connects and performs the handshake.
    /// Over a unix socket (`unix:`, `shm:`), the session then moves to the shared-memory
    /// transport as [`Transport::from_env`] says.
    pub fn open(addr: &Address, hello: &ClientHello) -> Result<(Self, Accepted), ClientError> {
        Self::open_with(addr, hello, Transport::from_env()?)
    }

    /// [`Connection::open`] with the transport given instead of read from the environment.
    pub fn open_with(
        addr: &Address,
        hello: &ClientHello,
        mut transport: Transport,
    ) -> Result<(Self, Accepted), ClientError> {
        let required = matches!(addr, Address::Shm(_));
        if required {
            transport = Transport::Shm;
        }
        let stream = addr.connect().map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        let (mut c, accepted) = Self::handshake(stream, hello)?;
        c.transport = transport;
        let unix = matches!(c.conn.stream(), gpufuse_transport::Stream::Unix(_));
        match transport {
            Transport::Socket => {}
            _ if c.conn.stream().is_shm() => {} // a redirect's connection moved already
            Transport::Auto | Transport::Shm if !unix && !required => {}
            Transport::Auto | Transport::Shm if !unix => {
                return Err(ClientError::Shm(format!(
                    "{addr} is not reached over a unix socket"
                )))
            }
            Transport::Auto => {
                // A node that cannot share memory with this process (another host's kernel
                // behind a forwarded socket, an older worker) keeps the socket.
                match c.upgrade_to_shm() {
                    Ok(()) | Err(ClientError::Cuda(_) | ClientError::Shm(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Transport::Shm => c.upgrade_to_shm()?,
        }
        Ok((c, accepted))
    }

    /// The transport the session uses: `shm`, `unix`, `tcp` or `tcp+tls`.
    pub fn transport(&self) -> &'static str {
        match self.conn.stream() {
            gpufuse_transport::Stream::Shm(_) => "shm",
            gpufuse_transport::Stream::Unix(_) => "unix",
            gpufuse_transport::Stream::Tcp(_) => "tcp",
            _ => "tcp+tls",
        }
    }

    /// Moves the session to the shared-memory transport: a mapping with two rings
    /// ([`gpufuse_transport::shm`]) is offered to the worker with `ShmAttach`, its descriptors
    /// attached; once the worker accepts, frames go through the rings and the socket only
    /// tells whether the worker lives. A refusal (`ClientError::Cuda`) leaves the socket in
    /// use; any other error means the connection is lost.
    pub fn upgrade_to_shm(&mut self) -> Result<(), ClientError> {
        self.upgrade_to_shm_with(None)
    }

    /// [`Connection::upgrade_to_shm`], offering the worker `arena` (the host arena of the
    /// session's earlier connection, whose blocks the application holds) instead of a new one.
    fn upgrade_to_shm_with(
        &mut self,
        keep: Option<std::sync::Arc<gpufuse_transport::arena::HostArena>>,
    ) -> Result<(), ClientError> {
        use gpufuse_transport::shm::{ShmRegion, Side, DEFAULT_RING};
        if self.conn.stream().is_shm() {
            return Ok(());
        }
        let gpufuse_transport::Stream::Unix(sock) = self.conn.stream() else {
            return Err(ClientError::Shm(
                "the session is not over a unix socket".into(),
            ));
        };
        let sock = sock
            .try_clone()
            .map_err(|e| ClientError::Shm(e.to_string()))?;
        let region = ShmRegion::create(DEFAULT_RING, DEFAULT_RING)
            .map_err(|e| ClientError::Shm(format!("cannot create the mapping: {e}")))?;
        let (request_ring, reply_ring) = region.ring_bytes();
        let arena = keep.or_else(crate::host::new_arena);
        let mut fds = region.fds();
        fds.extend(arena.as_ref().map(|a| a.fd()));
        self.flush()?;
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = Vec::new();
        encode_frame(
            &mut frame,
            FrameKind::Request,
            0,
            id,
            &Request::ShmAttach {
                request_ring: request_ring as u64,
                reply_ring: reply_ring as u64,
            },
        );
        self.conn
            .send_with_fds(&frame, &fds)
            .map_err(|e| self.lost(e.into()))?;
        self.next_reply_header()?;
        let (header, body) = match self.conn.recv() {
            Ok(frame) => frame,
            Err(e) => return Err(self.lost(e)),
        };
        if header.kind != FrameKind::Reply || header.request_id != id {
            return Err(ClientError::UnexpectedReply);
        }
        let reply = decode_reply(&header, body).map_err(ClientError::Protocol)?;
        let status = reply.status;
        self.absorb(reply);
        if status != 0 {
            return Err(ClientError::Cuda(status));
        }
        let stream = gpufuse_transport::Stream::Shm(region.into_stream(sock, Side::Client));
        if self.conn.replace_stream(stream).is_err() {
            return Err(ClientError::UnexpectedReply);
        }
        self.set_call_timeout(self.silence);
        self.arena = arena;
        self.arena_mapped = false;
        if let Some(base) = self.arena.as_ref().map(|a| a.base() as usize as u64) {
            // Kernels reach page-locked memory at its address where the device can map the
            // arena (the emulated GPU); elsewhere it is host memory only copies reach.
            match self.call(&Request::MapHostArena { base }) {
                Ok(_) => self.arena_mapped = true,
                Err(ClientError::Cuda(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Bytes that crossed the shared-memory rings since this connection moved to them
    /// (sent, received); `None` on a socket.
    pub fn ring_bytes(&self) -> Option<(u64, u64)> {
        match self.conn.stream() {
            gpufuse_transport::Stream::Shm(s) => Some(s.bytes_moved()),
            _ => None,
        }
    }

    /// The host arena of this session's worker, if it has one (see `host.rs`).
    pub fn host_arena(&self) -> Option<&std::sync::Arc<gpufuse_transport::arena::HostArena>> {
        self.arena.as_ref()
    }

    /// The host arena when the session's device reaches it at its address here (kernels may
    /// dereference page-locked memory in it).
    pub fn device_mapped_arena(
        &self,
    ) -> Option<&std::sync::Arc<gpufuse_transport::arena::HostArena>> {
        self.arena.as_ref().filter(|_| self.arena_mapped)
    }

    /// Performs the handshake on a connected stream.
    pub fn handshake(
        stream: gpufuse_transport::Stream,
        hello: &ClientHello,
    ) -> Result<(Self, Accepted), ClientError> {
        let mut c = Self {
            conn: Conn::new(stream),
            out: Vec::with_capacity(FLUSH_BYTES + 4096),
            next_id: 1,
            pending_copies: HashMap::new(),
            next_tag: 1,
            async_error: None,
            silence: call_timeout(),
            arena: None,
            arena_mapped: false,
            hello: Some(hello.clone()),
            last_sync: Vec::new(),
            transport: Transport::Auto,
            peer_version: 0,
            graphs: HashMap::new(),
        };
        let mut frame = Vec::new();
        encode_frame(&mut frame, FrameKind::Hello, 0, 0, hello);
        c.conn
            .send(&frame)
            .map_err(|e| ClientError::Lost(e.into()))?;
        let timeout = hello_timeout();
        let _ = c.conn.stream().set_read_timeout(Some(timeout));
        // The answer is copied out of the connection's buffer so the deadline can be cleared.
        let (header, body) = c.conn.recv().map_err(|e| no_answer(e, timeout))?;
        let (header, body) = (header, body.to_vec());
        c.peer_version = header.version;
        c.set_call_timeout(c.silence);
        let body = body.as_slice();
        if header.kind != FrameKind::HelloReply {
            return Err(ClientError::Protocol(
                gpufuse_proto::ProtoError::UnexpectedFrame {
                    expected: FrameKind::HelloReply,
                    got: header.kind,
                },
            ));
        }
        match decode_owned::<ServerHello>(body).map_err(ClientError::Protocol)? {
            ServerHello::Accepted {
                session_id,
                devices,
            } => Ok((
                c,
                Accepted {
                    session_id: session_id.get(),
                    devices,
                },
            )),
            ServerHello::Refused { reason } => Err(ClientError::Refused(reason)),
            ServerHello::Redirect { address, grant } => Self::redirected(&address, grant, hello),
            _ => Err(ClientError::UnexpectedReply),
        }
    }

    /// A pool controller placed the session on the node at `address`: the same hello goes
    /// there with the controller's grant as its token. One hop only: a redirect answering a
    /// hello that already carries a grant is an error, not a loop.
    fn redirected(
        address: &str,
        grant: String,
        hello: &ClientHello,
    ) -> Result<(Self, Accepted), ClientError> {
        if hello.token.starts_with(gpufuse_proto::GRANT_KIND) {
            return Err(ClientError::Refused(format!(
                "redirected again, to {address}, by the node the controller chose"
            )));
        }
        let addr: Address = address.parse().map_err(ClientError::BadAddress)?;
        let hello = ClientHello {
            token: grant,
            ..hello.clone()
        };
        Self::open(&addr, &hello)
    }

    /// Asks the node at `addr` for its status (a one-shot `Status` session).
    pub fn query_status(
        addr: &Address,
        token: String,
    ) -> Result<gpufuse_proto::NodeStatus, ClientError> {
        let hello = Self::hello(
            gpufuse_proto::SessionKind::Status,
            token,
            Default::default(),
        );
        match Self::one_shot(addr, &hello)? {
            ServerHello::Status(s) => Ok(s),
            ServerHello::Refused { reason } => Err(ClientError::Refused(reason)),
            _ => Err(ClientError::UnexpectedReply),
        }
    }

    /// Sends `hello` to the node at `addr` and returns its answer: for the hellos the node
    /// answers itself (`Status`, `Check`, `End`).
    pub fn one_shot(addr: &Address, hello: &ClientHello) -> Result<ServerHello, ClientError> {
        Self::one_shot_within(addr, hello, hello_timeout())
    }

    /// [`Connection::one_shot`] for a hello whose answer may take `timeout` (a move).
    pub fn one_shot_within(
        addr: &Address,
        hello: &ClientHello,
        timeout: std::time::Duration,
    ) -> Result<ServerHello, ClientError> {
        let stream = addr.connect().map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        let mut conn = Conn::new(stream);
        let mut frame = Vec::new();
        encode_frame(&mut frame, FrameKind::Hello, 0, 0, hello);
        conn.send(&frame).map_err(|e| ClientError::Lost(e.into()))?;
        let _ = conn.stream().set_read_timeout(Some(timeout));
        let (_, body) = conn.recv().map_err(|e| no_answer(e, timeout))?;
        decode_owned::<ServerHello>(body).map_err(ClientError::Protocol)
    }

    /// A hello for this process.
    pub fn hello(
        kind: gpufuse_proto::SessionKind,
        token: String,
        resources: gpufuse_proto::ResourceRequest,
    ) -> ClientHello {
        ClientHello {
            protocol_version: PROTOCOL_VERSION,
            kind,
            token,
            pid: std::process::id(),
            program: std::env::args().next().unwrap_or_default(),
            resources,
        }
    }

    /// How long a call may go without hearing from the worker before it fails with
    /// [`ClientError::Hung`] (`GPUFUSE_CALL_TIMEOUT` sets it at connect).
    pub fn set_call_timeout(&mut self, t: std::time::Duration) {
        self.silence = t;
        let _ = self.conn.stream().set_read_timeout(Some(t));
        let _ = self.conn.stream().set_write_timeout(Some(t));
    }

    /// The error for a failed read or write of the session's connection. Silence past the
    /// call timeout leaves the connection between frames: it is shut down, so every later
    /// call fails at once instead of waiting again.
    fn lost(&self, e: gpufuse_transport::TransportError) -> ClientError {
        match &e {
            gpufuse_transport::TransportError::Io(io) if timed_out(io) => {
                self.conn.stream().shutdown();
                ClientError::Hung {
                    secs: self.silence.as_secs_f64(),
                }
            }
            _ => ClientError::Lost(e),
        }
    }

    /// The header of the next frame that is not a heartbeat (those only say the worker is
    /// alive while it works; receiving them is what keeps a long call from timing out).
    /// A session that moved to another node meanwhile is followed there ([`FrameKind::Moved`]).
    fn next_reply_header(&mut self) -> Result<gpufuse_proto::FrameHeader, ClientError> {
        loop {
            let header = self.conn.peek_header().map_err(|e| self.lost(e))?;
            match header.kind {
                FrameKind::Heartbeat => self.conn.skip_frame().map_err(|e| self.lost(e))?,
                FrameKind::Moved => {
                    let moved = match self.conn.recv() {
                        Ok((_, body)) => decode_owned::<gpufuse_proto::Moved>(body)
                            .map_err(ClientError::Protocol)?,
                        Err(e) => return Err(self.lost(e)),
                    };
                    self.follow(moved)?;
                }
                _ => return Ok(header),
            }
        }
    }

    /// The session moved to another node (`docs/migration.md`): says hello there with the
    /// move's key, keeps the transport it had (the shared-memory rings, with the same host
    /// arena, when the node is on this host too), and sends the request the move answered
    /// again. Everything the session sent before that request ran where it was; the request
    /// and what follows run there.
    fn follow(&mut self, moved: gpufuse_proto::Moved) -> Result<(), ClientError> {
        let addr: Address = moved.address.parse().map_err(ClientError::BadAddress)?;
        let hello = ClientHello {
            kind: gpufuse_proto::SessionKind::Resume { key: moved.key },
            ..self.hello.clone().ok_or(ClientError::UnexpectedReply)?
        };
        let stream = addr.connect().map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        let (mut c, _accepted) = Self::handshake(stream, &hello)?;
        let unix = matches!(c.conn.stream(), gpufuse_transport::Stream::Unix(_));
        let was_shm = self.conn.stream().is_shm();
        if unix && (was_shm || self.transport == Transport::Shm) {
            match c.upgrade_to_shm_with(self.arena.clone()) {
                Ok(()) => {}
                Err(e) if self.transport == Transport::Shm => return Err(e),
                Err(_) => {}
            }
        }
        // The new connection's own requests (the rings' attach) are done; this one's request
        // ids, queued copies and errors go on.
        self.conn = c.conn;
        self.arena = c.arena;
        self.arena_mapped = c.arena_mapped;
        self.peer_version = c.peer_version;
        self.graphs.clear();
        self.hello = Some(ClientHello {
            kind: gpufuse_proto::SessionKind::Cuda,
            ..hello
        });
        self.set_call_timeout(self.silence);
        if let Err(e) = self.conn.send(&self.last_sync) {
            return Err(self.lost(e.into()));
        }
        Ok(())
    }

    /// Queues a quiet request; it is sent with the next flush.
    pub fn quiet(&mut self, req: &Request) -> Result<(), ClientError> {
        debug_assert!(req.is_quiet(), "{req:?} is not quiet");
        let id = self.next_id;
        self.next_id += 1;
        encode_frame(&mut self.out, FrameKind::Request, FLAG_QUIET, id, req);
        if self.out.len() >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Queues a quiet request whose last field is bulk data (`req` carries an empty slice
    /// there): large data goes to the socket straight from the caller's buffer.
    pub fn quiet_with_tail(&mut self, req: &Request, tail: &[u8]) -> Result<(), ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        gpufuse_proto::encode_frame_head(
            &mut self.out,
            FrameKind::Request,
            FLAG_QUIET,
            id,
            req,
            tail.len(),
        );
        if tail.len() < 64 * 1024 {
            self.out.extend_from_slice(tail);
            if self.out.len() >= FLUSH_BYTES {
                self.flush()?;
            }
            return Ok(());
        }
        self.flush()?;
        self.conn.send(tail).map_err(|e| self.lost(e.into()))
    }

    /// Sends every queued quiet request.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.conn.send(&self.out).map_err(|e| self.lost(e.into()));
        self.out.clear();
        if self.out.capacity() > 4 * FLUSH_BYTES {
            self.out.shrink_to(FLUSH_BYTES + 4096);
        }
        r
    }

    /// Appends already encoded quiet frames (a lane's, [`crate::lanes`]) to the queue.
    pub(crate) fn append_frames(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        f(&mut self.out);
    }

    /// Sends the queued quiet requests if they reached the batch size.
    pub fn flush_if_full(&mut self) -> Result<(), ClientError> {
        if self.out.len() >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Whether quiet requests are waiting to be sent.
    pub fn has_queued(&self) -> bool {
        !self.out.is_empty()
    }

    /// Sends a synchronous request (after the queued quiet ones) and waits for its reply.
    /// The reply's own status is returned as an error; its deferred error is kept for
    /// [`Connection::take_async_error`].
    pub fn call(&mut self, req: &Request) -> Result<gpufuse_proto::ReplyBody, ClientError> {
        let reply = self.call_raw(req)?;
        if reply.status != 0 {
            return Err(ClientError::Cuda(reply.status));
        }
        Ok(reply.body)
    }

    /// A synchronous request answered with `dst.len()` bytes of data, received straight into
    /// `dst` from the connection's buffer.
    pub fn call_read_into(&mut self, req: &Request, dst: &mut [u8]) -> Result<(), ClientError> {
        let id = self.send_request(req)?;
        // A large reply's message is decoded first and its data (the frame's tail) received
        // straight into `dst`.
        let header = self.next_reply_header()?;
        let head_len = header.message_len() as usize;
        if header.kind == FrameKind::Reply
            && header.request_id == id
            && header.tail as usize == dst.len()
            && dst.len() >= DIRECT_READ
            && (1..=MAX_DIRECT_HEAD).contains(&head_len)
        {
            let head = match self.conn.peek_body(head_len) {
                Ok(head) => head,
                Err(e) => return Err(self.lost(e)),
            };
            if let Ok(reply) = decode_owned::<Reply>(head) {
                if reply.status == 0 && reply.body == gpufuse_proto::ReplyBody::Data(Vec::new()) {
                    if let Err(e) = self.conn.recv_tail_into(head_len, dst) {
                        return Err(self.lost(e));
                    }
                    self.absorb(reply);
                    return Ok(());
                }
            }
        }
        let (header, body) = match self.conn.recv() {
            Ok(frame) => frame,
            Err(e) => return Err(self.lost(e)),
        };
        if header.kind != FrameKind::Reply || header.request_id != id {
            return Err(ClientError::UnexpectedReply);
        }
        let mut reply = decode_reply(&header, body).map_err(ClientError::Protocol)?;
        if reply.status == 0 {
            match &mut reply.body {
                gpufuse_proto::ReplyBody::Data(d) if d.len() == dst.len() => {
                    dst.copy_from_slice(d);
                    reply.body = gpufuse_proto::ReplyBody::None;
                }
                _ => return Err(ClientError::UnexpectedReply),
            }
        }
        let status = reply.status;
        self.absorb(reply);
        match status {
            0 => Ok(()),
            s => Err(ClientError::Cuda(s)),
        }
    }

    fn send_request(&mut self, req: &Request) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let start = self.out.len();
        encode_frame(&mut self.out, FrameKind::Request, 0, id, req);
        // Kept in case the session moves to another node before it runs (`follow`).
        self.last_sync.clear();
        self.last_sync.extend_from_slice(&self.out[start..]);
        if self.last_sync.capacity() > 1 << 20 && self.last_sync.len() < 4096 {
            self.last_sync.shrink_to(4096);
        }
        self.flush()?;
        Ok(id)
    }

    /// Takes a reply's deferred error and staged copies.
    fn absorb(&mut self, mut reply: Reply) -> gpufuse_proto::ReplyBody {
        if let Some(e) = reply.deferred_error {
            self.async_error.get_or_insert(e);
        }
        if !reply.output.is_empty() {
            print_device_output(&reply.output);
        }
        for staged in std::mem::take(&mut reply.staged) {
            if let Some(p) = self.pending_copies.remove(&staged.tag) {
                let n = p.len.min(staged.data.len());
                // SAFETY: `register_copy`'s contract: the destination stays valid and writable
                // for `len` bytes until the copy's stream is synchronized, which is no earlier
                // than this reply.
                unsafe { std::ptr::copy_nonoverlapping(staged.data.as_ptr(), p.dst as *mut u8, n) };
            }
        }
        reply.body
    }

    /// Like [`Connection::call`] but returns the whole reply, status included.
    pub fn call_raw(&mut self, req: &Request) -> Result<Reply, ClientError> {
        debug_assert!(!req.is_quiet(), "{req:?} is quiet");
        let id = self.send_request(req)?;
        self.next_reply_header()?;
        let (header, body) = match self.conn.recv() {
            Ok(frame) => frame,
            Err(e) => return Err(self.lost(e)),
        };
        if header.kind != FrameKind::Reply || header.request_id != id {
            return Err(ClientError::UnexpectedReply);
        }
        let mut reply = decode_reply(&header, body).map_err(ClientError::Protocol)?;
        let staged_and_error = Reply {
            status: reply.status,
            deferred_error: reply.deferred_error,
            staged: std::mem::take(&mut reply.staged),
            output: std::mem::take(&mut reply.output),
            body: gpufuse_proto::ReplyBody::None,
        };
        self.absorb(staged_and_error);
        Ok(reply)
    }

    /// Allocates a tag for a quiet device-to-host copy into `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid for writes of `len` bytes until the copy's stream (or the whole
    /// context) is synchronized, as CUDA requires of asynchronous copies.
    pub unsafe fn register_copy(&mut self, dst: *mut u8, len: usize) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.pending_copies.insert(
            tag,
            PendingCopy {
                dst: dst as usize,
                len,
            },
        );
        tag
    }

    /// Whether quiet device-to-host copies wait for their data (a synchronous reply).
    pub fn has_pending_copies(&self) -> bool {
        !self.pending_copies.is_empty()
    }

    /// Takes the first asynchronous error reported since the last call of this.
    pub fn take_async_error(&mut self) -> Option<CUresult> {
        self.async_error.take()
    }

    /// Keeps `e` for the next synchronizing call, unless an earlier error is waiting (a
    /// session that moved to another worker keeps the error its old one reported).
    pub fn keep_async_error(&mut self, e: CUresult) {
        self.async_error.get_or_insert(e);
    }
}

/// Device-side `printf` output, written to the application's stdout through the C library's
/// `stdout` stream (as NVIDIA's driver does), so that it keeps its place among the
/// application's own buffered `printf` output; flushed at once.
fn print_device_output(text: &[u8]) {
    extern "C" {
        static mut stdout: *mut libc::FILE;
    }
    // SAFETY: `stdout` is the C library's own stream, valid for the life of the process;
    // fwrite/fflush lock it, and `text` is valid for `len` bytes.
    unsafe {
        let out = stdout;
        if !out.is_null() {
            libc::fwrite(text.as_ptr().cast(), 1, text.len(), out);
            libc::fflush(out);
        }
    }
}
