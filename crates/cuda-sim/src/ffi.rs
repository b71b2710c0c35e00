//! The only code that reads or writes the caller's memory through raw pointers. Every helper
//! checks for NULL (`CUDA_ERROR_INVALID_VALUE`) and states its contract.

use std::ffi::{c_char, CStr};

use gpufuse_cuda_types::{short as E, CUresult};

/// Writes `v` through an out-pointer.
///
/// # Safety
/// `p` must be NULL or valid for writing a `T` (alignment not required).
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(E::INVALID_VALUE);
    }
    // SAFETY: non-NULL and writable, as the contract says.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `v` through an out-pointer the API allows to be NULL (then nothing is written).
///
/// # Safety
/// As [`put`].
pub(crate) unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-NULL and writable, as the contract says.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads a `T` the caller passed by pointer.
///
/// # Safety
/// `p` must be NULL or valid for reading a `T` (alignment not required).
pub(crate) unsafe fn get<T: Copy>(p: *const T) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(E::INVALID_VALUE);
    }
    // SAFETY: non-NULL and readable, as the contract says.
    Ok(unsafe { p.read_unaligned() })
}

/// The caller's NUL-terminated string, as UTF-8 (`CUDA_ERROR_INVALID_VALUE` if it is not).
///
/// # Safety
/// `p` must be NULL or point at a NUL-terminated string that outlives the call.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char) -> Result<&'a str, CUresult> {
    if p.is_null() {
        return Err(E::INVALID_VALUE);
    }
    // SAFETY: non-NULL, NUL-terminated and live for the call, as the contract says.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| E::INVALID_VALUE)
}

/// The caller's NUL-terminated image, as bytes (without the NUL).
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn cstr_bytes<'a>(p: *const c_char) -> Result<&'a [u8], CUresult> {
    if p.is_null() {
        return Err(E::INVALID_VALUE);
    }
    // SAFETY: non-NULL, NUL-terminated and live for the call, as the contract says.
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// A copy of `len` bytes of the caller's memory.
///
/// # Safety
/// `p` must be NULL or valid for reading `len` bytes.
pub(crate) unsafe fn bytes(p: *const u8, len: usize) -> Result<Vec<u8>, CUresult> {
    if p.is_null() {
        return Err(E::INVALID_VALUE);
    }
    // SAFETY: non-NULL and readable for `len` bytes, as the contract says.
    Ok(unsafe { std::slice::from_raw_parts(p, len) }.to_vec())
}

/// Writes `s` and a NUL into the caller's buffer of `len` bytes, truncating.
///
/// # Safety
/// `p` must be NULL or valid for writing `len` bytes.
pub(crate) unsafe fn put_str(p: *mut c_char, len: i32, s: &str) -> Result<(), CUresult> {
    if p.is_null() || len <= 0 {
        return Err(E::INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `p` is writable for `len` > `n` bytes; `s` is a distinct buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), p.cast::<u8>(), n);
        p.add(n).write(0);
    }
    Ok(())
}

/// A host address the caller handed to an asynchronous operation: the op reads or writes it
/// when it completes, which CUDA's contract allows (the memory stays valid until then).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostPtr(pub *mut u8);

// SAFETY: an address; the memory it names is the process's, valid (by CUDA's contract) until
// the op that holds it completes, whichever thread completes it.
unsafe impl Send for HostPtr {}

// SAFETY: sharing a `HostPtr` shares the address only; the memory behind it is read or
// written only while the simulated machine's lock is held.
unsafe impl Sync for HostPtr {}

/// A launch's parameters packed at `layout`'s (offset, size) into a buffer of `total` bytes,
/// from `kernelParams` (one pointer per parameter) or from `extra`
/// (`CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`, `CU_LAUNCH_PARAM_END`).
///
/// # Safety
/// `params` and `extra` must be NULL or as cuda.h documents for `cuLaunchKernel`.
pub(crate) unsafe fn kernel_params(
    layout: &[(usize, usize)],
    total: usize,
    params: *mut *mut std::ffi::c_void,
    extra: *mut *mut std::ffi::c_void,
) -> Result<Vec<u8>, CUresult> {
    let mut buf = vec![0u8; total];
    match (params.is_null(), extra.is_null()) {
        (false, false) => Err(E::INVALID_VALUE),
        (true, true) if layout.is_empty() => Ok(buf),
        (true, true) => Err(E::INVALID_VALUE),
        (false, true) => {
            for (i, &(off, size)) in layout.iter().enumerate() {
                // SAFETY: `kernelParams` holds one pointer per parameter (the contract).
                let p = unsafe { params.add(i).read() };
                if p.is_null() {
                    return Err(E::INVALID_VALUE);
                }
                // SAFETY: each points at its parameter's `size` bytes (the contract); `buf`
                // holds `off + size` <= `total` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(p.cast::<u8>(), buf.as_mut_ptr().add(off), size)
                };
            }
            Ok(buf)
        }
        (true, false) => {
            /// The most (key, value) pairs read before `CU_LAUNCH_PARAM_END` must appear.
            const MAX_PAIRS: usize = 16;
            let (mut ptr, mut size) = (std::ptr::null_mut::<std::ffi::c_void>(), None);
            let mut ended = false;
            for i in 0..MAX_PAIRS {
                // SAFETY: `extra` is a list of (key, value) pointers ending in
                // `CU_LAUNCH_PARAM_END` (the contract); keys are read up to the end.
                let key = unsafe { extra.add(2 * i).read() } as usize;
                if key == 0 {
                    ended = true;
                    break;
                }
                // SAFETY: as above: a key other than the end has its value after it.
                let value = unsafe { extra.add(2 * i + 1).read() };
                match key {
                    1 => ptr = value,
                    // SAFETY: `CU_LAUNCH_PARAM_BUFFER_SIZE`'s value points at a `size_t`.
                    2 => size = Some(unsafe { get(value.cast::<usize>()) }?),
                    _ => return Err(E::INVALID_VALUE),
                }
            }
            let size = size.ok_or(E::INVALID_VALUE)?;
            if !ended || ptr.is_null() || size < total {
                return Err(E::INVALID_VALUE);
            }
            // SAFETY: the buffer holds `size` >= `total` bytes (the contract).
            unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), buf.as_mut_ptr(), total) };
            Ok(buf)
        }
    }
}
