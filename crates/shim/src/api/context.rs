//! Contexts: primary contexts, created contexts, the per-thread current-context stack, limits.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use gpufuse_client::handles::{self, Kind};
use gpufuse_client::state::{self, Context, Inner};
use gpufuse_proto::Request;

use crate::api::device::CUdevice;
use crate::ffi::{out, out_opt};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_CONTEXT, INVALID_DEVICE, INVALID_VALUE, SUCCESS};

pub type CUcontext = *mut c_void;

fn handle(ctx: CUcontext) -> u64 {
    ctx as usize as u64
}

fn as_ctx(h: u64) -> CUcontext {
    h as usize as CUcontext
}

pub fn client_err(e: gpufuse_client::ClientError) -> CUresult {
    // A lost connection fails every later call the same way: say why once, on stderr, as the
    // failed connect is reported.
    static LOST_REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if matches!(
        e,
        gpufuse_client::ClientError::Lost(_) | gpufuse_client::ClientError::Hung { .. }
    ) && !LOST_REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        let cause = std::error::Error::source(&e).map_or(String::new(), |s| format!(" ({s})"));
        eprintln!(
            "gpufuse: {e}{cause}: the session has ended (`gpufuse kill`, or its worker or the server stopped); CUDA calls now return CUDA_ERROR_DEVICE_UNAVAILABLE"
        );
    }
    e.status()
}

/// The device of `ctx`, or of the current context when `ctx` is 0.
pub fn context_device(g: &Inner, ctx: u64) -> Result<u32, CUresult> {
    let ctx = if ctx == 0 {
        state::current_context()
    } else {
        ctx
    };
    if ctx == 0 {
        return Err(INVALID_CONTEXT);
    }
    match g.contexts.get(&ctx) {
        Some(c) => Ok(c.device),
        // A primary context's handle stays valid after a reset, as the driver's does: the
        // runtime keeps it across cudaDeviceReset and uses it again.
        None => primary_device(g, ctx).ok_or(INVALID_CONTEXT),
    }
}

/// The device whose primary context `ctx` is.
fn primary_device(g: &Inner, ctx: u64) -> Option<u32> {
    let d = g.primary.iter().position(|p| p.handle == ctx)?;
    u32::try_from(d).ok()
}

/// The current context and its device.
pub fn current(g: &Inner) -> Result<(u64, u32), CUresult> {
    let ctx = state::current_context();
    Ok((ctx, context_device(g, ctx)?))
}

/// Makes sure the device's primary context exists on the worker; returns its handle.
pub fn ensure_primary(g: &mut Inner, dev: u32) -> Result<u64, CUresult> {
    let p = g.primary.get_mut(dev as usize).ok_or(INVALID_DEVICE)?;
    let h = p.handle;
    if !p.created {
        p.created = true;
        let flags = p.flags;
        g.contexts.insert(
            h,
            Context {
                device: dev,
                flags,
                primary: true,
            },
        );
        g.conn
            .quiet(&Request::CtxCreate {
                ctx: h,
                device: dev,
                flags,
            })
            .map_err(client_err)?;
    }
    Ok(h)
}

/// Synchronizing calls report the first asynchronous error since the last one.
pub fn async_error(g: &mut Inner) -> Result<(), CUresult> {
    match g.conn.take_async_error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn synchronize(ctx: u64) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let ctx = if ctx == 0 {
        state::current_context()
    } else {
        ctx
    };
    context_device(&g, ctx)?;
    g.conn
        .call(&Request::CtxSynchronize { ctx })
        .map_err(client_err)?;
    async_error(&mut g)?;
    crate::api::managed::to_host(&mut g)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let d = u32::try_from(dev).map_err(|_| INVALID_DEVICE)?;
        let h = ensure_primary(&mut g, d)?;
        g.primary[d as usize].refcount += 1;
        out(pctx, as_ctx(h))
    })
}

fn primary_release(dev: CUdevice) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let p = g
        .primary
        .get_mut(usize::try_from(dev).map_err(|_| INVALID_DEVICE)?)
        .ok_or(INVALID_DEVICE)?;
    if p.refcount == 0 {
        return Err(INVALID_CONTEXT);
    }
    p.refcount -= 1;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    guard(|| primary_release(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| primary_release(dev))
}

/// Frees everything the session holds on `dev` (`cuDevicePrimaryCtxReset`, `cudaDeviceReset`).
fn primary_reset(dev: CUdevice) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let d = u32::try_from(dev).map_err(|_| INVALID_DEVICE)?;
    g.primary.get(d as usize).ok_or(INVALID_DEVICE)?;
    g.conn
        .call(&Request::DeviceReset { device: d })
        .map_err(client_err)?;
    let _ = g.conn.take_async_error();
    for (&p, a) in g
        .allocations
        .iter()
        .filter(|(_, a)| a.device == d && a.managed)
    {
        crate::api::managed::unmap(p, a.size);
    }
    g.allocations.retain(|_, a| a.device != d);
    g.managed_count = g.allocations.values().filter(|a| a.managed).count();
    g.physical.retain(|_, (_, dev)| *dev != d);
    let inner = &mut *g;
    inner
        .mappings
        .retain(|p, _| inner.allocations.contains_key(p));
    inner
        .arrays
        .retain(|_, a| inner.allocations.contains_key(&a.ptr));
    let allocations = &inner.allocations;
    inner.textures.retain(|_, t| {
        allocations
            .range(..=t.ptr)
            .next_back()
            .is_some_and(|(&base, a)| t.ptr < base + a.size.max(1))
    });
    let modules: Vec<u64> = g
        .modules
        .iter()
        .filter(|(_, m)| m.device == d)
        .map(|(&k, _)| k)
        .collect();
    for m in modules {
        g.modules.remove(&m);
        g.functions.retain(|_, f| f.module != m);
    }
    g.images_sent.clear();
    crate::api::module::reload_libraries(&mut g, d);
    let ctxs: Vec<u64> = g
        .contexts
        .iter()
        .filter(|(_, c)| c.device == d)
        .map(|(&k, _)| k)
        .collect();
    g.streams.retain(|_, st| !ctxs.contains(&st.ctx));
    g.contexts.retain(|_, c| c.device != d);
    for c in ctxs {
        crate::dark_api::cls_forget(c);
    }
    let p = &mut g.primary[d as usize];
    p.created = false;
    p.refcount = 0;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    guard(|| primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(|| primary_reset(dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let g = s.lock();
        let p = g
            .primary
            .get(usize::try_from(dev).map_err(|_| INVALID_DEVICE)?)
            .ok_or(INVALID_DEVICE)?;
        out(flags, p.flags)?;
        out(active, (p.created && p.refcount > 0) as c_int)
    })
}

fn primary_set_flags(dev: CUdevice, flags: c_uint) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let p = g
        .primary
        .get_mut(usize::try_from(dev).map_err(|_| INVALID_DEVICE)?)
        .ok_or(INVALID_DEVICE)?;
    p.flags = flags;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| primary_set_flags(dev, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| primary_set_flags(dev, flags))
}

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let d = u32::try_from(dev).map_err(|_| INVALID_DEVICE)?;
    if s.device(dev).is_none() {
        return Err(INVALID_DEVICE);
    }
    let h = handles::mint(Kind::Context);
    g.contexts.insert(
        h,
        Context {
            device: d,
            flags,
            primary: false,
        },
    );
    g.conn
        .quiet(&Request::CtxCreate {
            ctx: h,
            device: d,
            flags,
        })
        .map_err(client_err)?;
    state::push_context(h);
    out(pctx, as_ctx(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

fn destroy(ctx: CUcontext) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let h = handle(ctx);
    match g.contexts.get(&h) {
        Some(c) if !c.primary => {}
        Some(_) => return Err(INVALID_CONTEXT),
        None => return Err(INVALID_CONTEXT),
    }
    g.contexts.remove(&h);
    g.streams.retain(|_, st| st.ctx != h);
    state::forget_context(h);
    crate::dark_api::cls_forget(h);
    g.conn
        .quiet(&Request::CtxDestroy { ctx: h })
        .map_err(client_err)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(|| destroy(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    guard(|| destroy(ctx))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        session()?;
        out(pctx, as_ctx(state::current_context()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        let s = session()?;
        let h = handle(ctx);
        let mut g = s.lock();
        if h != 0 && !g.contexts.contains_key(&h) {
            // A reset primary context becomes active again when it is made current.
            let d = primary_device(&g, h).ok_or(INVALID_CONTEXT)?;
            ensure_primary(&mut g, d)?;
        }
        state::set_current_context(h);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    guard(|| {
        let s = session()?;
        let h = handle(ctx);
        if !s.lock().contexts.contains_key(&h) {
            return Err(INVALID_CONTEXT);
        }
        state::push_context(h);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        session()?;
        let h = state::pop_context().ok_or(INVALID_CONTEXT)?;
        out_opt(pctx, as_ctx(h));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    guard(|| {
        let s = session()?;
        let d = context_device(&s.lock(), 0)?;
        out(dev, d as CUdevice)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    guard(|| {
        let s = session()?;
        let d = context_device(&s.lock(), handle(ctx))?;
        out(dev, d as CUdevice)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| synchronize(0))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    guard(|| synchronize(handle(ctx)))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    guard(|| {
        let s = session()?;
        let g = s.lock();
        let ctx = state::current_context();
        let c = g.contexts.get(&ctx).ok_or(INVALID_CONTEXT)?;
        out(flags, c.flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let ctx = state::current_context();
        g.contexts.get_mut(&ctx).ok_or(INVALID_CONTEXT)?.flags = flags;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    guard(|| {
        let s = session()?;
        context_device(&s.lock(), handle(ctx))?;
        out(version, 12040)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    guard(|| {
        let s = session()?;
        let h = if handle(ctx) == 0 {
            state::current_context()
        } else {
            handle(ctx)
        };
        context_device(&s.lock(), h)?;
        out(id, h & 0xffff_ffff_ffff)
    })
}

/// `CUlimit` values, per process (the emulated GPU has no use for them beyond answering).
const LIMIT_PERSISTING_L2: c_int = 6;

static LIMITS: Mutex<[usize; 8]> = Mutex::new([1024, 1 << 20, 8 << 20, 2, 2048, 64, 0, 0]);

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    guard(|| {
        let l = LIMITS.lock().unwrap_or_else(|e| e.into_inner());
        out(
            value,
            *l.get(usize::try_from(limit).map_err(|_| INVALID_VALUE)?)
                .ok_or(INVALID_VALUE)?,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard(|| {
        // CU_LIMIT_PERSISTING_L2_CACHE_SIZE is capped at what may persist (attribute 108), as
        // the driver caps it; the emulated GPU has no cache for it to set aside.
        let value = if limit == LIMIT_PERSISTING_L2 {
            let max = session()?.attribute(0, 108).unwrap_or(0);
            value.min(usize::try_from(max).unwrap_or(0))
        } else {
            value
        };
        let mut l = LIMITS.lock().unwrap_or_else(|e| e.into_inner());
        *l.get_mut(usize::try_from(limit).map_err(|_| INVALID_VALUE)?)
            .ok_or(INVALID_VALUE)? = value;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_int) -> CUresult {
    guard(|| out(config, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCacheConfig(_config: c_int) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetSharedMemConfig(config: *mut c_int) -> CUresult {
    guard(|| out(config, 1))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetSharedMemConfig(_config: c_int) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    guard(|| {
        out_opt(least, 0);
        out_opt(greatest, -5);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    SUCCESS
}

include!(concat!(env!("OUT_DIR"), "/aliases_context.rs"));
