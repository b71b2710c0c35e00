//! The exported entry points, with cuda.h's C signatures.

#![allow(non_snake_case)]

use std::ffi::c_void;

/// `CUdevice`.
type CUdevice = std::ffi::c_int;
/// `CUdeviceptr`.
type CUdeviceptr = u64;
/// Every handle type (`CUcontext`, `CUstream`, `CUevent`, ...): an opaque pointer.
type Handle = *mut c_void;

/// Declares exports: `#[no_mangle] pub unsafe extern "C" fn NAME(args) -> CUresult`, with the
/// safety contract every driver entry point has.
macro_rules! export {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[$meta])*
        ///
        /// # Safety
        /// Pointer arguments must be NULL or valid as cuda.h documents for this entry point
        /// (NULL where a pointer is required is `CUDA_ERROR_INVALID_VALUE`).
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> gpufuse_cuda_types::CUresult $body
    )*};
}

mod device;
mod exec;
mod memory;
mod module;
