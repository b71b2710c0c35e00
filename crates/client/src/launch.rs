//! Kernel launches: arguments packed at the device-side offsets the function's layout gives
//! (the layout came back from the worker with the function), sent as one quiet request, or
//! recorded when the stream is capturing a graph.
//!
//! [`Session::launch_kernel`] is the one entry for a launch as the application names it: on a
//! stream other than the legacy default stream it goes through that stream's lane without the
//! session lock once the locked path has granted it ([`crate::lanes`]).

use std::sync::Arc;

use gpufuse_proto::{Launch, ParamSlot, Request};

use crate::error::ClientError;
use crate::graph::Op;
use crate::lanes::{Fast, StreamRef, Target};
use crate::state::{Inner, Session};
use crate::status::{INVALID_HANDLE, INVALID_VALUE};
use gpufuse_proto::{FunctionHandle, StreamHandle};

/// Largest parameter buffer a launch may carry (CUDA 12.1+: 32764 bytes).
pub const MAX_PARAM_BYTES: usize = 32764;

/// A launch's shape and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: u64,
    /// `CUlaunchAttribute`s: id and value.
    pub attributes: Vec<(u32, [u64; 8])>,
}

/// Packs one value per parameter (`arg(i, size)` gives parameter `i`'s `size` bytes, as
/// `kernelParams` points at them) into the buffer the layout describes.
pub fn pack_params<'a>(
    layout: &[ParamSlot],
    mut arg: impl FnMut(usize, usize) -> Result<&'a [u8], ClientError>,
) -> Result<Vec<u8>, ClientError> {
    let len = layout
        .iter()
        .map(|p| p.offset as usize + p.size as usize)
        .max()
        .unwrap_or(0);
    if len > MAX_PARAM_BYTES {
        return Err(INVALID_VALUE.into());
    }
    let mut buf = vec![0u8; len];
    for (i, slot) in layout.iter().enumerate() {
        let (at, size) = (slot.offset as usize, slot.size as usize);
        let bytes = arg(i, size)?;
        buf.get_mut(at..at + size)
            .filter(|_| bytes.len() == size)
            .ok_or(ClientError::Cuda(INVALID_VALUE))?
            .copy_from_slice(bytes);
    }
    Ok(buf)
}

/// Checks a pre-packed parameter buffer (`extra`'s `CU_LAUNCH_PARAM_BUFFER_POINTER`).
pub fn check_packed(buffer: &[u8]) -> Result<(), ClientError> {
    if buffer.len() > MAX_PARAM_BYTES {
        return Err(INVALID_VALUE.into());
    }
    Ok(())
}

impl LaunchConfig {
    /// A launch with no grid or no block is invalid.
    pub fn check(&self) -> Result<(), ClientError> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(INVALID_VALUE.into());
        }
        Ok(())
    }
}

/// A launch as the application names it: its function and stream by their handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLaunch {
    /// A `CUfunction` or `CUkernel`.
    pub function: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: StreamRef,
    /// `CUlaunchAttribute`s: id and value (a launch with any takes the locked path).
    pub attributes: Vec<(u32, [u64; 8])>,
}

pub use crate::lanes::Packer;

/// What a launch of one function on its device may ask: checked when the launch is made, as
/// NVIDIA's driver checks (`CUDA_ERROR_INVALID_VALUE`, before anything is queued), on the
/// locked path and on a stream's lane alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchLimits {
    /// Threads per block: the device's limit, or the function's if lower (`__launch_bounds__`).
    pub threads: u32,
    /// Block and grid dimensions (`CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_*`, `_MAX_GRID_DIM_*`).
    pub block: [u32; 3],
    pub grid: [u32; 3],
    /// Dynamic shared memory: the function's `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`
    /// (48 KiB less its static shared memory unless the application opted into more).
    pub dynamic_shared: u32,
}

impl LaunchLimits {
    /// `CUDA_ERROR_INVALID_VALUE` for a configuration the device cannot run.
    pub fn check(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
    ) -> Result<(), ClientError> {
        let threads = block
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(u64::from(d)));
        let fits = |v: [u32; 3], max: [u32; 3]| v.iter().zip(max).all(|(&v, m)| v >= 1 && v <= m);
        if !fits(block, self.block)
            || !fits(grid, self.grid)
            || threads.is_none_or(|t| t > u64::from(self.threads))
            || shared_mem > self.dynamic_shared
        {
            return Err(INVALID_VALUE.into());
        }
        Ok(())
    }
}

/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK` and `_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
const FUNC_MAX_THREADS: i32 = 0;
const FUNC_MAX_DYNAMIC_SHARED: i32 = 8;

impl Session {
    /// Launches `l`, its arguments packed by `pack`: through the stream's lane when this
    /// thread has been granted it, else under the session lock (which grants it when the
    /// launch may use one). Errors are the locked path's: an unknown stream or function is
    /// `INVALID_HANDLE`, bad arguments `INVALID_VALUE`; a failure on the worker is reported by
    /// the next synchronizing call.
    pub fn launch_kernel(&self, l: KernelLaunch, pack: &mut Packer<'_>) -> Result<(), ClientError> {
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(INVALID_VALUE.into());
        }
        let mut packed = None;
        if l.attributes.is_empty() {
            let dims = (l.grid, l.block, l.shared_mem);
            match self.lanes.try_launch(l.function, l.stream, dims, pack)? {
                Fast::Queued(false) => return Ok(()),
                Fast::Queued(true) => {
                    // The lane is full: it and every other lane move into the connection.
                    return self.lock().conn.flush_if_full();
                }
                Fast::Locked(p) => packed = p,
            }
        }
        let device_limit = |device: i32, attr: i32| self.attribute(device, attr);
        self.lock().launch_locked(l, packed, pack, &device_limit)
    }
}

impl Inner {
    /// [`Session::launch_kernel`] under the session lock: handles checked, the launch queued
    /// or recorded, and the stream's lane granted to this thread if the launch may use one
    /// (not the legacy default stream, not capturing, no attributes, no managed memory).
    pub fn launch_locked(
        &mut self,
        l: KernelLaunch,
        packed: Option<Vec<u8>>,
        pack: &mut Packer<'_>,
        device_attribute: &dyn Fn(i32, i32) -> Option<i32>,
    ) -> Result<(), ClientError> {
        let stream = self.stream_id(l.stream.handle)?;
        let (function, layout) = self.launch_layout(l.function)?;
        let limits = self.launch_limits(function, device_attribute)?;
        limits.check(l.grid, l.block, l.shared_mem)?;
        let params = match packed {
            Some(p) => p,
            None => pack(&layout)?,
        };
        let lane = l
            .stream
            .lane_key()
            .filter(|_| l.attributes.is_empty())
            .filter(|_| self.graphs.capturing(stream).is_none())
            .filter(|_| self.managed_count == 0 && self.shared_count == 0);
        let config = LaunchConfig {
            grid: l.grid,
            block: l.block,
            shared_mem: l.shared_mem,
            stream,
            attributes: l.attributes,
        };
        self.launch(function, config, params)?;
        if let Some(key) = lane {
            let target = Target {
                function,
                layout: Arc::from(layout),
                limits,
            };
            self.lanes.grant(key, stream, l.function, target);
        }
        Ok(())
    }

    /// What a launch of `function` (the worker's id) may ask ([`LaunchLimits`]): the
    /// attributes of its module's device and its own.
    pub fn launch_limits(
        &self,
        function: u64,
        device_attribute: &dyn Fn(i32, i32) -> Option<i32>,
    ) -> Result<LaunchLimits, ClientError> {
        let f = self.functions.get(&function).ok_or(INVALID_HANDLE)?;
        let device = self.module_device(f.module).unwrap_or(0) as i32;
        let dev = |a: i32| device_attribute(device, a).map_or(u32::MAX, |v| v.max(0) as u32);
        let func = |a: i32| f.attribute(a).map(|v| v.max(0) as u32);
        Ok(LaunchLimits {
            threads: dev(1).min(func(FUNC_MAX_THREADS).unwrap_or(u32::MAX)),
            block: [dev(2), dev(3), dev(4)],
            grid: [dev(5), dev(6), dev(7)],
            dynamic_shared: func(FUNC_MAX_DYNAMIC_SHARED).unwrap_or(u32::MAX),
        })
    }

    /// The worker's id and the parameter layout of a `CUfunction` or `CUkernel`.
    pub fn launch_layout(&self, f: u64) -> Result<(u64, Vec<ParamSlot>), ClientError> {
        let function = self.resolve_function(f).ok_or(INVALID_HANDLE)?;
        let info = &self.functions.get(&function).ok_or(INVALID_HANDLE)?.info;
        Ok((function, info.params.clone()))
    }

    /// The `CUkernel` (`cuLibraryGetKernel`) whose function `function` is, if any: what a
    /// kernel node made from a `CUkernel` reports back, for the runtime to find its host
    /// function by.
    pub fn kernel_of(&self, function: u64) -> Option<u64> {
        self.kernels
            .iter()
            .find(|(_, k)| k.function == function)
            .map(|(&h, _)| h)
    }

    /// Launches `function` (the worker's id, from [`Inner::launch_layout`]) with packed
    /// parameters, or records the launch if the stream is capturing.
    pub fn launch(
        &mut self,
        function: u64,
        config: LaunchConfig,
        params: Vec<u8>,
    ) -> Result<(), ClientError> {
        let LaunchConfig {
            grid,
            block,
            shared_mem,
            stream,
            attributes,
        } = config;
        let op = Op::Launch {
            function,
            grid,
            block,
            shared_mem,
            params,
            attributes,
        };
        let Some(Op::Launch {
            params, attributes, ..
        }) = self.graphs.record(stream, op)
        else {
            return Ok(());
        };
        let req = Request::LaunchKernel(Launch {
            function: FunctionHandle(function),
            grid,
            block,
            shared_mem,
            stream: StreamHandle(stream),
            params: &params,
            attributes,
        });
        self.device_work(&req)
    }
}
