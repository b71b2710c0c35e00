//! Export tables NVIDIA's math libraries (cuBLAS, cuBLASLt 12.9) call beyond what the runtime
//! needs. docs/export-tables.md records what was observed and why each slot answers as it does.
//!
//! cuBLASLt keeps a per-context registry of its kernels. Before a matmul (and so before every
//! cuBLAS GEMM, which goes through cuBLASLt) it asks TOOLS_TLS slot 2 for the calling thread's
//! context and `21318c60` slot 4 for that context's unique id, and looks the registry up by
//! the id. A failure of either makes the GEMM return `CUBLAS_STATUS_NOT_SUPPORTED`.

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

/// The context table (`CU_ETID_ToolsContext` in public dumps of the driver). The driver's has
/// 95 slots (a size and 94 functions); only slot 4 is called by cuBLAS/cuBLASLt 12.9, and the
/// 13.x runtimes ask for the table without calling a slot.
pub static PRIVATE_21318C60: ExportTable<95> =
    ExportTable::sized::<{ ix::PRIVATE_21318C60 }>().with(4, context_id as *const c_void);
