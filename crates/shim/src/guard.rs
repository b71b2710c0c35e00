//! The shape of every export: run the body, catch any panic, return a `CUresult`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::status::{CUresult, SUCCESS, UNKNOWN};

static PANIC_REPORTED: AtomicBool = AtomicBool::new(false);

/// Runs `f`; `Err(status)` and panics become the returned `CUresult`. No panic crosses the
/// FFI boundary.
/// With `GPUFUSE_LOG=errors`, every failing call prints where in the shim it failed.
#[track_caller]
pub fn guard(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    let at = std::panic::Location::caller();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(status)) => {
            if log_errors() {
                eprintln!("gpufuse: {}:{} returned {status}", at.file(), at.line());
            }
            status
        }
        Err(_) => {
            if !PANIC_REPORTED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "gpufuse: internal error in a driver call (reported as CUDA_ERROR_UNKNOWN)"
                );
            }
            UNKNOWN
        }
    }
}

/// Whether `GPUFUSE_LOG` asks for failing calls (read once).
fn log_errors() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUFUSE_LOG").is_ok_and(|v| v.contains("errors")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_unknown_errors() {
        assert_eq!(guard(|| panic!("boom")), UNKNOWN);
        assert_eq!(guard(|| Err(2)), 2);
        assert_eq!(guard(|| Ok(())), SUCCESS);
    }
}
