//! CUDA IPC: device memory and events shared with other processes of this host
//! (`gpufuse_client::ipc` says how each is shared).

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::os::fd::{IntoRawFd, OwnedFd};

use gpufuse_client::error::ClientError;
use gpufuse_client::state::Inner;

use gpufuse_client::ipc::HANDLE_LEN;

use crate::api::memory::{CUdeviceptr, HANDLE_TYPE_POSIX_FD};
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

/// A shareable handle's export: a POSIX file descriptor, written as an int to `shareable`.
///
/// # Safety
/// `shareable` is an exported call's own argument, valid as the CUDA API contract says.
unsafe fn export_fd(
    shareable: *mut c_void,
    handle_type: c_int,
    flags: c_ulonglong,
    export: impl FnOnce(&mut Inner) -> Result<OwnedFd, ClientError>,
) -> Result<(), CUresult> {
    if flags != 0 || shareable.is_null() {
        return Err(INVALID_VALUE);
    }
    if handle_type != HANDLE_TYPE_POSIX_FD {
        return Err(NOT_SUPPORTED);
    }
    let fd = with_core(export)?;
    // SAFETY: for a POSIX file descriptor `shareable` points to an int (# Safety).
    unsafe { out(shareable.cast::<c_int>(), fd.into_raw_fd()) }
}

/// A shareable handle's import: `os_handle` is a POSIX file descriptor itself, cast.
fn import_fd<T>(
    os_handle: *mut c_void,
    handle_type: c_int,
    import: impl FnOnce(&mut Inner, c_int) -> Result<T, ClientError>,
) -> Result<T, CUresult> {
    if handle_type != HANDLE_TYPE_POSIX_FD {
        return Err(NOT_SUPPORTED);
    }
    let fd = c_int::try_from(os_handle as usize).map_err(|_| INVALID_VALUE)?;
    with_core(|g| import(g, fd))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_int,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the pointer is this call's own argument.
    guard(|| unsafe {
        export_fd(shareable, handle_type, flags, |g| {
            g.export_physical_fd(handle)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if handle.is_null() {
            return Err(INVALID_VALUE);
        }
        let h = import_fd(os_handle, handle_type, |g, fd| g.import_physical_fd(fd))?;
        out(handle, h)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    shareable: *mut c_void,
    pool: *mut c_void,
    handle_type: c_int,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the pointer is this call's own argument.
    guard(|| unsafe { export_fd(shareable, handle_type, flags, |g| g.export_pool_fd(h(pool))) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    pool: *mut *mut c_void,
    handle: *mut c_void,
    handle_type: c_int,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if flags != 0 || pool.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = import_fd(handle, handle_type, |g, fd| g.import_pool_fd(fd))?;
        out(pool, p as usize as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportPointer(
    data: *mut IpcHandle,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let reserved = with_core(|g| g.export_pool_pointer(ptr))?;
        out(data, IpcHandle { reserved })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportPointer(
    ptr: *mut CUdeviceptr,
    pool: *mut c_void,
    data: *const IpcHandle,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let d = crate::ffi::read(data)?;
        if ptr.is_null() {
            return Err(INVALID_VALUE);
        }
        out(
            ptr,
            with_core(|g| g.import_pool_pointer(h(pool), &d.reserved))?,
        )
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_ipc.rs"));
