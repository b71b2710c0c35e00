//! gpufuse's `libcuda.so.1`: the CUDA driver API, exported for unmodified applications and
//! NVIDIA's own libraries, forwarded to a gpufuse server through [`gpufuse_client`].
//!
//! Every export has one shape: [`guard::guard`] around a body that checks its pointers through
//! [`ffi`] (the only code that dereferences application memory), talks to the session, and maps
//! the outcome to a `CUresult`. No panic crosses the FFI boundary.
//!
//! The export surface is one table: every name a real driver exports
//! (`gpufuse_cuda_types::DRIVER_EXPORTS`). `build.rs` reads the functions implemented under
//! `src/api/`, generates the `_ptds`/`_ptsz` per-thread aliases of implemented functions, a
//! stub returning `CUDA_ERROR_NOT_SUPPORTED` for every other name, and the name-to-address map
//! that `cuGetProcAddress` serves after version resolution (`gpufuse_cuda_types::resolve_proc`).
//!
//! Nothing happens at load: no I/O, no threads. `cuInit` connects to `GPUFUSE_SERVER`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod api;
pub mod dark_api;
pub mod ffi;
pub mod global;
pub mod guard;
pub mod image;
pub mod status;

/// Stubs for driver functions gpufuse does not implement, and the export address map.
pub mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}

/// Marks this library as gpufuse's shim, so gpufuse's real-GPU backend never loads it as
/// NVIDIA's driver.
#[no_mangle]
pub static gpufuse_shim_version: [u8; 6] = *b"0.1.0\0";
