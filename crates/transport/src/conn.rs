//! A framed connection over a blocking stream.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustls::{ClientConnection, ServerConnection, StreamOwned};

use gpufuse_proto::{FrameHeader, ProtoError, HEADER_LEN};

/// A connected byte stream.
#[derive(Debug)]
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    /// The client's end of a `tcp+tls:` connection, handshake done.
    TlsClient(Box<StreamOwned<ClientConnection, TcpStream>>),
    /// The server's end of a `tcp+tls:` connection; its handshake happens on the first read.
    TlsServer(Box<StreamOwned<ServerConnection, TcpStream>>),
    /// The rings of a shared mapping, with the unix socket kept for liveness
    /// ([`crate::shm`]).
    Shm(crate::shm::ShmStream),
}

impl Stream {
    /// The socket underneath (for TLS, the TCP socket that carries the records).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
            Stream::TlsClient(s) => s.sock.as_fd(),
            Stream::TlsServer(s) => s.sock.as_fd(),
            Stream::Shm(s) => s.socket().as_fd(),
        }
    }

    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Unix(_) | Stream::Shm(_) => None,
            Stream::Tcp(s) => Some(s),
            Stream::TlsClient(s) => Some(&s.sock),
            Stream::TlsServer(s) => Some(&s.sock),
        }
    }

    /// A deadline for reads (`None`: wait for ever).
    pub fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match (self, self.tcp()) {
            (Stream::Unix(s), _) => s.set_read_timeout(t),
            (Stream::Shm(s), _) => {
                s.set_read_timeout(t);
                Ok(())
            }
            (_, Some(s)) => s.set_read_timeout(t),
            (_, None) => Ok(()),
        }
    }

    /// A deadline for each write (`None`: wait for ever). [`Conn::send`] goes on past it
    /// while the peer is heard from (it sends heartbeats while busy).
    pub fn set_write_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match (self, self.tcp()) {
            (Stream::Unix(s), _) => s.set_write_timeout(t),
            (Stream::Shm(s), _) => {
                s.set_write_timeout(t);
                Ok(())
            }
            (_, Some(s)) => s.set_write_timeout(t),
            (_, None) => Ok(()),
        }
    }

    /// A second handle to the same socket (a thread that writes heartbeats). A TLS stream
    /// has one session state and cannot be cloned.
    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => Ok(Stream::Unix(s.try_clone()?)),
            Stream::Tcp(s) => Ok(Stream::Tcp(s.try_clone()?)),
            Stream::Shm(s) => Ok(Stream::Shm(s.clone())),
            Stream::TlsClient(_) | Stream::TlsServer(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS stream cannot be cloned",
            )),
        }
    }

    /// The descriptor, to hand the connection to another process. A TLS stream's session
    /// state lives in this process, so it cannot be handed over: relay it instead.
    pub fn into_fd(self) -> io::Result<OwnedFd> {
        match self {
            Stream::Unix(s) => Ok(s.into()),
            Stream::Tcp(s) => Ok(s.into()),
            Stream::TlsClient(_) | Stream::TlsServer(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS connection cannot be handed to another process",
            )),
            Stream::Shm(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a shared-memory session cannot be handed to another process",
            )),
        }
    }

    /// Rebuilds a stream from a descriptor received from another process.
    pub fn from_fd(fd: OwnedFd, tcp: bool) -> Self {
        if tcp {
            Stream::Tcp(TcpStream::from(fd))
        } else {
            Stream::Unix(UnixStream::from(fd))
        }
    }

    /// Plain TCP (not unix, not TLS).
    pub fn is_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::TlsClient(_) | Stream::TlsServer(_))
    }

    /// A TLS server stream whose client sent a plain gpufuse frame instead of a TLS hello
    /// (it was given `tcp:` for a `tcp+tls:` listener): the plain stream, so that the server
    /// can refuse it with a reason the client can read. Waits (under the read deadline) for
    /// the first bytes without consuming them. `Err`: the stream as it was.
    pub fn plain_client_on_tls(self) -> Result<Stream, Stream> {
        let Stream::TlsServer(s) = self else {
            return Err(self);
        };
        let mut first = [0u8; 4];
        if peek_exact(s.sock.as_fd(), &mut first) && first == gpufuse_proto::MAGIC.to_le_bytes() {
            let StreamOwned { sock, .. } = *s;
            return Ok(Stream::Tcp(sock));
        }
        Err(Stream::TlsServer(s))
    }

    /// Whether this is the shared-memory transport.
    pub fn is_shm(&self) -> bool {
        matches!(self, Stream::Shm(_))
    }

    pub fn shutdown(&self) {
        let _ = match (self, self.tcp()) {
            (Stream::Unix(s), _) => s.shutdown(std::net::Shutdown::Both),
            (Stream::Shm(s), _) => {
                s.shutdown();
                Ok(())
            }
            (_, Some(s)) => s.shutdown(std::net::Shutdown::Both),
            (_, None) => Ok(()),
        };
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        Stream::as_fd(self)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::TlsClient(s) => s.read(buf),
            Stream::TlsServer(s) => s.read(buf),
            Stream::Shm(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            Stream::TlsClient(s) => s.write(buf),
            Stream::TlsServer(s) => s.write(buf),
            Stream::Shm(s) => s.write(buf),
        }
    }
    /// Plain sockets hold nothing back; a TLS stream writes the records it still holds.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(_) | Stream::Tcp(_) | Stream::Shm(_) => Ok(()),
            Stream::TlsClient(s) => s.flush(),
            Stream::TlsServer(s) => s.flush(),
        }
    }
}

/// One non-blocking read: what the socket holds now, or `WouldBlock`. std has no per-call
/// non-blocking read (toggling `O_NONBLOCK` costs two more system calls on a hot path).
#[allow(unsafe_code)]
pub(crate) fn recv_fd_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes for the whole call, and
    // `fd` is an open socket, borrowed for the call.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Waits for `buf.len()` bytes to arrive and copies them without consuming them.
#[allow(unsafe_code)]
fn peek_exact(fd: BorrowedFd<'_>, buf: &mut [u8]) -> bool {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes for the whole call, and
        // `fd` is an open socket, borrowed for the call.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_WAITALL,
            )
        };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return n == buf.len() as isize;
    }
}

/// What the stream can give now without blocking (for TLS: decrypted bytes).
fn recv_now(stream: &mut Stream, buf: &mut [u8]) -> io::Result<usize> {
    match stream {
        Stream::Unix(s) => recv_fd_now(s.as_fd(), buf),
        Stream::Tcp(s) => recv_fd_now(s.as_fd(), buf),
        Stream::TlsClient(s) => crate::tls::recv_now(s, buf),
        Stream::TlsServer(s) => crate::tls::recv_now(s, buf),
        Stream::Shm(s) => s.read_now(buf),
    }
}

/// Whether the socket's peer has closed its end, waiting up to `timeout_ms` (-1: for ever)
/// without reading anything.
#[allow(unsafe_code)]
pub(crate) fn poll_hang_up(fd: std::os::fd::BorrowedFd<'_>, timeout_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    loop {
        // SAFETY: `fds` is one live pollfd for the call; `fd` is borrowed, so open, for it.
        let n = unsafe { libc::poll(&mut fds, 1, timeout_ms) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        let gone = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
        return n == 1 && fds.revents & gone != 0;
    }
}

/// Waits until the peer of socket `fd` closes its end (exits or is killed); reads nothing, so
/// another thread may go on using the socket.
pub fn wait_for_hang_up(fd: std::os::fd::BorrowedFd<'_>) {
    while !poll_hang_up(fd, -1) {}
}

/// Most descriptors a connection keeps for its owner ([`Conn::accept_fds`]); more are closed.
const MAX_HELD_FDS: usize = 16;

/// One read of a unix socket that also takes descriptors sent with `SCM_RIGHTS` into `fds`.
fn recv_keeping_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    dont_wait: bool,
) -> io::Result<usize> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if dont_wait {
        flags |= RecvFlags::DONTWAIT;
    }
    let msg = rustix::net::recvmsg(sock, &mut [io::IoSliceMut::new(buf)], &mut control, flags)?;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            for fd in got {
                if fds.len() < MAX_HELD_FDS {
                    fds.push(fd);
                }
            }
        }
    }
    Ok(msg.bytes)
}

/// One blocking read of at least a byte; the peer closing is [`TransportError::Closed`].
/// With `fds`, descriptors that come with the bytes of a unix socket are kept there.
fn read_some(
    stream: &mut Stream,
    fds: Option<&mut Vec<OwnedFd>>,
    buf: &mut [u8],
) -> Result<usize, TransportError> {
    let mut fds = fds;
    loop {
        let got = match (&mut *stream, fds.as_deref_mut()) {
            (Stream::Unix(s), Some(fds)) => recv_keeping_fds(s, buf, fds, false),
            (stream, _) => stream.read(buf),
        };
        match got {
            Ok(0) => return Err(TransportError::Closed),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // TLS: the peer closed the socket without a close_notify.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(TransportError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("connection closed by peer")]
    Closed,
    #[error("i/o error")]
    Io(#[from] io::Error),
    #[error("bad frame")]
    Proto(#[from] ProtoError),
}

const READ_CHUNK: usize = 256 * 1024;

/// A framed connection: buffered frame reads, whole-buffer writes.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Descriptors received with the bytes (`SCM_RIGHTS`), when the owner takes them.
    fds: Option<Vec<OwnedFd>>,
}

impl Conn {
    /// Whether the peer has closed its end (it exited or was killed), without reading:
    /// frames it sent before may still be buffered. A non-blocking `poll`.
    pub fn peer_hung_up(&self) -> bool {
        poll_hang_up(self.stream.as_fd(), 0)
    }

    pub fn new(stream: Stream) -> Self {
        Self {
            stream,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            fds: None,
        }
    }

    /// From now on, descriptors a unix-socket peer sends with its bytes (`SCM_RIGHTS`) are
    /// kept (at most 16 at a time) for [`Conn::take_fds`]; otherwise they are closed.
    pub fn accept_fds(&mut self) {
        self.fds.get_or_insert_with(Vec::new);
    }

    /// The descriptors received so far (see [`Conn::accept_fds`]).
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        self.fds.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Sends pre-encoded `frames` with `fds` attached to their first byte (`SCM_RIGHTS`;
    /// unix sockets only).
    pub fn send_with_fds(&mut self, frames: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let Stream::Unix(sock) = &self.stream else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "descriptors travel only over a unix socket",
            ));
        };
        if frames.is_empty() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many descriptors for one message",
            ));
        }
        let sent = loop {
            match rustix::net::sendmsg(
                sock,
                &[io::IoSlice::new(frames)],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Err(rustix::io::Errno::INTR) => {}
                other => break other?,
            }
        };
        self.send(&frames[sent..])
    }

    /// Replaces the stream under the connection (a session moving to the shared-memory
    /// transport). Refused while received bytes wait in the buffer: they belong to the old one.
    pub fn replace_stream(&mut self, stream: Stream) -> Result<Stream, Stream> {
        if self.start != self.end {
            return Err(stream);
        }
        self.start = 0;
        self.end = 0;
        Ok(std::mem::replace(&mut self.stream, stream))
    }

    /// Waits until the peer sends something (or hangs up), or `other` becomes readable, for at
    /// most `timeout` (for ever without). True: this connection has something (a frame, bytes,
    /// or the peer's end); false: `other` or the timeout.
    pub fn wait_readable(
        &self,
        other: Option<BorrowedFd<'_>>,
        timeout: Option<std::time::Duration>,
    ) -> io::Result<bool> {
        if self.has_frame() {
            return Ok(true);
        }
        if let Stream::Shm(s) = &self.stream {
            return s.wait_readable(other, timeout);
        }
        use rustix::event::{PollFd, PollFlags};
        let mut fds = vec![PollFd::new(&self.stream, PollFlags::IN)];
        if let Some(o) = other.as_ref() {
            fds.push(PollFd::new(o, PollFlags::IN));
        }
        let ts = timeout.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs() as _,
            tv_nsec: t.subsec_nanos() as _,
        });
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(!fds[0].revents().is_empty())
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The underlying stream (to hand the connection to another process). Bytes already
    /// buffered but not yet returned by [`Conn::recv`] are dropped.
    pub fn into_stream(self) -> Stream {
        self.stream
    }

    /// Writes pre-encoded frames. With a write deadline set ([`Stream::set_write_timeout`]),
    /// a write that waits past it fails only if the peer has sent nothing meanwhile: a peer
    /// that is busy (a long kernel) sends heartbeats and does not read, a stopped one neither.
    /// What it sent is kept for the next [`Conn::recv`].
    pub fn send(&mut self, frames: &[u8]) -> io::Result<()> {
        let mut rest = frames;
        while !rest.is_empty() {
            match self.stream.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if !self.take_available()? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        loop {
            match self.stream.flush() {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if !self.take_available()? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads the next frame. The body borrows the connection's buffer until the next call.
    pub fn recv(&mut self) -> Result<(FrameHeader, &[u8]), TransportError> {
        let header = self.peek_header()?;
        let total = HEADER_LEN + header.len as usize;
        self.fill(total)?;
        let body = self.start + HEADER_LEN..self.start + total;
        self.start += total;
        Ok((header, &self.buf[body]))
    }

    /// Whether a whole frame has been received and not yet returned: the next [`Conn::recv`]
    /// will not wait for the peer.
    pub fn has_frame(&self) -> bool {
        let Some(bytes) = self.buf.get(self.start..self.end) else {
            return false;
        };
        let Some(head) = bytes
            .get(..HEADER_LEN)
            .and_then(|h| <&[u8; HEADER_LEN]>::try_from(h).ok())
        else {
            return false;
        };
        FrameHeader::decode(head)
            .is_ok_and(|h| bytes.len() >= HEADER_LEN.saturating_add(h.len as usize))
    }

    /// The next frame's header, read but not consumed (a [`Conn::recv`] still returns it).
    pub fn peek_header(&mut self) -> Result<FrameHeader, TransportError> {
        self.fill(HEADER_LEN)?;
        let head: &[u8; HEADER_LEN] = self.buf[self.start..self.start + HEADER_LEN]
            .try_into()
            .expect("header length");
        Ok(FrameHeader::decode(head)?)
    }

    /// The first `n` bytes of the next frame's body (fewer if the body is shorter), read but
    /// not consumed. Call after [`Conn::peek_header`].
    pub fn peek_body(&mut self, n: usize) -> Result<&[u8], TransportError> {
        let len = self.peek_header()?.len as usize;
        let n = n.min(len);
        self.fill(HEADER_LEN + n)?;
        Ok(&self.buf[self.start + HEADER_LEN..self.start + HEADER_LEN + n])
    }

    /// Consumes the next frame, whose body is `skip` bytes of head and then exactly
    /// `dst.len()` bytes, reading the latter straight into `dst` (a large copy lands in its
    /// destination without passing through the frame buffer).
    pub fn recv_tail_into(&mut self, skip: usize, dst: &mut [u8]) -> Result<(), TransportError> {
        let len = self.peek_header()?.len as usize;
        if skip.checked_add(dst.len()) != Some(len) {
            return Err(TransportError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the frame's body is not that head and tail",
            )));
        }
        self.fill(HEADER_LEN + skip)?;
        self.start += HEADER_LEN + skip;
        let buffered = (self.end - self.start).min(dst.len());
        dst[..buffered].copy_from_slice(&self.buf[self.start..self.start + buffered]);
        self.start += buffered;
        let mut filled = buffered;
        while filled < dst.len() {
            filled += read_some(&mut self.stream, self.fds.as_mut(), &mut dst[filled..])?;
        }
        Ok(())
    }

    /// Consumes the next frame without looking at its body.
    pub fn skip_frame(&mut self) -> Result<(), TransportError> {
        let mut left = HEADER_LEN + self.peek_header()?.len as usize;
        while left > 0 {
            if self.end == self.start {
                self.compact();
                self.fill(1)?;
            }
            let n = (self.end - self.start).min(left);
            self.start += n;
            left -= n;
        }
        Ok(())
    }

    /// Like [`Conn::has_frame`], after taking in, without waiting, whatever the peer has
    /// already sent: a worker asks this before giving the device back, and a buffer that only
    /// just ran dry must not count as an idle client. An error is left for the next
    /// [`Conn::recv`] to report (and counts as a frame: the caller will not wait).
    pub fn poll_frame(&mut self) -> bool {
        self.has_frame() || self.take_available().is_err() || self.has_frame()
    }

    /// Reads what the socket holds now, without blocking (one `recv` with `MSG_DONTWAIT`).
    /// Whether the peer was heard from: bytes came, or the buffer is full of its frames.
    fn take_available(&mut self) -> io::Result<bool> {
        if self.end == self.buf.len() {
            if self.start == 0 {
                return Ok(true); // a frame larger than the buffer is on its way
            }
            self.compact();
        }
        let got = match (&self.stream, self.fds.as_mut()) {
            (Stream::Unix(s), Some(fds)) => {
                recv_keeping_fds(s, &mut self.buf[self.end..], fds, true)
            }
            _ => recv_now(&mut self.stream, &mut self.buf[self.end..]),
        };
        match got {
            Ok(n) => {
                self.end += n; // 0: the peer closed; recv reports it
                Ok(n > 0)
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Makes at least `need` bytes available from `start`.
    fn fill(&mut self, need: usize) -> Result<(), TransportError> {
        if self.end - self.start >= need {
            return Ok(());
        }
        if self.start + need > self.buf.len() {
            // Compact, and grow if one frame is larger than the buffer.
            self.compact();
            if need > self.buf.len() {
                self.buf.resize(need, 0);
            }
        }
        while self.end - self.start < need {
            self.end += read_some(
                &mut self.stream,
                self.fds.as_mut(),
                &mut self.buf[self.end..],
            )?;
        }
        Ok(())
    }

    /// Moves the bytes not yet returned to the front of the buffer.
    fn compact(&mut self) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }

    /// Shrinks an oversized receive buffer back after a large frame.
    pub fn trim(&mut self) {
        if self.buf.len() > READ_CHUNK * 4 && self.end - self.start <= READ_CHUNK {
            self.compact();
            self.buf.truncate(READ_CHUNK);
            self.buf.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufuse_proto::{encode_frame, FrameKind, Request};

    fn pair() -> (Conn, Conn) {
        let (a, b) = UnixStream::pair().unwrap();
        (Conn::new(Stream::Unix(a)), Conn::new(Stream::Unix(b)))
    }

    #[test]
    fn has_frame_says_whether_recv_would_wait() {
        let (mut a, mut b) = pair();
        assert!(!b.has_frame());
        let mut out = Vec::new();
        for id in 0..2 {
            encode_frame(&mut out, FrameKind::Request, 0, id, &Request::Ping);
        }
        a.send(&out).unwrap();
        b.recv().unwrap();
        assert!(b.has_frame(), "the second frame came with the first");
        b.recv().unwrap();
        assert!(!b.has_frame());
    }

    #[test]
    fn poll_frame_takes_in_what_the_peer_already_sent() {
        let (mut a, mut b) = pair();
        assert!(!b.poll_frame());
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::Request, 0, 1, &Request::Ping);
        a.send(&out).unwrap();
        assert!(!b.has_frame(), "nothing read yet");
        assert!(b.poll_frame());
        b.recv().unwrap();
        assert!(!b.poll_frame());
        // The connection still blocks normally afterwards.
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            a.send(&out).unwrap();
            a
        });
        b.recv().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn frames_of_every_size_arrive_whole() {
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            let mut out = Vec::new();
            for size in [0usize, 1, 100, 300_000, 5_000_000] {
                let data = vec![size as u8; size];
                out.clear();
                encode_frame(
                    &mut out,
                    FrameKind::Request,
                    0,
                    size as u64,
                    &Request::MemcpyHtoD {
                        dst: gpufuse_proto::DevicePtr(1),
                        stream: gpufuse_proto::StreamHandle(0),
                        data: &data,
                    },
                );
                a.send(&out).unwrap();
            }
        });
        for size in [0usize, 1, 100, 300_000, 5_000_000] {
            let (h, body) = b.recv().unwrap();
            assert_eq!(h.request_id, size as u64);
            match gpufuse_proto::decode_borrowed::<Request>(body).unwrap() {
                Request::MemcpyHtoD { data, .. } => {
                    assert_eq!(data.len(), size);
                    assert!(data.iter().all(|&x| x == size as u8));
                }
                other => panic!("unexpected {other:?}"),
            }
            b.trim();
        }
        t.join().unwrap();
    }

    #[test]
    fn garbage_header_is_an_error_not_a_panic() {
        let (mut a, mut b) = pair();
        a.send(&[0xAB; 64]).unwrap();
        assert!(matches!(b.recv(), Err(TransportError::Proto(_))));
    }

    #[test]
    fn eof_is_closed() {
        let (a, mut b) = pair();
        drop(a);
        assert!(matches!(b.recv(), Err(TransportError::Closed)));
    }
}
