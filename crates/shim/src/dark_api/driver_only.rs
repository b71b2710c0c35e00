//! Export tables NVIDIA's driver has that no library was seen to call a slot of: answered with
//! the driver's size and a fallback (`CUDA_ERROR_NOT_SUPPORTED`) in every slot, so a caller sees
//! the table it would natively and a clean error from any slot.
//!
//! - `0ca50b8c` (`CTX_CREATE_BYPASS` in public dumps): 16 bytes on driver 580 (H200, the
//!   conformance fixture); no library of the CUDA 12 and 13 wheels asks for it
//!   (`docs/export-table-scan.txt`).
//! - `b10541e1` (`DEVICE_EXTENDED_RT`): 248 bytes on driver 580; CUPTI and nvperf ask for it.

use super::{ix, ExportTable};

pub const UUID_CTX_CREATE_BYPASS: [u8; 16] = [
    0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7, 0x72, 0x86,
];

pub const UUID_DEVICE_EXTENDED_RT: [u8; 16] = [
    0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2, 0x23, 0xbe, 0x99, 0xf1, 0xe2,
];

pub static CTX_CREATE_BYPASS: ExportTable<2> = ExportTable::sized::<{ ix::CTX_CREATE_BYPASS }>();

pub static DEVICE_EXTENDED_RT: ExportTable<31> = ExportTable::sized::<{ ix::DEVICE_EXTENDED_RT }>();
