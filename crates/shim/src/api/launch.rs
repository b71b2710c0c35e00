//! Kernel launches: arguments are packed at the device-side offsets the function's layout
//! gives and sent as one quiet request. A launch on a stream other than the legacy default
//! stream goes through the stream's lane, without the session lock (`gpufuse_client::lanes`);
//! the `_ptsz` exports name the calling thread's per-thread default stream with NULL.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::lanes::StreamRef;
use gpufuse_client::launch::{pack_params, KernelLaunch, MAX_PARAM_BYTES};
use gpufuse_client::ClientError;

use crate::api::context::client_err;
use crate::api::module::CUfunction;
use crate::api::stream::CUstream;
use crate::ffi::{host_bytes, read, read_at};
use crate::global::with_session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE};

const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// Reads `kernelParams` (one pointer per parameter) or `extra` (a pre-packed buffer) from the
/// application; the client core packs them at the layout's offsets.
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
pub(crate) unsafe fn pack(
    layout: &[gpufuse_proto::ParamSlot],
    params: *const *const c_void,
    extra: *const *const c_void,
) -> Result<Vec<u8>, CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        match (params.is_null(), extra.is_null()) {
            (false, false) => Err(INVALID_VALUE),
            (true, true) => {
                if layout.is_empty() {
                    Ok(Vec::new())
                } else {
                    Err(INVALID_VALUE)
                }
            }
            (false, true) => pack_params(layout, |i, size| {
                let arg = read_at(params, i).map_err(ClientError::Cuda)?;
                // SAFETY: `kernelParams[i]` points at the parameter's value, `size` bytes as the
                // kernel declares it; read during this call only.
                host_bytes(arg, size).map_err(ClientError::Cuda)
            })
            .map_err(client_err),
            (true, false) => {
                let (mut buffer, mut size) = (std::ptr::null::<c_void>(), None::<usize>);
                for i in (0..64).step_by(2) {
                    match read_at(extra, i)? as usize {
                        PARAM_END => break,
                        PARAM_BUFFER_POINTER => buffer = read_at(extra, i + 1)?,
                        PARAM_BUFFER_SIZE => {
                            size = Some(read(read_at(extra, i + 1)?.cast::<usize>())?)
                        }
                        _ => return Err(INVALID_VALUE),
                    }
                }
                let size = size.ok_or(INVALID_VALUE)?;
                if size > MAX_PARAM_BYTES {
                    return Err(INVALID_VALUE);
                }
                // SAFETY: `extra` says the buffer holds `size` bytes; copied during this call.
                Ok(host_bytes(buffer, size)?.to_vec())
            }
        }
    }
}

struct Dims {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn launch(
    f: CUfunction,
    dims: Dims,
    stream: StreamRef,
    params: *const *const c_void,
    extra: *const *const c_void,
    attributes: Vec<(u32, [u64; 8])>,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if dims.grid.contains(&0) || dims.block.contains(&0) {
            return Err(INVALID_VALUE);
        }
        let cooperative = attributes
            .iter()
            .any(|&(id, v)| id == LAUNCH_ATTRIBUTE_COOPERATIVE && v[0] as u32 != 0);
        if cooperative {
            // Every block of a cooperative grid must be resident at once, as the driver checks
            // when the launch is made.
            let threads: u64 = dims.block.iter().map(|&d| d as u64).product();
            let blocks: u64 = dims.grid.iter().map(|&d| d as u64).product();
            let threads = c_int::try_from(threads).map_err(|_| INVALID_VALUE)?;
            let fits = crate::api::occupancy::coresident(f, threads, dims.shared_mem as usize)?;
            if blocks > fits {
                return Err(COOPERATIVE_LAUNCH_TOO_LARGE);
            }
        }
        let launch = KernelLaunch {
            function: f as usize as u64,
            grid: dims.grid,
            block: dims.block,
            shared_mem: dims.shared_mem,
            stream,
            attributes,
        };
        with_session(|s| {
            s.launch_kernel(launch, &mut |layout| {
                pack(layout, params, extra).map_err(ClientError::Cuda)
            })
            .map_err(client_err)
        })
    }
}

/// The stream a launch export names: NULL is the per-thread default stream through a `_ptsz`
/// export, the legacy default stream otherwise.
fn stream_ref(stream: CUstream, per_thread_default: bool) -> StreamRef {
    StreamRef {
        handle: stream as usize as u64,
        per_thread_default,
    }
}

macro_rules! launch_kernel {
    ($($name:ident: $per_thread:expr),*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint, gy: c_uint, gz: c_uint,
            bx: c_uint, by: c_uint, bz: c_uint,
            shared_mem: c_uint,
            stream: CUstream,
            params: *const *const c_void,
            extra: *const *const c_void,
        ) -> CUresult {
            // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
            guard(|| unsafe { launch(f, Dims { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem }, stream_ref(stream, $per_thread), params, extra, Vec::new()) })
        }
    )*};
}

launch_kernel!(cuLaunchKernel: false, cuLaunchKernel_ptsz: true);

macro_rules! launch_cooperative {
    ($($name:ident: $per_thread:expr),*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gx: c_uint, gy: c_uint, gz: c_uint,
            bx: c_uint, by: c_uint, bz: c_uint,
            shared_mem: c_uint,
            stream: CUstream,
            params: *const *const c_void,
        ) -> CUresult {
            let coop = vec![(LAUNCH_ATTRIBUTE_COOPERATIVE, [1, 0, 0, 0, 0, 0, 0, 0])];
            // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
            guard(|| unsafe { launch(f, Dims { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem }, stream_ref(stream, $per_thread), params, std::ptr::null(), coop) })
        }
    )*};
}

const LAUNCH_ATTRIBUTE_COOPERATIVE: u32 = 2;
/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`.
const COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;

launch_cooperative!(
    cuLaunchCooperativeKernel: false,
    cuLaunchCooperativeKernel_ptsz: true
);

/// `CUlaunchConfig` (generated from NVIDIA's header).
pub type LaunchConfig = gpufuse_cuda_types::structs::CUlaunchConfig;

/// `CUlaunchAttribute`: an id and a 64-byte union of values.
pub type LaunchAttribute = gpufuse_cuda_types::structs::CUlaunchAttribute;

/// A launch attribute as the client core takes it: its id and its value's 64 bytes as words.
pub fn attribute_words(a: &LaunchAttribute) -> (u32, [u64; 8]) {
    // SAFETY: `pad` spans the whole union, and every member is plain data (integers, handles
    // as values): any bytes the application wrote are a valid value.
    let bytes = unsafe { a.value.pad }.map(|b| b as u8);
    let mut words = [0u64; 8];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
    }
    (a.id as u32, words)
}

/// The grid and block of a launch configuration.
pub fn config_dims(c: &LaunchConfig) -> ([c_uint; 3], [c_uint; 3]) {
    (
        [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z],
        [c.block_dim_x, c.block_dim_y, c.block_dim_z],
    )
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn launch_ex(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *const *const c_void,
    extra: *const *const c_void,
    per_thread_default: bool,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let c = read(config)?;
        let mut attributes = Vec::with_capacity(c.num_attrs as usize);
        for i in 0..c.num_attrs as usize {
            let a = read_at(c.attrs.cast_const(), i)?;
            attributes.push(attribute_words(&a));
        }
        let (grid, block) = config_dims(&c);
        launch(
            f,
            Dims {
                grid,
                block,
                shared_mem: c.shared_mem_bytes,
            },
            stream_ref(c.h_stream, per_thread_default),
            params,
            extra,
            attributes,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *const *const c_void,
    extra: *const *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { launch_ex(config, f, params, extra, false) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *const *const c_void,
    extra: *const *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { launch_ex(config, f, params, extra, true) })
}

include!(concat!(env!("OUT_DIR"), "/aliases_launch.rs"));
