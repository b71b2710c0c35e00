//! Occupancy, from the device's limits and the function's attributes: blocks per
//! multiprocessor, the block size that fills a multiprocessor, dynamic shared memory left, and
//! thread-block clusters (the device model schedules a cluster's blocks on any multiprocessors;
//! it has no GPC partitioning).

use std::ffi::{c_int, c_uint, c_void};

use crate::api::launch::LaunchConfig;
use crate::api::module::{h, with_function};
use crate::ffi::{out, read, read_at};
use crate::global::{client_err, session};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE};

use crate::api::module::CUfunction;

const FUNC_MAX_THREADS: c_int = 0;
const FUNC_SHARED: c_int = 1;

/// Blocks per multiprocessor, as the device serving the session decides
/// (`gpufuse_client::Session::occupancy`): a real GPU's driver on the cuda backend, the model's
/// allocation rules on the emulated GPU (`gpufuse_device::model::blocks_per_sm`).
fn occupancy_with(
    f: *mut c_void,
    block: c_int,
    dyn_smem: usize,
    flags: c_uint,
) -> Result<c_int, CUresult> {
    let block = u32::try_from(block)
        .ok()
        .filter(|&b| b > 0)
        .ok_or(INVALID_VALUE)?;
    session()?
        .occupancy(h(f), block, dyn_smem as u64, flags)
        .map_err(client_err)
}

fn occupancy(f: *mut c_void, block: c_int, dyn_smem: usize) -> Result<c_int, CUresult> {
    occupancy_with(f, block, dyn_smem, 0)
}

/// Blocks of `block` threads with `dyn_smem` bytes of dynamic shared memory that the
/// function's device holds at once: the occupancy times the multiprocessors. A cooperative
/// launch may have no more (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`); the device checks the
/// same figure again when it launches.
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
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(n, occupancy_with(f, block, smem, flags)?) })
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
            // Ties go to the larger block, as NVIDIA's driver chooses.
            if blocks * b >= best_threads && blocks > 0 {
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

/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
const FUNC_MAX_DYNAMIC_SHARED: c_int = 8;
/// Shared memory the driver reserves for each block (`CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK`).
const DEVICE_RESERVED_SHARED_PER_BLOCK: c_int = 111;
const DEVICE_SHARED_PER_SM: c_int = 81;

#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    size: *mut usize,
    f: CUfunction,
    blocks: c_int,
    block: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if blocks <= 0 || block <= 0 {
            return Err(INVALID_VALUE);
        }
        // `blocks` blocks of `block` threads must fit one multiprocessor at all, with no shared
        // memory (NVIDIA's driver: CUDA_ERROR_INVALID_VALUE otherwise).
        if occupancy(f, block, 0)? < blocks {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let static_smem = function_attribute(f, FUNC_SHARED)?.unwrap_or(0).max(0) as usize;
        let opt_in = function_attribute(f, FUNC_MAX_DYNAMIC_SHARED)?
            .unwrap_or(0)
            .max(0) as usize;
        let per_sm = s.attribute(0, DEVICE_SHARED_PER_SM).unwrap_or(0).max(0) as usize;
        let reserved = s
            .attribute(0, DEVICE_RESERVED_SHARED_PER_BLOCK)
            .unwrap_or(0)
            .max(0) as usize;
        // Each block's share of the multiprocessor, less what the driver reserves and the
        // function's own, in 128-byte units; never more than the function opted into.
        let share = (per_sm / blocks as usize).saturating_sub(reserved + static_smem) / 128 * 128;
        out(size, share.min(opt_in))
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
    with_function(f, |func| Ok(func.attribute(attr)))
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
        // A cluster larger than the function may use fits nowhere: none are active (cuDNN
        // probes sizes 17 and 32 on compute capability 10.0 and reads the count; an error there
        // made it dereference NULL, issue 27).
        if cluster > limit {
            return Ok(0);
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
