//! `CUresult` values the shim returns.

pub use gpufuse_client::status::*;

pub const INVALID_PTX: CUresult = 218;
pub const NO_BINARY_FOR_GPU: CUresult = 209;
pub const ILLEGAL_ADDRESS: CUresult = 700;
pub const PEER_ACCESS_UNSUPPORTED: CUresult = 217;
pub const CONTEXT_ALREADY_IN_USE: CUresult = 216;
pub const PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const FILE_NOT_FOUND: CUresult = 301;
