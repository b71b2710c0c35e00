//! Heartbeats: while the worker works on the client's requests (a long kernel, a wait for the
//! device), a thread sends a bodiless [`FrameKind::Heartbeat`] frame every 250 ms, so a
//! client waiting for a reply can tell a busy worker from a stopped one without a fixed
//! deadline that a long kernel could exceed. An idle worker (waiting for the client) sends
//! nothing. Replies and heartbeats are written under one lock, so they never interleave.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpufuse_proto::{encode_frame, FrameKind};
use gpufuse_transport::Stream;

/// How often a busy worker says it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);

struct Shared {
    busy: AtomicBool,
    writing: Mutex<()>,
}

/// The heartbeat thread of one session; it stops when this is dropped.
pub struct Heartbeat {
    shared: Arc<Shared>,
    _stop: Sender<()>,
}

impl Heartbeat {
    /// Starts the thread, writing to `stream` (a second handle to the client's connection).
    pub fn start(mut stream: Stream) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            busy: AtomicBool::new(false),
            writing: Mutex::new(()),
        });
        let (stop, stopped) = channel::<()>();
        let mut beat = Vec::new();
        encode_frame(&mut beat, FrameKind::Heartbeat, 0, 0, &());
        let s = shared.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT_EVERY) {
                    if !s.busy.load(Ordering::Relaxed) {
                        continue;
                    }
                    let _w = s.writing.lock().unwrap_or_else(|e| e.into_inner());
                    if stream.write_all(&beat).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            shared,
            _stop: stop,
        })
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
