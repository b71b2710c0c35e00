//! CUDA arrays (`cuArrayCreate`, `cuArray3DCreate`, `cudaMallocArray`, `cudaMalloc3DArray`),
//! kept as linear device memory charged to the session's slice like any allocation: width x
//! channels x element size per row, rows and slices (or layers) packed. Copies to and from
//! arrays work (1-D offsets, 2-D and 3-D copies naming an array). Kernels sample them through
//! texture objects and read and write them through surface objects (`texture.rs`; the VM's
//! `tex`/`suld`/`sust`, crates/ptx/src/tex.rs), which read this memory in place. Layered,
//! surface load/store, texture gather, depth-texture, colour-attachment and cubemap flags are
//! accepted (a cubemap is six square faces, a layered one six per cubemap, kept as the layers
//! of a 2-D layered array that `tex.cube`/`tex.acube` sample); sparse, deferred-mapping
//! and video arrays are `CUDA_ERROR_NOT_SUPPORTED`, and unknown flags `CUDA_ERROR_INVALID_VALUE`.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::handles::{self, Kind};
use gpufuse_client::state::{ArrayInfo, Inner};

use crate::api::copy::{dtod, dtoh_sync, htod};
use crate::api::memory::{free, CUdeviceptr};
use crate::ffi::{host_bytes_mut, out, read};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};

pub type CUarray = *mut c_void;

/// `CUDA_ARRAY_DESCRIPTOR`, as NVIDIA's header declares it (generated).
pub type ArrayDescriptor = gpufuse_cuda_types::structs::CUDA_ARRAY_DESCRIPTOR;

/// `CUDA_ARRAY3D_DESCRIPTOR`, as NVIDIA's header declares it (generated).
pub type Array3DDescriptor = gpufuse_cuda_types::structs::CUDA_ARRAY3D_DESCRIPTOR;

/// Bytes of one channel of a `CUarray_format`.
fn format_bytes(format: c_int) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 | 0xb0 | 0xb1 => 1, // (un)signed 8-bit, unorm/snorm int8
        0x02 | 0x09 | 0x10 | 0xb2 | 0xb3 => 2, // 16-bit ints, half
        0x03 | 0x0a | 0x20 => 4,        // 32-bit ints, float
        _ => return None,
    })
}

fn create(
    g: &mut Inner,
    (width, height, depth): (usize, usize, usize),
    format: c_int,
    channels: c_uint,
    flags: c_uint,
) -> Result<u64, CUresult> {
    let elem = format_bytes(format).ok_or(INVALID_VALUE)?;
    if width == 0 || !matches!(channels, 1 | 2 | 4) {
        return Err(INVALID_VALUE);
    }
    // LAYERED, SURFACE_LDST, CUBEMAP, TEXTURE_GATHER, DEPTH_TEXTURE, COLOR_ATTACHMENT.
    const ACCEPTED: c_uint = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20;
    // SPARSE, DEFERRED_MAPPING, VIDEO_ENCODE_DECODE.
    const UNSUPPORTED: c_uint = 0x40 | 0x80 | 0x100;
    if flags & UNSUPPORTED != 0 {
        return Err(NOT_SUPPORTED);
    }
    if flags & !ACCEPTED != 0 || (flags & 0x01 != 0 && depth == 0) {
        return Err(INVALID_VALUE);
    }
    if flags & 0x04 != 0 {
        // CUBEMAP: six square faces (a multiple of six with LAYERED), as cuArray3DCreate says.
        let faces_ok = if flags & 0x01 != 0 {
            depth > 0 && depth.is_multiple_of(6)
        } else {
            depth == 6
        };
        if width != height || !faces_ok {
            return Err(INVALID_VALUE);
        }
    }
    if height == 0 && depth != 0 && flags & 0x01 == 0 {
        // A 3-D array needs a height (a 1-D layered array is width x layers).
        return Err(INVALID_VALUE);
    }
    let pitch = (width as u64)
        .checked_mul(elem * u64::from(channels))
        .ok_or(INVALID_VALUE)?;
    let size = pitch
        .checked_mul(height.max(1) as u64)
        .and_then(|s| s.checked_mul(depth.max(1) as u64))
        .ok_or(INVALID_VALUE)?;
    let ptr = g.alloc(size).map_err(crate::global::client_err)?;
    let h = handles::mint(Kind::Array);
    g.insert_array(
        h,
        ArrayInfo {
            ptr,
            width: width as u64,
            height: height as u64,
            depth: depth as u64,
            format,
            channels,
            flags,
            pitch,
        },
    );
    Ok(h)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    arr: *mut CUarray,
    desc: *const ArrayDescriptor,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let d = read(desc)?;
        let s = session()?;
        let h = create(
            &mut s.lock(),
            (d.width, d.height, 0),
            d.format,
            d.num_channels,
            0,
        )?;
        out(arr, h as usize as CUarray)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut CUarray,
    desc: *const Array3DDescriptor,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let d = read(desc)?;
        let s = session()?;
        let dims = (d.width, d.height, d.depth);
        let h = create(&mut s.lock(), dims, d.format, d.num_channels, d.flags)?;
        out(arr, h as usize as CUarray)
    })
}

/// The array a handle names.
pub fn array(g: &Inner, arr: CUarray) -> Result<ArrayInfo, CUresult> {
    g.array(arr as usize as u64).ok_or(INVALID_HANDLE)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(arr: CUarray) -> CUresult {
    guard(|| {
        let ptr = {
            let s = session()?;
            let mut g = s.lock();
            let a = array(&g, arr)?;
            g.remove_array(arr as usize as u64);
            a.ptr
        };
        free(ptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    desc: *mut ArrayDescriptor,
    arr: CUarray,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let a = array(&session()?.lock(), arr)?;
        if a.depth != 0 {
            return Err(INVALID_VALUE);
        }
        out(
            desc,
            ArrayDescriptor {
                width: a.width as usize,
                height: a.height as usize,
                format: a.format,
                num_channels: a.channels,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    desc: *mut Array3DDescriptor,
    arr: CUarray,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let a = array(&session()?.lock(), arr)?;
        out(
            desc,
            Array3DDescriptor {
                width: a.width as usize,
                height: a.height as usize,
                depth: a.depth as usize,
                format: a.format,
                num_channels: a.channels,
                flags: a.flags,
            },
        )
    })
}

/// The device address of byte `offset` of an array, with `len` bytes inside it.
fn at(g: &Inner, arr: CUarray, offset: usize, len: usize) -> Result<u64, CUresult> {
    let a = array(g, arr)?;
    let size = a.pitch * a.height.max(1) * a.depth.max(1);
    let end = offset.checked_add(len).ok_or(INVALID_VALUE)?;
    if end as u64 > size {
        return Err(INVALID_VALUE);
    }
    Ok(a.ptr + offset as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoA_v2(
    dst: CUarray,
    offset: usize,
    src: *const c_void,
    count: usize,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let p = at(&g, dst, offset, count)?;
        htod(&mut g, p, src, count, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoH_v2(
    dst: *mut c_void,
    src: CUarray,
    offset: usize,
    count: usize,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let p = at(&g, src, offset, count)?;
        // SAFETY: the destination argument, `count` bytes, used during this call only.
        dtoh_sync(&mut g, unsafe { host_bytes_mut(dst, count) }?, p, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoA_v2(
    dst: CUarray,
    offset: usize,
    src: CUdeviceptr,
    count: usize,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let p = at(&g, dst, offset, count)?;
        dtod(&mut g, p, src, count as u64, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoD_v2(
    dst: CUdeviceptr,
    src: CUarray,
    offset: usize,
    count: usize,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let p = at(&g, src, offset, count)?;
        dtod(&mut g, dst, p, count as u64, 0)
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_array.rs"));
