//! The only code that touches application memory through raw pointers.
//!
//! Safety model: every exported function receives pointers from C, and the CUDA API contract
//! makes the caller responsible for their validity (an output pointer points to writable
//! storage of the right type, an input buffer is readable for the stated length). These
//! helpers check what can be checked (NULL) and perform the access; nothing else in the shim
//! dereferences an application pointer.
//!
//! Every helper is an `unsafe fn` with its `# Safety` contract: the caller vouches for the
//! pointer (an argument of the current exported call, valid as the CUDA API contract says) and,
//! for the ones that hand out a reference (`host_bytes`, `host_bytes_mut`, `cstr`), for its
//! lifetime. The exported functions are the `unsafe` boundary: each says at its `unsafe`
//! block why the pointers it passes here are the application's own arguments.

use std::ffi::{c_char, c_void, CStr};

use crate::status::{CUresult, INVALID_VALUE};

/// Writes `v` to a required output.
///
/// # Safety
/// `p` is NULL or points to writable storage for a `T` (an output argument of the current
/// call, as the CUDA API contract gives).
pub unsafe fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL, and the API contract says it points to writable storage for a T.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `v` to an optional output (skipped when NULL).
///
/// # Safety
/// As [`out`].
pub unsafe fn out_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: as in `out`.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads a required input.
///
/// # Safety
/// `p` is NULL or points to a readable `T` (an input argument of the current call).
pub unsafe fn read<T: Copy>(p: *const T) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL, and the API contract says it points to a readable T.
    Ok(unsafe { p.read_unaligned() })
}

/// The `i`-th element of an array the application passed.
///
/// # Safety
/// `p` is NULL or an array argument with at least `i + 1` readable elements.
pub unsafe fn read_at<T: Copy>(p: *const T, i: usize) -> Result<T, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the API contract says the array has at least `i + 1` elements.
    Ok(unsafe { p.add(i).read_unaligned() })
}

/// Writes the `i`-th element of an output array.
///
/// # Safety
/// `p` is NULL or an output array argument with at least `i + 1` writable elements.
pub unsafe fn write_at<T>(p: *mut T, i: usize, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the API contract says the array has at least `i + 1` writable elements.
    unsafe { p.add(i).write_unaligned(v) };
    Ok(())
}

/// A host buffer the application passed for reading.
///
/// # Safety
/// `p` is NULL or readable for `len` bytes for all of `'a`, and not written meanwhile (a
/// buffer argument of the current call, used only during the call, as the API contract gives).
pub unsafe fn host_bytes<'a>(p: *const c_void, len: usize) -> Result<&'a [u8], CUresult> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller's contract: readable for `len` bytes for `'a`.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// A host buffer the application passed for writing.
///
/// # Safety
/// `p` is NULL or writable for `len` bytes for all of `'a`, and nothing else reads or writes
/// them meanwhile (a destination argument of the current call, used only during the call).
pub unsafe fn host_bytes_mut<'a>(p: *mut c_void, len: usize) -> Result<&'a mut [u8], CUresult> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller's contract: writable and unaliased for `len` bytes for `'a`.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// A NUL-terminated string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that stays valid and unchanged for all of `'a` (a
/// string argument of the current call, used only during the call).
pub unsafe fn cstr<'a>(p: *const c_char) -> Result<&'a str, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller's contract: a NUL-terminated string valid for `'a`.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| INVALID_VALUE)
}

/// Copies `s` into a caller buffer of `cap` bytes, truncated and NUL-terminated.
///
/// # Safety
/// `dst` is NULL or writable for `cap` bytes (a string output argument of the current call).
pub unsafe fn write_cstr(dst: *mut c_char, cap: usize, s: &str) -> Result<(), CUresult> {
    if dst.is_null() || cap == 0 {
        return Err(INVALID_VALUE);
    }
    let n = s.len().min(cap - 1);
    // SAFETY: the API contract says `dst` is writable for `cap` bytes; we write n + 1 <= cap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst.cast::<u8>(), n);
        *dst.add(n) = 0;
    }
    Ok(())
}

/// Reads a pointer-sized word at `addr` (used to follow a fatbinc wrapper to its fatbin).
///
/// # Safety
/// `addr` is 0 or readable for 8 bytes: a field of a structure the application passed.
pub unsafe fn read_word(addr: u64) -> Result<u64, CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe { read(addr as usize as *const u64) }
}

/// A byte source over application memory starting at an image pointer. Reads are bounded by
/// the caller-supplied length; the image formats make the caller promise the bytes exist.
pub struct RawImage(*const u8);

impl RawImage {
    /// # Safety
    /// `image` is NULL or the start of a module image that stays valid and unchanged while
    /// this source is read: every range its own headers say belong to it is readable.
    pub unsafe fn new(image: *const u8) -> Self {
        Self(image)
    }
}

impl gpufuse_fatbin::ByteSource for RawImage {
    fn read(&self, offset: u64, len: usize) -> Option<&[u8]> {
        if self.0.is_null() {
            return None;
        }
        let off = usize::try_from(offset).ok()?;
        // SAFETY: the application passed a pointer to a module image; the measuring code only
        // asks for ranges that the image's own headers say are part of it.
        Some(unsafe { std::slice::from_raw_parts(self.0.add(off), len) })
    }
}
