//! Module images arrive as a bare pointer: find out what they are and how long they are, and
//! check their headers (the load's error, since the worker may see an image only at its first
//! use).

use std::borrow::Cow;
use std::ffi::c_void;

use crate::ffi::{read_word, RawImage};
use crate::status::{CUresult, INVALID_IMAGE, INVALID_VALUE};

/// Most translation units a program's device link may name (a bound on a list read from the
/// application's memory).
const MAX_PRELINKED: usize = 4096;

/// The bytes of the image at `image`: a fatbin (a fatbinc wrapper is followed to its fatbin),
/// a cubin or NUL-terminated PTX text.
///
/// A version-2 fatbinc wrapper is what a program built with relocatable device code
/// (`nvcc -rdc=true`) registers: its fatbin is the device-linked one, SASS only, and its
/// fourth field a NULL-terminated list of the fatbins it was linked from, which keep their
/// PTX. Their PTX is appended to the image ([`gpufuse_fatbin::with_prelinked_ptx`]), as
/// NVIDIA's driver JIT-links it for a GPU the linked SASS does not fit.
///
/// # Safety
/// `image` is NULL or a module image as CUDA's contract describes it (a fatbinc wrapper, a
/// fatbin, a cubin or NUL-terminated PTX), whose bytes and the structures it points to stay
/// valid and unchanged for all of `'a` (an argument of the current call, used during it).
pub unsafe fn image_bytes<'a>(image: *const c_void) -> Result<Cow<'a, [u8]>, CUresult> {
    if image.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut ptr = image.cast::<u8>();
    // SAFETY: every image format is at least 4 bytes long (this function's contract).
    let head = unsafe { crate::ffi::host_bytes(image, 4) }?;
    let mut prelinked = 0;
    if gpufuse_fatbin::classify(head) == gpufuse_fatbin::ImageKind::FatbincWrapper {
        // SAFETY: a fatbinc wrapper: magic and version, then the fatbin's address (and, in
        // version 2, the list of prelinked fatbins), each a word.
        let version = unsafe { read_word(image as u64) }? >> 32;
        // SAFETY: as above.
        let fatbin = unsafe { read_word(image as u64 + 8) }?;
        if fatbin == 0 {
            return Err(INVALID_IMAGE);
        }
        if version == 2 {
            // SAFETY: a version-2 wrapper's third word.
            prelinked = unsafe { read_word(image as u64 + 16) }?;
        }
        ptr = fatbin as usize as *const u8;
    }
    // SAFETY: the image this function's contract vouches for.
    let len =
        gpufuse_fatbin::measure_len(&unsafe { RawImage::new(ptr) }).map_err(|_| INVALID_IMAGE)?;
    // SAFETY: the image's own headers say it is `len` bytes long.
    let bytes = unsafe { crate::ffi::host_bytes(ptr.cast(), len) }?;
    // A fatbin's entry headers are walked here (cheap: nothing is decompressed), so a
    // malformed one fails its load even when the image reaches the worker only at its first
    // use (lazy loading); a cubin's ELF headers were read to measure it.
    if gpufuse_fatbin::classify(bytes) == gpufuse_fatbin::ImageKind::Fatbin {
        gpufuse_fatbin::entries(bytes).map_err(|_| INVALID_IMAGE)?;
    }
    if prelinked == 0 {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut units = Vec::new();
    for i in 0..MAX_PRELINKED {
        // SAFETY: the NULL-terminated list of the wrapper's third word, read up to its NULL.
        let p = unsafe { read_word(prelinked + 8 * i as u64) }?;
        if p == 0 {
            break;
        }
        let unit = p as usize as *const u8;
        // SAFETY: a prelinked fatbin the wrapper names (this function's contract).
        let n = gpufuse_fatbin::measure_len(&unsafe { RawImage::new(unit) })
            .map_err(|_| INVALID_IMAGE)?;
        // SAFETY: a prelinked fatbin, `n` bytes long by its own headers.
        units.push(unsafe { crate::ffi::host_bytes(unit.cast(), n) }?);
    }
    gpufuse_fatbin::with_prelinked_ptx(bytes, &units)
        .map(Cow::Owned)
        .map_err(|_| INVALID_IMAGE)
}
