//! Device and host allocations, memory info, pointer attributes, stream-ordered allocation.

use std::alloc::Layout;
use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::graph::{GraphAlloc, Op};
use gpufuse_client::state::{Allocation, HostAllocation, Inner, PoolStats};
use gpufuse_proto::{ReplyBody, Request};

use crate::api::context::{client_err, current, CUcontext};
use crate::api::stream::stream_id;
use crate::ffi::{out, out_opt, read, read_at};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY};

pub type CUdeviceptr = u64;

const HOST_ALIGN: usize = 4096;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
const HOST_ALLOC_DEVICEMAP: u32 = 0x02;

pub(crate) fn alloc(g: &mut Inner, size: usize) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    let (_, device) = current(g)?;
    let body = g
        .conn
        .call(&Request::MemAlloc {
            device,
            size: size as u64,
        })
        .map_err(client_err)?;
    let ReplyBody::Ptr(p) = body else {
        return Err(crate::status::UNKNOWN);
    };
    g.allocations.insert(
        p,
        Allocation {
            size: size as u64,
            device,
            pool: None,
            managed: false,
            mapped: false,
            offset: 0,
        },
    );
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    guard(|| {
        let s = session()?;
        let p = alloc(&mut s.lock(), size)?;
        out(dptr, p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem_size: c_uint,
) -> CUresult {
    guard(|| {
        if width == 0 || height == 0 || !matches!(elem_size, 4 | 8 | 16) {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let mut g = s.lock();
        let (_, device) = current(&g)?;
        let req = Request::MemAllocPitch {
            device,
            width: width as u64,
            height: height as u64,
            elem_size,
        };
        let ReplyBody::Pitch { ptr, pitch: p } = g.conn.call(&req).map_err(client_err)? else {
            return Err(crate::status::UNKNOWN);
        };
        g.allocations.insert(
            ptr,
            Allocation {
                size: p * height as u64,
                device,
                pool: None,
                managed: false,
                mapped: false,
                offset: 0,
            },
        );
        out(dptr, ptr)?;
        out(pitch, p as usize)
    })
}

pub(crate) fn free(ptr: u64) -> Result<(), CUresult> {
    // Freeing NULL does nothing, as the driver does (the runtime forwards cudaFree(NULL)).
    if ptr == 0 {
        return Ok(());
    }
    let s = session()?;
    let mut g = s.lock();
    match g.allocations.get(&ptr) {
        // A graph's allocation is freed with the graph (`cuGraphDestroy`).
        Some(a) if !a.mapped && !g.graphs.allocations.contains_key(&ptr) => {}
        _ => return Err(INVALID_VALUE),
    }
    let a = g.allocations.remove(&ptr).ok_or(INVALID_VALUE)?;
    if a.managed {
        crate::api::managed::unmap(ptr, a.size);
        g.managed_count -= 1;
    }
    if let Some(pool) = a.pool.and_then(|h| g.pools.get_mut(&h)) {
        pool.used = pool.used.saturating_sub(a.size);
    }
    g.conn
        .quiet(&Request::MemFree {
            ptr: ptr - a.offset,
        })
        .map_err(client_err)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    guard(|| free(ptr))
}

/// Allocates `size` bytes from `pool` (a handle) and charges the pool.
fn alloc_from_pool(g: &mut Inner, size: usize, pool: u64) -> Result<u64, CUresult> {
    let device = pool_device(g, pool)?;
    let (_, current) = current(g)?;
    if device != current {
        return Err(INVALID_VALUE);
    }
    let stats = pool_stats(g, pool)?;
    if stats.max_size != 0 && stats.used.saturating_add(size as u64) > stats.max_size {
        return Err(OUT_OF_MEMORY);
    }
    let p = alloc(g, size)?;
    if let Some(a) = g.allocations.get_mut(&p) {
        a.pool = Some(pool);
        let size = a.size;
        let stats = pool_stats(g, pool)?;
        stats.used += size;
        stats.high = stats.high.max(stats.used);
        stats.reserved_high = stats.reserved_high.max(stats.used);
    }
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: *mut c_void,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let st = stream_id(&g, stream)?;
        let (_, device) = current(&g)?;
        let pool = g
            .current_pools
            .get(&device)
            .copied()
            .unwrap_or_else(|| default_pool(device));
        let p = alloc_async(&mut g, size, pool, st)?;
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
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let st = stream_id(&g, stream)?;
        let p = alloc_async(&mut g, size, pool as usize as u64, st)?;
        out(dptr, p)
    })
}

/// `cuMemAllocAsync` on stream `st`: at once, or, under stream capture, as a graph allocation
/// node whose address is fixed now (its memory is reserved until the graph goes).
fn alloc_async(g: &mut Inner, size: usize, pool: u64, st: u64) -> Result<u64, CUresult> {
    let p = alloc_from_pool(g, size, pool)?;
    if g.graphs.capturing(st).is_some() {
        graph_allocation(g, p, size as u64);
        g.graphs.record(
            st,
            Op::MemAlloc {
                ptr: p,
                size: size as u64,
            },
        );
    }
    Ok(p)
}

/// Marks `ptr` (just allocated) as a graph allocation held by the graph being built.
pub(crate) fn graph_allocation(g: &mut Inner, ptr: u64, size: u64) {
    g.graphs.allocations.insert(
        ptr,
        GraphAlloc {
            size,
            refs: 1,
            live: false,
        },
    );
}

/// A graph allocation node for `size` bytes in `pool`: the address.
pub(crate) fn graph_alloc_node(g: &mut Inner, size: usize, pool: u64) -> Result<u64, CUresult> {
    let p = alloc_from_pool(g, size, pool)?;
    graph_allocation(g, p, size as u64);
    Ok(p)
}

/// The default pool of `device` (graph allocation nodes name a device, not a pool).
pub(crate) fn device_pool(device: u32) -> u64 {
    default_pool(device)
}

/// Frees graph allocations no graph holds any more.
pub(crate) fn free_graph_memory(ptrs: Vec<u64>) -> Result<(), CUresult> {
    ptrs.into_iter().try_for_each(free)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: *mut c_void) -> CUresult {
    guard(|| {
        {
            let s = session()?;
            let mut g = s.lock();
            let st = stream_id(&g, stream)?;
            if g.graphs.capturing(st).is_some() {
                // A free node: only of a graph allocation.
                if !g.graphs.allocations.contains_key(&ptr) {
                    return Err(INVALID_VALUE);
                }
                g.graphs.record(st, Op::MemFree { ptr });
                return Ok(());
            }
            if let Some(a) = g.graphs.allocations.get_mut(&ptr) {
                // A graph allocation freed outside the graph: its life ends, the memory stays
                // reserved for the graph's next launch.
                if !a.live {
                    return Err(INVALID_VALUE);
                }
                a.live = false;
                return Ok(());
            }
        }
        free(ptr)
    })
}

/// Default pools are `DEFAULT_POOLS + device`; created pools count up from `CREATED_POOLS`.
/// Both are opaque, non-NULL handles.
const DEFAULT_POOLS: u64 = 0x9000_0000;
const CREATED_POOLS: u64 = 0xa000_0000;

fn default_pool(dev: u32) -> u64 {
    DEFAULT_POOLS + u64::from(dev)
}

/// The device `pool` allocates on: a created pool's, or a valid device's default pool.
fn pool_device(g: &Inner, pool: u64) -> Result<u32, CUresult> {
    if let Some(stats) = g.pools.get(&pool) {
        return Ok(stats.device);
    }
    let dev = pool
        .checked_sub(DEFAULT_POOLS)
        .filter(|&d| pool < CREATED_POOLS && (d as usize) < g.primary.len())
        .ok_or(INVALID_VALUE)?;
    Ok(dev as u32)
}

/// A pool's books (a default pool's made on first use).
fn pool_stats(g: &mut Inner, pool: u64) -> Result<&mut PoolStats, CUresult> {
    let device = pool_device(g, pool)?;
    Ok(g.pools.entry(pool).or_insert(PoolStats {
        device,
        ..PoolStats::default()
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: c_int) -> CUresult {
    guard(|| {
        session()?
            .device(dev)
            .ok_or(crate::status::INVALID_DEVICE)?;
        out(pool, default_pool(dev as u32) as usize as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: c_int) -> CUresult {
    guard(|| {
        let s = session()?;
        s.device(dev).ok_or(crate::status::INVALID_DEVICE)?;
        let d = dev as u32;
        let h = s
            .lock()
            .current_pools
            .get(&d)
            .copied()
            .unwrap_or_else(|| default_pool(d));
        out(pool, h as usize as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: c_int, pool: *mut c_void) -> CUresult {
    guard(|| {
        let s = session()?;
        s.device(dev).ok_or(crate::status::INVALID_DEVICE)?;
        let mut g = s.lock();
        let h = pool as usize as u64;
        if pool_device(&g, h)? != dev as u32 {
            return Err(INVALID_VALUE);
        }
        g.current_pools.insert(dev as u32, h);
        Ok(())
    })
}

/// `CUmemPoolProps`: allocation type, handle types, location (type, id), a Windows pointer,
/// `maxSize`, usage, reserved bytes (88 bytes).
const POOL_PROPS_LEN: usize = 88;
const MEM_ALLOCATION_TYPE_PINNED: i32 = 1;
const MEM_LOCATION_TYPE_DEVICE: i32 = 1;

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) -> CUresult {
    guard(|| {
        if pool.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = read(props.cast::<[u8; POOL_PROPS_LEN]>())?;
        let i32_at = |o: usize| i32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
        let (alloc_type, handle_types) = (i32_at(0), i32_at(4));
        let (location_type, device) = (i32_at(8), i32_at(12));
        let max_size = u64::from_le_bytes(p[24..32].try_into().map_err(|_| INVALID_VALUE)?);
        if alloc_type != MEM_ALLOCATION_TYPE_PINNED || location_type != MEM_LOCATION_TYPE_DEVICE {
            return Err(INVALID_VALUE);
        }
        // IPC handles (POSIX fd, fabric) cannot cross to a remote device.
        if handle_types != 0 {
            return Err(NOT_SUPPORTED);
        }
        let s = session()?;
        s.device(device).ok_or(crate::status::INVALID_DEVICE)?;
        let mut g = s.lock();
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let h = CREATED_POOLS + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        g.pools.insert(
            h,
            PoolStats {
                device: device as u32,
                max_size,
                ..PoolStats::default()
            },
        );
        out(pool, h as usize as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let h = pool as usize as u64;
        if h < CREATED_POOLS || !g.pools.contains_key(&h) {
            return Err(INVALID_VALUE);
        }
        // Allocations still out keep working and are freed as usual; the device falls back
        // to its default pool if this one was current.
        g.pools.remove(&h);
        g.current_pools.retain(|_, &mut p| p != h);
        Ok(())
    })
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
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let stats = pool_stats(&mut g, pool as usize as u64)?;
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
    guard(|| {
        let s = session()?;
        let stats = *pool_stats(&mut s.lock(), pool as usize as u64)?;
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
    guard(|| {
        let s = session()?;
        let g = s.lock();
        pool_device(&g, pool as usize as u64).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let (_, device) = current(&g)?;
        let ReplyBody::MemInfo { free: f, total: t } = g
            .conn
            .call(&Request::MemGetInfo { device })
            .map_err(client_err)?
        else {
            return Err(crate::status::UNKNOWN);
        };
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
    guard(|| {
        let s = session()?;
        let (b, a) = s
            .lock()
            .find_allocation(dptr, 1)
            .ok_or(crate::status::NOT_FOUND)?;
        out_opt(base, b);
        out_opt(size, a.size as usize);
        Ok(())
    })
}

fn host_alloc(pp: *mut *mut c_void, size: usize, flags: u32) -> Result<(), CUresult> {
    if pp.is_null() {
        return Err(INVALID_VALUE);
    }
    let s = session()?;
    if flags & HOST_ALLOC_DEVICEMAP != 0 {
        // Kernels reach it through the same pointer (unified addressing): a device allocation
        // with host pages at its address, moved like managed memory.
        let mut g = s.lock();
        let p = crate::api::managed::alloc_mirrored(&mut g, size.max(1))?;
        g.host.insert(
            p as usize,
            HostAllocation {
                size: size.max(1),
                flags,
                registered: false,
                device_mapped: true,
            },
        );
        return out(pp, p as usize as *mut c_void);
    }
    let layout = Layout::from_size_align(size.max(1), HOST_ALIGN).map_err(|_| OUT_OF_MEMORY)?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(OUT_OF_MEMORY);
    }
    s.lock().host.insert(
        p as usize,
        HostAllocation {
            size: size.max(1),
            flags,
            registered: false,
            device_mapped: false,
        },
    );
    out(pp, p.cast())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    guard(|| host_alloc(pp, size, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| host_alloc(pp, size, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        if g.host.get(&(p as usize)).is_some_and(|h| h.device_mapped) {
            g.host.remove(&(p as usize));
            drop(g);
            return free(p as usize as u64);
        }
        match g.host.get(&(p as usize)) {
            Some(h) if !h.registered => {
                let h = *h;
                g.host.remove(&(p as usize));
                let layout =
                    Layout::from_size_align(h.size, HOST_ALIGN).map_err(|_| INVALID_VALUE)?;
                // SAFETY: `p` was returned by `alloc_zeroed` with this layout in `host_alloc` and
                // is removed from the table, so it is freed once.
                unsafe { std::alloc::dealloc(p.cast(), layout) };
                Ok(())
            }
            _ => Err(INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if p.is_null() || size == 0 {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let mut g = s.lock();
        if g.find_host(p as usize).is_some() {
            return Err(crate::status::HOST_MEMORY_ALREADY_REGISTERED);
        }
        g.host.insert(
            p as usize,
            HostAllocation {
                size,
                flags,
                registered: true,
                device_mapped: false,
            },
        );
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        match g.host.get(&(p as usize)) {
            Some(h) if h.registered => {
                g.host.remove(&(p as usize));
                Ok(())
            }
            _ => Err(crate::status::HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    guard(|| {
        let s = session()?;
        let (_, h) = s.lock().find_host(p as usize).ok_or(INVALID_VALUE)?;
        out(flags, h.flags)
    })
}

/// Mapped pinned memory has the same address on the device (unified addressing). Registered
/// memory cannot be reached by a device in another process: not supported.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let g = s.lock();
        match g.find_host(p as usize) {
            Some((_, h)) if h.device_mapped => out(d, p as usize as u64),
            Some((_, h)) if h.registered => Err(NOT_SUPPORTED),
            _ => Err(INVALID_VALUE),
        }
    })
}

// CUpointer_attribute ids.
const P_CONTEXT: c_int = 1;
const P_MEMORY_TYPE: c_int = 2;
const P_DEVICE_POINTER: c_int = 3;
const P_HOST_POINTER: c_int = 4;
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

/// Writes one attribute. Returns false if the pointer is not CUDA memory.
fn write_attribute(
    g: &Inner,
    attr: c_int,
    data: *mut c_void,
    ptr: u64,
    unknown_ok: bool,
) -> Result<(), CUresult> {
    let kind = classify(g, ptr);
    let primary =
        |d: u32| g.primary.get(d as usize).map(|p| p.handle).unwrap_or(0) as usize as CUcontext;
    let (base, size, device, mem_type) = match kind {
        PointerKind::Device { base, size, device } => {
            (base, size, device as c_int, MEMORYTYPE_DEVICE)
        }
        PointerKind::Host { base, size } => (base as u64, size as u64, 0, MEMORYTYPE_HOST),
        PointerKind::Unknown if unknown_ok => {
            // "Default NULL values" for a non-CUDA pointer (cuda.h): what CuPy expects.
            return match attr {
                P_CONTEXT | P_HOST_POINTER | P_RANGE_START | P_MEMPOOL | P_MAPPING_BASE => {
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
    match attr {
        P_CONTEXT => out(data.cast::<CUcontext>(), primary(device as u32)),
        P_MEMORY_TYPE => out(data.cast::<u32>(), mem_type),
        P_DEVICE_POINTER => out(data.cast::<u64>(), ptr),
        P_HOST_POINTER => out(
            data.cast::<*mut c_void>(),
            if mem_type == MEMORYTYPE_HOST {
                ptr as usize as *mut c_void
            } else {
                std::ptr::null_mut()
            },
        ),
        P_IS_MANAGED => out(
            data.cast::<u32>(),
            (mem_type == MEMORYTYPE_DEVICE
                && g.find_allocation(ptr, 1).is_some_and(|(_, a)| a.managed)) as u32,
        ),
        P_SYNC_MEMOPS | P_IS_LEGACY_IPC | P_GDR_CAPABLE => out(data.cast::<u32>(), 0),
        P_MAPPED => out(data.cast::<u32>(), 1),
        P_BUFFER_ID | P_BLOCK_ID => out(data.cast::<u64>(), base),
        P_DEVICE_ORDINAL => out(data.cast::<c_int>(), device),
        P_RANGE_START | P_MAPPING_BASE => out(data.cast::<u64>(), base),
        P_RANGE_SIZE | P_MAPPING_SIZE => out(data.cast::<usize>(), size as usize),
        P_ALLOWED_HANDLE_TYPES => out(data.cast::<u64>(), 0),
        P_ACCESS_FLAGS => out(data.cast::<c_int>(), 3),
        P_MEMPOOL => out(data.cast::<*mut c_void>(), std::ptr::null_mut()),
        _ => Err(INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
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
    guard(|| {
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
