//! The shape of every export: lock the simulated machine, apply the effects of ops that have
//! completed by now, run the body, catch any panic, and wait (with the lock released) when the
//! call blocks.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gpufuse_cuda_types::{short as E, CUresult};

use crate::state::Sim;

/// The origin of the simulated timeline.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds since [`EPOCH`]: the timeline's clock.
pub(crate) fn now() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

static SIM: LazyLock<Mutex<Sim>> = LazyLock::new(|| Mutex::new(Sim::new()));

/// The machine. A panic while it was held leaves it usable (the panicking call returned
/// `CUDA_ERROR_UNKNOWN`).
fn lock() -> MutexGuard<'static, Sim> {
    SIM.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a call does after its body ran.
#[derive(Debug)]
pub(crate) enum Flow {
    /// Returns `CUDA_SUCCESS`.
    Done,
    /// Blocks the caller until timeline time `t`, then applies what completed by then and
    /// returns `CUDA_SUCCESS`, or the pending asynchronous error of context `fault_ctx`.
    Until { t: u64, fault_ctx: Option<u64> },
}

/// What an export's body returns.
pub(crate) type Res = Result<Flow, CUresult>;

/// Whether a call needs `cuInit` first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Nothing,
    Init,
}

static PANIC_REPORTED: AtomicBool = AtomicBool::new(false);

/// Runs one driver call. No panic crosses the FFI boundary: it is `CUDA_ERROR_UNKNOWN`.
pub(crate) fn call(need: Need, f: impl FnOnce(&mut Sim) -> Res) -> CUresult {
    match catch_unwind(AssertUnwindSafe(|| run(need, f))) {
        Ok(r) => r,
        Err(_) => {
            if !PANIC_REPORTED.swap(true, Ordering::Relaxed) {
                eprintln!("gpufuse-cuda-sim: internal error in a driver call (reported as CUDA_ERROR_UNKNOWN)");
            }
            E::UNKNOWN
        }
    }
}

fn run(need: Need, f: impl FnOnce(&mut Sim) -> Res) -> CUresult {
    let mut s = lock();
    s.stats.driver_calls += 1;
    if need == Need::Init && !s.initialized {
        return E::NOT_INITIALIZED;
    }
    // One instant for the whole call: what a query finds complete has had its effects.
    let t = now();
    s.clock = t;
    s.apply_due(t);
    let flow = match f(&mut s) {
        Ok(flow) => flow,
        Err(code) => return code,
    };
    match flow {
        Flow::Done => E::SUCCESS,
        Flow::Until { t, fault_ctx } => {
            drop(s);
            let t0 = now();
            sleep_until(t);
            let mut s = lock();
            let t1 = now();
            s.stats.host_blocked_ns += t1.saturating_sub(t0);
            s.apply_due(t1);
            fault_ctx
                .and_then(|c| s.take_fault(c))
                .unwrap_or(E::SUCCESS)
        }
    }
}

/// The test double's own exports: no call counting, no initialization needed.
pub(crate) fn stats_call(f: impl FnOnce(&mut Sim) -> Result<(), CUresult>) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut s = lock();
        s.apply_due(now());
        f(&mut s)
    }));
    match r {
        Ok(Ok(())) => E::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => E::UNKNOWN,
    }
}

/// Sleeps until timeline time `t`: the OS sleep for most of it, then a busy wait, so that
/// the wake-up is within some microseconds of `t` (yielding instead could give the processor
/// away for a whole scheduler slice on a busy machine).
pub(crate) fn sleep_until(t: u64) {
    const SPIN_NS: u64 = 200_000;
    loop {
        let n = now();
        if n >= t {
            return;
        }
        let left = t - n;
        if left > SPIN_NS {
            std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
        } else {
            std::hint::spin_loop();
        }
    }
}
