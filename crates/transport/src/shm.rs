//! The shared-memory transport: a client on the node's host and its worker exchange the same
//! frames as over a socket, through two rings in a mapping both processes share.
//!
//! - **Set-up.** The client creates the mapping (a sealed `memfd`: it can neither shrink nor
//!   grow, so the worker never touches a page that went away) and four `eventfd` doorbells,
//!   and sends them over the session's unix socket with `SCM_RIGHTS` (attached to its
//!   `ShmAttach` request, [`crate::Conn::send_with_fds`]). The worker checks them
//!   ([`ShmRegion::adopt`]), answers on the socket, and from then on both sides read and write
//!   frames through [`ShmStream`] (a [`crate::Stream`]), so everything above the byte stream
//!   (frame parsing, direct reads of bulk data, heartbeats) is unchanged.
//! - **Layout.** A 4 KiB control page (each position and flag on its own cache line), then the
//!   request ring (client to worker) and the reply ring (worker to client), each a power of
//!   two of bytes. A ring is a byte stream: a writer copies bytes at `write_pos`, publishes the
//!   new position, and the reader copies them out and publishes `read_pos`. Positions count
//!   bytes for ever (u64), so a ring is empty when they are equal and full when they differ by
//!   its size.
//! - **Waiting.** A side that finds nothing to read (or no room to write) spins for a short
//!   while ([`spin_time`]: a synchronous call's answer usually comes within it), then raises
//!   its *parked* flag and sleeps in `poll` on its doorbell and on the socket. The other side
//!   rings the doorbell (one `eventfd` write) only when it sees the flag, so a busy session
//!   makes no system calls and an idle one burns no CPU.
//! - **Liveness.** The socket stays open for the session's life and carries nothing more: a
//!   peer that exits or is killed closes it, which wakes a parked side (`POLLHUP`) and turns
//!   into end-of-stream (reads) or a broken pipe (writes), never a hang. Read and write
//!   deadlines behave as the socket's (`SO_RCVTIMEO`): a call that waits past one fails with
//!   `WouldBlock`.
//! - **Trust.** Each side keeps its own positions in private memory and only publishes them;
//!   what it reads from the other side is checked (a position that claims more bytes than the
//!   ring holds ends the stream with `InvalidData`), and bytes are copied out of the ring
//!   before anything decodes them, so a client scribbling on the mapping can corrupt only its
//!   own session's frames, which the worker rejects as it rejects a bad frame on a socket.
//!
//! Hand-written because no crate does this: shared-memory IPC crates (iceoryx2, shared_memory,
//! ipc-channel) bring their own discovery, naming and message types, while this transport must
//! carry gpufuse's existing byte frames over a mapping handed over an existing socket and tell
//! a dead peer by that socket. The system calls go through rustix (memfd, seals, eventfd, poll)
//! and the mapping through memmap2; the unsafe code is this module's raw access to the shared
//! pages, each with its SAFETY argument.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fs::{MemfdFlags, SealFlags};

/// Bytes of the control page at the front of the mapping.
const CONTROL: usize = 4096;
/// The mapping's first eight bytes: "gpufshm" and the layout's version.
const MAGIC: u64 = u64::from_le_bytes(*b"gpufshm\x01");
/// The ring size a client asks for unless told otherwise: 4 MiB each way.
pub const DEFAULT_RING: usize = 4 << 20;
/// Rings are between these sizes (powers of two).
const MIN_RING: usize = 4096;
const MAX_RING: usize = 1 << 30;

/// Control page offsets. Ring `r` (0: requests, 1: replies) has its words at `ring_base(r)`.
const OFF_MAGIC: usize = 0;
const OFF_RING_BYTES: [usize; 2] = [8, 16];
const fn ring_base(r: usize) -> usize {
    256 + r * 1024
}
const WRITE_POS: usize = 0;
const READ_POS: usize = 128;
const READER_PARKED: usize = 256;
const WRITER_PARKED: usize = 384;

/// The doorbells, in the order they travel: for each ring, "data" (its reader waits on it)
/// and "space" (its writer waits on it).
const BELLS: usize = 4;
/// The descriptors of a region ([`ShmRegion::fds`]): the mapping and the doorbells. A client
/// may send one more after them, its host arena ([`crate::arena`]).
pub const DESCRIPTORS: usize = 1 + BELLS;
const fn data_bell(r: usize) -> usize {
    2 * r
}
const fn space_bell(r: usize) -> usize {
    2 * r + 1
}

/// Which end of the session this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Worker,
}

impl Side {
    /// The ring this side writes (0: requests) and the one it reads.
    fn rings(self) -> (usize, usize) {
        match self {
            Side::Client => (0, 1),
            Side::Worker => (1, 0),
        }
    }
}

/// How long a side spins before it parks: `GPUFUSE_SHM_SPIN_US` microseconds, 50 by default
/// (0: park at once). Long enough for a synchronous call's answer from a worker running on
/// another core; short enough that a waiting side gives its core back quickly.
pub fn spin_time() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("GPUFUSE_SHM_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(50)
            .min(10_000);
        Duration::from_micros(us)
    })
}

/// A parked side wakes at least this often to look at its socket and deadline again (a
/// backstop: the doorbell and the socket's hang-up wake it first).
const PARK_SLICE: Duration = Duration::from_millis(100);

/// The shared mapping and its doorbells, before it carries a stream.
#[derive(Debug)]
pub struct ShmRegion {
    map: memmap2::MmapRaw,
    memfd: OwnedFd,
    bells: [OwnedFd; BELLS],
    ring_bytes: [usize; 2],
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl ShmRegion {
    /// A new region with rings of `request_ring` and `reply_ring` bytes (powers of two
    /// between 4 KiB and 1 GiB), for a client to offer its worker.
    pub fn create(request_ring: usize, reply_ring: usize) -> io::Result<Self> {
        for r in [request_ring, reply_ring] {
            if !r.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&r) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a ring of {r} bytes: expected a power of two from 4 KiB to 1 GiB"),
                ));
            }
        }
        let memfd = rustix::fs::memfd_create(
            "gpufuse-shm",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let size = CONTROL + request_ring + reply_ring;
        rustix::fs::ftruncate(&memfd, size as u64)?;
        rustix::fs::fcntl_add_seals(
            &memfd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )?;
        let bells = [(); BELLS]
            .map(|()| rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK));
        let bells = match bells {
            [Ok(a), Ok(b), Ok(c), Ok(d)] => [a, b, c, d],
            bells => {
                return Err(bells
                    .into_iter()
                    .find_map(Result::err)
                    .expect("one failed")
                    .into())
            }
        };
        let map = memmap2::MmapOptions::new().len(size).map_raw(&memfd)?;
        let region = Self {
            map,
            memfd,
            bells,
            ring_bytes: [request_ring, reply_ring],
        };
        region.word64(OFF_MAGIC).store(MAGIC, Ordering::Relaxed);
        for (r, &bytes) in region.ring_bytes.iter().enumerate() {
            region
                .word64(OFF_RING_BYTES[r])
                .store(bytes as u64, Ordering::Relaxed);
        }
        Ok(region)
    }

    /// The descriptors to send to the worker, in the order [`ShmRegion::adopt`] takes them:
    /// the mapping, then the doorbells.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        std::iter::once(self.memfd.as_fd())
            .chain(self.bells.iter().map(|b| b.as_fd()))
            .collect()
    }

    /// The ring sizes (requests, replies).
    pub fn ring_bytes(&self) -> (usize, usize) {
        (self.ring_bytes[0], self.ring_bytes[1])
    }

    /// Checks and maps a region a client sent: the descriptors of [`ShmRegion::fds`], the
    /// ring sizes its request named. Anything unexpected (a memfd that may still shrink, a
    /// size that does not match, a descriptor that is not an eventfd) is an error naming it.
    pub fn adopt(fds: Vec<OwnedFd>, request_ring: u64, reply_ring: u64) -> io::Result<Self> {
        if fds.len() != 1 + BELLS {
            return Err(invalid(format!(
                "expected {} descriptors (a memfd and {BELLS} eventfds), got {}",
                1 + BELLS,
                fds.len()
            )));
        }
        let ring_bytes = [request_ring, reply_ring].map(|r| usize::try_from(r).unwrap_or(0));
        if ring_bytes
            .iter()
            .any(|&r| !r.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&r))
        {
            return Err(invalid(format!(
                "rings of {request_ring} and {reply_ring} bytes: expected powers of two from 4 KiB to 1 GiB"
            )));
        }
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("counted");
        let seals = rustix::fs::fcntl_get_seals(&memfd)
            .map_err(|e| invalid(format!("the mapping is not a sealed memfd: {e}")))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(invalid(
                "the memfd is not sealed against shrinking and growing",
            ));
        }
        let size = CONTROL + ring_bytes[0] + ring_bytes[1];
        let actual = rustix::fs::fstat(&memfd)?.st_size;
        if actual != size as i64 {
            return Err(invalid(format!(
                "the memfd has {actual} bytes; the rings need {size}"
            )));
        }
        let bells: Vec<OwnedFd> = fds.collect();
        for b in &bells {
            let link = std::fs::read_link(format!("/proc/self/fd/{}", b.as_raw_fd()))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            if link != "anon_inode:[eventfd]" {
                return Err(invalid(format!("a doorbell is not an eventfd ({link:?})")));
            }
        }
        let bells: [OwnedFd; BELLS] = bells.try_into().expect("counted");
        let map = memmap2::MmapOptions::new().len(size).map_raw(&memfd)?;
        let region = Self {
            map,
            memfd,
            bells,
            ring_bytes,
        };
        if region.word64(OFF_MAGIC).load(Ordering::Relaxed) != MAGIC {
            return Err(invalid("the mapping does not start with gpufuse's magic"));
        }
        Ok(region)
    }

    /// The stream this side reads and writes; `socket` is the session's socket, kept for
    /// liveness (and to be shut down).
    pub fn into_stream(self, socket: UnixStream, side: Side) -> ShmStream {
        ShmStream {
            end: Arc::new(End {
                region: self,
                side,
                socket,
                my_write: AtomicU64::new(0),
                my_read: AtomicU64::new(0),
                read_timeout_ns: AtomicU64::new(NO_TIMEOUT),
                write_timeout_ns: AtomicU64::new(NO_TIMEOUT),
            }),
        }
    }

    fn word64(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= CONTROL);
        // SAFETY: `off` is 8-aligned and inside the control page (checked above), the mapping
        // is page-aligned and lives as long as `self`, and AtomicU64 has u64's size and
        // alignment. Both processes touch the control page only through atomics.
        unsafe { &*self.map.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn word32(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= CONTROL);
        // SAFETY: as in `word64`, for a 4-aligned u32.
        unsafe { &*self.map.as_ptr().add(off).cast::<AtomicU32>() }
    }

    fn ring_start(&self, r: usize) -> usize {
        CONTROL + if r == 0 { 0 } else { self.ring_bytes[0] }
    }

    /// Copies `src` into ring `r` at stream position `pos` (wrapping at its end). The caller
    /// owns those bytes: they lie between the reader's position and its own write position.
    fn copy_in(&self, r: usize, pos: u64, src: &[u8]) {
        let cap = self.ring_bytes[r];
        debug_assert!(src.len() <= cap);
        let at = (pos as usize) & (cap - 1);
        let first = src.len().min(cap - at);
        let base = self.ring_start(r);
        // SAFETY: `base + at + first` and `base + (src.len() - first)` stay inside ring `r`,
        // which lies inside the mapping (size checked at create/adopt). The other process
        // may write the same bytes only if it breaks the ring protocol, which can garble the
        // data but not this copy: both sides move raw bytes through these pointers and
        // decode only private copies.
        unsafe {
            let p = self.map.as_mut_ptr().add(base);
            std::ptr::copy_nonoverlapping(src.as_ptr(), p.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), p, src.len() - first);
        }
    }

    /// Copies bytes of ring `r` from stream position `pos` into `dst` (wrapping).
    fn copy_out(&self, r: usize, pos: u64, dst: &mut [u8]) {
        let cap = self.ring_bytes[r];
        debug_assert!(dst.len() <= cap);
        let at = (pos as usize) & (cap - 1);
        let first = dst.len().min(cap - at);
        let base = self.ring_start(r);
        // SAFETY: as in `copy_in`: both ranges lie inside ring `r` of the live mapping, and
        // `dst` is a private buffer that the other process cannot see.
        unsafe {
            let p = self.map.as_ptr().add(base);
            std::ptr::copy_nonoverlapping(p.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}

const NO_TIMEOUT: u64 = u64::MAX;

#[derive(Debug)]
struct End {
    region: ShmRegion,
    side: Side,
    socket: UnixStream,
    /// This side's own positions: the write position of the ring it writes and the read
    /// position of the ring it reads. The copies in the mapping are published for the other
    /// side, never trusted back.
    my_write: AtomicU64,
    my_read: AtomicU64,
    read_timeout_ns: AtomicU64,
    write_timeout_ns: AtomicU64,
}

/// One side's stream over a [`ShmRegion`]. Clones share the rings: like a socket's, reads and
/// writes from several threads must be serialized by the caller (the worker's heartbeat
/// thread writes under the same lock as its replies).
#[derive(Clone, Debug)]
pub struct ShmStream {
    end: Arc<End>,
}

fn timeout_of(ns: &AtomicU64) -> Option<Duration> {
    match ns.load(Ordering::Relaxed) {
        NO_TIMEOUT => None,
        n => Some(Duration::from_nanos(n)),
    }
}

impl ShmStream {
    /// The session's socket (liveness only).
    pub fn socket(&self) -> &UnixStream {
        &self.end.socket
    }

    pub fn side(&self) -> Side {
        self.end.side
    }

    /// Bytes this side has written into and read out of the rings since they were set up:
    /// (written, read), its own ring positions.
    pub fn bytes_moved(&self) -> (u64, u64) {
        (
            self.end.my_write.load(Ordering::Relaxed),
            self.end.my_read.load(Ordering::Relaxed),
        )
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) {
        let ns = t.map_or(NO_TIMEOUT, |t| {
            t.as_nanos().min(u128::from(NO_TIMEOUT - 1)) as u64
        });
        self.end.read_timeout_ns.store(ns, Ordering::Relaxed);
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) {
        let ns = t.map_or(NO_TIMEOUT, |t| {
            t.as_nanos().min(u128::from(NO_TIMEOUT - 1)) as u64
        });
        self.end.write_timeout_ns.store(ns, Ordering::Relaxed);
    }

    /// Shuts the session's socket down: the other side sees its peer gone, and so does this
    /// one (every later read or write fails at once).
    pub fn shutdown(&self) {
        let _ = self.end.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Whether the peer closed the socket (or it was shut down), without waiting.
    fn peer_gone(&self) -> bool {
        crate::conn::poll_hang_up(self.end.socket.as_fd(), 0)
    }

    fn ctl(&self, r: usize, word: usize) -> &AtomicU64 {
        self.end.region.word64(ring_base(r) + word)
    }

    fn flag(&self, r: usize, word: usize) -> &AtomicU32 {
        self.end.region.word32(ring_base(r) + word)
    }

    fn ring(&self, bell: usize) {
        // A full counter (the peer never drains it) only means it is awake already.
        let _ = rustix::io::write(&self.end.region.bells[bell], &1u64.to_ne_bytes());
    }

    /// Bytes the peer has written that this side has not read, checked against the ring.
    fn readable(&self) -> io::Result<usize> {
        let (_, r) = self.end.side.rings();
        let written = self.ctl(r, WRITE_POS).load(Ordering::Acquire);
        let read = self.end.my_read.load(Ordering::Relaxed);
        let n = written.wrapping_sub(read);
        if n > self.end.region.ring_bytes[r] as u64 {
            return Err(invalid(format!(
                "shared-memory ring corrupt: the peer's write position claims {n} unread bytes in a ring of {}",
                self.end.region.ring_bytes[r]
            )));
        }
        Ok(n as usize)
    }

    /// Room this side may write into, checked against the ring.
    fn writable(&self) -> io::Result<usize> {
        let (w, _) = self.end.side.rings();
        let read = self.ctl(w, READ_POS).load(Ordering::Acquire);
        let written = self.end.my_write.load(Ordering::Relaxed);
        let used = written.wrapping_sub(read);
        let cap = self.end.region.ring_bytes[w] as u64;
        if used > cap {
            return Err(invalid(format!(
                "shared-memory ring corrupt: the peer's read position is {used} bytes behind in a ring of {cap}"
            )));
        }
        Ok((cap - used) as usize)
    }

    /// What the ring holds now, without waiting: `Ok(0)` only for an empty `buf`;
    /// `WouldBlock` when nothing is there.
    pub fn read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.readable()?.min(buf.len());
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let (_, r) = self.end.side.rings();
        let pos = self.end.my_read.load(Ordering::Relaxed);
        self.end.region.copy_out(r, pos, &mut buf[..n]);
        let pos = pos.wrapping_add(n as u64);
        self.end.my_read.store(pos, Ordering::Relaxed);
        self.ctl(r, READ_POS).store(pos, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.flag(r, WRITER_PARKED).load(Ordering::Relaxed) != 0 {
            self.ring(space_bell(r));
        }
        Ok(n)
    }

    fn write_now(&self, buf: &[u8]) -> io::Result<usize> {
        let n = self.writable()?.min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let (w, _) = self.end.side.rings();
        let pos = self.end.my_write.load(Ordering::Relaxed);
        self.end.region.copy_in(w, pos, &buf[..n]);
        let pos = pos.wrapping_add(n as u64);
        self.end.my_write.store(pos, Ordering::Relaxed);
        self.ctl(w, WRITE_POS).store(pos, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.flag(w, READER_PARKED).load(Ordering::Relaxed) != 0 {
            self.ring(data_bell(w));
        }
        Ok(n)
    }

    /// Spins, then parks on `bell` (raising `parked` first) until `ready` holds, the bell
    /// rings, the socket hangs up, or `deadline`/[`PARK_SLICE`] passes. The caller looks again.
    fn wait(
        &self,
        parked: &AtomicU32,
        bell: usize,
        deadline: Option<Instant>,
        ready: impl Fn() -> io::Result<bool>,
    ) -> io::Result<()> {
        let spin = spin_time();
        if !spin.is_zero() {
            let until = Instant::now() + spin;
            loop {
                for _ in 0..64 {
                    if ready()? {
                        return Ok(());
                    }
                    std::hint::spin_loop();
                }
                if Instant::now() >= until {
                    break;
                }
            }
        }
        parked.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if ready()? {
            parked.store(0, Ordering::Relaxed);
            return Ok(());
        }
        let mut slice = PARK_SLICE;
        if let Some(d) = deadline {
            slice = slice.min(d.saturating_duration_since(Instant::now()));
        }
        let ts = rustix::event::Timespec {
            tv_sec: slice.as_secs() as _,
            tv_nsec: slice.subsec_nanos() as _,
        };
        let mut fds = [
            PollFd::new(&self.end.region.bells[bell], PollFlags::IN),
            PollFd::new(&self.end.socket, PollFlags::RDHUP),
        ];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                parked.store(0, Ordering::Relaxed);
                return Err(e.into());
            }
        }
        parked.store(0, Ordering::Relaxed);
        let mut drain = [0u8; 8];
        let _ = rustix::io::read(&self.end.region.bells[bell], &mut drain);
        Ok(())
    }

    fn deadline(ns: &AtomicU64) -> Option<Instant> {
        timeout_of(ns).map(|t| Instant::now() + t)
    }

    /// Parks until the ring has bytes to read, the peer is gone or `timeout` passes, leaving
    /// `also` (another descriptor, e.g. a command socket) to wake it too. What woke it:
    /// `Ok(true)` for this stream (data, or a peer gone: the next read reports it).
    pub fn wait_readable(
        &self,
        also: Option<BorrowedFd<'_>>,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let (_, r) = self.end.side.rings();
        let parked = self.flag(r, READER_PARKED);
        parked.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.readable()? > 0 {
            parked.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        let ts = timeout.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs() as _,
            tv_nsec: t.subsec_nanos() as _,
        });
        let bell = &self.end.region.bells[data_bell(r)];
        let mut fds = vec![
            PollFd::new(bell, PollFlags::IN),
            PollFd::new(&self.end.socket, PollFlags::RDHUP),
        ];
        if let Some(fd) = also.as_ref() {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        let polled = rustix::event::poll(&mut fds, ts.as_ref());
        let mine = !fds[0].revents().is_empty() || !fds[1].revents().is_empty();
        drop(fds);
        parked.store(0, Ordering::Relaxed);
        let mut drain = [0u8; 8];
        let _ = rustix::io::read(bell, &mut drain);
        match polled {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(mine || self.readable()? > 0)
    }
}

impl io::Read for ShmStream {
    /// Blocks until bytes come (`Ok(0)`: the peer is gone and everything it sent was read).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl io::Read for &ShmStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = ShmStream::deadline(&self.end.read_timeout_ns);
        let (_, r) = self.end.side.rings();
        loop {
            match self.read_now(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.wait(self.flag(r, READER_PARKED), data_bell(r), deadline, || {
                Ok(self.readable()? > 0)
            })?;
            // Looked at only when waiting found nothing (no system call on the fast path);
            // bytes written just before the peer went are still delivered first.
            if self.readable()? == 0 && self.peer_gone() {
                return match self.read_now(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    other => other,
                };
            }
        }
    }
}

impl io::Write for ShmStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Write for &ShmStream {
    /// Blocks until there is room; a peer that is gone is a broken pipe.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = ShmStream::deadline(&self.end.write_timeout_ns);
        let (w, _) = self.end.side.rings();
        let mut looked = false;
        loop {
            let n = self.write_now(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if looked && self.peer_gone() {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            looked = true;
            self.wait(self.flag(w, WRITER_PARKED), space_bell(w), deadline, || {
                Ok(self.writable()? > 0)
            })?;
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
