//! Occupancy, from the device's limits and the function's attributes: blocks per
//! multiprocessor, the block size that fills a multiprocessor, dynamic shared memory left, and
//! thread-block clusters (the device model schedules a cluster's blocks on any multiprocessors;
//! it has no GPC partitioning).

use std::ffi::{c_int, c_uint, c_void};

use crate::api::launch::LaunchConfig;
use crate::api::module::{h, with_function};
use crate::ffi::{out, read, read_at};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE};

use crate::api::module::CUfunction;

const FUNC_MAX_THREADS: c_int = 0;
const FUNC_SHARED: c_int = 1;
const FUNC_NUM_REGS: c_int = 4;

fn occupancy(f: *mut c_void, block: c_int, dyn_smem: usize) -> Result<c_int, CUresult> {
    if block <= 0 {
        return Err(INVALID_VALUE);
    }
    let s = session()?;
    let (device, attrs) = {
        let g = s.lock();
        let func = g.function_info(h(f)).map_err(|_| INVALID_HANDLE)?;
        (
            g.module_device(func.module).unwrap_or(0),
            func.info.attributes.clone(),
        )
    };
    let fa = |a: c_int| attrs.iter().find(|(k, _)| *k == a).map_or(0, |&(_, v)| v);
    let da = |a: c_int| s.attribute(device as c_int, a).unwrap_or(0);
    let max_threads = fa(FUNC_MAX_THREADS).max(1);
    if block > max_threads {
        return Ok(0);
    }
    let by_threads = da(39) / block; // max threads per multiprocessor
    let by_blocks = da(106); // max blocks per multiprocessor
    let regs = fa(FUNC_NUM_REGS).max(1) * block;
    let by_regs = da(82) / regs.max(1); // registers per multiprocessor
    let smem = fa(FUNC_SHARED) as usize + dyn_smem;
    let by_smem = (da(81) as usize)
        .checked_div(smem)
        .map_or(c_int::MAX, |n| n.min(c_int::MAX as usize) as c_int);
    Ok(by_threads.min(by_blocks).min(by_regs).min(by_smem).max(0))
}

/// Blocks of `block` threads with `dyn_smem` bytes of dynamic shared memory that the
/// function's device holds at once: the occupancy times the multiprocessors. A cooperative
/// launch may have no more (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`); the worker checks the
/// same figure again (`gpufuse_device::model::coresident_blocks`).
pub(crate) fn coresident(f: *mut c_void, block: c_int, dyn_smem: usize) -> Result<u64, CUresult> {
    let per_sm = occupancy(f, block, dyn_smem)?;
    let s = session()?;
    let device = {
        let g = s.lock();
        let func = g.function_info(h(f)).map_err(|_| INVALID_HANDLE)?;
        g.module_device(func.module).unwrap_or(0)
    };
    let sms = s.attribute(device as c_int, 16).unwrap_or(1);
    Ok(per_sm.max(0) as u64 * sms.max(0) as u64)
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(n, occupancy(f, block, smem)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(n, occupancy(f, block, smem)?) })
}

pub type SmemForBlock = Option<unsafe extern "C" fn(c_int) -> usize>;
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn potential_block(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: *mut c_void,
    cb: SmemForBlock,
    smem: usize,
    limit: c_int,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let s = session()?;
        let max_threads = function_attribute(f, FUNC_MAX_THREADS)?.unwrap_or(1024);
        let limit = if limit <= 0 {
            max_threads
        } else {
            limit.min(max_threads)
        };
        let sms = s.attribute(0, 16).unwrap_or(1);
        let (mut best_block, mut best_threads) = (32.min(limit).max(1), 0);
        let mut b = 32;
        while b <= limit {
            // SAFETY: the application supplied this callback for exactly this use.
            let sm = cb.map_or(smem, |c| c(b));
            let blocks = occupancy(f, b, sm)?;
            if blocks * b > best_threads {
                best_threads = blocks * b;
                best_block = b;
            }
            b += 32;
        }
        let per_sm = occupancy(f, best_block, cb.map_or(smem, |_| smem))?.max(1);
        out(block, best_block)?;
        out(min_grid, per_sm * sms)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    cb: SmemForBlock,
    smem: usize,
    limit: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { potential_block(min_grid, block, f, cb, smem, limit) })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    cb: SmemForBlock,
    smem: usize,
    limit: c_int,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { potential_block(min_grid, block, f, cb, smem, limit) })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    size: *mut usize,
    f: CUfunction,
    _blocks: c_int,
    _block: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let static_smem = function_attribute(f, FUNC_SHARED)?.unwrap_or(0);
        let per_block = s.attribute(0, 97).unwrap_or(0); // opt-in shared memory per block
        out(size, (per_block - static_smem).max(0) as usize)
    })
}

const FUNC_CLUSTER_WIDTH: c_int = 11;
const FUNC_CLUSTER_HEIGHT: c_int = 12;
const FUNC_CLUSTER_DEPTH: c_int = 13;
const FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;
const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: c_uint = 4;
/// The largest cluster a kernel may use without opting in, and with it (as on sm_90/sm_100).
const PORTABLE_CLUSTER: c_int = 8;
const NON_PORTABLE_CLUSTER: c_int = 16;
const INVALID_CLUSTER_SIZE: CUresult = 912;

/// What a cluster query needs from a launch configuration: threads per block, dynamic shared
/// memory, and the cluster size it asks for (x * y * z), if any.
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn cluster_config(
    config: *const LaunchConfig,
) -> Result<(c_int, usize, Option<c_int>), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let c = read(config)?;
        let (_, block) = crate::api::launch::config_dims(&c);
        let threads = block
            .iter()
            .try_fold(1i64, |n, &d| (d > 0).then(|| n * i64::from(d)));
        let threads = threads
            .and_then(|t| c_int::try_from(t).ok())
            .ok_or(INVALID_VALUE)?;
        let mut cluster = None;
        for i in 0..c.num_attrs as usize {
            let a = read_at(c.attrs.cast_const(), i)?;
            if a.id as u32 == LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
                // SAFETY: every member of the value union is plain data; any bytes are valid.
                let d = a.value.cluster_dim;
                let dims = [d.x, d.y, d.z];
                let size = dims
                    .iter()
                    .try_fold(1i64, |n, &d| (d > 0).then(|| n * i64::from(d)));
                cluster = Some(
                    size.and_then(|s| c_int::try_from(s).ok())
                        .ok_or(INVALID_CLUSTER_SIZE)?,
                );
            }
        }
        Ok((threads, c.shared_mem_bytes as usize, cluster))
    }
}

/// One of the function's attributes (`CUfunction_attribute`), if the server gave it.
fn function_attribute(f: CUfunction, attr: c_int) -> Result<Option<c_int>, CUresult> {
    with_function(f, |func| {
        Ok(func
            .info
            .attributes
            .iter()
            .find(|(a, _)| *a == attr)
            .map(|&(_, v)| v))
    })
}

/// The function's compiled-in cluster size (0 when it has none) and its largest allowed one.
fn function_cluster(f: CUfunction) -> Result<(c_int, c_int), CUresult> {
    let fa = |a: c_int| function_attribute(f, a).map(|v| v.unwrap_or(0).max(0));
    let required = fa(FUNC_CLUSTER_WIDTH)? * fa(FUNC_CLUSTER_HEIGHT)? * fa(FUNC_CLUSTER_DEPTH)?;
    let limit = if fa(FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)? != 0 {
        NON_PORTABLE_CLUSTER
    } else {
        PORTABLE_CLUSTER
    };
    Ok((required, limit))
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn max_active_clusters(
    f: CUfunction,
    config: *const LaunchConfig,
) -> Result<c_int, CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let (threads, smem, asked) = cluster_config(config)?;
        let (required, limit) = function_cluster(f)?;
        let cluster = match (asked, required) {
            (Some(a), r) if r == 0 || r == a => a,
            (None, r) if r > 0 => r,
            _ => return Err(INVALID_CLUSTER_SIZE),
        };
        if cluster > limit {
            return Err(INVALID_CLUSTER_SIZE);
        }
        let sms = session()?.attribute(0, 16).unwrap_or(1); // multiprocessor count
        Ok(occupancy(f, threads, smem)? * sms / cluster)
    }
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn max_potential_cluster_size(
    f: CUfunction,
    config: *const LaunchConfig,
) -> Result<c_int, CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let (threads, smem, _) = cluster_config(config)?;
        let (required, limit) = function_cluster(f)?;
        if occupancy(f, threads, smem)? == 0 {
            return Ok(0);
        }
        Ok(if required > 0 { required } else { limit })
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    n: *mut c_int,
    f: CUfunction,
    config: *const LaunchConfig,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(n, max_active_clusters(f, config)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut c_int,
    f: CUfunction,
    config: *const LaunchConfig,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(size, max_potential_cluster_size(f, config)?) })
}

include!(concat!(env!("OUT_DIR"), "/aliases_occupancy.rs"));
