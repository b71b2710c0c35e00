//! Kernel launches: arguments are packed at the device-side offsets the function's layout
//! gives and sent as one quiet request.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_proto::{Launch, Request};

use crate::api::context::client_err;
use crate::api::module::CUfunction;
use crate::api::stream::{stream_id, CUstream};
use crate::ffi::{host_bytes, read, read_at};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE};

const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
/// Largest parameter buffer a launch may carry (CUDA 12.1+: 32764 bytes).
const MAX_PARAM_BYTES: usize = 32764;

/// Packs `kernelParams` (one pointer per parameter) or `extra` (a pre-packed buffer).
pub(crate) fn pack(
    layout: &[gpufuse_proto::ParamSlot],
    params: *const *const c_void,
    extra: *const *const c_void,
) -> Result<Vec<u8>, CUresult> {
    match (params.is_null(), extra.is_null()) {
        (false, false) => Err(INVALID_VALUE),
        (true, true) => {
            if layout.is_empty() {
                Ok(Vec::new())
            } else {
                Err(INVALID_VALUE)
            }
        }
        (false, true) => {
            let len = layout
                .iter()
                .map(|p| (p.offset + p.size) as usize)
                .max()
                .unwrap_or(0);
            let mut buf = vec![0u8; len];
            for (i, slot) in layout.iter().enumerate() {
                let arg = read_at(params, i)?;
                let bytes = host_bytes(arg, slot.size as usize)?;
                buf[slot.offset as usize..(slot.offset + slot.size) as usize]
                    .copy_from_slice(bytes);
            }
            Ok(buf)
        }
        (true, false) => {
            let (mut buffer, mut size) = (std::ptr::null::<c_void>(), None::<usize>);
            for i in (0..64).step_by(2) {
                match read_at(extra, i)? as usize {
                    PARAM_END => break,
                    PARAM_BUFFER_POINTER => buffer = read_at(extra, i + 1)?,
                    PARAM_BUFFER_SIZE => size = Some(read(read_at(extra, i + 1)?.cast::<usize>())?),
                    _ => return Err(INVALID_VALUE),
                }
            }
            let size = size.ok_or(INVALID_VALUE)?;
            if size > MAX_PARAM_BYTES {
                return Err(INVALID_VALUE);
            }
            Ok(host_bytes(buffer, size)?.to_vec())
        }
    }
}

struct Dims {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
}

fn launch(
    f: CUfunction,
    dims: Dims,
    stream: CUstream,
    params: *const *const c_void,
    extra: *const *const c_void,
    attributes: Vec<(u32, [u64; 8])>,
) -> Result<(), CUresult> {
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
    let s = session()?;
    let mut g = s.lock();
    let st = stream_id(&g, stream)?;
    let function = g
        .resolve_function(f as usize as u64)
        .ok_or(INVALID_HANDLE)?;
    let packed = pack(&g.functions[&function].info.params, params, extra)?;
    send_launch(
        &mut g,
        function,
        dims.grid,
        dims.block,
        dims.shared_mem,
        st,
        packed,
        attributes,
    )
}

/// Sends a launch, or records it if `stream` is capturing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_launch(
    g: &mut gpufuse_client::state::Inner,
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    st: u64,
    packed: Vec<u8>,
    attributes: Vec<(u32, [u64; 8])>,
) -> Result<(), CUresult> {
    let op = gpufuse_client::graph::Op::Launch {
        function,
        grid,
        block,
        shared_mem,
        params: packed,
        attributes,
    };
    let Some(gpufuse_client::graph::Op::Launch {
        params: packed,
        attributes,
        ..
    }) = g.graphs.record(st, op)
    else {
        return Ok(());
    };
    let dims = Dims {
        grid,
        block,
        shared_mem,
    };
    crate::api::managed::to_device(g)?;
    let req = Request::LaunchKernel(Launch {
        function,
        grid: dims.grid,
        block: dims.block,
        shared_mem: dims.shared_mem,
        stream: st,
        params: &packed,
        attributes,
    });
    g.conn.quiet(&req).map_err(client_err)
}

macro_rules! launch_kernel {
    ($($name:ident),*) => {$(
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
            guard(|| launch(f, Dims { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem }, stream, params, extra, Vec::new()))
        }
    )*};
}

launch_kernel!(cuLaunchKernel, cuLaunchKernel_ptsz);

macro_rules! launch_cooperative {
    ($($name:ident),*) => {$(
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
            guard(|| launch(f, Dims { grid: [gx, gy, gz], block: [bx, by, bz], shared_mem }, stream, params, std::ptr::null(), coop))
        }
    )*};
}

const LAUNCH_ATTRIBUTE_COOPERATIVE: u32 = 2;
/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`.
const COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;

launch_cooperative!(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz);

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: CUstream,
    pub attrs: *const LaunchAttribute,
    pub num_attrs: c_uint,
}

/// `CUlaunchAttribute`: an id and a 64-byte value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    pub value: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LaunchConfig>() == 56);
const _: () = assert!(std::mem::size_of::<LaunchAttribute>() == 72);

fn launch_ex(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *const *const c_void,
    extra: *const *const c_void,
) -> Result<(), CUresult> {
    let c = read(config)?;
    let mut attributes = Vec::with_capacity(c.num_attrs as usize);
    for i in 0..c.num_attrs as usize {
        let a = read_at(c.attrs, i)?;
        attributes.push((a.id, a.value));
    }
    launch(
        f,
        Dims {
            grid: c.grid,
            block: c.block,
            shared_mem: c.shared_mem,
        },
        c.stream,
        params,
        extra,
        attributes,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *const *const c_void,
    extra: *const *const c_void,
) -> CUresult {
    guard(|| launch_ex(config, f, params, extra))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *const *const c_void,
    extra: *const *const c_void,
) -> CUresult {
    guard(|| launch_ex(config, f, params, extra))
}

include!(concat!(env!("OUT_DIR"), "/aliases_launch.rs"));
