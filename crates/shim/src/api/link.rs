//! The JIT linker: `cuLinkCreate`, `cuLinkAddData`, `cuLinkAddFile`, `cuLinkComplete`,
//! `cuLinkDestroy` (and their `_v2` names).
//!
//! Inputs are PTX, fatbins that carry PTX, and host objects and libraries whose
//! `__nv_relfatbin` (or `.nv_fatbin`) sections do (what `nvcc -rdc=true -c` and `nvcc -lib` make); a cubin is SASS, which the
//! emulated GPU cannot run, and is refused naming the input. Each PTX input is parsed when it
//! is added (a syntax error is `CUDA_ERROR_INVALID_PTX` then, as ptxas would find it);
//! `cuLinkComplete` links the units in the client (`gpufuse_ptx::Module::link`), so a symbol
//! defined twice or declared and defined nowhere fails there with `CUDA_ERROR_INVALID_IMAGE`
//! and the error log naming it, as nvlink's errors do. The image it gives back is a fatbin
//! of the units' PTX (`gpufuse_fatbin::link_image`); the device links them again when the
//! application loads it (`cuModuleLoadData`), so the image is self-contained and needs no
//! state of the linker. The image lives until `cuLinkDestroy`.
//!
//! Options: the info and error log buffers get the linker's messages (their size options are
//! updated to the bytes written), `CU_JIT_WALL_TIME` gets the time taken; every other option
//! of `CUjit_option` is a compiler setting with no meaning for the VM and is accepted.

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::ffi::{cstr, host_bytes, out, read_at, write_at, write_cstr};
use crate::guard::guard;
use crate::status::{
    CUresult, FILE_NOT_FOUND, INVALID_HANDLE, INVALID_IMAGE, INVALID_PTX, INVALID_VALUE,
    NO_BINARY_FOR_GPU,
};

pub type CUlinkState = *mut c_void;

/// An input's units: each one's name and bytes.
type Units = Vec<(String, Vec<u8>)>;

const CU_JIT_WALL_TIME: c_uint = 2;
const CU_JIT_INFO_LOG_BUFFER: c_uint = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_uint = 4;
const CU_JIT_ERROR_LOG_BUFFER: c_uint = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_uint = 6;
/// The last `CUjit_option` value CUDA 13 defines.
const LAST_JIT_OPTION: c_uint = 35;
/// Most options one call may pass (a bound on an array read from the application).
const MAX_OPTIONS: c_uint = 1024;

const CU_JIT_INPUT_CUBIN: c_uint = 0;
const CU_JIT_INPUT_PTX: c_uint = 1;
const CU_JIT_INPUT_FATBINARY: c_uint = 2;
const CU_JIT_INPUT_OBJECT: c_uint = 3;
const CU_JIT_INPUT_LIBRARY: c_uint = 4;
const CU_JIT_INPUT_NVVM: c_uint = 5;

/// Where the application wants the linker's messages: its option arrays, which must outlive
/// the link state (cuda.h).
#[derive(Default, Clone, Copy)]
struct Logs {
    /// (buffer, capacity, the option-values slot that gets the bytes written)
    info: Option<(usize, usize, usize)>,
    error: Option<(usize, usize, usize)>,
    /// The option-values slot that gets the wall time (a float, milliseconds).
    wall: Option<usize>,
}

struct LinkState {
    logs: Logs,
    /// Each input's name and its units' bytes (PTX text or a fatbin carrying PTX).
    inputs: Vec<(String, Vec<u8>)>,
    info: String,
    /// The image `cuLinkComplete` gave, kept until `cuLinkDestroy`.
    image: Option<Vec<u8>>,
}

fn states() -> &'static Mutex<HashMap<u64, LinkState>> {
    static S: std::sync::OnceLock<Mutex<HashMap<u64, LinkState>>> = std::sync::OnceLock::new();
    S.get_or_init(Default::default)
}

/// Link-state handles: distinct, never zero, never memory.
static NEXT: AtomicU64 = AtomicU64::new(0x11_0000_0001);

/// Reads the options the application passed. Unknown options are `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn read_options(
    n: c_uint,
    options: *const c_uint,
    values: *mut *mut c_void,
    logs: &mut Logs,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if n == 0 {
            return Ok(());
        }
        if n > MAX_OPTIONS || options.is_null() || values.is_null() {
            return Err(INVALID_VALUE);
        }
        let (mut info_buf, mut info_cap, mut err_buf, mut err_cap) = (None, None, None, None);
        for i in 0..n as usize {
            let opt = read_at(options, i)?;
            let value = read_at(values.cast_const(), i)? as usize;
            let slot = values as usize + i * std::mem::size_of::<*mut c_void>();
            match opt {
                CU_JIT_INFO_LOG_BUFFER => info_buf = Some(value),
                CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES => info_cap = Some((value, slot)),
                CU_JIT_ERROR_LOG_BUFFER => err_buf = Some(value),
                CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => err_cap = Some((value, slot)),
                CU_JIT_WALL_TIME => logs.wall = Some(slot),
                o if o <= LAST_JIT_OPTION => {}
                _ => return Err(INVALID_VALUE),
            }
        }
        if let (Some(b), Some((cap, slot))) = (info_buf, info_cap) {
            logs.info = (b != 0 && cap > 0).then_some((b, cap, slot));
        }
        if let (Some(b), Some((cap, slot))) = (err_buf, err_cap) {
            logs.error = (b != 0 && cap > 0).then_some((b, cap, slot));
        }
        Ok(())
    }
}

/// Writes `text` to a log buffer and the bytes written (with the NUL) to its size slot.
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn write_log(log: Option<(usize, usize, usize)>, text: &str) {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if let Some((buf, cap, slot)) = log {
            let _ = write_cstr(buf as *mut c_char, cap, text);
            let n = text.len().min(cap.saturating_sub(1)) + 1;
            let _ = write_at(slot as *mut usize, 0, n);
        }
    }
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn write_wall(logs: &Logs, started: Instant) {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if let Some(slot) = logs.wall {
            let ms = started.elapsed().as_secs_f32() * 1000.0;
            let _ = write_at(slot as *mut u64, 0, ms.to_bits() as u64);
        }
    }
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn link_create(
    n: c_uint,
    options: *const c_uint,
    values: *mut *mut c_void,
    state_out: *mut CUlinkState,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if state_out.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut logs = Logs::default();
        read_options(n, options, values, &mut logs)?;
        let h = NEXT.fetch_add(1, Ordering::Relaxed);
        states().lock().unwrap_or_else(|p| p.into_inner()).insert(
            h,
            LinkState {
                logs,
                inputs: Vec::new(),
                info: String::new(),
                image: None,
            },
        );
        out(state_out, h as usize as CUlinkState)
    }
}

/// The units of an object file or a static library: its fatbins that carry PTX.
fn units_of_object(name: &str, bytes: &[u8]) -> Result<Units, String> {
    let fatbins = gpufuse_fatbin::fatbins_in_object(bytes)
        .map_err(|e| format!("{name}: not an object file or library with device code: {e}"))?;
    if fatbins.is_empty() {
        return Err(format!(
            "{name} holds no device code (no __nv_relfatbin or .nv_fatbin section)"
        ));
    }
    Ok(fatbins
        .into_iter()
        .enumerate()
        .map(|(i, (member, f))| (format!("{name}({member}#{i})"), f))
        .collect())
}

/// Checks one input and returns its units, or the status and the error log's text.
fn accept(kind: c_uint, name: &str, bytes: &[u8]) -> Result<Units, (CUresult, String)> {
    let units = match kind {
        CU_JIT_INPUT_PTX => vec![(name.to_string(), bytes.to_vec())],
        CU_JIT_INPUT_CUBIN | CU_JIT_INPUT_FATBINARY => vec![(name.to_string(), bytes.to_vec())],
        CU_JIT_INPUT_OBJECT | CU_JIT_INPUT_LIBRARY => {
            units_of_object(name, bytes).map_err(|e| (INVALID_IMAGE, e))?
        }
        CU_JIT_INPUT_NVVM => {
            return Err((
                INVALID_VALUE,
                format!("{name}: NVVM IR inputs (link-time optimization) are not supported"),
            ))
        }
        _ => return Err((INVALID_VALUE, format!("{name}: unknown input type {kind}"))),
    };
    for (uname, u) in &units {
        if kind == CU_JIT_INPUT_PTX && gpufuse_fatbin::classify(u) != gpufuse_fatbin::ImageKind::Ptx
        {
            return Err((INVALID_PTX, format!("{uname} is not PTX text")));
        }
        let image = gpufuse_fatbin::link_image(&[(uname.as_str(), u.as_slice())])
            .map_err(|e| (NO_BINARY_FOR_GPU, e.to_string()))?;
        let texts = gpufuse_fatbin::select_units(&image, u32::MAX)
            .map_err(|e| (INVALID_IMAGE, format!("{uname}: {e}")))?;
        // NVIDIA's device runtime (libcudadevrt) is not linked: the emulated GPU provides it.
        for t in texts
            .iter()
            .filter(|t| !gpufuse_fatbin::defines_device_runtime(t.as_bytes()))
        {
            gpufuse_ptx::Module::parse(t).map_err(|e| (INVALID_PTX, format!("{uname}: {e}")))?;
        }
    }
    Ok(units)
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn add(
    state: CUlinkState,
    kind: c_uint,
    bytes: &[u8],
    name: &str,
    n: c_uint,
    options: *const c_uint,
    values: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let started = Instant::now();
        let mut all = states().lock().unwrap_or_else(|p| p.into_inner());
        let s = all
            .get_mut(&(state as usize as u64))
            .ok_or(INVALID_HANDLE)?;
        // Options given here apply to this input only.
        let mut logs = s.logs;
        read_options(n, options, values, &mut logs)?;
        match accept(kind, name, bytes) {
            Ok(units) => {
                s.info.push_str(&format!("info    : added {name}\n"));
                write_log(logs.info, &s.info);
                s.inputs.extend(units);
                write_wall(&logs, started);
                Ok(())
            }
            Err((status, why)) => {
                write_log(logs.error, &format!("error   : {why}"));
                Err(status)
            }
        }
    }
}

/// # Safety
/// `name` is NULL or a NUL-terminated string valid and unchanged for the current call (the
/// input's name argument of `cuLinkAddData`); the result is used only during the call.
unsafe fn name_or(name: *const c_char, default: &str) -> Result<&str, CUresult> {
    if name.is_null() {
        Ok(default)
    } else {
        // SAFETY: the caller's contract above is cstr's.
        unsafe { cstr(name) }
    }
}

#[allow(clippy::too_many_arguments)]
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn link_add_data(
    state: CUlinkState,
    kind: c_uint,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    n: c_uint,
    options: *const c_uint,
    values: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if data.is_null() || size == 0 {
            return Err(INVALID_VALUE);
        }
        // SAFETY: `data` is the caller's input of `size` bytes (cuLinkAddData's contract), read
        // only during this call: `add` copies what it keeps.
        let bytes = host_bytes(data, size)?;
        // SAFETY: `name` is NULL or the caller's NUL-terminated name, used only during this call.
        let name = name_or(name, "<data>")?;
        add(state, kind, bytes, name, n, options, values)
    }
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn link_add_file(
    state: CUlinkState,
    kind: c_uint,
    path: *const c_char,
    n: c_uint,
    options: *const c_uint,
    values: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        // SAFETY: `path` is NULL or the caller's NUL-terminated path (cuLinkAddFile's contract),
        // used only during this call.
        let path = cstr(path)?;
        let bytes = std::fs::read(path).map_err(|_| FILE_NOT_FOUND)?;
        add(state, kind, &bytes, path, n, options, values)
    }
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn link_complete(
    state: CUlinkState,
    cubin_out: *mut *mut c_void,
    size_out: *mut usize,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if cubin_out.is_null() || size_out.is_null() {
            return Err(INVALID_VALUE);
        }
        let started = Instant::now();
        let mut all = states().lock().unwrap_or_else(|p| p.into_inner());
        let s = all
            .get_mut(&(state as usize as u64))
            .ok_or(INVALID_HANDLE)?;
        let fail = |s: &LinkState, status: CUresult, why: String| {
            write_log(s.logs.error, &format!("error   : {why}"));
            Err(status)
        };
        if s.inputs.is_empty() {
            return fail(
                s,
                INVALID_VALUE,
                "nothing to link: no input was added".into(),
            );
        }
        let inputs: Vec<(&str, &[u8])> = s
            .inputs
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        let image = match gpufuse_fatbin::link_image(&inputs) {
            Ok(i) => i,
            Err(e) => return fail(s, NO_BINARY_FOR_GPU, e.to_string()),
        };
        // Each input's text (`link_image` makes each input a unit), named by its input; an
        // input that is NVIDIA's device runtime (libcudadevrt) has none: the emulated GPU
        // provides it.
        let mut texts: Vec<(&str, String)> = Vec::with_capacity(inputs.len());
        for &(name, bytes) in &inputs {
            let one = match gpufuse_fatbin::link_image(&[(name, bytes)])
                .and_then(|i| gpufuse_fatbin::select_units(&i, u32::MAX))
            {
                Ok(t) => t,
                Err(e) => return fail(s, INVALID_IMAGE, e.to_string()),
            };
            texts.extend(
                one.into_iter()
                    .filter(|t| !gpufuse_fatbin::defines_device_runtime(t.as_bytes()))
                    .map(|t| (name, t)),
            );
        }
        let units: Vec<(&str, &str)> = texts.iter().map(|(n, t)| (*n, t.as_str())).collect();
        match gpufuse_ptx::Module::link(&units) {
            Ok(_) => {}
            Err(e @ gpufuse_ptx::PtxError::Link(_)) => {
                return fail(s, INVALID_IMAGE, e.to_string())
            }
            Err(e) => return fail(s, INVALID_PTX, e.to_string()),
        }
        s.info.push_str(&format!(
            "info    : linked {} unit(s) into an image of {} bytes\n",
            units.len(),
            image.len()
        ));
        write_log(s.logs.info, &s.info);
        write_wall(&s.logs, started);
        let len = image.len();
        let ptr = s.image.insert(image).as_mut_ptr();
        out(cubin_out, ptr.cast::<c_void>())?;
        out(size_out, len)
    }
}

fn link_destroy(state: CUlinkState) -> Result<(), CUresult> {
    states()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(state as usize as u64))
        .map(|_| ())
        .ok_or(INVALID_HANDLE)
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate_v2(
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
    state_out: *mut CUlinkState,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { link_create(num_options, options, option_values, state_out) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkCreate(
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
    state_out: *mut CUlinkState,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { link_create(num_options, options, option_values, state_out) })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    state: CUlinkState,
    kind: c_uint,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        link_add_data(
            state,
            kind,
            data,
            size,
            name,
            num_options,
            options,
            option_values,
        )
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLinkAddData(
    state: CUlinkState,
    kind: c_uint,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        link_add_data(
            state,
            kind,
            data,
            size,
            name,
            num_options,
            options,
            option_values,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    state: CUlinkState,
    kind: c_uint,
    path: *const c_char,
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { link_add_file(state, kind, path, num_options, options, option_values) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkAddFile(
    state: CUlinkState,
    kind: c_uint,
    path: *const c_char,
    num_options: c_uint,
    options: *mut c_uint,
    option_values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { link_add_file(state, kind, path, num_options, options, option_values) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkComplete(
    state: CUlinkState,
    cubin_out: *mut *mut c_void,
    size_out: *mut usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { link_complete(state, cubin_out, size_out) })
}

#[no_mangle]
pub unsafe extern "C" fn cuLinkDestroy(state: CUlinkState) -> CUresult {
    guard(|| link_destroy(state))
}

include!(concat!(env!("OUT_DIR"), "/aliases_link.rs"));
