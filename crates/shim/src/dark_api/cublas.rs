//! Export tables NVIDIA's math libraries (cuBLAS, cuBLASLt 12.9) call beyond what the runtime
//! needs. docs/export-tables.md records what was observed and why each slot answers as it does.
//!
//! cuBLASLt keeps a per-context registry of its kernels. Before a matmul (and so before every
//! cuBLAS GEMM, which goes through cuBLASLt) it asks TOOLS_TLS slot 2 for the calling thread's
//! context and `21318c60` slot 4 for that context's unique id, and looks the registry up by
//! the id. A failure of either makes the GEMM return `CUBLAS_STATUS_NOT_SUPPORTED`. On some
//! paths (every GEMM on a device of compute capability 12.0) it asks slot 51 for a context
//! object and slot 39 for that object's id instead; an 801 from either makes the GEMM return
//! `CUBLAS_STATUS_INTERNAL_ERROR`.

use std::ffi::c_void;

use super::{ix, ExportTable};
use crate::api::context::CUcontext;
use crate::status::CUresult;

pub const UUID_21318C60: [u8; 16] = [
    0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2,
];

/// `21318c60` slot 4 `(CUcontext, u64* id)`: the context's unique id, as `cuCtxGetId`.
extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: the library passes a context handle and a writable u64, as `cuCtxGetId` takes;
    // the export checks both (NULL, unknown context) before writing.
    unsafe { crate::api::context::cuCtxGetId(ctx, id) }
}

/// `21318c60` slot 51 `(CUcontext ctx, u64 kind, CUcontext* out, u64 flags)`: observed with
/// the current context, kind 0 and flags 0 (docs/export-tables.md). cuBLASLt passes what it
/// writes to slot 39 and looks its kernel registry up by slot 39's answer, so the context itself
/// (NULL: the current one) is written, after checking it is one of the session's.
extern "C" fn context_object(
    ctx: CUcontext,
    _kind: u64,
    out: *mut CUcontext,
    _flags: u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    unsafe {
        let mut ctx = ctx;
        if ctx.is_null() {
            // SAFETY: a local out-pointer.
            let r = crate::api::context::cuCtxGetCurrent(&mut ctx);
            if r != 0 {
                return r;
            }
        }
        let mut id = 0u64;
        // SAFETY: a local out-pointer; the export checks the context.
        let r = crate::api::context::cuCtxGetId(ctx, &mut id);
        if r != 0 {
            return r;
        }
        match crate::ffi::out(out, ctx) {
            Ok(()) => 0,
            Err(e) => e,
        }
    }
}

/// `21318c60` slot 39 `(CUcontext ctx, CUcontext object, u64* id)`: the id of the object slot
/// 51 returned, which cuBLASLt's kernel registry is keyed by: the context's id, as slot 4.
extern "C" fn context_object_id(ctx: CUcontext, object: CUcontext, id: *mut u64) -> CUresult {
    let ctx = if object.is_null() { ctx } else { object };
    // SAFETY: as `context_id`.
    unsafe { crate::api::context::cuCtxGetId(ctx, id) }
}

/// The context table (`CU_ETID_ToolsContext` in public dumps of the driver). The driver's has
/// 93 slots (a size and 92 functions) as driver 580 answers on an H200 (a peer saw 95 from
/// driver 595); cuBLAS/cuBLASLt 12.9 call slots 4, 51 and 39, and the
/// 13.x runtimes ask for the table without calling a slot.
pub static PRIVATE_21318C60: ExportTable<93> = ExportTable::sized::<{ ix::PRIVATE_21318C60 }>()
    .with(4, context_id as *const c_void)
    .with(39, context_object_id as *const c_void)
    .with(51, context_object as *const c_void);
