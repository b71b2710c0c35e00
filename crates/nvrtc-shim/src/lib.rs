//! gpufuse's NVRTC interposer, `libgpufuse_nvrtc.so`, which `gpufuse run` preloads
//! (`LD_PRELOAD`) into the programs it starts.
//!
//! NVRTC compiles for a real architecture (`--gpu-architecture=sm_100`, what NVIDIA's samples
//! pass for the device they run on) to a cubin: SASS only, which the emulated GPU cannot run,
//! so launches of its kernels failed with `CUDA_ERROR_NO_BINARY_FOR_GPU`. NVRTC keeps the PTX
//! it compiled the cubin from; `nvrtcGetCUBINSize` and `nvrtcGetCUBIN` here give instead a
//! fatbin of both (`gpufuse_fatbin::cubin_with_ptx`), as `nvcc -fatbin -arch=sm_100` would
//! make: a GPU of the cubin's architecture runs the cubin, the emulated GPU the PTX, and every
//! module loader (`cuModuleLoadData`, `cuLibraryLoadData`, `cuLinkAddData`) takes a fatbin.
//!
//! The PTX entry is marked as the cubin's twin: it runs only where the cubin would (the same
//! major version, a minor not above the GPU's), so a cubin for another GPU still fails to load
//! with `CUDA_ERROR_NO_BINARY_FOR_GPU`, as on NVIDIA's driver.
//!
//! The real functions are NVRTC's own, found with `dlsym(RTLD_NEXT)`. Where the program has no
//! PTX (compiled with `-dlto`) or either image is not what it should be, the real cubin is
//! given unchanged; an error of NVRTC's is returned as it is. `GPUFUSE_NVRTC_PTX=0` turns the
//! interposer off. Programs whose NVRTC calls go through the dynamic linker's global scope see
//! it (C programs linked with NVRTC; cuda-python's bindings too, in the real-client tests); one
//! that looks NVRTC's functions up only in its own `dlopen` handle gets NVRTC's.

use std::ffi::{c_char, c_int, c_void, CStr};

/// `nvrtcResult`.
type NvrtcResult = c_int;
const NVRTC_SUCCESS: NvrtcResult = 0;
const NVRTC_ERROR_INVALID_INPUT: NvrtcResult = 3;
const NVRTC_ERROR_INTERNAL_ERROR: NvrtcResult = 11;

/// `nvrtcProgram`.
type Program = *mut c_void;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;
type GetFn = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;

/// NVRTC's own function `name`, the next definition after this library's.
fn next<T: Copy>(name: &CStr) -> Option<T> {
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `name` is NUL-terminated; dlsym reads nothing else.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    // SAFETY: T is a function pointer type of the same size as a data pointer (asserted),
    // and `p` is non-null: the address of NVRTC's function of that signature (nvrtc.h).
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn enabled() -> bool {
    std::env::var_os("GPUFUSE_NVRTC_PTX").is_none_or(|v| v != "0")
}

/// One of NVRTC's images of `prog` through its size and copy functions.
///
/// # Safety
/// `prog` is the caller's own argument, passed on to NVRTC as the caller passed it.
unsafe fn image(prog: Program, size: SizeFn, get: GetFn) -> Result<Vec<u8>, NvrtcResult> {
    let mut n = 0usize;
    // SAFETY: NVRTC's function with the caller's program and a valid out pointer.
    let st = unsafe { size(prog, &mut n) };
    if st != NVRTC_SUCCESS {
        return Err(st);
    }
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds the `n` bytes NVRTC said the image has.
    let st = unsafe { get(prog, buf.as_mut_ptr().cast()) };
    if st != NVRTC_SUCCESS {
        return Err(st);
    }
    Ok(buf)
}

/// The fatbin of `prog`'s cubin and PTX; None where NVRTC's own cubin is to be given.
///
/// # Safety
/// `prog` is the caller's own argument, passed on to NVRTC as the caller passed it.
unsafe fn combined(prog: Program) -> Result<Option<Vec<u8>>, NvrtcResult> {
    if !enabled() {
        return Ok(None);
    }
    let (Some(cubin_size), Some(cubin_get), Some(ptx_size), Some(ptx_get)) = (
        next::<SizeFn>(c"nvrtcGetCUBINSize"),
        next::<GetFn>(c"nvrtcGetCUBIN"),
        next::<SizeFn>(c"nvrtcGetPTXSize"),
        next::<GetFn>(c"nvrtcGetPTX"),
    ) else {
        return Ok(None);
    };
    // SAFETY: the caller's program, passed on (# Safety).
    let cubin = unsafe { image(prog, cubin_size, cubin_get)? };
    // SAFETY: as above. No PTX (`-dlto`): the cubin as it is.
    let Ok(ptx) = (unsafe { image(prog, ptx_size, ptx_get) }) else {
        return Ok(None);
    };
    Ok(gpufuse_fatbin::cubin_with_ptx(&cubin, &ptx).ok())
}

/// Runs `f`, a panic becoming `NVRTC_ERROR_INTERNAL_ERROR` (it must not unwind into C).
fn guard(f: impl FnOnce() -> NvrtcResult) -> NvrtcResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(NVRTC_ERROR_INTERNAL_ERROR)
}

/// `nvrtcGetCUBINSize`: the size of the fatbin [`nvrtcGetCUBIN`] gives.
///
/// # Safety
/// As NVRTC's: `prog` a program, `size` writable.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBINSize(prog: Program, size: *mut usize) -> NvrtcResult {
    guard(|| {
        if size.is_null() {
            return NVRTC_ERROR_INVALID_INPUT;
        }
        // SAFETY: the caller's program, passed on.
        match unsafe { combined(prog) } {
            Ok(Some(img)) => {
                // SAFETY: `size` is the caller's, non-null and writable (# Safety).
                unsafe { size.write(img.len()) };
                NVRTC_SUCCESS
            }
            Ok(None) => match next::<SizeFn>(c"nvrtcGetCUBINSize") {
                // SAFETY: NVRTC's own function with the caller's arguments.
                Some(real) => unsafe { real(prog, size) },
                None => NVRTC_ERROR_INTERNAL_ERROR,
            },
            Err(st) => st,
        }
    })
}

/// `nvrtcGetCUBIN`: a fatbin of the program's cubin and PTX (see the crate's documentation).
///
/// # Safety
/// As NVRTC's: `prog` a program, `cubin` room for what [`nvrtcGetCUBINSize`] said.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: Program, cubin: *mut c_char) -> NvrtcResult {
    guard(|| {
        if cubin.is_null() {
            return NVRTC_ERROR_INVALID_INPUT;
        }
        // SAFETY: the caller's program, passed on.
        match unsafe { combined(prog) } {
            Ok(Some(img)) => {
                // SAFETY: the caller made room for the size nvrtcGetCUBINSize gave, which is
                // this image's (the same program gives the same images).
                unsafe { std::ptr::copy_nonoverlapping(img.as_ptr(), cubin.cast(), img.len()) };
                NVRTC_SUCCESS
            }
            Ok(None) => match next::<GetFn>(c"nvrtcGetCUBIN") {
                // SAFETY: NVRTC's own function with the caller's arguments.
                Some(real) => unsafe { real(prog, cubin) },
                None => NVRTC_ERROR_INTERNAL_ERROR,
            },
            Err(st) => st,
        }
    })
}
