//! Managed memory (`cuMemAllocManaged`, `cudaMallocManaged`) for a device in another process.
//! The client core keeps it (`gpufuse_client::memory`): on a same-host session on an emulated
//! GPU, a block of the host arena that the worker uses as the allocation's memory and this
//! process maps at its address (host and device share the words; concurrent managed access
//! reported); otherwise a device allocation with host pages at the same address, moved whole
//! to the device before device work and back after a synchronize. Prefetches and advice are
//! hints, checked.

use std::ffi::{c_int, c_uint, c_void};

use crate::api::memory::CUdeviceptr;
use crate::ffi::out;
use crate::global::with_core;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE};

const ATTACH_GLOBAL: c_uint = 1;
const ATTACH_HOST: c_uint = 2;

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if size == 0 || !matches!(flags, ATTACH_GLOBAL | ATTACH_HOST) {
            return Err(INVALID_VALUE);
        }
        out(dptr, with_core(|g| g.alloc_managed(size as u64))?)
    })
}

/// The managed allocation holding `[ptr, ptr+count)`.
fn managed_range(ptr: u64, count: usize) -> Result<(), CUresult> {
    match with_core(|g| Ok(g.is_managed_range(ptr, count as u64)))? {
        true => Ok(()),
        false => Err(INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPrefetchAsync(
    ptr: CUdeviceptr,
    count: usize,
    _dst_device: c_int,
    _stream: *mut c_void,
) -> CUresult {
    // The data moves at the next device work or synchronize anyway: a hint, checked.
    guard(|| managed_range(ptr, count))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAdvise(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    _device: c_int,
) -> CUresult {
    guard(|| {
        if !(1..=6).contains(&advice) {
            return Err(INVALID_VALUE);
        }
        managed_range(ptr, count)
    })
}

/// `CUmemLocation`, passed by value (generated from NVIDIA's header).
pub type MemLocation = gpufuse_cuda_types::structs::CUmemLocation;

#[no_mangle]
pub unsafe extern "C" fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    count: usize,
    _location: MemLocation,
    _flags: c_uint,
    _stream: *mut c_void,
) -> CUresult {
    guard(|| managed_range(ptr, count))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    location: MemLocation,
) -> CUresult {
    // SAFETY: the same contract as `cuMemAdvise`, which takes the device as a plain int.
    unsafe { cuMemAdvise(ptr, count, advice, location.id) }
}

include!(concat!(env!("OUT_DIR"), "/aliases_managed.rs"));
