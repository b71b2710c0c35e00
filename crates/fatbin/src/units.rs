//! Images that hold several translation units' PTX, to be linked when they load.
//!
//! A program built with relocatable device code registers a device-linked image (SASS only)
//! and the units it was linked from; the driver's JIT linker (`cuLinkComplete`) hands back one
//! image made of what the application added. Both become one fatbin here, whose PTX entries
//! carry the number of the unit they belong to; the emulated device takes each unit's PTX
//! ([`select_units`]) and links them (`gpufuse_ptx::Module::link`).
//!
//! The unit number lives in the entry header's eight bytes at offset 48, which NVIDIA's
//! fatbins leave zero: [`UNIT_TAG`] in the high half, the unit number in the low half. An
//! entry without the tag belongs to no unit: a fatbin whose PTX entries have none is one unit
//! (its entries are the same code for different GPUs).

use std::collections::BTreeMap;

use crate::{classify, entries, raw_entries, u16_at, FatbinError, ImageKind, FATBIN_MAGIC};

/// The high 32 bits of a tagged entry's unit field ("gpfu").
pub const UNIT_TAG: u64 = 0x6770_6675 << 32;
/// The unit field of the PTX twin of a cubin ([`cubin_with_ptx`]): "gpfc", no unit.
pub(crate) const TWIN_TAG: u64 = 0x6770_6663 << 32;
/// Offset of the unit field in an entry header.
const UNIT_FIELD: usize = 48;
/// Most units one image may hold.
pub const MAX_UNITS: usize = 4096;

/// Whether a raw entry is the PTX twin of a cubin ([`cubin_with_ptx`]).
fn is_twin(header: &[u8]) -> bool {
    header
        .get(UNIT_FIELD..UNIT_FIELD + 8)
        .is_some_and(|f| u64::from_le_bytes(f.try_into().expect("8 bytes")) == TWIN_TAG)
}

fn unit_of(header: &[u8]) -> Option<u32> {
    let v = u64::from_le_bytes(header.get(UNIT_FIELD..UNIT_FIELD + 8)?.try_into().ok()?);
    (v >> 32 == UNIT_TAG >> 32).then_some(v as u32)
}

/// A fatbin of `entries` (raw: header and payload) after `version`.
fn assemble(version: u16, entries: &[Vec<u8>]) -> Vec<u8> {
    let body: usize = entries.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(16 + body);
    out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(e);
    }
    out
}

/// `raw` (an entry's header and payload) marked as unit `unit`'s.
fn tagged(raw: &[u8], unit: u32) -> Vec<u8> {
    let mut e = raw.to_vec();
    e[UNIT_FIELD..UNIT_FIELD + 8].copy_from_slice(&(UNIT_TAG | unit as u64).to_le_bytes());
    e
}

/// `(major, minor)` of `.version` and NN of `.target sm_NN` in PTX text (0 where missing).
fn ptx_header(text: &[u8]) -> ((u16, u16), u32) {
    let head = String::from_utf8_lossy(&text[..text.len().min(4096)]);
    let mut version = (0, 0);
    let mut sm = 0;
    for line in head.lines() {
        let mut w = line.split_whitespace();
        match w.next() {
            Some(".version") => {
                if let Some((a, b)) = w.next().and_then(|v| v.split_once('.')) {
                    version = (a.parse().unwrap_or(0), b.parse().unwrap_or(0));
                }
            }
            Some(".target") => {
                sm = w
                    .next()
                    .map(|t| t.trim_end_matches(','))
                    .and_then(|t| t.strip_prefix("sm_"))
                    .map(|t| t.trim_end_matches(['a', 'f']))
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
            }
            _ => {}
        }
        if sm != 0 && version != (0, 0) {
            break;
        }
    }
    (version, sm)
}

/// An uncompressed PTX entry of unit `unit` holding `text` (without a NUL).
fn ptx_entry(text: &[u8], unit: u32) -> Vec<u8> {
    let ((major, minor), sm) = ptx_header(text);
    let mut payload = text.to_vec();
    payload.push(0);
    payload.resize(payload.len().div_ceil(8) * 8, 0);
    let mut e = vec![0u8; 64];
    e[0..2].copy_from_slice(&1u16.to_le_bytes());
    e[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
    e[4..8].copy_from_slice(&64u32.to_le_bytes());
    e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    e[20..24].copy_from_slice(&64u32.to_le_bytes());
    e[24..26].copy_from_slice(&minor.to_le_bytes());
    e[26..28].copy_from_slice(&major.to_le_bytes());
    e[28..32].copy_from_slice(&sm.to_le_bytes());
    // 64-bit, Linux (as nvcc sets them).
    e[40..48].copy_from_slice(&0x11u64.to_le_bytes());
    e[UNIT_FIELD..UNIT_FIELD + 8].copy_from_slice(&(UNIT_TAG | unit as u64).to_le_bytes());
    e.extend_from_slice(&payload);
    e
}

/// The fatbin of a program built with relocatable device code (`nvcc -rdc=true`): `linked` is
/// the device-linked fatbin that the host code registers (SASS only: nvlink emits no PTX),
/// `prelinked` the fatbins of the translation units it was linked from, which keep their PTX.
/// The result holds `linked`'s entries and then the PTX entries of `prelinked`, each marked
/// with its unit, so a GPU without matching SASS (the emulated one, a newer one) finds every
/// unit's PTX in it and links them.
///
/// nvlink's output holds no PTX; should `linked` hold some, the units' PTX replaces it (it is
/// what the units' PTX would link to).
pub fn with_prelinked_ptx(linked: &[u8], prelinked: &[&[u8]]) -> Result<Vec<u8>, FatbinError> {
    let mut units: Vec<Vec<u8>> = Vec::new();
    let mut unit = 0u32;
    for fatbin in prelinked.iter().take(MAX_UNITS) {
        let ptx: Vec<(bool, &[u8])> = raw_entries(fatbin)?.into_iter().filter(|e| e.0).collect();
        if ptx.is_empty() {
            continue;
        }
        units.extend(ptx.iter().map(|e| tagged(e.1, unit)));
        unit += 1;
    }
    let mut out: Vec<Vec<u8>> = raw_entries(linked)?
        .into_iter()
        .filter(|e| unit == 0 || !e.0)
        .map(|e| e.1.to_vec())
        .collect();
    out.extend(units);
    Ok(assemble(u16_at(linked, 4), &out))
}

/// A fatbin of a cubin and the PTX it was compiled from, as `nvcc -fatbin -arch=sm_NN` makes
/// one: the cubin for a GPU of its architecture, the PTX for any other (the emulated GPU, which
/// runs no SASS). NVRTC gives a program's cubin and its PTX apart (`nvrtcGetCUBIN`,
/// `nvrtcGetPTX`); gpufuse's NVRTC interposer (`crates/nvrtc-shim`) hands the program this
/// image as its "cubin", which every module loader takes as well. Neither entry carries a unit.
/// The PTX entry is marked as the cubin's twin (its unit field [`TWIN_TAG`], its arch the
/// cubin's): it runs where the cubin would (the same major version, a minor not above the
/// GPU's; [`crate::Entry::runs_on`]) and nowhere else, so a cubin for another GPU fails to load
/// with CUDA_ERROR_NO_BINARY_FOR_GPU as it does on NVIDIA's driver, PTX or not.
/// `ptx` may end with its NUL. Not a cubin, or PTX that is empty: [`FatbinError::NoPtx`] or
/// [`FatbinError::Malformed`].
pub fn cubin_with_ptx(cubin: &[u8], ptx: &[u8]) -> Result<Vec<u8>, FatbinError> {
    if cubin.len() < 4 || classify(cubin) != ImageKind::Cubin {
        return Err(FatbinError::Malformed("not a cubin"));
    }
    let sm = crate::cubin_sm(cubin).ok_or(FatbinError::Malformed("cubin: no architecture"))?;
    let end = ptx.iter().position(|&b| b == 0).unwrap_or(ptx.len());
    if ptx[..end].iter().all(u8::is_ascii_whitespace) || classify(ptx) != ImageKind::Ptx {
        return Err(FatbinError::NoPtx("the program's PTX".to_string()));
    }
    // The ELF entry as nvcc writes it: kind 2, version 1.8, the architecture, 64-bit Linux.
    let mut payload = cubin.to_vec();
    payload.resize(payload.len().div_ceil(8) * 8, 0);
    let mut elf = vec![0u8; 64];
    elf[0..2].copy_from_slice(&2u16.to_le_bytes());
    elf[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
    elf[4..8].copy_from_slice(&64u32.to_le_bytes());
    elf[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    elf[24..26].copy_from_slice(&8u16.to_le_bytes());
    elf[26..28].copy_from_slice(&1u16.to_le_bytes());
    elf[28..32].copy_from_slice(&sm.to_le_bytes());
    elf[40..48].copy_from_slice(&0x11u64.to_le_bytes());
    elf.extend_from_slice(&payload);
    let mut text = ptx_entry(&ptx[..end], 0);
    text[28..32].copy_from_slice(&sm.to_le_bytes());
    text[UNIT_FIELD..UNIT_FIELD + 8].copy_from_slice(&TWIN_TAG.to_le_bytes());
    Ok(assemble(1, &[elf, text]))
}

/// The image `cuLinkComplete` gives back: each input (PTX text, with or without its NUL, or a
/// fatbin; a fatbinc wrapper's fatbin must be passed itself) is one unit, a fatbin's PTX
/// entries its unit's code for different GPUs. A fatbin with no PTX (the PTX twin of a cubin,
/// [`cubin_with_ptx`], does not count), a cubin (SASS, which the emulated GPU cannot run) or an
/// empty input is [`FatbinError::NoPtx`] naming the input.
pub fn link_image(inputs: &[(&str, &[u8])]) -> Result<Vec<u8>, FatbinError> {
    if inputs.len() > MAX_UNITS {
        return Err(FatbinError::TooLarge);
    }
    let mut out = Vec::new();
    for (unit, (name, bytes)) in inputs.iter().enumerate() {
        let unit = unit as u32;
        match classify(bytes) {
            ImageKind::Fatbin => {
                // The PTX twin of a cubin (`cubin_with_ptx`) stands in for the cubin only where
                // it would run: not a linker input, as the cubin itself is not.
                let ptx: Vec<_> = raw_entries(bytes)?
                    .into_iter()
                    .filter(|e| e.0 && !is_twin(e.1))
                    .collect();
                if ptx.is_empty() {
                    return Err(FatbinError::NoPtx(name.to_string()));
                }
                out.extend(ptx.iter().map(|e| tagged(e.1, unit)));
            }
            ImageKind::Ptx => {
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                if bytes[..end].iter().all(u8::is_ascii_whitespace) {
                    return Err(FatbinError::NoPtx(name.to_string()));
                }
                out.push(ptx_entry(&bytes[..end], unit));
            }
            ImageKind::Cubin | ImageKind::FatbincWrapper => {
                return Err(FatbinError::NoPtx(name.to_string()))
            }
        }
    }
    Ok(assemble(1, &out))
}

/// The PTX of each unit of `image` to run on a device of compute capability `max_sm`: one text
/// for PTX, for a fatbin whose PTX entries carry no unit, or a linked image of one unit (see
/// [`crate::select_ptx`]); for one of several units, each unit's PTX entry with the highest
/// arch not above `max_sm`, in unit order, leaving out the unit of NVIDIA's device runtime
/// (libcudadevrt, [`defines_device_runtime`]): the emulated GPU provides it.
pub fn select_units(image: &[u8], max_sm: u32) -> Result<Vec<String>, FatbinError> {
    if classify(image) != ImageKind::Fatbin {
        return crate::select_ptx(image, max_sm).map(|t| vec![t]);
    }
    let raw = raw_entries(image)?;
    let parsed = entries(image)?;
    let mut units: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    let mut untagged = false;
    for (i, (is_ptx, bytes)) in raw.iter().enumerate() {
        if !is_ptx {
            continue;
        }
        match unit_of(bytes) {
            Some(u) => units.entry(u).or_default().push(i),
            None => untagged = true,
        }
    }
    if units.is_empty() || (units.len() == 1 && !untagged) {
        return crate::select_ptx(image, max_sm).map(|t| vec![t]);
    }
    if untagged {
        return Err(FatbinError::Malformed(
            "fatbin: PTX entries with and without a unit",
        ));
    }
    let mut out = Vec::with_capacity(units.len());
    for list in units.values() {
        let best = list
            .iter()
            .map(|&i| &parsed[i])
            .filter(|e| e.runs_on(max_sm))
            .max_by_key(|e| e.sm);
        let Some(best) = best else {
            // The device runtime of libcudadevrt (CUDA 13 ships its PTX for the newest GPU
            // only) is left out: the emulated GPU provides it (`gpufuse_ptx`'s `devrt.rs`).
            if let Some(&i) = list.first() {
                if defines_device_runtime(&parsed[i].contents()?) {
                    continue;
                }
            }
            return Err(FatbinError::NoBinaryForGpu(max_sm));
        };
        let text = best.contents()?.into_owned();
        // Whatever its arch, libcudadevrt's unit gives way to the VM's own device runtime.
        if defines_device_runtime(&text) {
            continue;
        }
        out.push(String::from_utf8(text).map_err(|_| FatbinError::Malformed("PTX is not text"))?);
    }
    // Empty only for an image of the device runtime alone (`cuLinkAddFile` of
    // libcudadevrt.a), which holds nothing to run.
    Ok(out)
}

/// Whether PTX text is NVIDIA's device runtime (libcudadevrt's unit, linked into programs
/// that use dynamic parallelism): it defines `cudaLaunchDeviceV2` or, as CUDA 12 and later
/// name it, `__cudaCDP2LaunchDeviceV2`. An application's unit never does (nvlink would find
/// the symbol defined twice).
pub fn defines_device_runtime(ptx: &[u8]) -> bool {
    String::from_utf8_lossy(ptx).lines().any(|l| {
        let l = l.trim_start();
        (l.starts_with(".visible .func") || l.starts_with(".weak .func"))
            && (l.contains(" __cudaCDP2LaunchDeviceV2(") || l.contains(" cudaLaunchDeviceV2("))
    })
}

/// Whether `image` holds PTX of more than one unit (loading it links them).
pub fn is_multi_unit(image: &[u8]) -> bool {
    classify(image) == ImageKind::Fatbin
        && raw_entries(image).is_ok_and(|raw| {
            let mut seen = None;
            raw.iter()
                .filter(|e| e.0)
                .filter_map(|e| unit_of(e.1))
                .any(|u| *seen.get_or_insert(u) != u)
        })
}

/// The fatbins in a host object file's `__nv_relfatbin` section (what `nvcc -rdc=true -c`
/// makes; `.nv_fatbin` without `-rdc`),
/// or in each object of a static library (`nvcc -lib`): `(member, fatbin)`, the member being
/// the library member's name or empty for an object file.
pub fn fatbins_in_object(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, FatbinError> {
    use object::read::archive::ArchiveFile;
    let mut out = Vec::new();
    if let Ok(archive) = ArchiveFile::parse(bytes) {
        for member in archive.members() {
            let member = member.map_err(|_| FatbinError::Malformed("library member"))?;
            let name = String::from_utf8_lossy(member.name()).into_owned();
            let data = member
                .data(bytes)
                .map_err(|_| FatbinError::Malformed("library member"))?;
            // Members that are not ELF objects (a symbol index) hold no device code.
            if classify(data) != ImageKind::Cubin {
                continue;
            }
            for f in object_fatbins(data)? {
                out.push((name.clone(), f));
            }
        }
        return Ok(out);
    }
    Ok(object_fatbins(bytes)?
        .into_iter()
        .map(|f| (String::new(), f))
        .collect())
}

fn object_fatbins(elf: &[u8]) -> Result<Vec<Vec<u8>>, FatbinError> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(elf).map_err(|_| FatbinError::Malformed("object file"))?;
    let mut out = Vec::new();
    for section in file.sections() {
        // `__nv_relfatbin` in objects built with relocatable device code, `.nv_fatbin` in
        // others.
        if !matches!(section.name(), Ok("__nv_relfatbin" | ".nv_fatbin")) {
            continue;
        }
        let data = section
            .data()
            .map_err(|_| FatbinError::Malformed("object file .nv_fatbin"))?;
        // Fatbins back to back, each aligned to 8 bytes.
        let mut off = 0usize;
        while off + 16 <= data.len() && out.len() < MAX_UNITS {
            let rest = &data[off..];
            if classify(rest) != ImageKind::Fatbin {
                off += 8;
                continue;
            }
            let len = crate::measure_len(rest)?;
            out.push(rest[..len].to_vec());
            off += len.div_ceil(8).max(1) * 8;
        }
    }
    Ok(out)
}
