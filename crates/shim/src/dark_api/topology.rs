//! The export table `1734dc26` that cuBLASLt asks for before choosing a matmul algorithm
//! (`cublasLtMatmulAlgoGetHeuristic`, so every cuBLAS/cuBLASLt GEMM of the kinds that go through
//! its cluster-aware heuristic: every bf16 and fp16 product PyTorch makes). Found by reading
//! cuBLASLt 12.9.1 and 13.x at their one call site (docs/export-tables.md):
//!
//! - the table is fetched once (a function-local static) and stored **without a NULL check**;
//!   a refused table (NULL) made the next call jump through address 0x20: the SIGSEGV of
//!   issue 27, on an H200 and on the emulated GPU alike;
//! - **slot 4** `(void** data, u64* handle)`: on success with a non-NULL `data`, cuBLASLt reads
//!   one byte per TPC (half the SM count it passes in its own key) and counts how many TPCs share
//!   each byte value, which is the GPU's TPC-to-GPC layout (Hopper's thread-block clusters are
//!   placed within a GPC); it then releases the answer through **slot 13** `(data, handle)`;
//! - on any error from slot 4, or a NULL `data`, it takes its own path without the layout,
//!   which is what the real driver's answer refines, not what makes a matmul correct.
//!
//! gpufuse answers slot 4 with `CUDA_ERROR_NOT_SUPPORTED`: the layout of a real GPU is the
//! worker's driver's to know, and guessing one would steer cuBLASLt's cluster shapes wrongly.
//! Slot 13 is never reached then, and answers success (releasing nothing) should a caller
//! release anyway. `tests/real-clients/test_pytorch.py` (mixed precision) runs the path.

use std::ffi::c_void;

use super::{ix, ExportTable};
use crate::status::{CUresult, NOT_SUPPORTED, SUCCESS};

pub const UUID_1734DC26: [u8; 16] = [
    0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca,
];

/// Slot 4 `(void** data, u64* handle)`: the TPC-to-GPC layout. Not offered (see the module
/// doc); the outputs are cleared so a caller that reads them despite the error sees nothing.
extern "C" fn tpc_layout(data: *mut *mut c_void, handle: *mut u64) -> CUresult {
    // SAFETY: cuBLASLt passes two writable stack slots; `out_opt` skips NULL ones.
    unsafe {
        crate::ffi::out_opt(data, std::ptr::null_mut());
        crate::ffi::out_opt(handle, 0);
    }
    NOT_SUPPORTED
}

/// Slot 13 `(data, handle)`: releases what slot 4 gave, which is nothing.
extern "C" fn release_layout(_data: *mut c_void, _handle: u64) -> CUresult {
    SUCCESS
}

/// 17 slots with a size slot, as NVIDIA's driver 580 answers (136 bytes, H200: the
/// conformance fixture); cuBLASLt reads slots 4 and 13 only.
pub static PRIVATE_1734DC26: ExportTable<17> = ExportTable::sized::<{ ix::GPU_TOPOLOGY }>()
    .with(4, tpc_layout as *const c_void)
    .with(13, release_layout as *const c_void);
