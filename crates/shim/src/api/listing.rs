//! Listing what a module or a library holds: `cuModuleGetFunctionCount`,
//! `cuModuleEnumerateFunctions`, `cuLibraryGetKernelCount`, `cuLibraryEnumerateKernels`
//! (CUDA 12.4), and the walk over a module's functions that cuFFT asks the driver for through
//! the export table `6e163fbe` (`crate::dark_api::tools`).
//!
//! The names come from the module's own image: the kernels of the code the device loads from
//! it (`gpufuse_fatbin::kernel_names`). Each listed function is the one `cuModuleGetFunction`
//! returns for its name.

use std::ffi::{c_uint, c_void};

use crate::api::module::{h, CUfunction, CUkernel, CUlibrary, CUmodule};
use crate::ffi::out;
use crate::global::{session, with_core};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE};

/// The kernel names of module `m`, in the order the enumeration lists them.
fn kernel_names(m: u64) -> Result<Vec<String>, CUresult> {
    let s = session()?;
    let (device, image) = s.lock().module_image(m).ok_or(INVALID_HANDLE)?;
    let sm = s.compute_capability(device as i32).ok_or(INVALID_HANDLE)?;
    gpufuse_fatbin::kernel_names(&image, sm).map_err(|_| crate::status::INVALID_IMAGE)
}

/// Module `m`'s functions, as `cuModuleGetFunction` gives them, with their names.
pub(crate) fn named_functions(m: u64) -> Result<Vec<(String, u64)>, CUresult> {
    let names = kernel_names(m)?;
    with_core(|g| {
        names
            .into_iter()
            .map(|name| {
                let f = g.function(m, &name)?;
                Ok((name, f))
            })
            .collect::<Result<Vec<_>, _>>()
    })
}

/// Module `m`'s functions, as `cuModuleGetFunction` gives them.
fn module_functions(m: u64) -> Result<Vec<u64>, CUresult> {
    Ok(named_functions(m)?.into_iter().map(|(_, f)| f).collect())
}

fn library_module(lib: CUlibrary) -> Result<u64, CUresult> {
    with_core(|g| g.library_module(h(lib)))
}

/// Writes the first `n` of `handles` (all of them if fewer) to `list`: NVIDIA's driver
/// accepts a list shorter than the count (seen on driver 580, 2026-11-27).
///
/// # Safety
/// `list` is NULL or points to `n` writable handles.
unsafe fn fill(list: *mut *mut c_void, n: c_uint, handles: &[u64]) -> Result<(), CUresult> {
    if list.is_null() {
        return Err(INVALID_VALUE);
    }
    for (i, &x) in handles.iter().take(n as usize).enumerate() {
        // SAFETY: `list` holds `n` slots (# Safety) and `i` < `n`.
        unsafe { list.add(i).write(x as usize as *mut c_void) };
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut c_uint, hmod: CUmodule) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(count, kernel_names(h(hmod))?.len() as c_uint) })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut CUfunction,
    n: c_uint,
    hmod: CUmodule,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { fill(functions, n, &module_functions(h(hmod))?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUlibrary) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(count, kernel_names(library_module(lib)?)?.len() as c_uint) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut CUkernel,
    n: c_uint,
    lib: CUlibrary,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let names = kernel_names(library_module(lib)?)?;
        let handles = with_core(|g| {
            names
                .iter()
                .map(|name| g.library_kernel(h(lib), name))
                .collect::<Result<Vec<_>, _>>()
        })?;
        fill(kernels, n, &handles)
    })
}
