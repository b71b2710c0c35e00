//! Module images arrive as a bare pointer: find out what they are and how long they are.

use std::ffi::c_void;

use crate::ffi::{read_word, RawImage};
use crate::status::{CUresult, INVALID_IMAGE, INVALID_VALUE};

/// The bytes of the image at `image`: a fatbin (a fatbinc wrapper is followed to its fatbin),
/// a cubin or NUL-terminated PTX text.
pub fn image_bytes<'a>(image: *const c_void) -> Result<&'a [u8], CUresult> {
    if image.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut ptr = image.cast::<u8>();
    let head = crate::ffi::host_bytes(image, 4)?;
    if gpufuse_fatbin::classify(head) == gpufuse_fatbin::ImageKind::FatbincWrapper {
        let fatbin = read_word(image as u64 + 8)?;
        if fatbin == 0 {
            return Err(INVALID_IMAGE);
        }
        ptr = fatbin as usize as *const u8;
    }
    let len = gpufuse_fatbin::measure_len(&RawImage(ptr)).map_err(|_| INVALID_IMAGE)?;
    crate::ffi::host_bytes(ptr.cast(), len)
}
