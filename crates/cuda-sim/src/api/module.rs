//! Modules (PTX text), functions, globals, function attributes, occupancy.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};

use gpufuse_cuda_types::{short as E, CUresult};

use super::{CUdeviceptr, Handle};
use crate::ffi;
use crate::guard::{call, Flow, Need};
use crate::ptx::{self, PtxError};
use crate::state::{handle, Function, Global, KernelKind, Kind, Module, ModuleMem, Sim};
use crate::tables::{self, GRANULARITY};

/// A kernel's duration from its name: `_us<N>` anywhere in it is N microseconds, else 5.
pub(crate) fn duration_ns(name: &str) -> u64 {
    let mut rest = name;
    while let Some(i) = rest.find("_us") {
        rest = &rest[i + 3..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if let Ok(us) = rest[..digits].parse::<u64>() {
            return us.saturating_mul(1000);
        }
    }
    5_000
}

/// The prefix of the kernels that add to memory when they complete.
const ADD_U32: &str = "sim_add_u32";

/// Allocates a module's variables in simulated memory (one reservation, one mapping) and
/// writes their initializers. Returns the memory and each variable's address and size.
fn place_vars(
    s: &mut Sim,
    dev: usize,
    vars: &[ptx::Var],
) -> Result<(Option<ModuleMem>, HashMap<String, Global>), CUresult> {
    let mut offsets = Vec::with_capacity(vars.len());
    let mut end = 0u64;
    for v in vars {
        let at = end.next_multiple_of(v.align);
        offsets.push(at);
        end = at + v.size;
    }
    if end == 0 {
        let globals = vars
            .iter()
            .map(|v| (v.name.clone(), Global { addr: 0, size: 0 }))
            .collect();
        return Ok((None, globals));
    }
    let size = end.next_multiple_of(GRANULARITY);
    let va = s.mem.reserve(size, 0, 0)?;
    let total = s.cfg.mem;
    let phys = match s.mem.create(dev, size, total) {
        Ok(p) => p,
        Err(e) => {
            let _ = s.mem.free_reservation(va, size);
            return Err(e);
        }
    };
    let mem = ModuleMem { va, size, phys };
    let mapped = s
        .mem
        .map(va, size, 0, phys)
        .and_then(|()| s.mem.set_access(va, size, true));
    if let Err(e) = mapped {
        free_mem(s, &mem);
        return Err(e);
    }
    let mut globals = HashMap::new();
    for (v, &off) in vars.iter().zip(&offsets) {
        if !v.init.is_empty() {
            s.mem.write(va + off, &v.init)?;
        }
        globals.insert(
            v.name.clone(),
            Global {
                addr: va + off,
                size: v.size,
            },
        );
    }
    Ok((Some(mem), globals))
}

fn free_mem(s: &mut Sim, m: &ModuleMem) {
    let _ = s.mem.unmap(m.va, m.size);
    let _ = s.mem.release(m.phys);
    let _ = s.mem.free_reservation(m.va, m.size);
}

/// `cuModuleLoadData`'s work, on the text of the image.
fn load(s: &mut Sim, image: &[u8]) -> Result<u64, CUresult> {
    let ctx = s.current()?;
    let dev = s.contexts[&ctx].device;
    let text = std::str::from_utf8(image).map_err(|_| E::INVALID_IMAGE)?;
    let m = ptx::parse(text).map_err(|e| match e {
        PtxError::NotPtx => E::INVALID_IMAGE,
        PtxError::Invalid(why) => {
            eprintln!("gpufuse-cuda-sim: PTX refused: {why}");
            E::INVALID_PTX
        }
    })?;
    if m.version > tables::MAX_PTX_VERSION {
        return Err(E::UNSUPPORTED_PTX_VERSION);
    }
    if m.target.is_some_and(|t| t > tables::DEVICE_ARCH) {
        return Err(E::INVALID_PTX);
    }
    for e in &m.entries {
        let sizes: Vec<usize> = e.params.iter().map(|p| p.size).collect();
        if e.name.starts_with(ADD_U32) && sizes != [8, 4, 4] {
            eprintln!(
                "gpufuse-cuda-sim: {} must take (.u64 ptr, .u32 n, .u32 value)",
                e.name
            );
            return Err(E::INVALID_PTX);
        }
    }
    let (mem, globals) = place_vars(s, dev, &m.vars)?;
    let module = s.new_id();
    let ptx_version = (m.version.0 * 10 + m.version.1) as i32;
    let mut functions = HashMap::new();
    for e in m.entries {
        let id = s.new_id();
        let static_shared = e.static_shared;
        s.functions.insert(
            id,
            Function {
                params: e.params.iter().map(|p| (p.offset, p.size)).collect(),
                kind: match e.name.starts_with(ADD_U32) {
                    true => KernelKind::AddU32,
                    false => KernelKind::Plain,
                },
                duration_ns: duration_ns(&e.name),
                max_threads: e
                    .max_threads
                    .unwrap_or(tables::MAX_THREADS_PER_BLOCK)
                    .clamp(1, tables::MAX_THREADS_PER_BLOCK),
                static_shared,
                ptx_version,
                max_dynamic_shared: tables::SHARED_PER_BLOCK.saturating_sub(static_shared),
                carveout: -1,
                cluster: [0; 6],
            },
        );
        if let Some(old) = functions.insert(e.name, id) {
            s.functions.remove(&old);
        }
    }
    s.modules.insert(
        module,
        Module {
            functions,
            globals,
            mem,
        },
    );
    Ok(module)
}

export! {
    /// `cuModuleLoadData`: NUL-terminated PTX text only.
    fn cuModuleLoadData(module: *mut Handle, image: *const c_void) {
        call(Need::Init, |s| {
            if module.is_null() {
                return Err(E::INVALID_VALUE);
            }
            // SAFETY: `image` is NULL or a NUL-terminated module image (this export's
            // contract: PTX images end in NUL; ELF and fatbin headers hold a NUL early).
            let image = unsafe { ffi::cstr_bytes(image.cast()) }?;
            let id = load(s, image)?;
            // SAFETY: `module` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(module, handle(Kind::Module, id)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuModuleUnload`: its functions go, and its variables' memory.
    fn cuModuleUnload(module: Handle) {
        call(Need::Init, |s| {
            let id = s.module_id(module)?;
            let Some(m) = s.modules.remove(&id) else {
                return Err(E::INVALID_HANDLE);
            };
            for f in m.functions.values() {
                s.functions.remove(f);
            }
            if let Some(mem) = &m.mem {
                free_mem(s, mem);
            }
            Ok(Flow::Done)
        })
    }

    /// `cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND` for a name the module lacks.
    fn cuModuleGetFunction(func: *mut Handle, module: Handle, name: *const c_char) {
        call(Need::Init, |s| {
            if func.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let id = s.module_id(module)?;
            // SAFETY: `name` is NULL or a NUL-terminated string (this export's contract).
            let name = unsafe { ffi::str_arg(name) }?;
            let f = *s.modules[&id].functions.get(name).ok_or(E::NOT_FOUND)?;
            // SAFETY: `func` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(func, handle(Kind::Function, f)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuModuleGetGlobal_v2`: either out-pointer may be NULL.
    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, module: Handle, name: *const c_char) {
        call(Need::Init, |s| {
            let id = s.module_id(module)?;
            // SAFETY: `name` is NULL or a NUL-terminated string (this export's contract).
            let name = unsafe { ffi::str_arg(name) }?;
            let g = s.modules[&id].globals.get(name).ok_or(E::NOT_FOUND)?;
            // SAFETY: each out-pointer is NULL or writable (this export's contract).
            unsafe {
                ffi::put_opt(dptr, g.addr);
                ffi::put_opt(bytes, g.size as usize);
            }
            Ok(Flow::Done)
        })
    }

    /// `cuFuncGetAttribute`.
    fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, func: Handle) {
        call(Need::Init, |s| {
            if pi.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let f = &s.functions[&s.function_id(func)?];
            let v = match attrib {
                0 => f.max_threads as i32,
                1 => f.static_shared as i32,
                2 | 3 => 0, // constant, local bytes
                4 => 32,    // registers per thread
                5 => f.ptx_version,
                6 => tables::DEVICE_ARCH as i32,
                7 => 0, // cache mode CA
                8 => f.max_dynamic_shared as i32,
                9 => f.carveout,
                10..=15 => f.cluster[(attrib - 10) as usize],
                _ => return Err(E::INVALID_VALUE),
            };
            // SAFETY: `pi` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(pi, v) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuFuncSetAttribute`: the settable attributes, within the device's limits.
    fn cuFuncSetAttribute(func: Handle, attrib: c_int, value: c_int) {
        call(Need::Init, |s| {
            let id = s.function_id(func)?;
            let Some(f) = s.functions.get_mut(&id) else {
                return Err(E::INVALID_HANDLE);
            };
            let ok = match attrib {
                8 => value >= 0 && value as u64 + f.static_shared <= tables::SHARED_PER_BLOCK_OPTIN,
                9 => (-1..=100).contains(&value),
                11..=13 => (0..=16).contains(&value),
                14 => (0..=1).contains(&value),
                15 => (0..=2).contains(&value),
                _ => false,
            };
            if !ok {
                return Err(E::INVALID_VALUE);
            }
            match attrib {
                8 => f.max_dynamic_shared = value as u64,
                9 => f.carveout = value,
                _ => f.cluster[(attrib - 10) as usize] = value,
            }
            Ok(Flow::Done)
        })
    }

    /// `cuFuncGetParamInfo`: offset and size of parameter `index`; `size` may be NULL.
    fn cuFuncGetParamInfo(func: Handle, index: usize, offset: *mut usize, size: *mut usize) {
        call(Need::Init, |s| {
            let f = &s.functions[&s.function_id(func)?];
            if offset.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let &(o, sz) = f.params.get(index).ok_or(E::INVALID_VALUE)?;
            // SAFETY: `offset` is non-NULL and writable, `size` NULL or writable (this
            // export's contract).
            unsafe {
                ffi::put_opt(offset, o);
                ffi::put_opt(size, sz);
            }
            Ok(Flow::Done)
        })
    }

    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`: `min(2048 / block, 32)`, less
    /// where shared memory does not fit.
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks: *mut c_int, func: Handle, block_size: c_int, dynamic_smem: usize, flags: c_uint) {
        call(Need::Init, |s| {
            if num_blocks.is_null() || flags > 1 || block_size <= 0 {
                return Err(E::INVALID_VALUE);
            }
            let f = &s.functions[&s.function_id(func)?];
            let block = block_size as u32;
            let n = if block > f.max_threads || dynamic_smem as u64 > f.max_dynamic_shared {
                0
            } else {
                tables::occupancy(block, f.static_shared + dynamic_smem as u64)
            };
            // SAFETY: `num_blocks` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(num_blocks, n as c_int) }?;
            Ok(Flow::Done)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_come_from_names() {
        assert_eq!(duration_ns("spin_us20"), 20_000);
        assert_eq!(duration_ns("_Z9spin_us1000Pf"), 1_000_000);
        assert_eq!(duration_ns("sim_add_u32"), 5_000);
        assert_eq!(duration_ns("sim_add_u32_usx_us7"), 7_000);
        assert_eq!(duration_ns("k_us"), 5_000);
    }
}
