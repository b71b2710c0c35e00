//! The runtime's export tables (libcudart, and the copy of it inside cuBLAS and other
//! libraries): CUDART_INTERFACE, the tools hooks and TLS, context-local storage, the context
//! wrapper check and the integrity check. docs/export-tables.md ("The runtime's tables") and
//! docs/driver-interception.md (sections 3 and 4).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use gpufuse_client::state;

use super::{ix, ExportTable};
use crate::api::context::CUcontext;
use crate::global::{session, DRIVER_VERSION};
use crate::status::{CUresult, INVALID_VALUE, NOT_FOUND, SUCCESS};

pub const UUID_CUDART_INTERFACE: [u8; 16] = [
    0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9,
];
pub const UUID_HOOKS: [u8; 16] = [
    0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66,
];
pub const UUID_TOOLS_TLS: [u8; 16] = [
    0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc,
];
pub const UUID_CLS: [u8; 16] = [
    0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93,
];
pub const UUID_CTX_WRAPPER: [u8; 16] = [
    0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e,
];
pub const UUID_INTEGRITY: [u8; 16] = [
    0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2,
];

/// Slots the runtime calls whose meaning is unknown and whose observed answer is "success,
/// nothing written": CUDART_INTERFACE slot 12 (13.5, `(ptr, ptr, 0xb, 0x44)`) and the context
/// wrapper's slot 3 (`()` at init). Implemented so that they are not reported as unknown.
extern "C" fn observed_success() -> CUresult {
    SUCCESS
}

// ---- CUDART_INTERFACE (6bd5fb6c) ----

extern "C" fn cudart_primary_context(out: *mut CUcontext, dev: c_int) -> CUresult {
    // SAFETY: the runtime passes a writable context slot, as `cuDevicePrimaryCtxRetain` takes.
    unsafe { crate::api::context::cuDevicePrimaryCtxRetain(out, dev) }
}

pub static CUDART_INTERFACE: ExportTable<13> = ExportTable::sized::<{ ix::CUDART_INTERFACE }>()
    .with(2, cudart_primary_context as *const c_void)
    .with(12, observed_success as *const c_void);

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c) ----

static HOOK_BUFFER: Mutex<[usize; 1024]> = Mutex::new([0; 1024]);
static HOOK_SMALL: Mutex<[u8; 14]> = Mutex::new([0; 14]);

extern "C" fn hooks_buffer(buf: *mut *mut c_void, size: *mut usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    unsafe {
        let p = HOOK_BUFFER
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut_ptr();
        crate::ffi::out_opt(buf, p.cast());
        crate::ffi::out_opt(size, 1024);
        SUCCESS
    }
}

extern "C" fn hooks_small(buf: *mut *mut c_void, size: *mut usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    unsafe {
        let p = HOOK_SMALL
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut_ptr();
        crate::ffi::out_opt(buf, p.cast());
        crate::ffi::out_opt(size, 14);
        SUCCESS
    }
}

pub static HOOKS: ExportTable<7> = ExportTable::sized::<{ ix::TOOLS_RUNTIME_HOOKS }>()
    .with(2, hooks_buffer as *const c_void)
    .with(6, hooks_small as *const c_void);

// ---- TOOLS_TLS (42d85a81) ----

/// Slot 2 `(CUcontext* out)`: the calling thread's current context, as `cuCtxGetCurrent`.
/// The runtime never calls it; cuBLASLt does before every matmul (docs/export-tables.md).
extern "C" fn tls_current_context(out: *mut CUcontext) -> CUresult {
    // SAFETY: the library passes a writable context slot; the export checks it for NULL.
    unsafe { crate::api::context::cuCtxGetCurrent(out) }
}

pub static TOOLS_TLS: ExportTable<3> =
    ExportTable::sized::<{ ix::TOOLS_TLS }>().with(2, tls_current_context as *const c_void);

// ---- context wrapper (263e8860) ----

extern "C" fn ctx_wrapper_check(
    _ctx: CUcontext,
    wrapped: *mut c_uint,
    other: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    unsafe {
        crate::ffi::out_opt(wrapped, 0);
        crate::ffi::out_opt(other, std::ptr::null_mut());
        SUCCESS
    }
}

pub static CTX_WRAPPER: ExportTable<15> = ExportTable::sized::<{ ix::CONTEXT_WRAPPER }>()
    .with(2, ctx_wrapper_check as *const c_void)
    .with(3, observed_success as *const c_void);

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
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    unsafe {
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
}

/// Forgets the context-local storage of a context that was reset or destroyed.
pub fn cls_forget(ctx: u64) {
    let mut m = CLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = m.as_mut() {
        m.retain(|&(c, _), _| c as u64 != ctx);
    }
}

pub static CLS_TABLE: ExportTable<4> = ExportTable::without_size::<{ ix::CONTEXT_LOCAL_STORAGE }>()
    .with(0, cls_insert as *const c_void)
    .with(1, cls_remove as *const c_void)
    .with(2, cls_get as *const c_void);

// ---- INTEGRITY_CHECK (d4082055) ----

extern "C" fn integrity_check(version: c_uint, unix_seconds: u64, out: *mut [u8; 16]) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    unsafe {
        let Ok(s) = session() else { return NOT_FOUND };
        let devices: Vec<gpufuse_runtime_integrity::DeviceIdentity> = (0..s.devices.len() as c_int)
            .map(|d| gpufuse_runtime_integrity::DeviceIdentity {
                uuid: s.devices[d as usize].uuid,
                pci_domain: s.attribute(d, 50).unwrap_or(0) as u32,
                pci_bus: s.attribute(d, 33).unwrap_or(0) as u32,
                pci_device: s.attribute(d, 34).unwrap_or(0) as u32,
            })
            .collect();
        // SAFETY: pthread_self has no preconditions.
        let thread = libc::pthread_self() as u64;
        let input = gpufuse_runtime_integrity::IntegrityInput {
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
        match crate::ffi::out(out, gpufuse_runtime_integrity::integrity_answer(&input)) {
            Ok(()) => SUCCESS,
            Err(e) => e,
        }
    }
}

pub static INTEGRITY: ExportTable<3> =
    ExportTable::sized::<{ ix::INTEGRITY_CHECK }>().with(1, integrity_check as *const c_void);
