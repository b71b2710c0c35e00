//! gpufuse's `libcuda.so.1`: the CUDA driver API, exported for unmodified applications and
//! NVIDIA's own libraries, forwarded to a gpufuse server through [`gpufuse_client`].
//!
//! Every export has one shape: [`guard::guard`] around a body that checks its pointers through
//! [`ffi`] (the only code that dereferences application memory), talks to the session, and maps
//! the outcome to a `CUresult`. No panic crosses the FFI boundary.
//!
//! The export surface is every name a real driver exports (`gpufuse_cuda_types::DRIVER_EXPORTS`).
//! The implemented ones are declared as data in `exports.toml` (name, area, quiet or
//! synchronous, per-thread alias); `build.rs` generates from it the `_ptds`/`_ptsz` aliases, a
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

/// Stubs for driver functions gpufuse does not implement, the export address map, and the
/// export table (`exports.toml`) as [`exports::DECLARED`].
pub mod exports {
    /// How an export answers.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Call {
        /// Returns before the server has done the work; a failure is reported by a later
        /// synchronizing call, as CUDA reports asynchronous errors.
        Quiet,
        /// Answers with the outcome of the call itself.
        Sync,
    }

    /// One implemented export, as `exports.toml` declares it.
    #[derive(Debug, Clone, Copy)]
    pub struct Declared {
        pub name: &'static str,
        /// The module under `crate::api` that defines it.
        pub area: &'static str,
        pub call: Call,
        /// Its generated `_ptds`/`_ptsz` alias, if any.
        pub per_thread: Option<&'static str>,
    }

    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}

/// Marks this library as gpufuse's shim, so gpufuse's real-GPU backend never loads it as
/// NVIDIA's driver.
#[no_mangle]
pub static gpufuse_shim_version: [u8; 6] = *b"0.1.0\0";
