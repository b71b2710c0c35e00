//! The CUDA status codes devices return.

pub type Status = i32;

pub const INVALID_VALUE: Status = 1;
pub const OUT_OF_MEMORY: Status = 2;
pub const INVALID_IMAGE: Status = 200;
pub const NO_BINARY_FOR_GPU: Status = 209;
pub const INVALID_PTX: Status = 218;
pub const UNSUPPORTED_PTX_VERSION: Status = 222;
pub const INVALID_HANDLE: Status = 400;
pub const NOT_FOUND: Status = 500;
pub const ILLEGAL_ADDRESS: Status = 700;
pub const LAUNCH_OUT_OF_RESOURCES: Status = 701;
/// A device-side `assert()` failed; sticky like a fault.
pub const ASSERT: Status = 710;
/// A load, store or atomic at an address not a multiple of its size; sticky like a fault.
pub const MISALIGNED_ADDRESS: Status = 716;
pub const INVALID_CONFIGURATION: Status = 9;
pub const NOT_SUPPORTED: Status = 801;
pub const LAUNCH_FAILED: Status = 719;
pub const COOPERATIVE_LAUNCH_TOO_LARGE: Status = 720;
pub const UNKNOWN: Status = 999;
