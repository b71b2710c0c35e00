//! The shape of every export: run the body, catch any panic, return a `CUresult`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::status::{CUresult, SUCCESS, UNKNOWN};

static PANIC_REPORTED: AtomicBool = AtomicBool::new(false);

/// Runs `f`; `Err(status)` and panics become the returned `CUresult`. No panic crosses the
/// FFI boundary.
pub fn guard(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(status)) => status,
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
