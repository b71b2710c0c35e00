//! Device queries, answered from the attributes the session cached at connect time.

use std::ffi::{c_char, c_int, c_uint};

use crate::ffi::{cstr, out, write_cstr};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_DEVICE, INVALID_VALUE, NOT_SUPPORTED};

pub type CUdevice = c_int;

// CUdevice_attribute ids used here.
const MAX_THREADS_PER_BLOCK: c_int = 1;
const MAX_BLOCK_DIM_X: c_int = 2;
const MAX_GRID_DIM_X: c_int = 5;
const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 8;
const TOTAL_CONSTANT_MEMORY: c_int = 9;
const WARP_SIZE: c_int = 10;
const MAX_PITCH: c_int = 11;
const MAX_REGISTERS_PER_BLOCK: c_int = 12;
const CLOCK_RATE: c_int = 13;
const TEXTURE_ALIGNMENT: c_int = 14;
const PCI_BUS_ID: c_int = 33;
const PCI_DEVICE_ID: c_int = 34;
const PCI_DOMAIN_ID: c_int = 50;
const CC_MAJOR: c_int = 75;
const CC_MINOR: c_int = 76;

fn check_device(dev: CUdevice) -> Result<std::sync::Arc<gpufuse_client::Session>, CUresult> {
    let s = session()?;
    if s.device(dev).is_none() {
        return Err(INVALID_DEVICE);
    }
    Ok(s)
}

/// The last `CUdevice_attribute` of the CUDA 13.5 API the shim implements; 0 and anything
/// past it are `CUDA_ERROR_INVALID_VALUE`, as from NVIDIA's driver.
const LAST_ATTRIBUTE: c_int = 161;

fn attr(dev: CUdevice, a: c_int) -> Result<c_int, CUresult> {
    let s = check_device(dev)?;
    if !(1..=LAST_ATTRIBUTE).contains(&a) {
        return Err(INVALID_VALUE);
    }
    s.attribute(dev, a).ok_or(INVALID_VALUE)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        check_device(ordinal)?;
        out(device, ordinal)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(count, session()?.devices.len() as c_int) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = check_device(dev)?;
        let cap = usize::try_from(len).map_err(|_| INVALID_VALUE)?;
        write_cstr(name, cap, &s.device(dev).ok_or(INVALID_DEVICE)?.name)
    })
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn uuid(uuid: *mut [u8; 16], dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let s = check_device(dev)?;
        out(uuid, s.device(dev).ok_or(INVALID_DEVICE)?.uuid)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(u: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { uuid(u, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(u: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { uuid(u, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetLuid(
    luid: *mut c_char,
    mask: *mut c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        check_device(dev)?;
        out(luid.cast::<[u8; 8]>(), [0; 8])?;
        out(mask, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = check_device(dev)?;
        out(
            bytes,
            s.device(dev).ok_or(INVALID_DEVICE)?.total_mem as usize,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = check_device(dev)?;
        let total = s.device(dev).ok_or(INVALID_DEVICE)?.total_mem;
        out(bytes, total.min(u32::MAX as u64) as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(pi, attr(dev, attrib)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        out(major, attr(dev, CC_MAJOR)?)?;
        out(minor, attr(dev, CC_MINOR)?)
    })
}

/// `CUdevprop`, as NVIDIA's header declares it (generated).
pub type DevProp = gpufuse_cuda_types::structs::CUdevprop;

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetProperties(prop: *mut DevProp, dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let a = |id| attr(dev, id);
        let p = DevProp {
            max_threads_per_block: a(MAX_THREADS_PER_BLOCK)?,
            max_threads_dim: [
                a(MAX_BLOCK_DIM_X)?,
                a(MAX_BLOCK_DIM_X + 1)?,
                a(MAX_BLOCK_DIM_X + 2)?,
            ],
            max_grid_size: [
                a(MAX_GRID_DIM_X)?,
                a(MAX_GRID_DIM_X + 1)?,
                a(MAX_GRID_DIM_X + 2)?,
            ],
            shared_mem_per_block: a(MAX_SHARED_MEMORY_PER_BLOCK)?,
            total_constant_memory: a(TOTAL_CONSTANT_MEMORY)?,
            simd_width: a(WARP_SIZE)?,
            mem_pitch: a(MAX_PITCH)?,
            regs_per_block: a(MAX_REGISTERS_PER_BLOCK)?,
            clock_rate: a(CLOCK_RATE)?,
            texture_align: a(TEXTURE_ALIGNMENT)?,
        };
        out(prop, p)
    })
}

/// `0000:40:00.0`: CUDA's 13-byte form (4-digit domain), as the driver writes it.
fn pci_bus_id(dev: CUdevice) -> Result<String, CUresult> {
    let (domain, bus, device) = pci_location(dev)?;
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

fn pci_location(dev: CUdevice) -> Result<(c_int, c_int, c_int), CUresult> {
    Ok((
        attr(dev, PCI_DOMAIN_ID)?,
        attr(dev, PCI_BUS_ID)?,
        attr(dev, PCI_DEVICE_ID)?,
    ))
}

/// `[domain:]bus:device[.function]`, hexadecimal, any domain width (NVML writes 8 digits).
fn parse_pci_bus_id(id: &str) -> Option<(c_int, c_int, c_int)> {
    let hex = |s: &str| c_int::from_str_radix(s, 16).ok();
    let id = id.split_once('.').map_or(
        id,
        |(head, function)| {
            if hex(function) == Some(0) {
                head
            } else {
                ""
            }
        },
    );
    let parts: Vec<&str> = id.split(':').collect();
    match parts.as_slice() {
        [domain, bus, device] => Some((hex(domain)?, hex(bus)?, hex(device)?)),
        [bus, device] => Some((0, hex(bus)?, hex(device)?)),
        _ => None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        write_cstr(
            id,
            usize::try_from(len).map_err(|_| INVALID_VALUE)?,
            &pci_bus_id(dev)?,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // SAFETY: a NUL-terminated string argument, used during this call only.
        let want = parse_pci_bus_id(cstr(id)?).ok_or(INVALID_VALUE)?;
        let s = session()?;
        for d in 0..s.devices.len() as c_int {
            if pci_location(d)? == want {
                return out(dev, d);
            }
        }
        Err(INVALID_DEVICE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        check_device(dev)?;
        check_device(peer)?;
        out(can, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    _attr: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        check_device(src)?;
        check_device(dst)?;
        out(value, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    pi: *mut c_int,
    _kind: c_int,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        check_device(dev)?;
        out(pi, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetTexture1DLinearMaxWidth(
    _max: *mut usize,
    _format: c_int,
    _channels: c_uint,
    _dev: CUdevice,
) -> CUresult {
    NOT_SUPPORTED
}

include!(concat!(env!("OUT_DIR"), "/aliases_device.rs"));

#[cfg(test)]
mod tests {
    use super::parse_pci_bus_id;

    #[test]
    fn pci_bus_ids_parse_in_every_form_the_driver_takes() {
        for id in [
            "0000:40:00.0",
            "00000000:40:00.0",
            "40:00.0",
            "40:00",
            "0000:40:00",
        ] {
            assert_eq!(parse_pci_bus_id(id), Some((0, 0x40, 0)), "{id}");
        }
        for bad in ["", "40", "0000:40:00.1", "zz:00.0", "0:0:0:0"] {
            assert_eq!(parse_pci_bus_id(bad), None, "{bad}");
        }
    }
}
