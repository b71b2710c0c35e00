//! Module images arrive as a bare pointer: find out what they are and how long they are.

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
pub fn image_bytes<'a>(image: *const c_void) -> Result<Cow<'a, [u8]>, CUresult> {
    if image.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut ptr = image.cast::<u8>();
    let head = crate::ffi::host_bytes(image, 4)?;
    let mut prelinked = 0;
    if gpufuse_fatbin::classify(head) == gpufuse_fatbin::ImageKind::FatbincWrapper {
        let version = read_word(image as u64)? >> 32;
        let fatbin = read_word(image as u64 + 8)?;
        if fatbin == 0 {
            return Err(INVALID_IMAGE);
        }
        if version == 2 {
            prelinked = read_word(image as u64 + 16)?;
        }
        ptr = fatbin as usize as *const u8;
    }
    let len = gpufuse_fatbin::measure_len(&RawImage(ptr)).map_err(|_| INVALID_IMAGE)?;
    let bytes = crate::ffi::host_bytes(ptr.cast(), len)?;
    if prelinked == 0 {
        return Ok(Cow::Borrowed(bytes));
    }
    let mut units = Vec::new();
    for i in 0..MAX_PRELINKED {
        let p = read_word(prelinked + 8 * i as u64)?;
        if p == 0 {
            break;
        }
        let unit = p as usize as *const u8;
        let n = gpufuse_fatbin::measure_len(&RawImage(unit)).map_err(|_| INVALID_IMAGE)?;
        units.push(crate::ffi::host_bytes(unit.cast(), n)?);
    }
    match gpufuse_fatbin::with_prelinked_ptx(bytes, &units) {
        Ok(v) => Ok(Cow::Owned(v)),
        // The device-linked image alone: a GPU whose SASS it holds runs it; any other loads
        // it lazily and its launches fail with CUDA_ERROR_NO_BINARY_FOR_GPU, as NVIDIA's
        // driver fails them without matching SASS. The log says why.
        Err(e @ gpufuse_fatbin::FatbinError::NeedsLinking(_)) => {
            if std::env::var_os("GPUFUSE_LOG").is_some() {
                eprintln!("gpufuse: {e}");
            }
            Ok(Cow::Borrowed(bytes))
        }
        Err(_) => Err(INVALID_IMAGE),
    }
}
