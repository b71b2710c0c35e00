//! Modules, libraries, kernels and functions. Images are measured in the client, hashed, and
//! sent once per connection; parameter layouts come back with each function and are cached.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::Mutex;

use gpufuse_client::handles::{self, Kind};
use gpufuse_client::state::{Function, Inner, Kernel, Library, Module};
use gpufuse_proto::{ReplyBody, Request};
use sha2::{Digest, Sha256};

use crate::api::context::{client_err, current, ensure_primary};
use crate::api::memory::CUdeviceptr;
use crate::ffi::{cstr, out, out_opt};
use crate::global::session;
use crate::guard::guard;
use crate::image::image_bytes;
use crate::status::{
    CUresult, INVALID_HANDLE, INVALID_VALUE, NOT_FOUND, NO_BINARY_FOR_GPU, UNKNOWN,
};

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

/// Images above this size travel in parts (a frame carries at most 64 MiB and change).
const IMAGE_PART: usize = 32 << 20;

/// Loads `image` on `device` as module `module`.
fn load(g: &mut Inner, device: u32, image: &[u8], library: Option<u64>) -> Result<u64, CUresult> {
    let hash: [u8; 32] = Sha256::digest(image).into();
    let module = handles::mint(Kind::Module);
    let mut send = !g.images_sent.contains(&hash);
    loop {
        // An image larger than a frame goes ahead in parts; the load then names it by hash.
        let parts = send && image.len() > IMAGE_PART;
        if parts {
            for (i, data) in image.chunks(IMAGE_PART).enumerate() {
                let part = Request::ModuleImagePart {
                    hash,
                    total: image.len() as u64,
                    offset: (i * IMAGE_PART) as u64,
                    data,
                };
                g.conn.quiet(&part).map_err(client_err)?;
            }
        }
        let req = Request::ModuleLoad {
            module,
            device,
            hash,
            image: (send && !parts).then_some(image),
        };
        match g.conn.call(&req).map_err(client_err)? {
            ReplyBody::NeedImage if !send => send = true,
            ReplyBody::NeedImage => return Err(crate::status::INVALID_IMAGE),
            ReplyBody::None => break,
            _ => return Err(UNKNOWN),
        }
    }
    g.images_sent.insert(hash);
    g.modules.insert(
        module,
        Module {
            device,
            functions: HashMap::new(),
            library,
        },
    );
    Ok(module)
}

/// The device modules load on: the current context's, or device 0's primary context.
fn load_device(g: &mut Inner) -> Result<u32, CUresult> {
    match current(g) {
        Ok((_, d)) => Ok(d),
        Err(_) => {
            ensure_primary(g, 0)?;
            Ok(0)
        }
    }
}

fn module_load(pmod: *mut CUmodule, image: *const c_void) -> Result<(), CUresult> {
    if pmod.is_null() {
        return Err(INVALID_VALUE);
    }
    let bytes = image_bytes(image)?;
    let s = session()?;
    let mut g = s.lock();
    let (_, device) = current(&g)?;
    let m = load(&mut g, device, &bytes, None)?;
    out(pmod, p(m))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| module_load(pmod, image))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    guard(|| module_load(pmod, image))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    pmod: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    guard(|| module_load(pmod, image))
}

fn read_file(path: *const c_char) -> Result<Vec<u8>, CUresult> {
    let path = cstr(path)?;
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
    guard(|| {
        let bytes = read_file(fname)?;
        let s = session()?;
        let mut g = s.lock();
        let (_, device) = current(&g)?;
        let m = load(&mut g, device, &bytes, None)?;
        out(pmod, p(m))
    })
}

fn unload_module(g: &mut Inner, m: u64) -> Result<(), CUresult> {
    g.modules.remove(&m).ok_or(INVALID_HANDLE)?;
    g.functions.retain(|_, f| f.module != m);
    g.conn
        .quiet(&Request::ModuleUnload { module: m })
        .map_err(client_err)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        unload_module(&mut g, h(hmod))
    })
}

/// The function `name` of module `m`, fetched from the worker once.
fn function(g: &mut Inner, m: u64, name: &str) -> Result<u64, CUresult> {
    let module = g.modules.get(&m).ok_or(INVALID_HANDLE)?;
    if let Some(&f) = module.functions.get(name) {
        return Ok(f);
    }
    let f = handles::mint(Kind::Function);
    let req = Request::ModuleGetFunction {
        module: m,
        name,
        function: f,
    };
    let info = match g.conn.call(&req) {
        Ok(ReplyBody::Function(info)) => info,
        Ok(_) => return Err(UNKNOWN),
        Err(e) => return Err(e.status()),
    };
    g.functions.insert(
        f,
        Function {
            module: m,
            name: name.to_string(),
            info,
        },
    );
    if let Some(module) = g.modules.get_mut(&m) {
        module.functions.insert(name.to_string(), f);
    }
    Ok(f)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    pf: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let name = cstr(name)?;
        let s = session()?;
        let f = function(&mut s.lock(), h(hmod), name)?;
        out(pf, p(f))
    })
}

fn global(g: &mut Inner, m: u64, name: &str) -> Result<(u64, u64), CUresult> {
    g.modules.get(&m).ok_or(INVALID_HANDLE)?;
    match g.conn.call(&Request::ModuleGetGlobal { module: m, name }) {
        Ok(ReplyBody::Global { ptr, size }) => {
            let device = g.modules[&m].device;
            g.allocations
                .entry(ptr)
                .or_insert(gpufuse_client::state::Allocation {
                    size,
                    device,
                    pool: None,
                    managed: false,
                    mapped: false,
                    offset: 0,
                });
            Ok((ptr, size))
        }
        Ok(_) => Err(UNKNOWN),
        Err(e) => Err(e.status()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let name = cstr(name)?;
        let s = session()?;
        let (ptr, size) = global(&mut s.lock(), h(hmod), name)?;
        out_opt(dptr, ptr);
        out_opt(bytes, size as usize);
        Ok(())
    })
}

/// `CU_MODULE_EAGER_LOADING`: images are loaded when the application loads them.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    guard(|| out(mode, 1))
}

fn library_load(plib: *mut CUlibrary, bytes: &[u8]) -> Result<(), CUresult> {
    if plib.is_null() {
        return Err(INVALID_VALUE);
    }
    let s = session()?;
    let mut g = s.lock();
    let device = load_device(&mut g)?;
    let lib = handles::mint(Kind::Library);
    // The driver loads a library's code into a context lazily (CUDA_MODULE_LOADING=LAZY, the
    // default): an image with no code for this GPU loads, and only its use fails. cuBLAS loads
    // such images (sm_6x SASS only) in cublasCreate.
    let module = match load(&mut g, device, bytes, Some(lib)) {
        Err(NO_BINARY_FOR_GPU) => Err(NO_BINARY_FOR_GPU),
        r => Ok(r?),
    };
    g.libraries.insert(
        lib,
        Library {
            module,
            device,
            image: bytes.into(),
            kernels: HashMap::new(),
        },
    );
    out(plib, p(lib))
}

/// After a device reset: libraries are context-independent, so each library on `device` is
/// loaded again (fresh module variables, as in a new context) and its kernels point at the new
/// module's functions. A library or kernel that fails to load again keeps the failure.
pub(crate) fn reload_libraries(g: &mut Inner, device: u32) {
    let libs: Vec<(u64, std::sync::Arc<[u8]>)> = g
        .libraries
        .iter()
        .filter(|(_, l)| l.device == device)
        .map(|(&h, l)| (h, l.image.clone()))
        .collect();
    for (lib, image) in libs {
        let module = load(g, device, &image, Some(lib));
        let names: Vec<(String, u64)> = g.libraries[&lib]
            .kernels
            .iter()
            .map(|(n, &k)| (n.clone(), k))
            .collect();
        for (name, k) in names {
            match module.and_then(|m| function(g, m, &name)) {
                Ok(f) => {
                    if let Some(kernel) = g.kernels.get_mut(&k) {
                        kernel.function = f;
                    }
                }
                Err(_) => {
                    g.kernels.remove(&k);
                    if let Some(l) = g.libraries.get_mut(&lib) {
                        l.kernels.remove(&name);
                    }
                }
            }
        }
        if let Some(l) = g.libraries.get_mut(&lib) {
            l.module = module;
        }
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
    guard(|| library_load(plib, &image_bytes(code)?))
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
    guard(|| library_load(plib, &read_file(fname)?))
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let l = g.libraries.remove(&h(lib)).ok_or(INVALID_HANDLE)?;
        g.kernels.retain(|_, k| k.library != h(lib));
        match l.module {
            Ok(m) => unload_module(&mut g, m),
            Err(_) => Ok(()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    pk: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let name = cstr(name)?;
        let s = session()?;
        let mut g = s.lock();
        let l = g.libraries.get(&h(lib)).ok_or(INVALID_HANDLE)?;
        if let Some(&k) = l.kernels.get(name) {
            return out(pk, p(k));
        }
        let module = l.module?;
        let f = function(&mut g, module, name)?;
        let k = handles::mint(Kind::Kernel);
        g.kernels.insert(
            k,
            Kernel {
                library: h(lib),
                function: f,
            },
        );
        if let Some(l) = g.libraries.get_mut(&h(lib)) {
            l.kernels.insert(name.to_string(), k);
        }
        out(pk, p(k))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(pmod: *mut CUmodule, lib: CUlibrary) -> CUresult {
    guard(|| {
        let s = session()?;
        let m = s
            .lock()
            .libraries
            .get(&h(lib))
            .ok_or(INVALID_HANDLE)?
            .module?;
        out(pmod, p(m))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let name = cstr(name)?;
        let s = session()?;
        let mut g = s.lock();
        let m = g.libraries.get(&h(lib)).ok_or(INVALID_HANDLE)?.module?;
        let (ptr, size) = global(&mut g, m, name)?;
        out_opt(dptr, ptr);
        out_opt(bytes, size as usize);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(pf: *mut CUfunction, kernel: CUkernel) -> CUresult {
    guard(|| {
        let s = session()?;
        let f = s
            .lock()
            .kernels
            .get(&h(kernel))
            .ok_or(INVALID_HANDLE)?
            .function;
        out(pf, p(f))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetLibrary(plib: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    guard(|| {
        let s = session()?;
        let l = s
            .lock()
            .kernels
            .get(&h(kernel))
            .ok_or(INVALID_HANDLE)?
            .library;
        out(plib, p(l))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(pmod: *mut CUmodule, f: CUfunction) -> CUresult {
    guard(|| {
        let s = session()?;
        let g = s.lock();
        let f = g.resolve_function(h(f)).ok_or(INVALID_HANDLE)?;
        out(pmod, p(g.functions[&f].module))
    })
}

/// Runs `op` on the function a `CUfunction` or `CUkernel` names.
pub(crate) fn with_function<T>(
    f: *mut c_void,
    op: impl FnOnce(&mut Function) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let id = g.resolve_function(h(f)).ok_or(INVALID_HANDLE)?;
    op(g.functions.get_mut(&id).ok_or(INVALID_HANDLE)?)
}

fn get_attribute(pi: *mut c_int, attrib: c_int, f: *mut c_void) -> Result<(), CUresult> {
    let v = with_function(f, |func| {
        func.info
            .attributes
            .iter()
            .find(|(a, _)| *a == attrib)
            .map(|&(_, v)| v)
            .ok_or(INVALID_VALUE)
    })?;
    out(pi, v)
}

fn set_attribute(f: *mut c_void, attrib: c_int, value: c_int) -> Result<(), CUresult> {
    with_function(f, |func| {
        match func.info.attributes.iter_mut().find(|(a, _)| *a == attrib) {
            Some(slot) => slot.1 = value,
            None => func.info.attributes.push((attrib, value)),
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    f: CUfunction,
) -> CUresult {
    guard(|| get_attribute(pi, attrib, f))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    k: CUkernel,
    _dev: c_int,
) -> CUresult {
    guard(|| get_attribute(pi, attrib, k))
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

fn param_info(
    f: *mut c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CUresult> {
    let slot = with_function(f, |func| {
        func.info.params.get(index).copied().ok_or(INVALID_VALUE)
    })?;
    out(offset, slot.offset as usize)?;
    out_opt(size, slot.size as usize);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    guard(|| param_info(f, index, offset, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    guard(|| param_info(k, index, offset, size))
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamCount(f: CUfunction, count: *mut usize) -> CUresult {
    guard(|| out(count, with_function(f, |func| Ok(func.info.params.len()))?))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamCount(k: CUkernel, count: *mut usize) -> CUresult {
    guard(|| out(count, with_function(k, |func| Ok(func.info.params.len()))?))
}

/// Function names handed to the application live as long as the process.
static NAMES: Mutex<Option<HashMap<String, &'static CString>>> = Mutex::new(None);

fn name_of(f: *mut c_void, pname: *mut *const c_char) -> Result<(), CUresult> {
    let name = with_function(f, |func| Ok(func.name.clone()))?;
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
    out(pname, c.as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(pname: *mut *const c_char, f: CUfunction) -> CUresult {
    guard(|| name_of(f, pname))
}

#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(pname: *mut *const c_char, k: CUkernel) -> CUresult {
    guard(|| name_of(k, pname))
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, f: CUfunction) -> CUresult {
    guard(|| {
        with_function(f, |_| Ok(()))?;
        out(state, 1)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    guard(|| with_function(f, |_| Ok(())))
}

include!(concat!(env!("OUT_DIR"), "/aliases_module.rs"));
