//! CUDA IPC: device memory and events shared with other processes of this host
//! (`gpufuse_client::ipc` says how each is shared).

use std::ffi::{c_uint, c_void};

use gpufuse_client::ipc::HANDLE_LEN;

use crate::api::memory::CUdeviceptr;
use crate::api::module::h;
use crate::api::stream::CUevent;
use crate::ffi::out;
use crate::global::with_core;
use crate::guard::guard;
use crate::status::CUresult;

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    pub reserved: [u8; HANDLE_LEN],
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut IpcHandle, dptr: CUdeviceptr) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let reserved = with_core(|g| g.ipc_get_mem_handle(dptr))?;
        out(handle, IpcHandle { reserved })
    })
}

/// # Safety
/// The pointer argument is an exported call's own, valid as the CUDA API contract says.
unsafe fn open_mem(dptr: *mut CUdeviceptr, handle: IpcHandle, flags: c_uint) -> CUresult {
    // SAFETY: the caller vouches for the pointer argument (# Safety).
    guard(|| unsafe {
        if dptr.is_null() {
            return Err(crate::status::INVALID_VALUE);
        }
        out(
            dptr,
            with_core(|g| g.ipc_open_mem_handle(&handle.reserved, flags))?,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    dptr: *mut CUdeviceptr,
    handle: IpcHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointer is this call's own argument.
    unsafe { open_mem(dptr, handle, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut CUdeviceptr,
    handle: IpcHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointer is this call's own argument.
    unsafe { open_mem(dptr, handle, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    guard(|| with_core(|g| g.ipc_close_mem_handle(dptr)))
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(handle: *mut IpcHandle, event: CUevent) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let reserved = with_core(|g| g.ipc_get_event_handle(h(event)))?;
        out(handle, IpcHandle { reserved })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(event: *mut CUevent, handle: IpcHandle) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if event.is_null() {
            return Err(crate::status::INVALID_VALUE);
        }
        let ev = with_core(|g| g.ipc_open_event_handle(&handle.reserved))?;
        out(event, ev as usize as *mut c_void)
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_ipc.rs"));
