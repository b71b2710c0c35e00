//! Initialization, versions, symbol lookup, export tables and error strings.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

use gpufuse_cuda_types::{resolve_proc, ProcLookup};

use crate::dark_api::Answer;
use crate::ffi::{cstr, out, out_opt};
use crate::global::{self, DRIVER_VERSION};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE, NOT_FOUND};

/// The answer of every driver function gpufuse does not implement. With `GPUFUSE_LOG` set,
/// each name is reported once on stderr.
pub fn unsupported(name: &'static str) -> CUresult {
    static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    if std::env::var_os("GPUFUSE_LOG").is_some() {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.contains(&name) {
            seen.push(name);
            eprintln!("gpufuse: {name} is not supported");
        }
    }
    crate::status::NOT_SUPPORTED
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    // The flags must be 0 (cuda.h); NVIDIA's driver refuses any other value.
    if flags != 0 {
        return INVALID_VALUE;
    }
    guard(global::init)
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(version, DRIVER_VERSION) })
}

/// Status values of `cuGetProcAddress_v2`.
const FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn lookup(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> (CUresult, c_int) {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        // SAFETY: a NUL-terminated string argument, used during this call only.
        let Ok(name) = cstr(symbol) else {
            return (INVALID_VALUE, SYMBOL_NOT_FOUND);
        };
        if pfn.is_null() {
            return (INVALID_VALUE, SYMBOL_NOT_FOUND);
        }
        out_opt(pfn, std::ptr::null_mut());
        match resolve_proc(name, version, flags) {
            ProcLookup::Found(export) => match crate::exports::address(export) {
                Some(addr) => {
                    out_opt(pfn, addr);
                    (0, FOUND)
                }
                None => (NOT_FOUND, SYMBOL_NOT_FOUND),
            },
            ProcLookup::UnknownSymbol => (NOT_FOUND, SYMBOL_NOT_FOUND),
            ProcLookup::VersionTooNew => (NOT_FOUND, VERSION_NOT_SUFFICIENT),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (r, s) = lookup(symbol, pfn, cuda_version, flags);
        out_opt(status, s);
        // A symbol that is missing or too new is a success with a NULL function and the
        // status saying why, as NVIDIA's driver answers the `_v2` form (580, H200); a bad
        // argument is still an error.
        if r == 0 || (r == NOT_FOUND && !status.is_null()) {
            Ok(())
        } else {
            Err(r)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        match lookup(symbol, pfn, cuda_version, flags).0 {
            0 => Ok(()),
            r => Err(r),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let id = crate::ffi::read(id)?;
        match crate::dark_api::table_for(&id) {
            Answer::Known(t) | Answer::Unknown(t) => out(table, t),
            Answer::Refused => {
                out_opt(table, std::ptr::null());
                Err(INVALID_VALUE)
            }
        }
    })
}

fn error_strings() -> &'static HashMap<CUresult, (CString, CString)> {
    static STRINGS: OnceLock<HashMap<CUresult, (CString, CString)>> = OnceLock::new();
    STRINGS.get_or_init(|| {
        (-1..1000)
            .filter_map(|code| {
                let name = gpufuse_cuda_types::result_name(code)?;
                let text = gpufuse_cuda_types::result_text(code)?;
                Some((code, (CString::new(name).ok()?, CString::new(text).ok()?)))
            })
            .collect()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, name: *mut *const c_char) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        match error_strings().get(&error) {
            Some((n, _)) => out(name, n.as_ptr()),
            None => {
                out_opt(name, std::ptr::null());
                Err(INVALID_VALUE)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        match error_strings().get(&error) {
            Some((_, t)) => out(text, t.as_ptr()),
            None => {
                out_opt(text, std::ptr::null());
                Err(INVALID_VALUE)
            }
        }
    })
}

/// Profiler control succeeds and does nothing: no profiler attaches to a remote device, and
/// programs call these around the region they want profiled.
#[no_mangle]
pub unsafe extern "C" fn cuProfilerStart() -> CUresult {
    guard(|| global::session().map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn cuProfilerStop() -> CUresult {
    guard(|| global::session().map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn cuProfilerInitialize(
    _config: *const c_char,
    _output: *const c_char,
    _mode: c_int,
) -> CUresult {
    guard(|| global::session().map(|_| ()))
}

include!(concat!(env!("OUT_DIR"), "/aliases_init.rs"));
