//! Virtual memory management, page-locked host memory, copies and memsets.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use gpufuse_cuda_types::short as E;
use gpufuse_cuda_types::structs::{CUmemAccessDesc, CUmemAllocationProp};
use gpufuse_cuda_types::CUresult;

use super::{CUdeviceptr, Handle};
use crate::ffi::{self, HostPtr};
use crate::guard::{call, now, Flow, Need, Res};
use crate::state::{SRef, Sim};
use crate::tables::GRANULARITY;
use crate::timeline::{transfer_ns, HostSrc, Work};

/// `CU_MEM_ALLOCATION_TYPE_PINNED` and `CU_MEM_LOCATION_TYPE_DEVICE`.
const ALLOCATION_PINNED: c_int = 1;
const LOCATION_DEVICE: c_int = 1;

/// The device an allocation property names (pinned memory on a device is the only kind).
///
/// # Safety
/// `prop` must be NULL or point at a `CUmemAllocationProp`.
unsafe fn prop_device(s: &Sim, prop: *const CUmemAllocationProp) -> Result<usize, CUresult> {
    // SAFETY: `prop` is NULL or readable (the contract).
    let p = unsafe { ffi::get(prop) }?;
    if p.r#type != ALLOCATION_PINNED || p.location.r#type != LOCATION_DEVICE {
        return Err(E::INVALID_VALUE);
    }
    s.device(p.location.id)
}

/// The stream of an asynchronous call, or the legacy stream of a synchronous one.
fn stream_of(s: &Sim, stream: Option<Handle>) -> Result<SRef, CUresult> {
    match stream {
        Some(h) => s.stream(h),
        None => Ok(SRef::Null(s.current()?)),
    }
}

/// What a copy or memset returns after it was issued: a synchronous one blocks until it is
/// done.
fn after(end: Option<u64>, sync: bool) -> Res {
    match (end, sync) {
        (Some(t), true) => Ok(Flow::Until { t, fault_ctx: None }),
        _ => Ok(Flow::Done),
    }
}

/// # Safety
/// `src` must be NULL or readable for `n` bytes, until the copy completes if it is
/// asynchronous.
unsafe fn htod(s: &mut Sim, dst: u64, src: *const c_void, n: usize, stream: Option<Handle>) -> Res {
    let t0 = now();
    let sref = stream_of(s, stream)?;
    if n == 0 {
        return Ok(Flow::Done);
    }
    if src.is_null() {
        return Err(E::INVALID_VALUE);
    }
    s.mem.check(dst, n as u64)?;
    let pinned = s.mem.is_pinned(src as usize, n);
    let source = if pinned || s.capturing(sref) {
        HostSrc::Ptr(HostPtr(src as *mut u8))
    } else {
        // Pageable memory is read now: the call returns once the source has been read.
        // SAFETY: `src` is non-NULL and readable for `n` bytes (the contract).
        HostSrc::Bytes(Arc::new(unsafe { ffi::bytes(src.cast(), n) }?))
    };
    // Issued when the call began: reading a pageable source is part of the transfer.
    let end = s.submit_at(
        sref,
        Work::HtoD {
            dst,
            src: source,
            len: n,
        },
        t0,
    )?;
    match (end, stream) {
        // From pageable memory the caller pays the transfer time (reading the source
        // included), whatever the stream still has to do before the copy.
        (Some(_), Some(_)) if !pinned => Ok(Flow::Until {
            t: t0 + transfer_ns(n, s.cfg.pageable_gbps),
            fault_ctx: None,
        }),
        _ => after(end, stream.is_none()),
    }
}

/// # Safety
/// `dst` must be NULL or writable for `n` bytes until the copy completes.
unsafe fn dtoh(s: &mut Sim, dst: *mut c_void, src: u64, n: usize, stream: Option<Handle>) -> Res {
    let sref = stream_of(s, stream)?;
    if n == 0 {
        return Ok(Flow::Done);
    }
    if dst.is_null() {
        return Err(E::INVALID_VALUE);
    }
    s.mem.check(src, n as u64)?;
    let pinned = s.mem.is_pinned(dst as usize, n);
    let end = s.submit(
        sref,
        Work::DtoH {
            dst: HostPtr(dst.cast()),
            src,
            len: n,
        },
    )?;
    // Into pageable memory the call returns when the copy is complete.
    after(end, stream.is_none() || !pinned)
}

fn dtod(s: &mut Sim, dst: u64, src: u64, n: usize, stream: Option<Handle>) -> Res {
    let sref = stream_of(s, stream)?;
    if n == 0 {
        return Ok(Flow::Done);
    }
    s.mem.check(src, n as u64)?;
    s.mem.check(dst, n as u64)?;
    let end = s.submit(sref, Work::DtoD { dst, src, len: n })?;
    after(end, stream.is_none())
}

fn memset(
    s: &mut Sim,
    dst: u64,
    value: u32,
    elem: u8,
    count: usize,
    stream: Option<Handle>,
) -> Res {
    let sref = stream_of(s, stream)?;
    if count == 0 {
        return Ok(Flow::Done);
    }
    if !dst.is_multiple_of(elem as u64) {
        return Err(E::INVALID_VALUE);
    }
    let bytes = count.checked_mul(elem as usize).ok_or(E::INVALID_VALUE)?;
    s.mem.check(dst, bytes as u64)?;
    let end = s.submit(
        sref,
        Work::Memset {
            dst,
            value,
            elem,
            count,
        },
    )?;
    after(end, stream.is_none())
}

export! {
    /// `cuMemGetAllocationGranularity`: 2 MiB, minimum (0) and recommended (1).
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int) {
        call(Need::Init, |s| {
            if granularity.is_null() || !(0..=1).contains(&option) {
                return Err(E::INVALID_VALUE);
            }
            // SAFETY: `prop` is NULL or readable (this export's contract).
            unsafe { prop_device(s, prop) }?;
            // SAFETY: `granularity` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(granularity, GRANULARITY as usize) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemAddressReserve`: at `addr` if it is free and aligned, else where there is room.
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        call(Need::Init, |s| {
            if ptr.is_null() || flags != 0 {
                return Err(E::INVALID_VALUE);
            }
            let va = s.mem.reserve(size as u64, alignment as u64, addr)?;
            // SAFETY: `ptr` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(ptr, va) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemAddressFree`: exactly a reservation, with nothing mapped in it.
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        call(Need::Init, |s| {
            s.mem.free_reservation(ptr, size as u64)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemCreate`: host memory, allocated on demand; `CUDA_ERROR_OUT_OF_MEMORY` past the
    /// device's memory.
    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        call(Need::Init, |s| {
            if handle.is_null() || flags != 0 {
                return Err(E::INVALID_VALUE);
            }
            // SAFETY: `prop` is NULL or readable (this export's contract).
            let dev = unsafe { prop_device(s, prop) }?;
            let total = s.cfg.mem;
            let h = s.mem.create(dev, size as u64, total)?;
            // SAFETY: `handle` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(handle, h) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemRelease`: the memory goes with its last mapping.
    fn cuMemRelease(handle: u64) {
        call(Need::Init, |s| {
            s.mem.release(handle)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemMap`.
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) {
        call(Need::Init, |s| {
            if flags != 0 {
                return Err(E::INVALID_VALUE);
            }
            s.mem.map(ptr, size as u64, offset as u64, handle)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemUnmap`: whole mappings.
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        call(Need::Init, |s| {
            s.mem.unmap(ptr, size as u64)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemSetAccess`: device locations only; copies need read/write access.
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        call(Need::Init, |s| {
            if desc.is_null() || count == 0 || count > s.devices.len() {
                return Err(E::INVALID_VALUE);
            }
            let mut read_write = false;
            for i in 0..count {
                // SAFETY: `desc` points at `count` descriptors (this export's contract).
                let d = unsafe { ffi::get(desc.add(i)) }?;
                if d.location.r#type != LOCATION_DEVICE || !matches!(d.flags, 0 | 1 | 3) {
                    return Err(E::INVALID_VALUE);
                }
                s.device(d.location.id)?;
                read_write |= d.flags == 3;
            }
            s.mem.set_access(ptr, size as u64, read_write)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemHostRegister_v2`: page-locks a host range (copies from and to it are DMA).
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) {
        call(Need::Init, |s| {
            s.current()?;
            if flags & !0xf != 0 {
                return Err(E::INVALID_VALUE);
            }
            s.mem.host_register(p as usize, bytesize)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemHostUnregister`.
    fn cuMemHostUnregister(p: *mut c_void) {
        call(Need::Init, |s| {
            s.current()?;
            if p.is_null() {
                return Err(E::INVALID_VALUE);
            }
            s.mem.host_unregister(p as usize)?;
            Ok(Flow::Done)
        })
    }

    /// `cuMemcpyHtoD_v2`: on the legacy stream; returns when done.
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) {
        // SAFETY: `src` is readable for `n` bytes (this export's contract).
        call(Need::Init, |s| unsafe { htod(s, dst, src, n, None) })
    }

    /// `cuMemcpyDtoH_v2`: on the legacy stream; returns when done.
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        // SAFETY: `dst` is writable for `n` bytes (this export's contract).
        call(Need::Init, |s| unsafe { dtoh(s, dst, src, n, None) })
    }

    /// `cuMemcpyDtoD_v2`: on the legacy stream; returns when done.
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        call(Need::Init, |s| dtod(s, dst, src, n, None))
    }

    /// `cuMemsetD8_v2`: on the legacy stream; returns when done.
    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) {
        call(Need::Init, |s| memset(s, dst, value as u32, 1, n, None))
    }

    /// `cuMemsetD16_v2`: on the legacy stream; returns when done.
    fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) {
        call(Need::Init, |s| memset(s, dst, value as u32, 2, n, None))
    }

    /// `cuMemsetD32_v2`: on the legacy stream; returns when done.
    fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize) {
        call(Need::Init, |s| memset(s, dst, value, 4, n, None))
    }

    /// `cuMemcpyHtoDAsync_v2`: from pageable memory, returns after the source was read.
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: Handle) {
        // SAFETY: `src` is readable for `n` bytes until the copy completes (this export's contract).
        call(Need::Init, |s| unsafe { htod(s, dst, src, n, Some(stream)) })
    }

    /// `cuMemcpyDtoHAsync_v2`: into pageable memory, returns when complete.
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: Handle) {
        // SAFETY: `dst` is writable for `n` bytes until the copy completes (this export's contract).
        call(Need::Init, |s| unsafe { dtoh(s, dst, src, n, Some(stream)) })
    }

    /// `cuMemcpyDtoDAsync_v2`.
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle) {
        call(Need::Init, |s| dtod(s, dst, src, n, Some(stream)))
    }

    /// `cuMemsetD8Async`.
    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: Handle) {
        call(Need::Init, |s| memset(s, dst, value as u32, 1, n, Some(stream)))
    }

    /// `cuMemsetD16Async`.
    fn cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, stream: Handle) {
        call(Need::Init, |s| memset(s, dst, value as u32, 2, n, Some(stream)))
    }

    /// `cuMemsetD32Async`.
    fn cuMemsetD32Async(dst: CUdeviceptr, value: u32, n: usize, stream: Handle) {
        call(Need::Init, |s| memset(s, dst, value, 4, n, Some(stream)))
    }
}
