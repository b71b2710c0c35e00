//! What a cubin (a CUDA ELF) says about its kernels and variables without running anything:
//! each kernel's parameter layout from its `.nv.info.<kernel>` section and each module
//! variable's size and initializer from the symbol table.
//!
//! `.nv.info` records (docs/driver-interception.md, section 6): u8 format, u8 attribute,
//! u16 value or payload length. Format 1 has no value, format 2 a u8 and format 3 a u16 in the
//! header itself; format 4 is followed by a payload of that length. `EIATTR_KPARAM_INFO` (0x17)
//! carries one parameter: u32 index, u16 ordinal, u16 offset, u32 with the size in bits 18-31.
//!
//! ELF parsing is the `object` crate's (with its `unaligned` feature: a cubin's section headers
//! need not be 8-byte aligned); only the CUDA-specific records are read here.

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use crate::FatbinError;

const EIATTR_KPARAM_INFO: u8 = 0x17;
/// A kernel's total parameter bytes (format 3).
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;

/// One parameter of a kernel: byte offset and size in the parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubinParam {
    pub ordinal: u16,
    pub offset: u32,
    pub size: u32,
}

/// A kernel (an entry function) of a cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinKernel {
    pub name: String,
    /// In ordinal order.
    pub params: Vec<CubinParam>,
    /// Total parameter bytes, when the cubin says.
    pub param_bytes: Option<u32>,
}

/// A module-scope variable (`__device__`, `__constant__`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinVariable {
    pub name: String,
    pub size: u64,
    /// The initial bytes, when the variable lives in a section with data.
    pub init: Option<Vec<u8>>,
}

/// The kernels and variables of a cubin.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CubinInfo {
    pub kernels: Vec<CubinKernel>,
    pub variables: Vec<CubinVariable>,
}

/// The architecture a cubin's code is for (e.g. 100 for sm_100), from the ELF header's flags:
/// bits 8-15 from CUDA ELF ABI version 8 on (`EI_ABIVERSION`), bits 0-7 before.
pub fn cubin_sm(elf: &[u8]) -> Option<u32> {
    if elf.len() < 52 || elf[..4] != *b"\x7fELF" {
        return None;
    }
    let abi_version = elf[8];
    let flags_at = if elf[4] == 2 { 48 } else { 36 };
    let flags = u32::from_le_bytes(elf[flags_at..flags_at + 4].try_into().ok()?);
    Some(if abi_version >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    })
}

/// Reads the kernels and variables of a cubin (ELF, as found in a fatbin entry).
pub fn cubin_info(elf: &[u8]) -> Result<CubinInfo, FatbinError> {
    let file = object::File::parse(elf).map_err(|_| FatbinError::Malformed("cubin ELF"))?;
    let mut info = CubinInfo::default();
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        let Some(kernel) = name.strip_prefix(".nv.info.") else {
            continue;
        };
        let data = section
            .data()
            .map_err(|_| FatbinError::Malformed("cubin .nv.info"))?;
        info.kernels.push(parse_kernel_info(kernel, data)?);
    }
    info.kernels.sort_by(|a, b| a.name.cmp(&b.name));
    for sym in file.symbols() {
        // nvcc gives module variables local binding; the driver still finds them by name.
        if sym.kind() != SymbolKind::Data || sym.size() == 0 {
            continue;
        }
        let (Ok(name), Some(index)) = (sym.name(), sym.section_index()) else {
            continue;
        };
        let Ok(section) = file.section_by_index(index) else {
            continue;
        };
        let in_module_memory = section
            .name()
            .is_ok_and(|n| n.starts_with(".nv.global") || n.starts_with(".nv.constant"));
        if !in_module_memory {
            continue;
        }
        let init = if section.kind() == SectionKind::UninitializedData {
            None
        } else {
            section
                .data()
                .ok()
                .and_then(|d| {
                    let start = usize::try_from(sym.address()).ok()?;
                    d.get(start..start.checked_add(usize::try_from(sym.size()).ok()?)?)
                })
                .map(<[u8]>::to_vec)
        };
        info.variables.push(CubinVariable {
            name: name.to_string(),
            size: sym.size(),
            init,
        });
    }
    Ok(info)
}

fn parse_kernel_info(name: &str, data: &[u8]) -> Result<CubinKernel, FatbinError> {
    let bad = FatbinError::Malformed("cubin .nv.info record");
    let mut params = Vec::new();
    let mut param_bytes = None;
    let mut off = 0usize;
    while off + 4 <= data.len() {
        let (format, attr) = (data[off], data[off + 1]);
        let value = u16::from_le_bytes([data[off + 2], data[off + 3]]);
        off += 4;
        match format {
            1..=3 => {
                if attr == EIATTR_CBANK_PARAM_SIZE {
                    param_bytes = Some(u32::from(value));
                }
            }
            4 => {
                let payload = data.get(off..off + value as usize).ok_or(bad.clone())?;
                off += value as usize;
                if attr == EIATTR_KPARAM_INFO {
                    if payload.len() < 12 {
                        return Err(bad);
                    }
                    let ordinal = u16::from_le_bytes([payload[4], payload[5]]);
                    let offset = u16::from_le_bytes([payload[6], payload[7]]);
                    let packed = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
                    params.push(CubinParam {
                        ordinal,
                        offset: u32::from(offset),
                        size: packed >> 18,
                    });
                }
            }
            _ => return Err(bad),
        }
    }
    params.sort_by_key(|p| p.ordinal);
    Ok(CubinKernel {
        name: name.to_string(),
        params,
        param_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kparam(ordinal: u16, offset: u16, size: u32) -> Vec<u8> {
        let mut r = vec![4, EIATTR_KPARAM_INFO, 12, 0];
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&ordinal.to_le_bytes());
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&((size << 18) | (0x1F << 12)).to_le_bytes());
        r
    }

    /// The records nvcc 13.5 writes for `vadd(float*, float*, float*, int)`: descending
    /// ordinals, sizes 8/8/8/4, 28 parameter bytes.
    #[test]
    fn kernel_params_come_out_in_ordinal_order() {
        let mut data = vec![3, EIATTR_CBANK_PARAM_SIZE, 28, 0];
        for (ord, off, size) in [(3, 24, 4), (2, 16, 8), (1, 8, 8), (0, 0, 8)] {
            data.extend(kparam(ord, off, size));
        }
        data.extend([1, 0x2a, 0, 0]); // a format-1 record with no value
        let k = parse_kernel_info("vadd", &data).unwrap();
        assert_eq!(k.param_bytes, Some(28));
        let got: Vec<_> = k.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(got, [(0, 8), (8, 8), (16, 8), (24, 4)]);
    }

    /// The arch in the ELF flags: bits 8-15 for ABI version 8 (nvcc 13's sm_100 cubin has
    /// flags 0x06006402), bits 0-7 before.
    #[test]
    fn cubin_arch_from_the_elf_flags() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[7] = 0x41;
        elf[8] = 8;
        elf[48..52].copy_from_slice(&0x0600_6402u32.to_le_bytes());
        assert_eq!(cubin_sm(&elf), Some(100));
        elf[8] = 7;
        elf[48..52].copy_from_slice(&0x0050_0550u32.to_le_bytes());
        assert_eq!(cubin_sm(&elf), Some(0x50));
        assert_eq!(cubin_sm(b"\x7fELF"), None);
    }

    #[test]
    fn truncated_records_are_errors() {
        let mut data = kparam(0, 0, 8);
        data.truncate(10);
        assert!(parse_kernel_info("k", &data).is_err());
        assert!(parse_kernel_info("k", &[9, 0, 0, 0]).is_err());
        assert!(cubin_info(b"\x7fELF garbage").is_err());
    }
}
