//! The export table `6e163fbe` (`CU_ETID_ToolsModule` in public dumps of the driver): cuFFT
//! asks for it when it loads its kernels and calls slot 7 to walk a module's functions. Refused,
//! or answered 801, cuFFT gives up with `CUFFT_INTERNAL_ERROR` (seen on an H200 and on the
//! emulated GPU, 2026-11-27).
//!
//! Slot 7 `(CUcontext ctx, CUmodule module, callback, void* user)` calls
//! `callback(user, CUfunction f, const char* name)` for each function of `module` and returns
//! how many it called back for. NVIDIA's driver (580, on an H200) was seen to return the
//! count and to pass each function (the `CUfunction` `cuModuleEnumerateFunctions` lists)
//! with a third pointer, distinct per function and byte-aligned, which gpufuse takes for the
//! function's name; docs/export-tables.md records the observations.

use std::ffi::{c_char, c_void};

use super::{ix, ExportTable};
use crate::api::context::CUcontext;
use crate::api::module::{h, CUmodule};
use crate::status::{CUresult, INVALID_VALUE};

pub const UUID_TOOLS_MODULE: [u8; 16] = [
    0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e,
];

type EachFunction = extern "C" fn(user: *mut c_void, f: *mut c_void, name: *const c_char);

/// Slot 7: calls `each(user, f, name)` for every function of `module`; returns the count.
extern "C" fn for_each_function(
    _ctx: CUcontext,
    module: CUmodule,
    each: Option<EachFunction>,
    user: *mut c_void,
) -> CUresult {
    let Some(each) = each else {
        return INVALID_VALUE;
    };
    let functions = match crate::api::listing::named_functions(h(module)) {
        Ok(f) => f,
        Err(e) => return e,
    };
    if super::verbose() {
        eprintln!(
            "gpufuse: export table 6e163fbe slot 7: {} function(s) of module {:#x}",
            functions.len(),
            h(module)
        );
    }
    for (name, f) in &functions {
        let name = crate::api::module::lasting_name(name.clone()).unwrap_or(std::ptr::null());
        each(user, *f as usize as *mut c_void, name);
    }
    functions.len() as CUresult
}

/// 99 slots, a size and 98 functions, as NVIDIA's driver 580 answers (H200, the conformance
/// fixture); every slot but 7 is its reporting fallback.
pub static TOOLS_MODULE: ExportTable<99> =
    ExportTable::sized::<{ ix::TOOLS_MODULE }>().with(7, for_each_function as *const c_void);
