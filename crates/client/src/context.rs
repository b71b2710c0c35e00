//! Contexts: primary contexts (one per device, made on the worker on first use), created
//! contexts, which device a context is on, and a device reset (everything the session holds on
//! the device goes; libraries, which outlive contexts, are loaded again).

use gpufuse_proto::Request;

use crate::error::ClientError;
use crate::handles::{self, Kind};
use crate::state::{self, Context, Inner, Session};
use crate::status::{
    INVALID_CONTEXT, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, NOT_PERMITTED, NOT_SUPPORTED,
};
use gpufuse_proto::ContextHandle;

/// The limits the worker's device applies (`SetLimit`): `CU_LIMIT_PRINTF_FIFO_SIZE`,
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
const DEVICE_LIMITS: [i32; 2] = [1, 2];

/// `CU_LIMIT_PERSISTING_L2_CACHE_SIZE`.
const LIMIT_PERSISTING_L2: i32 = 6;
/// `CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE`.
const MAX_PERSISTING_L2_CACHE_SIZE: i32 = 108;
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
const FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
/// `CU_LIMIT_STACK_SIZE`.
const LIMIT_STACK_SIZE: i32 = 0;
/// `CU_LIMIT_SHMEM_SIZE` to `CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED` can only be queried (setting
/// one is `CUDA_ERROR_NOT_PERMITTED` from NVIDIA's driver), and `CU_LIMIT_MAX` ends the
/// enumeration.
const FIRST_QUERY_ONLY_LIMIT: i32 = 7;
const LIMIT_CIG_SHMEM_FALLBACK: i32 = 9;
const LIMIT_MAX: i32 = 11;

/// The number a device answered (`ReplyBody::Count`: occupancy, limits).
fn count(body: gpufuse_proto::ReplyBody) -> Result<u64, ClientError> {
    match body {
        gpufuse_proto::ReplyBody::Count(n) => Ok(n),
        _ => Err(ClientError::UnexpectedReply),
    }
}

impl Session {
    /// `cuCtxGetLimit`: what the application set, else the device's own value (asked of the
    /// device serving the session once, so a real GPU's driver decides it).
    pub fn limit(&self, limit: i32) -> Result<usize, ClientError> {
        if !(0..LIMIT_MAX).contains(&limit) {
            return Err(INVALID_VALUE.into());
        }
        let mut g = self.lock();
        let (_, device) = g.current()?;
        if let Some(&v) = g.limits.get(&(device, limit)) {
            return Ok(v);
        }
        let req = Request::GetLimit {
            device,
            limit: limit as u32,
        };
        let v = usize::try_from(count(g.conn.call(&req)?)?).unwrap_or(usize::MAX);
        g.limits.insert((device, limit), v);
        Ok(v)
    }

    /// `cuCtxSetLimit`. The persisting L2 cache size is capped at what may persist (device
    /// attribute 108), as the driver caps it; the emulated GPU has no cache to set aside. The
    /// limits from `CU_LIMIT_SHMEM_SIZE` on can only be queried (`CUDA_ERROR_INVALID_VALUE`).
    pub fn set_limit(&self, limit: i32, value: usize) -> Result<(), ClientError> {
        if (FIRST_QUERY_ONLY_LIMIT..=LIMIT_CIG_SHMEM_FALLBACK).contains(&limit) {
            return Err(NOT_PERMITTED.into());
        }
        if !(0..FIRST_QUERY_ONLY_LIMIT).contains(&limit) {
            return Err(INVALID_VALUE.into());
        }
        let value = if limit == LIMIT_STACK_SIZE {
            // The driver keeps the stack size in 16-byte units (1000 reads back as 1008).
            value.checked_next_multiple_of(16).ok_or(INVALID_VALUE)?
        } else if limit == LIMIT_PERSISTING_L2 {
            let max = self.attribute(0, MAX_PERSISTING_L2_CACHE_SIZE).unwrap_or(0);
            value.min(usize::try_from(max).unwrap_or(0))
        } else {
            value
        };
        let mut g = self.lock();
        let (_, device) = g.current()?;
        if DEVICE_LIMITS.contains(&limit) {
            let req = Request::SetLimit {
                device,
                limit: limit as u32,
                value: value as u64,
            };
            match g.conn.call(&req) {
                // A device that keeps no such limit (a real GPU's backend): the value is the
                // session's only, as before the device applied any.
                Ok(_) | Err(ClientError::Cuda(NOT_SUPPORTED)) => {}
                Err(e) => return Err(e),
            }
        }
        g.limits.insert((device, limit), value);
        Ok(())
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags` for function `f` (a `CUfunction`
    /// or `CUkernel`): the device serving the session answers, once per configuration.
    pub fn occupancy(
        &self,
        f: u64,
        block: u32,
        dyn_smem: u64,
        flags: u32,
    ) -> Result<i32, ClientError> {
        let mut g = self.lock();
        let function = g
            .resolve_function(f)
            .ok_or(ClientError::Cuda(INVALID_HANDLE))?;
        let max_dyn_smem = g
            .functions
            .get(&function)
            .ok_or(ClientError::Cuda(INVALID_HANDLE))?
            .attribute(FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            .map_or(u32::MAX, |v| u32::try_from(v).unwrap_or(0));
        let key = (function, block, dyn_smem, max_dyn_smem, flags);
        if let Some(&n) = g.occupancy.get(&key) {
            return Ok(n);
        }
        let req = Request::Occupancy {
            function: gpufuse_proto::FunctionHandle(function),
            block,
            dyn_smem,
            max_dyn_smem,
            flags,
        };
        let n = i32::try_from(count(g.conn.call(&req)?)?).unwrap_or(i32::MAX);
        g.occupancy.insert(key, n);
        Ok(n)
    }
}

impl Inner {
    /// The device of `ctx`, or of the current context when `ctx` is 0.
    pub fn context_device(&self, ctx: u64) -> Result<u32, ClientError> {
        let ctx = if ctx == 0 {
            state::current_context()
        } else {
            ctx
        };
        if ctx == 0 {
            return Err(INVALID_CONTEXT.into());
        }
        match self.contexts.get(&ctx) {
            Some(c) => Ok(c.device),
            // A primary context's handle stays valid after a reset, as the driver's does: the
            // runtime keeps it across cudaDeviceReset and uses it again.
            None => self
                .primary_device(ctx)
                .ok_or(ClientError::Cuda(INVALID_CONTEXT)),
        }
    }

    /// The device whose primary context `ctx` is.
    pub fn primary_device(&self, ctx: u64) -> Option<u32> {
        let d = self.primary.iter().position(|p| p.handle == ctx)?;
        u32::try_from(d).ok()
    }

    /// Device `dev`'s primary context handle.
    pub fn primary_handle(&self, dev: u32) -> Option<u64> {
        self.primary.get(dev as usize).map(|p| p.handle)
    }

    /// The current context and its device.
    pub fn current(&self) -> Result<(u64, u32), ClientError> {
        let ctx = state::current_context();
        Ok((ctx, self.context_device(ctx)?))
    }

    /// Makes sure the device's primary context exists on the worker; returns its handle.
    pub fn ensure_primary(&mut self, dev: u32) -> Result<u64, ClientError> {
        let p = self
            .primary
            .get_mut(dev as usize)
            .ok_or(ClientError::Cuda(INVALID_DEVICE))?;
        let h = p.handle;
        if !p.created {
            p.created = true;
            let flags = p.flags;
            self.contexts.insert(
                h,
                Context {
                    device: dev,
                    flags,
                    primary: true,
                },
            );
            self.conn.quiet(&Request::CtxCreate {
                ctx: ContextHandle(h),
                device: dev,
                flags,
            })?;
        }
        Ok(h)
    }

    /// `cuDevicePrimaryCtxRetain`: the primary context's handle, its count raised.
    pub fn retain_primary(&mut self, dev: u32) -> Result<u64, ClientError> {
        let h = self.ensure_primary(dev)?;
        self.primary[dev as usize].refcount += 1;
        Ok(h)
    }

    /// `cuDevicePrimaryCtxRelease`.
    pub fn release_primary(&mut self, dev: u32) -> Result<(), ClientError> {
        let p = self
            .primary
            .get_mut(dev as usize)
            .ok_or(ClientError::Cuda(INVALID_DEVICE))?;
        if p.refcount == 0 {
            return Err(INVALID_CONTEXT.into());
        }
        p.refcount -= 1;
        Ok(())
    }

    /// `cuDevicePrimaryCtxGetState`: (flags, active).
    pub fn primary_state(&self, dev: u32) -> Result<(u32, bool), ClientError> {
        let p = self
            .primary
            .get(dev as usize)
            .ok_or(ClientError::Cuda(INVALID_DEVICE))?;
        Ok((p.flags, p.created && p.refcount > 0))
    }

    /// `cuDevicePrimaryCtxSetFlags`.
    pub fn set_primary_flags(&mut self, dev: u32, flags: u32) -> Result<(), ClientError> {
        self.primary
            .get_mut(dev as usize)
            .ok_or(ClientError::Cuda(INVALID_DEVICE))?
            .flags = flags;
        Ok(())
    }

    /// `cuCtxCreate`: a new context on `dev`, made current on the calling thread.
    pub fn create_context(&mut self, dev: u32, flags: u32) -> Result<u64, ClientError> {
        if dev as usize >= self.primary.len() {
            return Err(INVALID_DEVICE.into());
        }
        let h = handles::mint(Kind::Context);
        self.contexts.insert(
            h,
            Context {
                device: dev,
                flags,
                primary: false,
            },
        );
        self.conn.quiet(&Request::CtxCreate {
            ctx: ContextHandle(h),
            device: dev,
            flags,
        })?;
        state::push_context(h);
        Ok(h)
    }

    /// `cuCtxDestroy` of a created context (a primary one is released, not destroyed); its
    /// streams go with it.
    pub fn destroy_context(&mut self, h: u64) -> Result<(), ClientError> {
        match self.contexts.get(&h) {
            Some(c) if !c.primary => {}
            _ => return Err(INVALID_CONTEXT.into()),
        }
        self.contexts.remove(&h);
        self.streams.retain(|_, st| st.ctx != h);
        self.lanes_changed();
        state::forget_context(h);
        self.conn.quiet(&Request::CtxDestroy {
            ctx: ContextHandle(h),
        })
    }

    /// `cuCtxSetCurrent`: a reset primary context becomes active again when made current.
    pub fn set_current(&mut self, h: u64) -> Result<(), ClientError> {
        if h != 0 && !self.contexts.contains_key(&h) {
            let d = self
                .primary_device(h)
                .ok_or(ClientError::Cuda(INVALID_CONTEXT))?;
            self.ensure_primary(d)?;
        }
        state::set_current_context(h);
        Ok(())
    }

    /// `cuCtxPushCurrent`.
    pub fn push_current(&self, h: u64) -> Result<(), ClientError> {
        if !self.contexts.contains_key(&h) {
            return Err(INVALID_CONTEXT.into());
        }
        state::push_context(h);
        Ok(())
    }

    /// The flags of the current context.
    pub fn current_flags(&self) -> Result<u32, ClientError> {
        let ctx = state::current_context();
        Ok(self
            .contexts
            .get(&ctx)
            .ok_or(ClientError::Cuda(INVALID_CONTEXT))?
            .flags)
    }

    /// Sets the flags of the current context.
    pub fn set_current_flags(&mut self, flags: u32) -> Result<(), ClientError> {
        let ctx = state::current_context();
        self.contexts
            .get_mut(&ctx)
            .ok_or(ClientError::Cuda(INVALID_CONTEXT))?
            .flags = flags;
        Ok(())
    }

    /// Frees everything the session holds on `dev` (`cuDevicePrimaryCtxReset`,
    /// `cudaDeviceReset`) and returns the contexts that went, so the caller can forget what it
    /// keeps per context. Libraries on the device are loaded again.
    pub fn reset_device(&mut self, dev: u32) -> Result<Vec<u64>, ClientError> {
        self.primary
            .get(dev as usize)
            .ok_or(ClientError::Cuda(INVALID_DEVICE))?;
        self.conn.call(&Request::DeviceReset { device: dev })?;
        let _ = self.conn.take_async_error();
        self.lanes_changed();
        self.forget_device_memory(dev);
        self.forget_device_modules(dev);
        self.reload_libraries(dev);
        let ctxs: Vec<u64> = self
            .contexts
            .iter()
            .filter(|(_, c)| c.device == dev)
            .map(|(&k, _)| k)
            .collect();
        self.streams.retain(|_, st| !ctxs.contains(&st.ctx));
        self.contexts.retain(|_, c| c.device != dev);
        let p = &mut self.primary[dev as usize];
        p.created = false;
        p.refcount = 0;
        Ok(ctxs)
    }
}
