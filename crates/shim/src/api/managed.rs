//! Managed memory (`cuMemAllocManaged`, `cudaMallocManaged`) for a device in another process.
//!
//! A managed allocation is a device allocation (charged to the session's slice like any other)
//! plus an anonymous mapping of the same size at the same address in this process, so that the
//! one pointer works on the host and in kernels. The two copies follow the rule CUDA applies
//! where the device does not report concurrent managed access (`CONCURRENT_MANAGED_ACCESS` is
//! 0, as the client reports it): the host may touch managed memory only while no device work is
//! outstanding. So ownership moves at two points:
//!
//! - before the first device work (a launch, copy or memset) after the host had the memory,
//!   every managed allocation is copied to the device ([`to_device`]);
//! - when a synchronizing call (context, stream or event synchronize) returns after device work,
//!   every managed allocation is copied back ([`to_host`]).
//!
//! Whole allocations move each time (no dirty-page tracking yet): correct, and cheap for the
//! small managed buffers programs usually have.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::state::{Allocation, Inner};
use gpufuse_proto::{ReplyBody, Request, MAX_COPY_CHUNK};

use crate::api::context::{client_err, current};
use crate::api::memory::CUdeviceptr;
use crate::ffi::out;
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE, OUT_OF_MEMORY, UNKNOWN};

const ATTACH_GLOBAL: c_uint = 1;
const ATTACH_HOST: c_uint = 2;

fn page() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
}

fn page_len(size: u64) -> usize {
    size.div_ceil(page()).saturating_mul(page()) as usize
}

/// Maps `size` bytes at exactly `addr` in this process, or fails without touching anything
/// already mapped there.
fn map_at(addr: u64, size: u64) -> bool {
    let len = page_len(size);
    // SAFETY: an anonymous private mapping with MAP_FIXED_NOREPLACE never replaces an existing
    // mapping; the result is checked before the memory is used.
    let got = unsafe {
        libc::mmap(
            addr as usize as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return false;
    }
    if got as usize as u64 != addr {
        // A kernel without MAP_FIXED_NOREPLACE placed it elsewhere.
        // SAFETY: `got` is the mapping just made, of `len` bytes.
        unsafe { libc::munmap(got, len) };
        return false;
    }
    true
}

/// Removes the host mapping of a managed allocation.
pub fn unmap(addr: u64, size: u64) {
    // SAFETY: the range is the mapping `map_at` made for this allocation, which the session
    // no longer hands out.
    unsafe { libc::munmap(addr as usize as *mut c_void, page_len(size)) };
}

fn alloc_managed(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) -> Result<(), CUresult> {
    if size == 0 || !matches!(flags, ATTACH_GLOBAL | ATTACH_HOST) {
        return Err(INVALID_VALUE);
    }
    let s = session()?;
    let mut g = s.lock();
    let p = alloc_mirrored(&mut g, size)?;
    out(dptr, p)
}

/// A device allocation of `size` bytes with host pages at the same address, moved like managed
/// memory (managed memory, and mapped pinned memory: `CU_MEMHOSTALLOC_DEVICEMAP`).
pub(crate) fn alloc_mirrored(g: &mut Inner, size: usize) -> Result<u64, CUresult> {
    let (_, device) = current(g)?;
    // Host pages must start at the device address: the server's allocation gets a page more,
    // and the managed pointer is its first page boundary (what the slice is charged for
    // includes that page and the rounding up to whole pages).
    let server_size = page_len(size as u64) as u64 + page();
    let ReplyBody::Ptr(base) = g
        .conn
        .call(&Request::MemAlloc {
            device,
            size: server_size,
        })
        .map_err(client_err)?
    else {
        return Err(UNKNOWN);
    };
    let p = base.div_ceil(page()) * page();
    if !map_at(p, size as u64) {
        g.conn
            .quiet(&Request::MemFree { ptr: base })
            .map_err(client_err)?;
        return Err(OUT_OF_MEMORY);
    }
    // The new device memory must not be overwritten by a stale host copy, nor the zeroed host
    // copy by the device's: both are zero, and the next device work copies the host's over.
    g.allocations.insert(
        p,
        Allocation {
            size: size as u64,
            device,
            pool: None,
            managed: true,
            mapped: false,
            offset: p - base,
        },
    );
    g.managed_count += 1;
    g.managed_on_device = false;
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| alloc_managed(dptr, size, flags))
}

fn managed_ranges(g: &Inner) -> Vec<(u64, u64)> {
    g.allocations
        .iter()
        .filter(|(_, a)| a.managed)
        .map(|(&p, a)| (p, a.size))
        .collect()
}

/// Before device work: the device gets the host's copy of managed memory, if the host had it.
pub fn to_device(g: &mut Inner) -> Result<(), CUresult> {
    if g.managed_on_device || g.managed_count == 0 {
        return Ok(());
    }
    g.managed_on_device = true;
    for (p, size) in managed_ranges(g) {
        // SAFETY: `[p, p+size)` is this allocation's host mapping (`map_at`), alive until the
        // allocation is freed, which needs the session lock held here.
        let host = unsafe { std::slice::from_raw_parts(p as usize as *const u8, size as usize) };
        for (i, chunk) in host.chunks(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyHtoD {
                dst: p + (i * MAX_COPY_CHUNK) as u64,
                stream: 0,
                data: chunk,
            };
            g.conn.quiet(&req).map_err(client_err)?;
        }
    }
    Ok(())
}

/// After a synchronizing call: the host gets the device's copy back, if device work ran.
pub fn to_host(g: &mut Inner) -> Result<(), CUresult> {
    if !g.managed_on_device || g.managed_count == 0 {
        return Ok(());
    }
    g.managed_on_device = false;
    for (p, size) in managed_ranges(g) {
        // SAFETY: as in `to_device`; the host does not touch managed memory while device work
        // is outstanding (CONCURRENT_MANAGED_ACCESS is 0), and this runs after a synchronize.
        let host = unsafe { std::slice::from_raw_parts_mut(p as usize as *mut u8, size as usize) };
        for (i, chunk) in host.chunks_mut(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyDtoH {
                src: p + (i * MAX_COPY_CHUNK) as u64,
                size: chunk.len() as u64,
                stream: 0,
            };
            g.conn.call_read_into(&req, chunk).map_err(client_err)?;
        }
    }
    Ok(())
}

/// The managed allocation holding `[ptr, ptr+count)`.
fn managed_range(g: &Inner, ptr: u64, count: usize) -> Result<(), CUresult> {
    match g.find_allocation(ptr, count as u64) {
        Some((_, a)) if a.managed => Ok(()),
        _ => Err(INVALID_VALUE),
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
    guard(|| managed_range(&session()?.lock(), ptr, count))
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
        managed_range(&session()?.lock(), ptr, count)
    })
}

/// `CUmemLocation`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    count: usize,
    _location: MemLocation,
    _flags: c_uint,
    _stream: *mut c_void,
) -> CUresult {
    guard(|| managed_range(&session()?.lock(), ptr, count))
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
