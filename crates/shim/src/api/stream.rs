//! Streams and events. Creates, records, waits and destroys are quiet; queries and
//! synchronizations are round trips that also report asynchronous errors.

use std::ffi::{c_int, c_uint, c_void};

use gpufuse_client::state::{Inner, Stream};

use crate::api::context::{current, CUcontext};
use crate::ffi::{out, out_opt};
use crate::global::{client_err, session, with_core};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE};

pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;

fn h(p: *mut c_void) -> u64 {
    p as usize as u64
}

/// The id the worker knows for `stream` (0 = the default stream).
pub fn stream_id(g: &Inner, stream: CUstream) -> Result<u64, CUresult> {
    g.stream_id(h(stream)).map_err(client_err)
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn create_stream(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        // `CU_STREAM_NON_BLOCKING` is the only flag (NVIDIA's driver refuses others).
        if ph.is_null() || flags & !STREAM_NON_BLOCKING != 0 {
            return Err(INVALID_VALUE);
        }
        let st = with_core(|g| g.create_stream(flags, priority))?;
        out(ph, st as usize as CUstream)
    }
}

const STREAM_NON_BLOCKING: c_uint = 0x1;
const EVENT_FLAGS: c_uint = 0x7;

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { create_stream(ph, flags, 0) })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { create_stream(ph, flags, priority) })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    guard(|| with_core(|g| g.destroy_stream(h(stream))))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    guard(|| with_core(|g| g.synchronize_stream(h(stream))))
}

/// `cuStreamAttachMemAsync`: managed memory is moved whole to the device before device work
/// and back after a synchronize (crates/shim/src/api/managed.rs), so an attachment changes
/// nothing; the stream, the flags and the range (inside one allocation) are still checked.
fn attach_mem(stream: CUstream, ptr: u64, len: usize, flags: c_uint) -> Result<(), CUresult> {
    const GLOBAL: c_uint = 1;
    const HOST: c_uint = 2;
    const SINGLE: c_uint = 4;
    if ![GLOBAL, HOST, SINGLE].contains(&flags) {
        return Err(INVALID_VALUE);
    }
    let s = session()?;
    let g = s.lock();
    stream_id(&g, stream)?;
    // Length 0 means the whole allocation.
    g.find_allocation(ptr, len.max(1) as u64)
        .ok_or(INVALID_VALUE)
        .map(|_| ())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamAttachMemAsync(
    stream: CUstream,
    ptr: u64,
    len: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| attach_mem(stream, ptr, len, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamAttachMemAsync_ptsz(
    stream: CUstream,
    ptr: u64,
    len: usize,
    flags: c_uint,
) -> CUresult {
    guard(|| attach_mem(stream, ptr, len, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    guard(|| with_core(|g| g.query_stream(h(stream))))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: CUstream,
    event: CUevent,
    _flags: c_uint,
) -> CUresult {
    guard(|| with_core(|g| g.stream_wait_event(h(stream), h(event))))
}

fn with_stream<T>(
    stream: CUstream,
    f: impl FnOnce(&Inner, Option<&Stream>) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    let s = session()?;
    let g = s.lock();
    let st = g.stream(h(stream)).map_err(client_err)?;
    f(&g, st)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(stream: CUstream, priority: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { with_stream(stream, |_, st| out(priority, st.map_or(0, |s| s.priority))) })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { with_stream(stream, |_, st| out(flags, st.map_or(0, |s| s.flags))) })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(stream: CUstream, id: *mut u64) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        with_stream(stream, |_, st| {
            out(
                id,
                if st.is_some() {
                    stream as u64 & 0xffff_ffff
                } else {
                    0
                },
            )
        })
    })
}

fn stream_ctx(g: &Inner, st: Option<&Stream>) -> Result<u64, CUresult> {
    match st {
        Some(s) => Ok(s.ctx),
        None => Ok(current(g)?.0),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        with_stream(stream, |g, st| {
            out(pctx, stream_ctx(g, st)? as usize as CUcontext)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    stream: CUstream,
    pctx: *mut CUcontext,
    green: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        with_stream(stream, |g, st| {
            out_opt(green, std::ptr::null_mut());
            out(pctx, stream_ctx(g, st)? as usize as CUcontext)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(stream: CUstream, dev: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        with_stream(stream, |g, st| {
            let ctx = stream_ctx(g, st)?;
            out(dev, crate::api::context::context_device(g, ctx)? as c_int)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        crate::ffi::read(mode)?;
        Ok(())
    })
}

/// Host functions run in stream order: the stream is drained, then the function is called.
fn run_host_fn(
    stream: CUstream,
    capture: Option<(usize, usize)>,
    f: impl FnOnce(),
) -> Result<(), CUresult> {
    if with_core(|g| g.host_fn_ready(h(stream), capture))? {
        f();
    }
    Ok(())
}

pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: CUstream,
    f: HostFn,
    user: *mut c_void,
) -> CUresult {
    guard(|| {
        let f = f.ok_or(INVALID_VALUE)?;
        // SAFETY: the application gave us this callback and its argument to call once.
        run_host_fn(stream, Some((f as usize, user as usize)), || unsafe {
            f(user)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback(
    stream: CUstream,
    cb: StreamCallback,
    user: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    guard(|| {
        let cb = cb.ok_or(INVALID_VALUE)?;
        // SAFETY: the application gave us this callback and its argument to call once.
        run_host_fn(stream, None, || unsafe { cb(stream, 0, user) })
    })
}

// ---- events ----

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // `CU_EVENT_BLOCKING_SYNC`, `_DISABLE_TIMING`, `_INTERPROCESS` (NVIDIA's driver
        // refuses others).
        if ph.is_null() || flags & !EVENT_FLAGS != 0 {
            return Err(INVALID_VALUE);
        }
        out(
            ph,
            with_core(|g| g.create_event(flags))? as usize as CUevent,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    guard(|| with_core(|g| g.destroy_event(h(event))))
}

fn record(event: CUevent, stream: CUstream) -> Result<(), CUresult> {
    with_core(|g| g.record_event(h(event), h(stream)))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    guard(|| record(event, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    event: CUevent,
    stream: CUstream,
    _flags: c_uint,
) -> CUresult {
    guard(|| record(event, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: CUevent) -> CUresult {
    guard(|| with_core(|g| g.query_event(h(event))))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    guard(|| with_core(|g| g.synchronize_event(h(event))))
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe { out(ms, with_core(|g| g.elapsed(h(start), h(end)))?) }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { elapsed(ms, start, end) })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { elapsed(ms, start, end) })
}

/// `CUstreamAttrValue` (`CUlaunchAttributeValue`): 64 bytes.
type AttrValue = [u64; 8];

const STREAM_ATTR_ACCESS_POLICY_WINDOW: c_uint = 1;
const STREAM_ATTR_SYNCHRONIZATION_POLICY: c_uint = 3;
const STREAM_ATTR_PRIORITY: c_uint = 8;
const STREAM_ATTR_MEM_SYNC_DOMAIN_MAP: c_uint = 9;
const STREAM_ATTR_MEM_SYNC_DOMAIN: c_uint = 10;

/// Stream attributes set by `cuStreamSetAttribute`, by stream handle and attribute: kept to be
/// read back. An access-policy window (persisting L2) is a hint the emulated GPU, which has no
/// cache, has no use for beyond checking it as the driver does.
static STREAM_ATTRS: std::sync::Mutex<Vec<(u64, c_uint, AttrValue)>> =
    std::sync::Mutex::new(Vec::new());

/// Checks a stream (or launch, or kernel-node) attribute value as the driver does: an
/// access-policy window's hit ratio lies in [0, 1] and its size within the device's largest
/// window (attribute 109); the other stream attributes take any value.
pub(crate) fn check_attr(id: c_uint, v: &AttrValue) -> Result<(), CUresult> {
    match id {
        STREAM_ATTR_ACCESS_POLICY_WINDOW => {
            let (bytes, ratio) = (v[1], f32::from_bits(v[2] as u32));
            let props = [(v[2] >> 32) as u32, v[3] as u32];
            let max = session()?.attribute(0, 109).unwrap_or(0) as u64;
            if !(0.0..=1.0).contains(&ratio) || bytes > max || props.iter().any(|&p| p > 2) {
                return Err(INVALID_VALUE);
            }
            Ok(())
        }
        STREAM_ATTR_SYNCHRONIZATION_POLICY
        | STREAM_ATTR_PRIORITY
        | STREAM_ATTR_MEM_SYNC_DOMAIN_MAP
        | STREAM_ATTR_MEM_SYNC_DOMAIN => Ok(()),
        _ => Err(INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSetAttribute(
    stream: CUstream,
    attr: c_uint,
    value: *const AttrValue,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let v = crate::ffi::read(value)?;
        with_stream(stream, |_, _| Ok(()))?;
        check_attr(attr, &v)?;
        let h = stream as usize as u64;
        let mut a = STREAM_ATTRS.lock().unwrap_or_else(|e| e.into_inner());
        match a.iter_mut().find(|(s, id, _)| *s == h && *id == attr) {
            Some(slot) => slot.2 = v,
            None => a.push((h, attr, v)),
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetAttribute(
    stream: CUstream,
    attr: c_uint,
    value: *mut AttrValue,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let priority = with_stream(stream, |_, st| Ok(st.map_or(0, |s| s.priority)))?;
        check_attr(attr, &[0; 8])?;
        let h = stream as usize as u64;
        let a = STREAM_ATTRS.lock().unwrap_or_else(|e| e.into_inner());
        let v = match a.iter().find(|(s, id, _)| *s == h && *id == attr) {
            Some(&(_, _, v)) => v,
            None if attr == STREAM_ATTR_PRIORITY => [priority as u32 as u64, 0, 0, 0, 0, 0, 0, 0],
            None => [0; 8],
        };
        out(value, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCopyAttributes(dst: CUstream, src: CUstream) -> CUresult {
    guard(|| {
        with_stream(dst, |_, _| Ok(()))?;
        with_stream(src, |_, _| Ok(()))?;
        let (d, s) = (dst as usize as u64, src as usize as u64);
        let mut a = STREAM_ATTRS.lock().unwrap_or_else(|e| e.into_inner());
        a.retain(|(h, _, _)| *h != d);
        let copied: Vec<_> = a
            .iter()
            .filter(|(h, _, _)| *h == s)
            .map(|&(_, id, v)| (d, id, v))
            .collect();
        a.extend(copied);
        Ok(())
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_stream.rs"));
