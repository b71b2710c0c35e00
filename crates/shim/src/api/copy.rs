//! Copies and memsets. Host-to-device data, device-to-device copies and memsets are quiet;
//! synchronous device-to-host copies are round trips; asynchronous ones are staged by the
//! worker and land with the next synchronizing reply.

use std::ffi::{c_int, c_void};

use gpufuse_client::copy::Side2D;
use gpufuse_client::state::Inner;

use crate::api::context::{client_err, CUcontext};
use crate::api::memory::CUdeviceptr;
use crate::api::stream::{stream_id, CUstream};
use crate::ffi::{host_bytes, host_bytes_mut, read};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_CONTEXT, INVALID_VALUE, NOT_SUPPORTED};

pub(crate) fn htod(
    g: &mut Inner,
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: u64,
) -> Result<(), CUresult> {
    // SAFETY: the source argument, `n` bytes, copied during this call (captured copies read
    // it when the graph is launched, as CUDA's contract for them says).
    g.copy_to_device(dst, unsafe { host_bytes(src, n) }?, stream)
        .map_err(client_err)
}

/// An asynchronous host-to-device copy: from page-locked memory the worker maps, it reads the
/// source when the copy runs (CUDA's contract: unchanged until the stream is synchronized).
pub(crate) fn htod_async(
    g: &mut Inner,
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: u64,
) -> Result<(), CUresult> {
    // SAFETY: the source argument, `n` bytes; read during this call unless it is page-locked
    // memory, which stays mapped for the process's life and unchanged until the stream is
    // synchronized, as CUDA requires of asynchronous copies.
    g.copy_to_device_async(dst, unsafe { host_bytes(src, n) }?, stream)
        .map_err(client_err)
}

pub(crate) fn dtoh_sync(
    g: &mut Inner,
    dst: &mut [u8],
    src: u64,
    stream: u64,
) -> Result<(), CUresult> {
    g.copy_from_device(dst, src, stream).map_err(client_err)
}

pub(crate) fn dtoh_async(
    g: &mut Inner,
    dst: *mut c_void,
    src: u64,
    len: usize,
    stream: u64,
) -> Result<(), CUresult> {
    // SAFETY: CUDA requires the destination of a copy to be writable for `len` bytes, and to
    // stay valid until the stream is synchronized for an asynchronous one.
    unsafe { g.copy_from_device_async(dst.cast::<u8>(), src, len, stream) }.map_err(client_err)
}

pub(crate) fn dtod(
    g: &mut Inner,
    dst: u64,
    src: u64,
    len: u64,
    stream: u64,
) -> Result<(), CUresult> {
    g.copy_on_device(dst, src, len, stream).map_err(client_err)
}

/// Runs `f` with the session locked and the stream resolved.
fn with(
    stream: CUstream,
    f: impl FnOnce(&mut Inner, u64) -> Result<(), CUresult>,
) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let id = stream_id(&g, stream)?;
    f(&mut g, id)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    guard(|| with(std::ptr::null_mut(), |g, st| htod(g, dst, src, n, st)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| with(stream, |g, st| htod_async(g, dst, src, n, st)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        with(std::ptr::null_mut(), |g, st| {
            // SAFETY: a buffer argument of `n` bytes, used during this call only.
            dtoh_sync(g, unsafe { host_bytes_mut(dst, n) }?, src, st)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| with(stream, |g, st| dtoh_async(g, dst, src, n, st)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        with(std::ptr::null_mut(), |g, st| {
            dtod(g, dst, src, n as u64, st)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| with(stream, |g, st| dtod(g, dst, src, n as u64, st)))
}

/// A copy between device memory of two contexts. A session sees one device, so both contexts
/// are on it and the copy is a device-to-device one; contexts of two devices (which no session
/// has today) are refused as not supported rather than copied through the host unasked.
fn peer(
    g: &mut Inner,
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    stream: u64,
) -> Result<(), CUresult> {
    if dst_ctx.is_null() || src_ctx.is_null() {
        return Err(INVALID_CONTEXT);
    }
    let to = super::context::context_device(g, dst_ctx as usize as u64)?;
    let from = super::context::context_device(g, src_ctx as usize as u64)?;
    if to != from {
        return Err(NOT_SUPPORTED);
    }
    dtod(g, dst, src, n as u64, stream)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> CUresult {
    guard(|| {
        with(std::ptr::null_mut(), |g, st| {
            peer(g, dst, dst_ctx, src, src_ctx, n, st)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| with(stream, |g, st| peer(g, dst, dst_ctx, src, src_ctx, n, st)))
}

/// A unified-addressing copy: the direction comes from which side is device memory.
pub(crate) fn unified(
    g: &mut Inner,
    dst: u64,
    src: u64,
    n: usize,
    stream: u64,
    sync: bool,
) -> Result<(), CUresult> {
    let dst_dev = g.find_allocation(dst, 1).is_some();
    let src_dev = g.find_allocation(src, 1).is_some();
    match (dst_dev, src_dev) {
        (true, true) => dtod(g, dst, src, n as u64, stream),
        (true, false) if sync => htod(g, dst, src as usize as *const c_void, n, stream),
        (true, false) => htod_async(g, dst, src as usize as *const c_void, n, stream),
        (false, true) if sync => dtoh_sync(
            g,
            // SAFETY: the destination argument, `n` bytes, used during this call only.
            unsafe { host_bytes_mut(dst as usize as *mut c_void, n) }?,
            src,
            stream,
        ),
        (false, true) => dtoh_async(g, dst as usize as *mut c_void, src, n, stream),
        (false, false) => {
            if n > 0 && (src == 0 || dst == 0) {
                return Err(INVALID_VALUE);
            }
            // SAFETY: both are `n`-byte host buffers of this call, not NULL; `copy` allows
            // overlap.
            unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, n) };
            Ok(())
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard(|| {
        with(std::ptr::null_mut(), |g, st| {
            unified(g, dst, src, n, st, true)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    guard(|| with(stream, |g, st| unified(g, dst, src, n, st, false)))
}

/// `CUDA_MEMCPY2D`, as NVIDIA's header declares it (generated).
pub type Memcpy2D = gpufuse_cuda_types::structs::CUDA_MEMCPY2D;

const MEM_HOST: c_int = 1;
const MEM_DEVICE: c_int = 2;
pub(crate) const MEM_ARRAY: c_int = 3;
const MEM_UNIFIED: c_int = 4;

/// Whether one side of a 2-D copy is device memory, its address of the first byte, and its
/// pitch (an array's own, whatever the copy says).
#[allow(clippy::too_many_arguments)]
pub(crate) fn side(
    g: &Inner,
    kind: c_int,
    host: usize,
    device: u64,
    array: *mut c_void,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<(bool, u64, usize), CUresult> {
    // `y` rows of `pitch` bytes and `x` bytes in: checked, they are the application's.
    let at = |base: u64, pitch: usize| {
        y.checked_mul(pitch)
            .and_then(|o| o.checked_add(x))
            .and_then(|o| base.checked_add(o as u64))
            .ok_or(INVALID_VALUE)
    };
    match kind {
        MEM_HOST => Ok((false, at(host as u64, pitch)?, pitch)),
        MEM_DEVICE => Ok((true, at(device, pitch)?, pitch)),
        MEM_UNIFIED => Ok((
            g.find_allocation(device, 1).is_some(),
            at(device, pitch)?,
            pitch,
        )),
        MEM_ARRAY => {
            let a = crate::api::array::array(g, array)?;
            let pitch = a.pitch as usize;
            Ok((true, at(a.ptr, pitch)?, pitch))
        }
        _ => Err(INVALID_VALUE),
    }
}

fn copy2d(p: &Memcpy2D, stream: CUstream, sync: bool) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let st = stream_id(&g, stream)?;
    if p.width_in_bytes == 0 || p.height == 0 {
        return Ok(());
    }
    let (device, ptr, pitch) = side(
        &g,
        p.src_memory_type,
        p.src_host as usize,
        p.src_device,
        p.src_array,
        p.src_x_in_bytes,
        p.src_y,
        p.src_pitch,
    )?;
    let src = Side2D {
        device,
        ptr,
        pitch: pitch as u64,
    };
    let (device, ptr, pitch) = side(
        &g,
        p.dst_memory_type,
        p.dst_host as usize,
        p.dst_device,
        p.dst_array,
        p.dst_x_in_bytes,
        p.dst_y,
        p.dst_pitch,
    )?;
    let dst = Side2D {
        device,
        ptr,
        pitch: pitch as u64,
    };
    let (w, h) = (p.width_in_bytes as u64, p.height as u64);
    // SAFETY: the host sides are the application's buffers of this call, `height` rows of
    // `width` bytes at their pitch, as cuMemcpy2D's contract says; used during the call only.
    unsafe { g.copy_2d(src, dst, w, h, st, sync) }.map_err(client_err)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const Memcpy2D) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { copy2d(&read(p)?, std::ptr::null_mut(), true) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { copy2d(&read(p)?, std::ptr::null_mut(), true) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, stream: CUstream) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { copy2d(&read(p)?, stream, false) })
}

/// `CUDA_MEMCPY3D`, as NVIDIA's header declares it (generated).
pub type Memcpy3D = gpufuse_cuda_types::structs::CUDA_MEMCPY3D;

/// Rows per slice of each side of a 3-D copy, (source, destination): an array's own height,
/// or the copy's `srcHeight`/`dstHeight` (at least its `Height`). Mipmap levels are refused.
/// Slice `z` of linear memory starts `pitch x rows` bytes after slice `z - 1`, and an array's
/// slices follow each other in its rows.
pub(crate) fn slice_rows(g: &Inner, p: &Memcpy3D) -> Result<(usize, usize), CUresult> {
    if p.src_lod != 0 || p.dst_lod != 0 {
        return Err(INVALID_VALUE);
    }
    let rows = |kind: c_int, array: *mut c_void, height: usize| {
        if kind == MEM_ARRAY {
            crate::api::array::array(g, array).map(|a| a.height.max(1) as usize)
        } else {
            Ok(height.max(p.height))
        }
    };
    Ok((
        rows(p.src_memory_type, p.src_array, p.src_height)?,
        rows(p.dst_memory_type, p.dst_array, p.dst_height)?,
    ))
}

/// A 3-D copy as one 2-D copy per slice ([`slice_rows`]).
fn copy3d(p: &Memcpy3D, stream: CUstream, sync: bool) -> Result<(), CUresult> {
    let (src_rows, dst_rows) = slice_rows(&session()?.lock(), p)?;
    for z in 0..p.depth.max(1) {
        let slice = Memcpy2D {
            src_x_in_bytes: p.src_x_in_bytes,
            src_y: p.src_y + (p.src_z + z) * src_rows,
            src_memory_type: p.src_memory_type,
            src_host: p.src_host,
            src_device: p.src_device,
            src_array: p.src_array,
            src_pitch: p.src_pitch,
            dst_x_in_bytes: p.dst_x_in_bytes,
            dst_y: p.dst_y + (p.dst_z + z) * dst_rows,
            dst_memory_type: p.dst_memory_type,
            dst_host: p.dst_host,
            dst_device: p.dst_device,
            dst_array: p.dst_array,
            dst_pitch: p.dst_pitch,
            width_in_bytes: p.width_in_bytes,
            height: p.height,
        };
        copy2d(&slice, stream, sync)?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(p: *const Memcpy3D) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { copy3d(&read(p)?, std::ptr::null_mut(), true) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(p: *const Memcpy3D, stream: CUstream) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { copy3d(&read(p)?, stream, false) })
}

fn memset(dst: u64, value: u32, elem: u8, count: usize, stream: CUstream) -> Result<(), CUresult> {
    with(stream, |g, st| {
        g.memset(dst, value, elem, count as u64, st)
            .map_err(client_err)
    })
}

fn memset2d(
    dst: u64,
    pitch: usize,
    value: u32,
    elem: u8,
    width: usize,
    height: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    with(stream, |g, st| {
        g.memset_2d(
            dst,
            pitch as u64,
            value,
            elem,
            width as u64,
            height as u64,
            st,
        )
        .map_err(client_err)
    })
}

macro_rules! memsets {
    ($($name:ident, $name_ptds:ident, $name_async:ident, $name_async_ptsz:ident, $ty:ty, $elem:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(dst: CUdeviceptr, value: $ty, n: usize) -> CUresult {
            guard(|| memset(dst, value as u32, $elem, n, std::ptr::null_mut()))
        }
        #[no_mangle]
        pub unsafe extern "C" fn $name_ptds(dst: CUdeviceptr, value: $ty, n: usize) -> CUresult {
            guard(|| memset(dst, value as u32, $elem, n, std::ptr::null_mut()))
        }
        #[no_mangle]
        pub unsafe extern "C" fn $name_async(dst: CUdeviceptr, value: $ty, n: usize, stream: CUstream) -> CUresult {
            guard(|| memset(dst, value as u32, $elem, n, stream))
        }
        #[no_mangle]
        pub unsafe extern "C" fn $name_async_ptsz(dst: CUdeviceptr, value: $ty, n: usize, stream: CUstream) -> CUresult {
            guard(|| memset(dst, value as u32, $elem, n, stream))
        }
    )*};
}

memsets! {
    cuMemsetD8_v2, cuMemsetD8_v2_ptds, cuMemsetD8Async, cuMemsetD8Async_ptsz, u8, 1;
    cuMemsetD16_v2, cuMemsetD16_v2_ptds, cuMemsetD16Async, cuMemsetD16Async_ptsz, u16, 2;
    cuMemsetD32_v2, cuMemsetD32_v2_ptds, cuMemsetD32Async, cuMemsetD32Async_ptsz, u32, 4;
}

macro_rules! memsets2d {
    ($($name:ident, $name_ptds:ident, $name_async:ident, $name_async_ptsz:ident, $ty:ty, $elem:expr;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(dst: CUdeviceptr, pitch: usize, value: $ty, w: usize, h: usize) -> CUresult {
            guard(|| memset2d(dst, pitch, value as u32, $elem, w, h, std::ptr::null_mut()))
        }
        #[no_mangle]
        pub unsafe extern "C" fn $name_ptds(dst: CUdeviceptr, pitch: usize, value: $ty, w: usize, h: usize) -> CUresult {
            guard(|| memset2d(dst, pitch, value as u32, $elem, w, h, std::ptr::null_mut()))
        }
        #[no_mangle]
        pub unsafe extern "C" fn $name_async_ptsz(dst: CUdeviceptr, pitch: usize, value: $ty, w: usize, h: usize, stream: CUstream) -> CUresult {
            guard(|| memset2d(dst, pitch, value as u32, $elem, w, h, stream))
        }
        #[no_mangle]
        pub unsafe extern "C" fn $name_async(dst: CUdeviceptr, pitch: usize, value: $ty, w: usize, h: usize, stream: CUstream) -> CUresult {
            guard(|| memset2d(dst, pitch, value as u32, $elem, w, h, stream))
        }
    )*};
}

memsets2d! {
    cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, u8, 1;
    cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds, cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, u16, 2;
    cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds, cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, u32, 4;
}

include!(concat!(env!("OUT_DIR"), "/aliases_copy.rs"));
