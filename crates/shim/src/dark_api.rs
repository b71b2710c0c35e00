//! Export tables ("dark API"): private tables NVIDIA's runtime asks the driver for. They hold
//! client addresses, pid and thread identity, so they are answered here, never forwarded.
//! Which tables exist, their slots and the integrity check: docs/cuda-driver-interception.md §4–5.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use gpufuse_client::state;

use crate::api::context::CUcontext;
use crate::global::{session, DRIVER_VERSION};
use crate::status::{CUresult, INVALID_VALUE, NOT_FOUND, SUCCESS};

/// An array of pointer-sized slots, shared with C.
#[repr(C)]
pub struct ExportTable<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable after construction and hold only addresses of functions
// and sizes; sharing them between threads reads nothing mutable.
unsafe impl<const N: usize> Sync for ExportTable<N> {}

impl<const N: usize> ExportTable<N> {
    fn addr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

const fn size_slot(entries: usize) -> *const c_void {
    (entries * std::mem::size_of::<*const c_void>()) as *const c_void
}

/// Slots of unknown meaning answer success and change nothing.
extern "C" fn unknown_slot() -> CUresult {
    SUCCESS
}

const U: *const c_void = unknown_slot as *const c_void;

// ---- CUDART_INTERFACE (6bd5fb6c) ----

extern "C" fn cudart_primary_context(out: *mut CUcontext, dev: c_int) -> CUresult {
    // SAFETY: the runtime passes a writable context slot, as `cuDevicePrimaryCtxRetain` takes.
    unsafe { crate::api::context::cuDevicePrimaryCtxRetain(out, dev) }
}

static CUDART_INTERFACE: ExportTable<16> = ExportTable([
    size_slot(16),
    U,
    cudart_primary_context as *const c_void,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
    U,
]);

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c) ----

static HOOK_BUFFER: Mutex<[usize; 1024]> = Mutex::new([0; 1024]);
static HOOK_SMALL: Mutex<[u8; 14]> = Mutex::new([0; 14]);

extern "C" fn hooks_buffer(buf: *mut *mut c_void, size: *mut usize) -> CUresult {
    let p = HOOK_BUFFER
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut_ptr();
    crate::ffi::out_opt(buf, p.cast());
    crate::ffi::out_opt(size, 1024);
    SUCCESS
}

extern "C" fn hooks_small(buf: *mut *mut c_void, size: *mut usize) -> CUresult {
    let p = HOOK_SMALL
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut_ptr();
    crate::ffi::out_opt(buf, p.cast());
    crate::ffi::out_opt(size, 14);
    SUCCESS
}

static HOOKS: ExportTable<8> = ExportTable([
    size_slot(8),
    U,
    hooks_buffer as *const c_void,
    U,
    U,
    U,
    hooks_small as *const c_void,
    U,
]);

// ---- size-only and placeholder tables ----

static TOOLS_TLS: ExportTable<4> = ExportTable([size_slot(4), U, U, U]);
static PRIVATE_21318C60: ExportTable<64> = {
    let mut t = [U; 64];
    t[0] = size_slot(64);
    ExportTable(t)
};

// ---- context wrapper (263e8860) ----

extern "C" fn ctx_wrapper_check(
    _ctx: CUcontext,
    wrapped: *mut c_uint,
    other: *mut *mut c_void,
) -> CUresult {
    crate::ffi::out_opt(wrapped, 0);
    crate::ffi::out_opt(other, std::ptr::null_mut());
    SUCCESS
}

static CTX_WRAPPER: ExportTable<4> =
    ExportTable([size_slot(4), U, ctx_wrapper_check as *const c_void, U]);

// ---- CONTEXT_LOCAL_STORAGE (c693336e): slot 0 is a function, there is no size slot ----

type ClsKey = (usize, usize);
static CLS: Mutex<Option<HashMap<ClsKey, usize>>> = Mutex::new(None);

fn cls_context(ctx: CUcontext) -> usize {
    if ctx.is_null() {
        state::current_context() as usize
    } else {
        ctx as usize
    }
}

extern "C" fn cls_insert(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    _dtor: *mut c_void,
) -> CUresult {
    let ctx = cls_context(ctx);
    if ctx == 0 {
        return INVALID_VALUE;
    }
    let mut m = CLS.lock().unwrap_or_else(|e| e.into_inner());
    m.get_or_insert_with(HashMap::new)
        .insert((ctx, key as usize), value as usize);
    SUCCESS
}

extern "C" fn cls_remove(ctx: CUcontext, key: *mut c_void, _flag: c_int) -> CUresult {
    let ctx = cls_context(ctx);
    let mut m = CLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = m.as_mut() {
        m.remove(&(ctx, key as usize));
    }
    SUCCESS
}

extern "C" fn cls_get(value: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> CUresult {
    let ctx = cls_context(ctx);
    let m = CLS.lock().unwrap_or_else(|e| e.into_inner());
    match m.as_ref().and_then(|m| m.get(&(ctx, key as usize))) {
        Some(&v) => {
            crate::ffi::out_opt(value, v as *mut c_void);
            SUCCESS
        }
        // A miss is what makes the runtime set the context up.
        None => INVALID_VALUE,
    }
}

/// Forgets the context-local storage of a context that was reset or destroyed.
pub fn cls_forget(ctx: u64) {
    let mut m = CLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = m.as_mut() {
        m.retain(|&(c, _), _| c as u64 != ctx);
    }
}

static CLS_TABLE: ExportTable<4> = ExportTable([
    cls_insert as *const c_void,
    cls_remove as *const c_void,
    cls_get as *const c_void,
    U,
]);

// ---- INTEGRITY_CHECK (d4082055) ----

extern "C" fn integrity_check(version: c_uint, unix_seconds: u64, out: *mut [u8; 16]) -> CUresult {
    let Ok(s) = session() else { return NOT_FOUND };
    let devices: Vec<gpufuse_integrity::DeviceIdentity> = (0..s.devices.len() as c_int)
        .map(|d| gpufuse_integrity::DeviceIdentity {
            uuid: s.devices[d as usize].uuid,
            pci_domain: s.attribute(d, 50).unwrap_or(0) as u32,
            pci_bus: s.attribute(d, 33).unwrap_or(0) as u32,
            pci_device: s.attribute(d, 34).unwrap_or(0) as u32,
        })
        .collect();
    // SAFETY: pthread_self has no preconditions.
    let thread = unsafe { libc::pthread_self() } as u64;
    let input = gpufuse_integrity::IntegrityInput {
        driver_version: DRIVER_VERSION as u32,
        version,
        pid: std::process::id(),
        thread_id: thread as u32,
        cudart_interface_table: CUDART_INTERFACE.addr() as u64,
        integrity_table: INTEGRITY.addr() as u64,
        integrity_fn: integrity_check as *const () as u64,
        unix_seconds,
        devices: &devices,
    };
    match crate::ffi::out(out, gpufuse_integrity::integrity_answer(&input)) {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

static INTEGRITY: ExportTable<4> =
    ExportTable([size_slot(4), integrity_check as *const c_void, U, U]);

/// The table for an export-table UUID, or None to refuse it.
pub fn table_for(id: &[u8; 16]) -> Option<*const c_void> {
    let t = match id {
        [0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9] => {
            CUDART_INTERFACE.addr()
        }
        [0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66] => {
            HOOKS.addr()
        }
        [0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc] => {
            TOOLS_TLS.addr()
        }
        [0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2] => {
            PRIVATE_21318C60.addr()
        }
        [0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93] => {
            CLS_TABLE.addr()
        }
        [0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e] => {
            CTX_WRAPPER.addr()
        }
        [0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2] => {
            INTEGRITY.addr()
        }
        // f8cff951 (unknown), da9151d3 (NVRTC: a fake table makes it abort) and everything else.
        _ => return None,
    };
    Some(t)
}
