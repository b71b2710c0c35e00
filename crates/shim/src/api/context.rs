//! Contexts: primary contexts, created contexts, the per-thread current-context stack, limits.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::state::{self, Inner};
use gpufuse_client::work::SyncScope;

use crate::api::device::CUdevice;
use crate::ffi::{out, out_opt};
use crate::global::{session, with_core};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_CONTEXT, INVALID_DEVICE, SUCCESS};

pub type CUcontext = *mut c_void;

fn handle(ctx: CUcontext) -> u64 {
    ctx as usize as u64
}

fn as_ctx(h: u64) -> CUcontext {
    h as usize as CUcontext
}

pub use crate::global::client_err;

/// The device of `ctx`, or of the current context when `ctx` is 0.
pub fn context_device(g: &Inner, ctx: u64) -> Result<u32, CUresult> {
    g.context_device(ctx).map_err(client_err)
}

/// The current context and its device.
pub fn current(g: &Inner) -> Result<(u64, u32), CUresult> {
    g.current().map_err(client_err)
}

/// Makes sure the device's primary context exists on the worker; returns its handle.
pub fn ensure_primary(g: &mut Inner, dev: u32) -> Result<u64, CUresult> {
    g.ensure_primary(dev).map_err(client_err)
}

fn device(dev: CUdevice) -> Result<u32, CUresult> {
    u32::try_from(dev).map_err(|_| INVALID_DEVICE)
}

fn synchronize(ctx: u64) -> Result<(), CUresult> {
    with_core(|g| g.synchronize(SyncScope::Context(ctx)))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let d = device(dev)?;
        out(pctx, as_ctx(with_core(|g| g.retain_primary(d))?))
    })
}

fn primary_release(dev: CUdevice) -> Result<(), CUresult> {
    let d = device(dev)?;
    with_core(|g| g.release_primary(d))
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
    let d = device(dev)?;
    for c in with_core(|g| g.reset_device(d))? {
        crate::dark_api::cls_forget(c);
    }
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
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let d = device(dev)?;
        let (f, on) = with_core(|g| g.primary_state(d))?;
        out(flags, f)?;
        out(active, on as c_int)
    })
}

fn primary_set_flags(dev: CUdevice, flags: c_uint) -> Result<(), CUresult> {
    let d = device(dev)?;
    with_core(|g| g.set_primary_flags(d, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| primary_set_flags(dev, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    guard(|| primary_set_flags(dev, flags))
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let d = device(dev)?;
        out(pctx, as_ctx(with_core(|g| g.create_context(d, flags))?))
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { create(pctx, flags, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { create(pctx, flags, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    _num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { create(pctx, flags, dev) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { create(pctx, flags, dev) })
}

fn destroy(ctx: CUcontext) -> Result<(), CUresult> {
    let h = handle(ctx);
    with_core(|g| g.destroy_context(h))?;
    crate::dark_api::cls_forget(h);
    Ok(())
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
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        session()?;
        out(pctx, as_ctx(state::current_context()))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| with_core(|g| g.set_current(handle(ctx))))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    guard(|| with_core(|g| g.push_current(handle(ctx))))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        session()?;
        let h = state::pop_context().ok_or(INVALID_CONTEXT)?;
        out_opt(pctx, as_ctx(h));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let d = context_device(&s.lock(), 0)?;
        out(dev, d as CUdevice)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
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

/// `CU_CTX_MAP_HOST`.
const CTX_MAP_HOST: c_uint = 0x8;

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    // With unified addressing every context maps host memory: NVIDIA's driver reports
    // `CU_CTX_MAP_HOST` (0x8) whatever the context was made with (driver 580, H200).
    guard(|| unsafe { out(flags, with_core(|g| g.current_flags())? | CTX_MAP_HOST) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    guard(|| with_core(|g| g.set_current_flags(flags)))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        context_device(&s.lock(), handle(ctx))?;
        // NVIDIA's driver answers 3020 for every context (the context API's version, not the
        // CUDA version: driver 580, H200).
        out(version, 3020)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
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

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(value, session()?.limit(limit).map_err(client_err)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard(|| session()?.set_limit(limit, value).map_err(client_err))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(config, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCacheConfig(_config: c_int) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetSharedMemConfig(config: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(config, 1) })
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
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
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
