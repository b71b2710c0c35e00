//! CUDA IPC: device memory and events shared with other processes of this host
//! (`gpufuse_client::ipc` says how each is shared).

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::os::fd::IntoRawFd;

use gpufuse_client::ipc::HANDLE_LEN;

use crate::api::memory::CUdeviceptr;
use crate::api::module::h;
use crate::api::stream::CUevent;
use crate::api::vmm::CUmemGenericAllocationHandle;
use crate::ffi::out;
use crate::global::with_core;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE, NOT_SUPPORTED};

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
            return Err(INVALID_VALUE);
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
            return Err(INVALID_VALUE);
        }
        let ev = with_core(|g| g.ipc_open_event_handle(&handle.reserved))?;
        out(event, ev as usize as *mut c_void)
    })
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, the one shareable handle type gpufuse makes.
const HANDLE_TYPE_POSIX_FD: c_int = 1;

#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_int,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says
    // (for a POSIX file descriptor, `shareable` points to an int).
    guard(|| unsafe {
        if flags != 0 || shareable.is_null() {
            return Err(INVALID_VALUE);
        }
        if handle_type != HANDLE_TYPE_POSIX_FD {
            return Err(NOT_SUPPORTED);
        }
        let fd = with_core(|g| g.export_physical_fd(handle))?;
        out(shareable.cast::<c_int>(), fd.into_raw_fd())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says
    // (for a POSIX file descriptor, `os_handle` is the descriptor itself, cast).
    guard(|| unsafe {
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        if handle_type != HANDLE_TYPE_POSIX_FD {
            return Err(NOT_SUPPORTED);
        }
        let fd = c_int::try_from(os_handle as usize).map_err(|_| INVALID_VALUE)?;
        out(handle, with_core(|g| g.import_physical_fd(fd))?)
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_ipc.rs"));
