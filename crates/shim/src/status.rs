//! `CUresult` values the shim returns: the client core's, generated from NVIDIA's headers.

pub use gpufuse_client::status::*;
