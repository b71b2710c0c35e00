//! The built `libgpufuse_nvrtc.so` as `gpufuse run` preloads it, in a process without NVRTC:
//! what it exports, what its two functions answer when there is no NVRTC to ask, and that its
//! `dlsym` answers every lookup as glibc's does, `RTLD_NEXT` ones relative to the caller.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

type SizeFn = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

const NVRTC_ERROR_INVALID_INPUT: c_int = 3;
const NVRTC_ERROR_INTERNAL_ERROR: c_int = 11;

/// The library, loaded into the global scope as a preloaded library is.
fn library() -> *mut c_void {
    // Cargo builds the crate's cdylib beside this test (target/*/deps) to link the test, and
    // `cargo build` copies it up a level.
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let lib = [&deps, deps.parent().unwrap()]
        .map(|d| d.join("libgpufuse_nvrtc.so"))
        .into_iter()
        .find(|p| p.exists())
        .expect("libgpufuse_nvrtc.so beside the test or a level up");
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the library's constructor only looks up glibc's dlsym.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!handle.is_null(), "dlopen {}", lib.display());
    handle
}

/// `name` in `handle`, through glibc's `dlsym`.
fn symbol(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: a live handle (or a pseudo-handle) and a NUL-terminated name.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

#[test]
fn it_exports_the_two_functions_it_replaces() {
    let lib = library();
    for name in [c"nvrtcGetCUBIN", c"nvrtcGetCUBINSize"] {
        assert!(!symbol(lib, name).is_null(), "{name:?}");
    }
    // Only those: every other NVRTC function stays NVRTC's.
    for name in [c"nvrtcGetPTX", c"nvrtcGetPTXSize", c"nvrtcCompileProgram"] {
        assert!(symbol(lib, name).is_null(), "{name:?}");
    }
}

#[test]
fn with_no_nvrtc_to_ask_it_fails_cleanly() {
    let lib = library();
    // SAFETY: the exported functions have NVRTC's signatures (nvrtc.h).
    let (size_fn, get_fn) = unsafe {
        (
            std::mem::transmute::<*mut c_void, SizeFn>(symbol(lib, c"nvrtcGetCUBINSize")),
            std::mem::transmute::<*mut c_void, GetFn>(symbol(lib, c"nvrtcGetCUBIN")),
        )
    };
    // A program NVRTC never made: the interposer must not touch it without NVRTC.
    let mut program = [0u64; 4];
    let prog = program.as_mut_ptr().cast::<c_void>();
    let mut size = 7usize;
    let mut out = [0u8; 16];
    // SAFETY: writable outputs; the program is passed on only to an NVRTC, and there is none.
    unsafe {
        assert_eq!(size_fn(prog, &mut size), NVRTC_ERROR_INTERNAL_ERROR);
        assert_eq!(
            get_fn(prog, out.as_mut_ptr().cast()),
            NVRTC_ERROR_INTERNAL_ERROR
        );
        assert_eq!(
            size_fn(prog, std::ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
        assert_eq!(
            get_fn(prog, std::ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
    }
    assert_eq!(size, 7);
    assert_eq!(out, [0u8; 16]);
    assert_eq!(program, [0u64; 4]);
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn its_dlsym_answers_as_glibc_s() {
    let lib = library();
    let ours = symbol(lib, c"dlsym");
    assert!(!ours.is_null());
    assert_ne!(
        ours,
        symbol(libc::RTLD_DEFAULT, c"dlsym"),
        "glibc's dlsym comes first"
    );
    // SAFETY: the library's `dlsym` has glibc's signature.
    let dlsym = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(ours) };
    // SAFETY: pseudo-handles or live handles, and NUL-terminated names.
    let via = |handle: *mut c_void, name: &CStr| unsafe { dlsym(handle, name.as_ptr()) };

    for name in [c"strlen", c"nvrtcGetCUBIN", c"no_such_symbol_anywhere"] {
        assert_eq!(
            via(libc::RTLD_DEFAULT, name),
            symbol(libc::RTLD_DEFAULT, name),
            "{name:?}"
        );
        assert_eq!(via(lib, name), symbol(lib, name), "{name:?}");
    }
    // The library's own functions, looked up in its own handle, are its own.
    assert_eq!(via(lib, c"nvrtcGetCUBIN"), symbol(lib, c"nvrtcGetCUBIN"));

    // RTLD_NEXT is relative to whoever called dlsym: from this test program, the next
    // definition of nvrtcGetCUBIN is the interposer's, which comes after it in the global
    // scope. Had the library's dlsym called glibc's instead of jumping to it, the lookup would
    // start after the library itself and find nothing.
    let next = via(libc::RTLD_NEXT, c"nvrtcGetCUBIN");
    assert_eq!(next, symbol(libc::RTLD_NEXT, c"nvrtcGetCUBIN"));
    assert_eq!(next, symbol(lib, c"nvrtcGetCUBIN"));
    assert!(!next.is_null());
}
