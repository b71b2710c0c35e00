//! The `CUresult` values the client core itself produces.

pub type CUresult = i32;
pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const OUT_OF_MEMORY: CUresult = 2;
pub const NOT_INITIALIZED: CUresult = 3;
pub const NO_DEVICE: CUresult = 100;
pub const INVALID_DEVICE: CUresult = 101;
pub const INVALID_IMAGE: CUresult = 200;
pub const INVALID_CONTEXT: CUresult = 201;
pub const INVALID_HANDLE: CUresult = 400;
pub const NOT_FOUND: CUresult = 500;
pub const NOT_READY: CUresult = 600;
pub const NOT_SUPPORTED: CUresult = 801;
pub const DEVICE_UNAVAILABLE: CUresult = 46;
pub const UNKNOWN: CUresult = 999;
