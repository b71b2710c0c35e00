//! Modules, libraries, kernels and functions. Images are measured and their headers checked
//! here, at load; the client core sends them by content hash at their first use (lazy
//! loading, `gpufuse_client::module`); parameter layouts come back with each function and are
//! cached.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::Mutex;

use gpufuse_client::state::Function;

use crate::api::memory::CUdeviceptr;
use crate::ffi::{cstr, out, out_opt};
use crate::global::{client_err, session, with_core};
use crate::guard::guard;
use crate::image::image_bytes;
use crate::status::{CUresult, INVALID_VALUE, NOT_FOUND, NO_BINARY_FOR_GPU};

pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;

/// The handle number behind a driver handle pointer.
pub(crate) fn h(p: *mut c_void) -> u64 {
    p as usize as u64
}

fn p(h: u64) -> *mut c_void {
    h as usize as *mut c_void
}

/// Loads a module in the current context. An image with no code the context's device can
/// load is refused here, as the driver refuses it at `cuModuleLoadData` also in lazy mode
/// (the image itself may reach the worker only at its first use).
fn load_checked(bytes: &[u8]) -> Result<CUmodule, CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let (_, device) = g.current().map_err(client_err)?;
    if let Some(sm) = s.compute_capability(device as i32) {
        if !gpufuse_fatbin::has_code_for(bytes, sm) {
            return Err(NO_BINARY_FOR_GPU);
        }
    }
    Ok(p(g.load_module(bytes).map_err(client_err)?))
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn module_load(pmod: *mut CUmodule, image: *const c_void) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if pmod.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: CUDA's contract for a module image argument, read during this call only.
        let bytes = image_bytes(image)?;
        out(pmod, load_checked(&bytes)?)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { module_load(pmod, image) })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { module_load(pmod, image) })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    pmod: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { module_load(pmod, image) })
}

fn read_file(path: *const c_char) -> Result<Vec<u8>, CUresult> {
    // SAFETY: a NUL-terminated string argument, used during this call only.
    let path = unsafe { cstr(path) }?;
    let mut bytes = std::fs::read(path).map_err(|_| crate::status::FILE_NOT_FOUND)?;
    // A PTX file is text without its terminating NUL.
    if !bytes.starts_with(&[0x7f, b'E', b'L', b'F'])
        && !bytes.starts_with(&0xBA55ED50u32.to_le_bytes())
    {
        bytes.push(0);
    }
    Ok(bytes)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(pmod: *mut CUmodule, fname: *const c_char) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let bytes = read_file(fname)?;
        out(pmod, load_checked(&bytes)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    guard(|| with_core(|g| g.unload_module(h(hmod))))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    pf: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // SAFETY: a NUL-terminated string argument, used during this call only.
        let name = cstr(name)?;
        out(pf, p(with_core(|g| g.function(h(hmod), name))?))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // SAFETY: a NUL-terminated string argument, used during this call only.
        let name = cstr(name)?;
        let (ptr, size) = with_core(|g| g.global(h(hmod), name))?;
        out_opt(dptr, ptr);
        out_opt(bytes, size as usize);
        Ok(())
    })
}

/// `CU_MODULE_LAZY_LOADING` (2) unless `CUDA_MODULE_LOADING=EAGER` (`CU_MODULE_EAGER_LOADING`,
/// 1): fatbins and cubins reach the worker at their first use.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        out(
            mode,
            if gpufuse_client::module::lazy_loading() {
                2
            } else {
                1
            },
        )
    })
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn library_load(plib: *mut CUlibrary, bytes: &[u8]) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if plib.is_null() {
            return Err(INVALID_VALUE);
        }
        out(plib, p(with_core(|g| g.load_library(bytes))?))
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    plib: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // SAFETY: CUDA's contract for a module image argument, read during this call only.
        let image = image_bytes(code)?;
        library_load(plib, &image)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    plib: *mut CUlibrary,
    fname: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { library_load(plib, &read_file(fname)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    guard(|| with_core(|g| g.unload_library(h(lib))))
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    pk: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // SAFETY: a NUL-terminated string argument, used during this call only.
        let name = cstr(name)?;
        out(pk, p(with_core(|g| g.library_kernel(h(lib), name))?))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(pmod: *mut CUmodule, lib: CUlibrary) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(pmod, p(with_core(|g| g.library_module(h(lib)))?)) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        // SAFETY: a NUL-terminated string argument, used during this call only.
        let name = cstr(name)?;
        let (ptr, size) = with_core(|g| {
            let m = g.library_module(h(lib))?;
            g.global(m, name)
        })?;
        out_opt(dptr, ptr);
        out_opt(bytes, size as usize);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(pf: *mut CUfunction, kernel: CUkernel) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(pf, p(with_core(|g| g.kernel(h(kernel)))?.function)) })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetLibrary(plib: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(plib, p(with_core(|g| g.kernel(h(kernel)))?.library)) })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(pmod: *mut CUmodule, f: CUfunction) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(pmod, p(with_core(|g| Ok(g.function_info(h(f))?.module))?)) })
}

/// Runs `op` on the function a `CUfunction` or `CUkernel` names.
pub(crate) fn with_function<T>(
    f: *mut c_void,
    op: impl FnOnce(&Function) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    let s = session()?;
    let g = s.lock();
    op(g.function_info(h(f)).map_err(client_err)?)
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn get_attribute(pi: *mut c_int, attrib: c_int, f: *mut c_void) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let v = with_function(f, |func| func.attribute(attrib).ok_or(INVALID_VALUE))?;
        out(pi, v)
    }
}

/// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`, `_MAX_DYNAMIC_SHARED_SIZE_BYTES`,
/// `_PREFERRED_SHARED_MEMORY_CARVEOUT`; `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`.
const FUNC_SHARED_SIZE: c_int = 1;
const FUNC_MAX_DYNAMIC_SHARED: c_int = 8;
const FUNC_CARVEOUT: c_int = 9;
const DEVICE_SHARED_PER_BLOCK_OPTIN: c_int = 97;

fn set_attribute(f: *mut c_void, attrib: c_int, value: c_int) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let module = g.function_info(h(f)).map_err(client_err)?.module;
    let device = g.module_device(module).unwrap_or(0) as c_int;
    let optin = s
        .attribute(device, DEVICE_SHARED_PER_BLOCK_OPTIN)
        .unwrap_or(c_int::MAX);
    let func = g.function_info_mut(h(f)).map_err(client_err)?;
    // As NVIDIA's driver checks: dynamic shared memory up to what a block of the function's
    // device may opt into, less the function's static shared memory; a carveout is a
    // percentage or -1 (the default).
    let valid = match attrib {
        FUNC_MAX_DYNAMIC_SHARED => {
            (0..=optin - func.attribute(FUNC_SHARED_SIZE).unwrap_or(0)).contains(&value)
        }
        FUNC_CARVEOUT => (-1..=100).contains(&value),
        _ => true,
    };
    if !valid {
        return Err(INVALID_VALUE);
    }
    func.set_attribute(attrib, value);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    f: CUfunction,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { get_attribute(pi, attrib, f) })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { get_attribute(pi, attrib, k) })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(
    f: CUfunction,
    attrib: c_int,
    value: c_int,
) -> CUresult {
    guard(|| set_attribute(f, attrib, value))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: c_int,
    value: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    guard(|| set_attribute(k, attrib, value))
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(f: CUfunction, _config: c_int) -> CUresult {
    guard(|| with_function(f, |_| Ok(())))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelSetCacheConfig(
    k: CUkernel,
    _config: c_int,
    _dev: c_int,
) -> CUresult {
    guard(|| with_function(k, |_| Ok(())))
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetSharedMemConfig(f: CUfunction, _config: c_int) -> CUresult {
    guard(|| with_function(f, |_| Ok(())))
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn param_info(
    f: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let slot = with_function(f, |func| {
            func.info.params.get(index).copied().ok_or(INVALID_VALUE)
        })?;
        out(offset, slot.offset as usize)?;
        out_opt(size, slot.size as usize);
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { param_info(f, index, offset, size) })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { param_info(k, index, offset, size) })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamCount(f: CUfunction, count: *mut usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(count, with_function(f, |func| Ok(func.info.params.len()))?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamCount(k: CUkernel, count: *mut usize) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(count, with_function(k, |func| Ok(func.info.params.len()))?) })
}

/// Function names handed to the application live as long as the process.
static NAMES: Mutex<Option<HashMap<String, &'static CString>>> = Mutex::new(None);
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn name_of(f: *mut c_void, pname: *mut *const c_char) -> Result<(), CUresult> {
    let name = with_function(f, |func| Ok(func.name.clone()))?;
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe { out(pname, lasting_name(name)?) }
}

/// `name` as a NUL-terminated string that lives as long as the process.
pub(crate) fn lasting_name(name: String) -> Result<*const c_char, CUresult> {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let map = names.get_or_insert_with(HashMap::new);
    let c: &'static CString = match map.get(&name) {
        Some(c) => c,
        None => {
            let c = Box::leak(Box::new(CString::new(name.clone()).map_err(|_| NOT_FOUND)?));
            map.insert(name, c);
            c
        }
    };
    Ok(c.as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(pname: *mut *const c_char, f: CUfunction) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { name_of(f, pname) })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(pname: *mut *const c_char, k: CUkernel) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { name_of(k, pname) })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, f: CUfunction) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        with_function(f, |_| Ok(()))?;
        out(state, 1)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    guard(|| with_function(f, |_| Ok(())))
}

include!(concat!(env!("OUT_DIR"), "/aliases_module.rs"));
