//! Process-wide state: whether `cuInit` ran, and the session (connected lazily, reconnected in
//! a forked child).
//!
//! Every export asks for the session, so finding it takes no process-wide lock: each thread
//! keeps the session it last got, valid until the process forks (a `pthread_atfork` child
//! handler counts forks; the child's first call connects anew, as the pid check in `connect`
//! does for the slow path).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use gpufuse_client::state::Inner;
use gpufuse_client::{ClientError, Session, SessionConfig};

use crate::status::{CUresult, NOT_INITIALIZED};

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static SESSION: Mutex<Option<(u32, Arc<Session>)>> = Mutex::new(None);
static REPORTED: AtomicBool = AtomicBool::new(false);

/// The driver version gpufuse advertises, whatever the worker's driver is (13.5: both runtimes
/// accept it; see docs/driver-interception.md, section 7).
pub const DRIVER_VERSION: i32 = 13050;

/// `cuInit`: connects the session (or fails with the reason on stderr, once).
pub fn init() -> Result<(), CUresult> {
    connect()?;
    INITIALIZED.store(true, Ordering::Release);
    Ok(())
}

/// How many times this process has forked (counted in the child).
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::AcqRel);
}

thread_local! {
    /// The session this thread last got, and the fork count it was got at.
    static MINE: RefCell<Option<(u64, Arc<Session>)>> = const { RefCell::new(None) };
}

/// The session, for every call after `cuInit`.
pub fn session() -> Result<Arc<Session>, CUresult> {
    with_session(|s| Ok(s.clone()))
}

/// Runs `f` on the session (every call after `cuInit`), without the process-wide lock once
/// this thread has found it.
pub fn with_session<T>(
    f: impl FnOnce(&Arc<Session>) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(NOT_INITIALIZED);
    }
    let forks = FORKS.load(Ordering::Acquire);
    let mut f = Some(f);
    let mut call = |s: &Arc<Session>| match f.take() {
        Some(f) => f(s),
        None => Err(crate::status::NOT_INITIALIZED),
    };
    // A call from a thread-local destructor (an allocator's cache freed at thread exit) finds
    // no cache and goes the slow way.
    let cached = MINE.try_with(|m| {
        let mine = m.try_borrow().ok()?;
        let (_, s) = mine.as_ref().filter(|(at, _)| *at == forks)?;
        // This thread's own reference: no shared counter is touched.
        Some(call(s))
    });
    if let Ok(Some(r)) = cached {
        return r;
    }
    let s = connect()?;
    let _ = MINE.try_with(|m| {
        if let Ok(mut mine) = m.try_borrow_mut() {
            *mine = Some((forks, s.clone()));
        }
    });
    call(&s)
}

fn connect() -> Result<Arc<Session>, CUresult> {
    static AT_FORK: Once = Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only increments an atomic (async-signal-safe, as a
        // handler run in a forked child must be); the library is never unloaded while the
        // process can fork.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
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
    with_session(|s| {
        let mut g = s.lock();
        f(&mut g).map_err(client_err)
    })
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
