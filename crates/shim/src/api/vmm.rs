//! Virtual memory management (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`, ...), as
//! PyTorch's expandable segments and other allocators use it. Physical memory is charged to
//! the session's slice when it is created. A mapping covers one whole physical allocation
//! (offset 0, its full size; a partial mapping is `CUDA_ERROR_NOT_SUPPORTED`), and one
//! physical allocation is mapped at one address at a time. A copy may not span two mappings.

use std::ffi::{c_int, c_ulonglong, c_void};

use crate::api::memory::CUdeviceptr;
use crate::ffi::{out, read, read_at};
use crate::global::{client_err, session, with_core};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_DEVICE, INVALID_VALUE};

pub type CUmemGenericAllocationHandle = c_ulonglong;

/// 2 MiB, the granularity GPUs report for device memory.
const GRANULARITY: u64 = 2 << 20;
const ALLOCATION_TYPE_PINNED: c_int = 1;
const LOCATION_TYPE_DEVICE: c_int = 1;
const ACCESS_READWRITE: c_int = 3;
/// `CU_MEM_ALLOCATION_COMP_GENERIC`.
const COMP_GENERIC: u8 = 1;
/// `CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED`.
const GENERIC_COMPRESSION_SUPPORTED: c_int = 107;

/// `CUmemLocation` (the structs here are generated from NVIDIA's header).
pub type MemLocation = gpufuse_cuda_types::structs::CUmemLocation;

/// `CUmemAllocationProp`.
pub type AllocationProp = gpufuse_cuda_types::structs::CUmemAllocationProp;

/// `CUmemAccessDesc`.
pub type AccessDesc = gpufuse_cuda_types::structs::CUmemAccessDesc;

use gpufuse_cuda_types::structs::CUmemAllocationProp_v1_allocFlags as AllocFlags;

/// The device a pinned, device-located allocation property names.
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn prop_device(prop: *const AllocationProp) -> Result<u32, CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let p = read(prop)?;
        if p.r#type != ALLOCATION_TYPE_PINNED || p.location.r#type != LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        session()?.device(p.location.id).ok_or(INVALID_DEVICE)?;
        Ok(p.location.id as u32)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    _option: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        prop_device(prop)?;
        out(granularity, GRANULARITY as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const AllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let device = prop_device(prop)?;
        let size = size as u64;
        if flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) || handle.is_null() {
            return Err(INVALID_VALUE);
        }
        // Compressible memory where the device supports it (else plain memory, as NVIDIA's
        // driver gives; the caller checks with cuMemGetAllocationPropertiesFromHandle).
        let compressible = read(prop)?.alloc_flags.compression_type == COMP_GENERIC
            && session()?.attribute(device as i32, GENERIC_COMPRESSION_SUPPORTED) == Some(1);
        out(
            handle,
            with_core(|g| g.create_physical_with(device, size, compressible))?,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard(|| with_core(|g| g.release_physical(handle)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    _flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if ptr.is_null() || size == 0 || !(size as u64).is_multiple_of(GRANULARITY) {
            return Err(INVALID_VALUE);
        }
        out(
            ptr,
            with_core(|g| g.reserve_address(size as u64, alignment as u64))?,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| with_core(|g| g.free_address(ptr, size as u64)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        with_core(|g| g.map(ptr, size as u64, offset as u64, handle))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard(|| with_core(|g| g.unmap(ptr, size as u64)))
}

/// Every byte of `[ptr, ptr+size)` lies in mapped memory.
fn all_mapped(ptr: u64, size: u64) -> Result<(), CUresult> {
    with_core(|g| g.all_mapped(ptr, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if count == 0 {
            return Err(INVALID_VALUE);
        }
        for i in 0..count {
            let d = read_at(desc, i)?;
            if d.location.r#type != LOCATION_TYPE_DEVICE
                || !(0..=ACCESS_READWRITE).contains(&d.flags)
            {
                return Err(INVALID_VALUE);
            }
            session()?.device(d.location.id).ok_or(INVALID_DEVICE)?;
        }
        all_mapped(ptr, size as u64)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut c_ulonglong,
    location: *const MemLocation,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let loc = read(location)?;
        if loc.r#type != LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        all_mapped(ptr, 1)?;
        out(flags, ACCESS_READWRITE as c_ulonglong)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut AllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        let (_, device) = g.physical(handle).ok_or(INVALID_VALUE)?;
        let compressible = g.physical_compressible(handle) == Some(true);
        drop(g);
        out(
            prop,
            AllocationProp {
                r#type: ALLOCATION_TYPE_PINNED,
                requested_handle_types: 0,
                location: MemLocation {
                    r#type: LOCATION_TYPE_DEVICE,
                    id: device as c_int,
                },
                win32_handle_meta_data: std::ptr::null_mut(),
                alloc_flags: AllocFlags {
                    compression_type: if compressible { COMP_GENERIC } else { 0 },
                    gpu_direct_rdma_capable: 0,
                    usage: 0,
                    reserved: [0; 4],
                },
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let mut g = s.lock();
        let (base, a) = g
            .find_allocation(addr as usize as u64, 1)
            .ok_or(INVALID_VALUE)?;
        let h = g
            .mapping_handle(base)
            .filter(|_| a.is_mapped())
            .ok_or(INVALID_VALUE)?;
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        g.retain_physical(h).map_err(client_err)?;
        out(handle, h)
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_vmm.rs"));
