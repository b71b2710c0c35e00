//! Device and host allocations, memory info, pointer attributes, stream-ordered allocation.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::memory::MemoryKind;
use gpufuse_client::pools::default_pool;
use gpufuse_client::state::Inner;

use crate::api::context::{client_err, CUcontext};
use crate::ffi::{out, out_opt, read, read_at};
use crate::global::{session, with_core};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE, NOT_SUPPORTED};

pub type CUdeviceptr = u64;

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(dptr, with_core(|g| g.alloc(size as u64))?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem_size: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (ptr, p) = with_core(|g| g.alloc_pitch(width as u64, height as u64, elem_size))?;
        out(dptr, ptr)?;
        out(pitch, p as usize)
    })
}

pub(crate) fn free(ptr: u64) -> Result<(), CUresult> {
    with_core(|g| g.free(ptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    guard(|| free(ptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = with_core(|g| {
            let st = g.stream_id(stream as usize as u64)?;
            let (_, device) = g.current()?;
            let pool = g.current_pool(device);
            g.alloc_async(size as u64, pool, st)
        })?;
        out(dptr, p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = with_core(|g| {
            let st = g.stream_id(stream as usize as u64)?;
            g.alloc_async(size as u64, pool as usize as u64, st)
        })?;
        out(dptr, p)
    })
}

/// The default pool of `device` (graph allocation nodes name a device, not a pool).
pub(crate) fn device_pool(device: u32) -> u64 {
    default_pool(device)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: *mut c_void) -> CUresult {
    guard(|| {
        with_core(|g| {
            let st = g.stream_id(stream as usize as u64)?;
            g.free_async(ptr, st)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        session()?
            .device(dev)
            .ok_or(crate::status::INVALID_DEVICE)?;
        out(pool, default_pool(dev as u32) as usize as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        s.device(dev).ok_or(crate::status::INVALID_DEVICE)?;
        let h = s.lock().current_pool(dev as u32);
        out(pool, h as usize as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: *mut c_void) -> CUresult {
    guard(|| {
        let s = session()?;
        s.device(dev).ok_or(crate::status::INVALID_DEVICE)?;
        let mut g = s.lock();
        g.set_current_pool(dev as u32, pool as usize as u64)
            .map_err(client_err)
    })
}

/// `CUmemPoolProps`: allocation type, handle types, location (type, id), a Windows pointer,
const MEM_ALLOCATION_TYPE_PINNED: i32 = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub(crate) const HANDLE_TYPE_POSIX_FD: i32 = 1;
const MEM_LOCATION_TYPE_DEVICE: i32 = 1;

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if pool.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = read(props.cast::<gpufuse_cuda_types::structs::CUmemPoolProps>())?;
        let (alloc_type, handle_types) = (p.alloc_type, p.handle_types);
        let (location_type, device) = (p.location.r#type, p.location.id);
        let max_size = p.max_size as u64;
        if alloc_type != MEM_ALLOCATION_TYPE_PINNED || location_type != MEM_LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        // Exportable pools: POSIX file descriptors only (gpufuse_client::ipc); no fabric or
        // Windows handles.
        let shareable = match handle_types {
            0 => None,
            HANDLE_TYPE_POSIX_FD => Some(gpufuse_client::ipc::pool_secret().map_err(client_err)?),
            _ => return Err(NOT_SUPPORTED),
        };
        let s = session()?;
        s.device(device).ok_or(crate::status::INVALID_DEVICE)?;
        let h = s.lock().create_pool(device as u32, max_size, shareable);
        out(pool, h as usize as *mut c_void)
    })
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READWRITE: c_int = 3;

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_int,
    pool: *mut c_void,
    location: *const gpufuse_cuda_types::structs::CUmemLocation,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let loc = read(location)?;
        let device = with_core(|g| g.pool_device(pool as usize as u64))?;
        if loc.r#type != MEM_LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        session()?
            .device(loc.id)
            .ok_or(crate::status::INVALID_DEVICE)?;
        // The pool's own device reads and writes it; a session's other devices have no peer
        // access (`cuDeviceCanAccessPeer` answers 0).
        out(
            flags,
            if loc.id as u32 == device {
                ACCESS_READWRITE
            } else {
                0
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: *mut c_void,
    desc: *const gpufuse_cuda_types::structs::CUmemAccessDesc,
    count: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let device = with_core(|g| g.pool_device(pool as usize as u64))?;
        for i in 0..count {
            let d = read_at(desc, i)?;
            if d.location.r#type != MEM_LOCATION_TYPE_DEVICE
                || !(0..=ACCESS_READWRITE).contains(&d.flags)
            {
                return Err(INVALID_VALUE);
            }
            session()?
                .device(d.location.id)
                .ok_or(crate::status::INVALID_DEVICE)?;
            match (d.location.id as u32 == device, d.flags == ACCESS_READWRITE) {
                // The owner's access cannot change, as NVIDIA's driver says.
                (true, false) => return Err(INVALID_VALUE),
                (true, true) => {}
                (false, _) => return Err(NOT_SUPPORTED),
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CUresult {
    guard(|| with_core(|g| g.destroy_pool(pool as usize as u64)))
}

// CUmemPool_attribute.
const POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const POOL_RELEASE_THRESHOLD: c_int = 4;
const POOL_RESERVED_MEM_CURRENT: c_int = 5;
const POOL_RESERVED_MEM_HIGH: c_int = 6;
const POOL_USED_MEM_CURRENT: c_int = 7;
const POOL_USED_MEM_HIGH: c_int = 8;

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let mut g = s.lock();
        let stats = g.pool_stats(pool as usize as u64).map_err(client_err)?;
        match attr {
            POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES..=POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                read(value.cast::<c_int>())?;
            }
            POOL_RELEASE_THRESHOLD => stats.release_threshold = read(value.cast::<u64>())?,
            // The high-water marks can only be reset (to the current value) by writing 0.
            POOL_RESERVED_MEM_HIGH | POOL_USED_MEM_HIGH => {
                if read(value.cast::<u64>())? != 0 {
                    return Err(INVALID_VALUE);
                }
                if attr == POOL_USED_MEM_HIGH {
                    stats.high = stats.used;
                } else {
                    stats.reserved_high = stats.used;
                }
            }
            _ => return Err(INVALID_VALUE),
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let stats = *s
            .lock()
            .pool_stats(pool as usize as u64)
            .map_err(client_err)?;
        match attr {
            // Reuse policies: all enabled.
            POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES..=POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                out(value.cast::<c_int>(), 1)
            }
            POOL_RELEASE_THRESHOLD => out(value.cast::<u64>(), stats.release_threshold),
            POOL_RESERVED_MEM_CURRENT | POOL_USED_MEM_CURRENT => {
                out(value.cast::<u64>(), stats.used)
            }
            POOL_RESERVED_MEM_HIGH => out(value.cast::<u64>(), stats.reserved_high),
            POOL_USED_MEM_HIGH => out(value.cast::<u64>(), stats.high),
            _ => Err(INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, _keep: usize) -> CUresult {
    // Freed pool memory goes back to the device at once: nothing is cached to trim.
    guard(|| with_core(|g| g.pool_device(pool as usize as u64).map(|_| ())))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (f, t) = with_core(|g| g.mem_info())?;
        out_opt(free, f as usize);
        out_opt(total, t as usize);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        // Page-locked host memory has a range too (unified addressing: NVIDIA's driver answers
        // for `cuMemHostAlloc` and registered memory alike).
        let (b, n) = match g.find_host(dptr as usize) {
            Some((b, h)) => (b as u64, h.size as u64),
            None => g
                .find_allocation(dptr, 1)
                .map(|(b, a)| (b, a.size))
                .ok_or(crate::status::NOT_FOUND)?,
        };
        out_opt(base, b);
        out_opt(size, n as usize);
        Ok(())
    })
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn host_alloc(pp: *mut *mut c_void, size: usize, flags: u32) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if pp.is_null() || flags & !(HOST_PORTABLE | HOST_DEVICEMAP | HOST_WRITECOMBINED) != 0 {
            return Err(INVALID_VALUE);
        }
        // Nothing to allocate: a NULL pointer and success, as from NVIDIA's driver.
        if size == 0 {
            return out(pp, std::ptr::null_mut());
        }
        out(pp, with_core(|g| g.host_alloc(size, flags))?.cast())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { host_alloc(pp, size, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { host_alloc(pp, size, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| with_core(|g| g.host_free(p as usize)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // `CU_MEMHOSTREGISTER_PORTABLE`, `_DEVICEMAP`, `_IOMEMORY`, `_READ_ONLY`.
    if flags & !0xf != 0 {
        return INVALID_VALUE;
    }
    guard(|| with_core(|g| g.host_register(p as usize, size, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| with_core(|g| g.host_unregister(p as usize)))
}

/// `CU_MEMHOSTALLOC_PORTABLE`, `_DEVICEMAP`, `_WRITECOMBINED`.
const HOST_PORTABLE: u32 = 1;
const HOST_DEVICEMAP: u32 = 2;
const HOST_WRITECOMBINED: u32 = 4;
/// `CU_MEMHOSTREGISTER_READ_ONLY`.
const HOST_REGISTER_READ_ONLY: u32 = 8;

/// What `cuMemHostGetFlags` reports for page-locked memory allocated or registered with
/// `flags`, as NVIDIA's driver 580 does (H200, tests/conformance/fixtures): with unified
/// addressing all of it is mapped, so `DEVICEMAP` is always set; an allocation keeps its
/// `PORTABLE` and `WRITECOMBINED` bits; registered memory keeps `PORTABLE` only (the register
/// flags `DEVICEMAP`, `IOMEMORY` and `READ_ONLY` are not allocation flags).
fn host_flags(flags: u32, registered: bool) -> u32 {
    let kept = if registered {
        HOST_PORTABLE
    } else {
        HOST_PORTABLE | HOST_WRITECOMBINED
    };
    (flags & kept) | HOST_DEVICEMAP
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        let f = match g.find_host(p as usize) {
            Some((_, h)) => host_flags(h.flags, h.registered),
            // Managed memory is mapped host memory to the driver too (H200, 580: 0x2).
            None if managed(&g, p as usize as u64) => HOST_DEVICEMAP,
            None => return Err(INVALID_VALUE),
        };
        out(flags, f)
    })
}

/// Page-locked memory the device reaches has the same address on it (unified addressing):
/// mapped pinned memory, and on the emulated GPU of a same-host session every `cuMemHostAlloc`
/// block. Registered memory cannot be reached by a device in another process: not supported.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let ptr = s.lock().host_device_pointer(p as usize)?;
        out(d, ptr)
    })
}

// CUpointer_attribute ids.
const P_CONTEXT: c_int = 1;
const P_MEMORY_TYPE: c_int = 2;
const P_DEVICE_POINTER: c_int = 3;
const P_HOST_POINTER: c_int = 4;
const P_P2P_TOKENS: c_int = 5;
const P_SYNC_MEMOPS: c_int = 6;
const P_BUFFER_ID: c_int = 7;
const P_IS_MANAGED: c_int = 8;
const P_DEVICE_ORDINAL: c_int = 9;
const P_IS_LEGACY_IPC: c_int = 10;
const P_RANGE_START: c_int = 11;
const P_RANGE_SIZE: c_int = 12;
const P_MAPPED: c_int = 13;
const P_ALLOWED_HANDLE_TYPES: c_int = 14;
const P_GDR_CAPABLE: c_int = 15;
const P_ACCESS_FLAGS: c_int = 16;
const P_MEMPOOL: c_int = 17;
const P_MAPPING_SIZE: c_int = 18;
const P_MAPPING_BASE: c_int = 19;
const P_BLOCK_ID: c_int = 20;
const P_HW_DECOMPRESS_CAPABLE: c_int = 21;

/// The granule device allocations are mapped in (`cuMemGetAllocationGranularity`'s
/// recommendation on current GPUs).
const MAPPING_GRANULE: u64 = 2 << 20;
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const DEVICE_INVALID: c_int = -2;

/// What the client knows about an address.
enum PointerKind {
    Device { base: u64, size: u64, device: u32 },
    Host { base: usize, size: usize },
    Unknown,
}

fn classify(g: &Inner, ptr: u64) -> PointerKind {
    // Host first: mapped pinned memory is also a device allocation, and is host memory.
    if let Some((base, h)) = g.find_host(ptr as usize) {
        return PointerKind::Host { base, size: h.size };
    }
    if let Some((base, a)) = g.find_allocation(ptr, 1) {
        return PointerKind::Device {
            base,
            size: a.size,
            device: a.device,
        };
    }
    PointerKind::Unknown
}

/// Whether `ptr` is managed memory (`cuMemAllocManaged`).
fn managed(g: &Inner, ptr: u64) -> bool {
    g.find_host(ptr as usize).is_none()
        && g.find_allocation(ptr, 1)
            .is_some_and(|(_, a)| a.is_managed())
}

/// Writes one attribute. Returns false if the pointer is not CUDA memory.
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn write_attribute(
    g: &Inner,
    attr: c_int,
    data: *mut c_void,
    ptr: u64,
    unknown_ok: bool,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let kind = classify(g, ptr);
        let primary = |d: u32| g.primary_handle(d).unwrap_or(0) as usize as CUcontext;
        let (base, size, device, mem_type) = match kind {
            PointerKind::Device { base, size, device } => {
                (base, size, device as c_int, MEMORYTYPE_DEVICE)
            }
            PointerKind::Host { base, size } => (base as u64, size as u64, 0, MEMORYTYPE_HOST),
            PointerKind::Unknown if unknown_ok => {
                // "Default NULL values" for a non-CUDA pointer (cuda.h): what CuPy expects.
                return match attr {
                    // Host memory the driver does not know is still host memory at its own
                    // address (NVIDIA's driver 580 answers the pointer itself).
                    P_HOST_POINTER => out(data.cast::<*mut c_void>(), ptr as usize as *mut c_void),
                    P_CONTEXT | P_RANGE_START | P_MEMPOOL | P_MAPPING_BASE => {
                        out(data.cast::<*mut c_void>(), std::ptr::null_mut())
                    }
                    P_DEVICE_POINTER | P_BUFFER_ID | P_ALLOWED_HANDLE_TYPES | P_BLOCK_ID => {
                        out(data.cast::<u64>(), 0)
                    }
                    P_RANGE_SIZE | P_MAPPING_SIZE => out(data.cast::<usize>(), 0),
                    P_DEVICE_ORDINAL => out(data.cast::<c_int>(), DEVICE_INVALID),
                    _ => out(data.cast::<u32>(), 0),
                };
            }
            PointerKind::Unknown => return Err(INVALID_VALUE),
        };
        // The device allocation behind a device pointer, looked up once for every attribute
        // that depends on its kind.
        let alloc = g
            .find_allocation(ptr, 1)
            .map(|(_, a)| a)
            .filter(|_| mem_type == MEMORYTYPE_DEVICE);
        let plain = alloc.is_some_and(|a| a.kind == MemoryKind::Device);
        let is_managed = alloc.is_some_and(|a| a.is_managed());
        let pool = match alloc.map(|a| a.kind) {
            Some(MemoryKind::Pooled { pool }) => Some(pool),
            _ => None,
        };
        match attr {
            // Pool memory belongs to no context (NVIDIA's driver 580 answers NULL).
            P_CONTEXT if pool.is_some() => out(data.cast::<CUcontext>(), std::ptr::null_mut()),
            P_CONTEXT => out(data.cast::<CUcontext>(), primary(device as u32)),
            // Tokens for GPUDirect RDMA of device memory (a kernel module's, on the GPU's
            // host): no such module reaches a gpufuse GPU, so the tokens are zero; host memory
            // has none (CUDA_ERROR_INVALID_VALUE, as from the driver).
            P_P2P_TOKENS if mem_type == MEMORYTYPE_DEVICE => out(data.cast::<[u64; 2]>(), [0, 0]),
            // Device memory's copies and kernels are ordered (`SYNC_MEMOPS` on: the driver
            // answers 1 for every kind of device memory on an H200, 0 for host memory).
            P_SYNC_MEMOPS => out(data.cast::<u32>(), (mem_type == MEMORYTYPE_DEVICE) as u32),
            P_MEMPOOL if pool.is_some() => out(
                data.cast::<*mut c_void>(),
                pool.unwrap_or(0) as usize as *mut c_void,
            ),
            P_MEMORY_TYPE => out(data.cast::<u32>(), mem_type),
            P_DEVICE_POINTER => out(data.cast::<u64>(), ptr),
            // Device memory has no host address: NVIDIA's driver refuses (H200, 580).
            P_HOST_POINTER if mem_type == MEMORYTYPE_HOST || is_managed => {
                out(data.cast::<*mut c_void>(), ptr as usize as *mut c_void)
            }
            // ... and `cuPointerGetAttributes` answers NULL for it rather than failing.
            P_HOST_POINTER if unknown_ok => out(data.cast::<*mut c_void>(), std::ptr::null_mut()),
            P_HOST_POINTER => Err(INVALID_VALUE),
            P_IS_MANAGED => out(data.cast::<u32>(), is_managed as u32),
            // `cuMemAlloc` memory can be shared with `cuIpcGetMemHandle`, and NCCL relies on
            // the answer: memory that is not legacy-IPC capable it takes for `cuMemCreate`
            // memory and asks for its allocation handle. Pool, mapped, managed, module and host
            // memory is not (as NVIDIA's driver answers, H200, 580).
            P_IS_LEGACY_IPC => out(data.cast::<u32>(), plain as u32),
            // GPUDirect RDMA needs the GPU in the application's host: never through gpufuse
            // (an intended difference, docs/conformance.md).
            P_GDR_CAPABLE => out(data.cast::<u32>(), 0),
            // NVIDIA's driver 580 (H200): 1 for `cuMemAlloc` memory, 0 for every other kind.
            P_HW_DECOMPRESS_CAPABLE => out(data.cast::<u32>(), plain as u32),
            P_MAPPED => out(data.cast::<u32>(), 1),
            P_BUFFER_ID | P_BLOCK_ID => out(data.cast::<u64>(), base),
            P_DEVICE_ORDINAL => out(data.cast::<c_int>(), device),
            P_RANGE_START | P_MAPPING_BASE => out(data.cast::<u64>(), base),
            // `cuMemAlloc` memory is mapped in 2 MiB granules (the cuda backend maps each
            // allocation so; the driver's own suballocations report the same on an H200).
            P_MAPPING_SIZE if plain => out(
                data.cast::<usize>(),
                size.next_multiple_of(MAPPING_GRANULE) as usize,
            ),
            P_RANGE_SIZE | P_MAPPING_SIZE => out(data.cast::<usize>(), size as usize),
            P_ALLOWED_HANDLE_TYPES => out(data.cast::<u64>(), 0),
            // Memory registered read-only (`CU_MEMHOSTREGISTER_READ_ONLY`) is readable only
            // (`CU_POINTER_ACCESS_FLAG_READ`, 1; everything else read-write, 3).
            P_ACCESS_FLAGS => out(
                data.cast::<c_int>(),
                match g.find_host(ptr as usize) {
                    Some((_, h)) if h.registered && h.flags & HOST_REGISTER_READ_ONLY != 0 => 1,
                    _ => 3,
                },
            ),
            P_MEMPOOL => out(data.cast::<*mut c_void>(), std::ptr::null_mut()),
            _ => Err(INVALID_VALUE),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        write_attribute(&g, attr, data, ptr, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    num: c_uint,
    attrs: *const c_int,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        for i in 0..num as usize {
            let a = read_at(attrs, i)?;
            let d = read_at(data, i)?;
            write_attribute(&g, a, d, ptr, true)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerSetAttribute(
    _value: *const c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let s = session()?;
        if attr != P_SYNC_MEMOPS || s.lock().find_allocation(ptr, 1).is_none() {
            return Err(INVALID_VALUE);
        }
        Ok(())
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_memory.rs"));
