//! `CUresult`: the one status type of the client core and the shim, with every value NVIDIA's
//! `cuda.h` defines under its short name (`INVALID_VALUE` for `CUDA_ERROR_INVALID_VALUE`),
//! generated from the headers into `gpufuse-cuda-types` (`scripts/gen_cuda_types.py`).

pub use gpufuse_cuda_types::short::*;
pub use gpufuse_cuda_types::CUresult;
