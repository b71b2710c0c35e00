//! CUDA module images (docs/driver-interception.md, section 5).
//!
//! The client receives images as a bare pointer with no size: [`classify`] tells a fatbinc
//! wrapper, a fatbin, a cubin and PTX apart, and [`measure_len`] finds the length by reading
//! only what the image's own headers say belongs to it. [`entries`] reads a fatbin's entries;
//! the emulated device takes the PTX out of a fatbin with [`select_ptx`] (decompressing Zstd or
//! LZ4 entries), the SASS a device could run with [`select_cubin`], and what a cubin says about
//! its kernels (parameter layouts from `.nv.info`) and variables with [`cubin_info`]
//! (`cubin.rs`; the ELF is read by the `object` crate). Images of several translation units'
//! PTX mark each PTX entry with its unit (`units.rs`): an `-rdc` program's device-linked image
//! with its units' PTX ([`with_prelinked_ptx`]), the JIT linker's output ([`link_image`]), and
//! the fatbins taken out of host objects and static libraries (`__nv_relfatbin`,
//! `.nv_fatbin`: [`fatbins_in_object`]); [`select_units`] gives each unit's PTX for the device
//! to link.
//!
//! Pure and bounded: every length is capped, truncated or garbage input is an error, never a
//! panic.

#![forbid(unsafe_code)]

mod cubin;
mod names;
mod units;

use std::borrow::Cow;

pub use cubin::{cubin_info, cubin_sm, CubinInfo, CubinKernel, CubinParam, CubinVariable};
pub use names::kernel_names;
pub use units::{
    cubin_with_ptx, defines_device_runtime, fatbins_in_object, is_multi_unit, link_image,
    select_units, with_prelinked_ptx, MAX_UNITS, UNIT_TAG,
};

/// Reads bytes of an image at an offset from its start.
pub trait ByteSource {
    /// `len` bytes at `offset`, or None if they are not available.
    fn read(&self, offset: u64, len: usize) -> Option<&[u8]>;
}

impl ByteSource for [u8] {
    fn read(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.get(start..start.checked_add(len)?)
    }
}

pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
pub const ELF_MAGIC: u32 = 0x464C_457F;
/// Largest image accepted.
pub const MAX_IMAGE: u64 = 2 << 30;
/// Longest PTX text scanned for its terminating NUL.
pub const MAX_PTX: u64 = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    FatbincWrapper,
    Fatbin,
    Cubin,
    Ptx,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FatbinError {
    #[error("image is truncated or unreadable")]
    Truncated,
    #[error("image is larger than the limit")]
    TooLarge,
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("no PTX entry for a GPU of compute capability {0}")]
    NoBinaryForGpu(u32),
    #[error("PTX ISA {0}.{1} is newer than supported")]
    UnsupportedPtxVersion(u16, u16),
    #[error("entry cannot be decompressed")]
    Decompress,
    /// An input of the JIT linker that holds no PTX (a cubin, a fatbin of SASS only).
    #[error("{0} holds no PTX (the emulated GPU links and runs PTX only)")]
    NoPtx(String),
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// What the first four bytes say the image is.
pub fn classify(first4: &[u8]) -> ImageKind {
    match first4
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    {
        Some(WRAPPER_MAGIC) => ImageKind::FatbincWrapper,
        Some(FATBIN_MAGIC) => ImageKind::Fatbin,
        Some(ELF_MAGIC) => ImageKind::Cubin,
        _ => ImageKind::Ptx,
    }
}

/// The length of the image at the start of `src` (not a fatbinc wrapper: follow its pointer).
pub fn measure_len<S: ByteSource + ?Sized>(src: &S) -> Result<usize, FatbinError> {
    let head = src.read(0, 4).ok_or(FatbinError::Truncated)?;
    let len = match classify(head) {
        ImageKind::FatbincWrapper => {
            return Err(FatbinError::Malformed(
                "wrapper: measure the fatbin it points to",
            ))
        }
        ImageKind::Fatbin => {
            let h = src.read(0, 16).ok_or(FatbinError::Truncated)?;
            (u16_at(h, 6) as u64).saturating_add(u64_at(h, 8))
        }
        ImageKind::Cubin => cubin_len(src)?,
        ImageKind::Ptx => ptx_len(src)?,
    };
    if len > MAX_IMAGE {
        return Err(FatbinError::TooLarge);
    }
    // A header that claims more than the source holds is a truncated image, not a length.
    if len > 0 && src.read(len - 1, 1).is_none() {
        return Err(FatbinError::Truncated);
    }
    Ok(len as usize)
}

fn ptx_len<S: ByteSource + ?Sized>(src: &S) -> Result<u64, FatbinError> {
    const CHUNK: usize = 1;
    // Byte by byte: reading past the NUL could touch unmapped memory.
    let mut off = 0u64;
    while off < MAX_PTX {
        let b = src.read(off, CHUNK).ok_or(FatbinError::Truncated)?;
        if b[0] == 0 {
            return Ok(off + 1);
        }
        off += 1;
    }
    Err(FatbinError::TooLarge)
}

/// The end of the furthest section, program header or header table of an ELF64 image.
fn cubin_len<S: ByteSource + ?Sized>(src: &S) -> Result<u64, FatbinError> {
    let eh = src.read(0, 64).ok_or(FatbinError::Truncated)?;
    if eh[4] != 2 {
        return Err(FatbinError::Malformed("cubin: not ELF64"));
    }
    let (phoff, shoff) = (u64_at(eh, 32), u64_at(eh, 40));
    let (phentsize, phnum) = (u16_at(eh, 54) as u64, u16_at(eh, 56) as u64);
    let (shentsize, shnum) = (u16_at(eh, 58) as u64, u16_at(eh, 60) as u64);
    let mut end = 64u64
        .max(shoff.saturating_add(shnum * shentsize))
        .max(phoff.saturating_add(phnum * phentsize));
    if end > MAX_IMAGE {
        return Err(FatbinError::TooLarge);
    }
    for i in 0..shnum {
        let sh = src
            .read(shoff.saturating_add(i * shentsize), 64)
            .ok_or(FatbinError::Truncated)?;
        let (kind, off, size) = (u32_at(sh, 4), u64_at(sh, 24), u64_at(sh, 32));
        if kind != 8 {
            // not SHT_NOBITS
            end = end.max(off.saturating_add(size));
        }
    }
    for i in 0..phnum {
        let ph = src
            .read(phoff.saturating_add(i * phentsize), 56)
            .ok_or(FatbinError::Truncated)?;
        end = end.max(u64_at(ph, 8).saturating_add(u64_at(ph, 32)));
    }
    if end > MAX_IMAGE {
        return Err(FatbinError::TooLarge);
    }
    Ok(end)
}

/// One entry of a fatbin.
#[derive(Clone, Debug)]
pub struct Entry<'a> {
    /// 1 = PTX, 2 = ELF cubin.
    pub kind: u16,
    pub sm: u32,
    /// (major, minor): the PTX ISA version for PTX entries.
    pub version: (u16, u16),
    pub flags: u64,
    pub decompressed_size: u64,
    pub payload: &'a [u8],
    /// A PTX entry that is the PTX of the image's cubin ([`cubin_with_ptx`]: gpufuse's NVRTC
    /// interposer), its `sm` the cubin's: it runs where that cubin would, nowhere else.
    pub cubin_twin: bool,
}

const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

impl Entry<'_> {
    pub fn is_ptx(&self) -> bool {
        self.kind == 1
    }

    /// Whether a GPU of compute capability `sm` (e.g. 100) can load this entry: PTX for `sm`
    /// or below; SASS, and the PTX twin of a cubin, of the same major version and a minor not
    /// above it.
    pub fn runs_on(&self, sm: u32) -> bool {
        if self.is_ptx() && !self.cubin_twin {
            self.sm <= sm
        } else {
            self.sm / 10 == sm / 10 && self.sm <= sm
        }
    }

    /// The payload, decompressed, with trailing NUL padding removed for PTX.
    pub fn contents(&self) -> Result<Cow<'_, [u8]>, FatbinError> {
        let data: Cow<[u8]> = if self.flags & FLAG_ZSTD != 0 {
            let cap = self.decompressed_size.min(MAX_IMAGE) as usize;
            Cow::Owned(
                zstd::bulk::decompress(self.payload, cap.max(1024))
                    .map_err(|_| FatbinError::Decompress)?,
            )
        } else if self.flags & FLAG_LZ4 != 0 {
            let cap = self.decompressed_size.min(MAX_IMAGE) as usize;
            Cow::Owned(
                lz4_flex::block::decompress(self.payload, cap)
                    .map_err(|_| FatbinError::Decompress)?,
            )
        } else {
            Cow::Borrowed(self.payload)
        };
        if self.is_ptx() {
            let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            return Ok(match data {
                Cow::Borrowed(b) => Cow::Borrowed(&b[..end]),
                Cow::Owned(mut v) => {
                    v.truncate(end);
                    Cow::Owned(v)
                }
            });
        }
        Ok(data)
    }
}

/// The entries of a complete fatbin image.
pub fn entries(image: &[u8]) -> Result<Vec<Entry<'_>>, FatbinError> {
    if image.len() < 16 || classify(image) != ImageKind::Fatbin {
        return Err(FatbinError::Malformed("fatbin header"));
    }
    let header = u16_at(image, 6) as usize;
    let total = header
        .checked_add(u64_at(image, 8) as usize)
        .ok_or(FatbinError::TooLarge)?;
    let body = image.get(header..total).ok_or(FatbinError::Truncated)?;
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + 64 <= body.len() {
        let e = &body[off..];
        let (kind, hsize, psize) = (u16_at(e, 0), u32_at(e, 4) as usize, u64_at(e, 8) as usize);
        if hsize < 64 || !(1..=2).contains(&kind) {
            return Err(FatbinError::Malformed("fatbin entry"));
        }
        let start = hsize;
        let end = start.checked_add(psize).ok_or(FatbinError::TooLarge)?;
        let payload = e.get(start..end).ok_or(FatbinError::Truncated)?;
        let compressed = u32_at(e, 16) as usize;
        let flags = u64_at(e, 40);
        let payload =
            if flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 && compressed > 0 && compressed <= payload.len()
            {
                &payload[..compressed]
            } else {
                payload
            };
        out.push(Entry {
            kind,
            sm: u32_at(e, 28),
            version: (u16_at(e, 26), u16_at(e, 24)),
            flags,
            decompressed_size: if hsize >= 64 { u64_at(e, 56) } else { 0 },
            payload,
            cubin_twin: kind == 1 && u64_at(e, 48) == units::TWIN_TAG,
        });
        off += end;
    }
    Ok(out)
}

/// Each entry of a complete fatbin as its raw bytes (header and padded payload) and whether it
/// is PTX.
fn raw_entries(image: &[u8]) -> Result<Vec<(bool, &[u8])>, FatbinError> {
    if image.len() < 16 || classify(image) != ImageKind::Fatbin {
        return Err(FatbinError::Malformed("fatbin header"));
    }
    let header = u16_at(image, 6) as usize;
    let total = header
        .checked_add(u64_at(image, 8) as usize)
        .ok_or(FatbinError::TooLarge)?;
    let body = image.get(header..total).ok_or(FatbinError::Truncated)?;
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + 64 <= body.len() {
        let e = &body[off..];
        let (kind, hsize, psize) = (u16_at(e, 0), u32_at(e, 4) as usize, u64_at(e, 8) as usize);
        if hsize < 64 || !(1..=2).contains(&kind) {
            return Err(FatbinError::Malformed("fatbin entry"));
        }
        let end = hsize.checked_add(psize).ok_or(FatbinError::TooLarge)?;
        out.push((kind == 1, e.get(..end).ok_or(FatbinError::Truncated)?));
        off += end;
    }
    Ok(out)
}

/// The PTX text to run on a device of compute capability `max_sm` (e.g. 80): the PTX entry
/// with the highest arch not above it. A PTX image is returned as it is.
pub fn select_ptx(image: &[u8], max_sm: u32) -> Result<String, FatbinError> {
    let text = match classify(image) {
        ImageKind::Ptx => {
            let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
            image[..end].to_vec()
        }
        ImageKind::Fatbin => {
            let entries = entries(image)?;
            let best = entries
                .iter()
                .filter(|e| e.is_ptx() && e.runs_on(max_sm))
                .max_by_key(|e| e.sm)
                .ok_or(FatbinError::NoBinaryForGpu(max_sm))?;
            best.contents()?.into_owned()
        }
        ImageKind::Cubin | ImageKind::FatbincWrapper => {
            return Err(FatbinError::NoBinaryForGpu(max_sm))
        }
    };
    String::from_utf8(text).map_err(|_| FatbinError::Malformed("PTX is not text"))
}

/// Whether an image holds code a GPU of compute capability `sm` (e.g. 100) can load, by the
/// rules [`select_ptx`] and [`select_cubin`] apply, from the entries' headers alone (nothing
/// is decompressed): PTX text, PTX for `sm` or below, or SASS (or the PTX twin of a cubin,
/// [`Entry::runs_on`]) of the same major version and a minor not above it. What a load would refuse with CUDA_ERROR_NO_BINARY_FOR_GPU, known
/// before the image is sent (lazy loading sends it at its first use).
pub fn has_code_for(image: &[u8], sm: u32) -> bool {
    let same_family = |c: u32| c / 10 == sm / 10 && c <= sm;
    match classify(image) {
        ImageKind::Ptx => true,
        ImageKind::Cubin => cubin_sm(image).is_some_and(same_family),
        ImageKind::FatbincWrapper => false,
        ImageKind::Fatbin => {
            entries(image).is_ok_and(|entries| entries.iter().any(|e| e.runs_on(sm)))
        }
    }
}

/// The SASS a GPU of compute capability `sm` (e.g. 100) could run from a fatbin: the cubin
/// entry of the same major version with the highest minor not above the GPU's, as `(sm,
/// cubin)`; None when there is none.
pub fn select_cubin(image: &[u8], sm: u32) -> Result<Option<(u32, Vec<u8>)>, FatbinError> {
    match classify(image) {
        ImageKind::Fatbin => {}
        ImageKind::Cubin => {
            return Ok(cubin_sm(image)
                .filter(|&c| c / 10 == sm / 10 && c <= sm)
                .map(|c| (c, image.to_vec())))
        }
        _ => return Ok(None),
    }
    let entries = entries(image)?;
    let Some(best) = entries
        .iter()
        .filter(|e| !e.is_ptx() && e.sm / 10 == sm / 10 && e.sm <= sm)
        .max_by_key(|e| e.sm)
    else {
        return Ok(None);
    };
    Ok(Some((best.sm, best.contents()?.into_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Found by the `fatbin` fuzz target: a 36-byte fatbin whose header claims 32,395 bytes
    /// was measured at 32,395, and a caller slicing that much panicked.
    #[test]
    fn a_header_claiming_more_than_the_source_holds_is_truncated() {
        let mut image = [0xffu8; 36];
        image[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image[6..8].copy_from_slice(&16u16.to_le_bytes());
        image[8..16].copy_from_slice(&32379u64.to_le_bytes());
        assert!(matches!(
            measure_len(&image[..]),
            Err(FatbinError::Truncated)
        ));
        image[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            measure_len(&image[..]),
            Err(FatbinError::TooLarge)
        ));
        image[8..16].copy_from_slice(&20u64.to_le_bytes());
        assert_eq!(measure_len(&image[..]).unwrap(), 36);
    }

    #[test]
    fn ptx_is_measured_to_its_nul() {
        let img = b".version 8.0\n\0garbage";
        assert_eq!(measure_len(&img[..]), Ok(14));
        assert_eq!(measure_len(&b".version"[..]), Err(FatbinError::Truncated));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = measure_len(&bytes[..]);
            let _ = entries(&bytes);
            let _ = select_ptx(&bytes, 80);
            let _ = select_cubin(&bytes, 80);
        }

        #[test]
        fn garbage_fatbins_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 16..512)) {
            bytes[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
            let _ = measure_len(&bytes[..]);
            let _ = entries(&bytes);
            let _ = select_ptx(&bytes, 80);
            let _ = select_cubin(&bytes, 80);
        }
    }
}
