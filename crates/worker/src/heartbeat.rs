//! Heartbeats: while the worker works on the client's requests (a long kernel, a wait for the
//! device), a thread sends a bodiless [`FrameKind::Heartbeat`] frame every 250 ms, so a
//! client waiting for a reply can tell a busy worker from a stopped one without a fixed
//! deadline that a long kernel could exceed. An idle worker (waiting for the client) sends
//! nothing. Replies and heartbeats are written under one lock, so they never interleave.
//!
//! The same thread watches for the client's end: when the client has hung up (its socket
//! closed, or a heartbeat cannot be written because the peer is gone) while the worker is
//! busy, it sets the session's cancel flag, which stops the kernel running now
//! ([`gpufuse_device::KernelLaunch::cancel`]): a killed program's launch does not hold the
//! device for the minutes it would still run. The worker's loop then sees the hang-up and
//! ends the session.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpufuse_proto::{encode_frame, FrameKind};
use gpufuse_transport::Stream;

/// How often a busy worker says it is alive (and looks whether its client is still there).
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);

struct Shared {
    busy: AtomicBool,
    writing: Mutex<()>,
}

/// The heartbeat thread of one session; it stops when this is dropped.
pub struct Heartbeat {
    shared: Arc<Shared>,
    cancel: Arc<AtomicBool>,
    _stop: Sender<()>,
}

impl Heartbeat {
    /// Starts the thread, writing to `stream` (a second handle to the client's connection).
    /// `cancel` is set when the client is found gone while the worker is busy.
    pub fn start(mut stream: Stream, cancel: Arc<AtomicBool>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            busy: AtomicBool::new(false),
            writing: Mutex::new(()),
        });
        let (stop, stopped) = channel::<()>();
        let mut beat = Vec::new();
        encode_frame(&mut beat, FrameKind::Heartbeat, 0, 0, &());
        let s = shared.clone();
        let kept = cancel.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT_EVERY) {
                    if !s.busy.load(Ordering::Relaxed) {
                        continue;
                    }
                    if hung_up(&stream) {
                        stop_the_session(&cancel, "the client hung up");
                        return;
                    }
                    let _w = s.writing.lock().unwrap_or_else(|e| e.into_inner());
                    if let Err(e) = stream.write_all(&beat) {
                        if peer_gone(&e) {
                            stop_the_session(&cancel, "the client's connection broke");
                        }
                        return;
                    }
                }
            })?;
        Ok(Self {
            shared,
            cancel: kept,
            _stop: stop,
        })
    }

    /// The session's cancel flag (a heartbeat restarted on another stream sets the same one).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Whether the worker is working on received requests (true) or waiting for more (false).
    pub fn busy(&self, busy: bool) {
        self.shared.busy.store(busy, Ordering::Relaxed);
    }

    /// Held while a reply is written.
    pub fn writing(&self) -> MutexGuard<'_, ()> {
        self.shared
            .writing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

fn stop_the_session(cancel: &AtomicBool, why: &str) {
    tracing::info!("{why} while its work ran: stopping the kernel running now");
    cancel.store(true, Ordering::Relaxed);
}

/// A write error that means the peer is gone (not a full socket or a timeout).
fn peer_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        BrokenPipe | ConnectionReset | ConnectionAborted | NotConnected
    )
}

/// Whether the peer of `stream` has closed its end, without waiting or reading.
fn hung_up(stream: &Stream) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: stream.as_fd().as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `fd` is one pollfd that lives for the call; the descriptor is `stream`'s, open
    // while it is borrowed. A timeout of 0 never blocks.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n == 1 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}
