//! gpufuse's NVRTC interposer, `libgpufuse_nvrtc.so`, which `gpufuse run` preloads
//! (`LD_PRELOAD`) into the programs it starts when the library was built beside its binary.
//!
//! NVRTC compiles for a real architecture (`--gpu-architecture=sm_100`, what NVIDIA's samples
//! pass for the device they run on) to a cubin: SASS only, which the emulated GPU cannot run,
//! so launches of its kernels failed with `CUDA_ERROR_NO_BINARY_FOR_GPU`. NVRTC keeps the PTX
//! it compiled the cubin from; `nvrtcGetCUBINSize` and `nvrtcGetCUBIN` here give instead a
//! fatbin of both (`gpufuse_fatbin::cubin_with_ptx`), as `nvcc -fatbin -arch=sm_100` would
//! make: a GPU of the cubin's architecture runs the cubin, the emulated GPU the PTX, and every
//! module loader (`cuModuleLoadData`, `cuLibraryLoadData`, `cuLinkAddData`) takes a fatbin.
//! So the emulated GPU runs NVRTC-compiled cubins (NVIDIA's `*_nvrtc` samples).
//!
//! The PTX entry is marked as the cubin's twin: it runs only where the cubin would (the same
//! major version, a minor not above the GPU's: `gpufuse_fatbin::Entry::runs_on`), so a cubin
//! for another GPU still fails to load with `CUDA_ERROR_NO_BINARY_FOR_GPU`, as on NVIDIA's
//! driver.
//!
//! The real functions are NVRTC's own, found with `dlsym(RTLD_NEXT)`. Where the program has no
//! PTX (compiled with `-dlto`) or either image is not what it should be, the real cubin is
//! given unchanged; an error of NVRTC's is returned as it is. `GPUFUSE_NVRTC_PTX=0` turns the
//! interposer off.
//!
//! Programs whose NVRTC calls go through the dynamic linker's global scope see these functions
//! (C programs linked with NVRTC; cuda-python's bindings). Others open NVRTC themselves and
//! look its functions up in their own handle (`dlopen` then `dlsym(handle, ...)`: CuPy, through
//! ctypes), which the global scope never enters; for those this library also defines `dlsym`
//! (x86-64 Linux): a lookup of `nvrtcGetCUBIN` or `nvrtcGetCUBINSize` in a handle that has them
//! answers this library's, which then use that handle's NVRTC functions (the first such
//! library's; a second, different NVRTC gets its own functions unchanged). Every other lookup
//! is glibc's: `dlsym` is a naked function that jumps to glibc's for `RTLD_NEXT` (so glibc sees
//! the caller's own return address, which `RTLD_NEXT` is relative to) and otherwise to the hook,
//! which calls glibc's and looks at the answer. glibc's `dlsym` is found once, at load
//! (`dlvsym`, an `.init_array` constructor).
//!
//! Tests: the crate's own over a stand-in NVRTC (`src/tests.rs`) and over the built library
//! (`tests/cdylib.rs`: its exports, its `dlsym` answering as glibc's); with NVIDIA's NVRTC,
//! the real-client tier: `test_cupy_kernels_as_installed` (CuPy's lookups in its own handle)
//! and `test_the_dlsym_hook_keeps_rtld_next` (another interposer's `RTLD_NEXT` lookup still
//! skips it).

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

/// NVRTC's functions from the handle a program looked them up in (the `dlsym` hook), if any.
#[derive(Clone, Copy)]
struct FromHandle {
    cubin_size: SizeFn,
    cubin: GetFn,
    ptx_size: SizeFn,
    ptx: GetFn,
}

static FROM_HANDLE: std::sync::OnceLock<FromHandle> = std::sync::OnceLock::new();

/// NVRTC's size and copy functions of the cubin and the PTX: those of the handle the program
/// looked them up in, else the next definitions after this library's.
fn nvrtc_functions() -> Option<(SizeFn, GetFn, SizeFn, GetFn)> {
    if let Some(f) = FROM_HANDLE.get() {
        return Some((f.cubin_size, f.cubin, f.ptx_size, f.ptx));
    }
    Some((
        next(c"nvrtcGetCUBINSize")?,
        next(c"nvrtcGetCUBIN")?,
        next(c"nvrtcGetPTXSize")?,
        next(c"nvrtcGetPTX")?,
    ))
}

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
    let Some((cubin_size, cubin_get, ptx_size, ptx_get)) = nvrtc_functions() else {
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
            Ok(None) => match nvrtc_functions().map(|f| f.0) {
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
            Ok(None) => match nvrtc_functions().map(|f| f.1) {
                // SAFETY: NVRTC's own function with the caller's arguments.
                Some(real) => unsafe { real(prog, cubin) },
                None => NVRTC_ERROR_INTERNAL_ERROR,
            },
            Err(st) => st,
        }
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod dlsym_hook {
    //! The `dlsym` of the crate's documentation.

    use std::ffi::{c_char, c_void, CStr};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{enabled, FromHandle, GetFn, SizeFn, FROM_HANDLE};

    type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

    /// glibc's `dlsym`, set at load by [`find_glibc_dlsym`].
    static GLIBC_DLSYM: AtomicUsize = AtomicUsize::new(0);

    /// Runs when the library is loaded, before the program can call `dlsym`.
    #[used]
    #[unsafe(link_section = ".init_array")]
    static FIND_GLIBC_DLSYM: extern "C" fn() = find_glibc_dlsym;

    extern "C" fn find_glibc_dlsym() {
        // `dlsym` is versioned: GLIBC_2.34 since glibc moved it into libc, GLIBC_2.2.5 before.
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: both strings are NUL-terminated; dlvsym reads nothing else.
            let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                GLIBC_DLSYM.store(p as usize, Ordering::Release);
                return;
            }
        }
    }

    fn glibc_dlsym() -> Option<DlsymFn> {
        let p = GLIBC_DLSYM.load(Ordering::Acquire);
        // SAFETY: a non-zero value is glibc's `dlsym` (set above), of this signature.
        (p != 0).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
    }

    /// `dlsym`: `RTLD_NEXT` goes straight to glibc's (a tail jump: glibc must see the
    /// caller's return address), everything else to [`hook`]. Before the constructor has run
    /// (another preloaded library's constructor calling `dlsym` first) everything goes to the
    /// hook, which finds glibc's then (an `RTLD_NEXT` lookup is then relative to this library).
    ///
    /// # Safety
    /// As glibc's `dlsym`.
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
        core::arch::naked_asm!(
            "mov rax, qword ptr [rip + {glibc}]",
            "test rax, rax",
            "jz {hook}",
            "cmp rdi, -1",
            "jne {hook}",
            "jmp rax",
            glibc = sym GLIBC_DLSYM,
            hook = sym hook,
        );
    }

    /// glibc's answer, or this library's `nvrtcGetCUBIN`/`nvrtcGetCUBINSize` for a program's
    /// own NVRTC handle (see the crate's documentation).
    unsafe extern "C" fn hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
        let glibc = glibc_dlsym().or_else(|| {
            find_glibc_dlsym();
            glibc_dlsym()
        });
        let Some(glibc) = glibc else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's arguments, as glibc's dlsym takes them.
        let found = unsafe { glibc(handle, name) };
        if found.is_null() || name.is_null() || handle.is_null() {
            return found;
        }
        // SAFETY: a non-null symbol name is a NUL-terminated string (dlsym's contract).
        let ours = match unsafe { CStr::from_ptr(name) }.to_bytes() {
            b"nvrtcGetCUBIN" => super::nvrtcGetCUBIN as *mut c_void,
            b"nvrtcGetCUBINSize" => super::nvrtcGetCUBINSize as *mut c_void,
            _ => return found,
        };
        if found == ours || !enabled() {
            return found;
        }
        // SAFETY: `handle` found a symbol, so it is a live handle; the names are NUL-terminated.
        let get = |n: &CStr| unsafe { glibc(handle, n.as_ptr()) };
        let fns = [
            get(c"nvrtcGetCUBINSize"),
            get(c"nvrtcGetCUBIN"),
            get(c"nvrtcGetPTXSize"),
            get(c"nvrtcGetPTX"),
        ];
        if fns.iter().any(|p| p.is_null()) {
            return found;
        }
        // SAFETY: each is NVRTC's function of that name, of the signature nvrtc.h gives it.
        let recorded = FROM_HANDLE.get_or_init(|| unsafe {
            FromHandle {
                cubin_size: std::mem::transmute::<*mut c_void, SizeFn>(fns[0]),
                cubin: std::mem::transmute::<*mut c_void, GetFn>(fns[1]),
                ptx_size: std::mem::transmute::<*mut c_void, SizeFn>(fns[2]),
                ptx: std::mem::transmute::<*mut c_void, GetFn>(fns[3]),
            }
        });
        // Another NVRTC than the first one seen: its own functions, unchanged.
        if recorded.cubin as usize != fns[1] as usize {
            return found;
        }
        ours
    }
}

#[cfg(test)]
mod tests;
