//! Process-wide state: whether `cuInit` ran, and the session (connected lazily, reconnected in
//! a forked child).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use gpufuse_client::state::Inner;
use gpufuse_client::{ClientError, Session, SessionConfig};

use crate::status::{CUresult, NOT_INITIALIZED};

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static SESSION: Mutex<Option<(u32, Arc<Session>)>> = Mutex::new(None);
static REPORTED: AtomicBool = AtomicBool::new(false);

/// The driver version gpufuse advertises, whatever the worker's driver is (13.5: both runtimes
/// accept it; see docs/cuda-driver-interception.md §8).
pub const DRIVER_VERSION: i32 = 13050;

/// `cuInit`: connects the session (or fails with the reason on stderr, once).
pub fn init() -> Result<(), CUresult> {
    connect()?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// The session, for every call after `cuInit`.
pub fn session() -> Result<Arc<Session>, CUresult> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(NOT_INITIALIZED);
    }
    connect()
}

fn connect() -> Result<Arc<Session>, CUresult> {
    let pid = std::process::id();
    let mut slot = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, s)) = slot.as_ref() {
        if *owner == pid {
            return Ok(s.clone());
        }
        // A forked child: the parent's connection is not ours to use.
        *slot = None;
    }
    let result = SessionConfig::from_env().and_then(|c| Session::connect(&c));
    match result {
        Ok(s) => {
            let s = Arc::new(s);
            s.start_flusher(std::time::Duration::from_millis(2));
            *slot = Some((pid, s.clone()));
            Ok(s)
        }
        Err(e) => {
            if !REPORTED.swap(true, Ordering::Relaxed) {
                let mut msg = format!("gpufuse: {e}");
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                eprintln!("{msg}");
            }
            Err(e.status())
        }
    }
}

/// Runs `f` on the locked session: the one call into the client core an export makes.
pub fn with_core<T>(f: impl FnOnce(&mut Inner) -> Result<T, ClientError>) -> Result<T, CUresult> {
    let s = session()?;
    let mut g = s.lock();
    f(&mut g).map_err(client_err)
}

/// The status for a client error. A lost connection fails every later call the same way: say
/// why once, on stderr, as the failed connect is reported.
pub fn client_err(e: ClientError) -> CUresult {
    static LOST_REPORTED: AtomicBool = AtomicBool::new(false);
    if matches!(e, ClientError::Lost(_) | ClientError::Hung { .. })
        && !LOST_REPORTED.swap(true, Ordering::Relaxed)
    {
        let cause = std::error::Error::source(&e).map_or(String::new(), |s| format!(" ({s})"));
        eprintln!(
            "gpufuse: {e}{cause}: the session has ended (`gpufuse kill`, or its worker or the server stopped); CUDA calls now return CUDA_ERROR_DEVICE_UNAVAILABLE"
        );
    }
    e.status()
}
