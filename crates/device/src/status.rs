//! The CUDA status codes devices return: every `CUresult` value NVIDIA's `cuda.h` defines,
//! under its short name (`INVALID_VALUE` for `CUDA_ERROR_INVALID_VALUE`), generated from the
//! headers into `gpufuse-cuda-types` (`scripts/gen_cuda_types.py`), the same table the client
//! core uses.

pub use gpufuse_cuda_types::short::*;

pub type Status = gpufuse_cuda_types::CUresult;

/// A failed device operation: its CUDA status and, where the device can say more (the
/// instruction a launch stopped at, the illegal address, what a module lacks to link), why.
/// A bare [`Status`] converts into one without detail, and one converts back to its status,
/// so `?` works across both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError {
    pub status: Status,
    pub detail: Option<String>,
}

impl DeviceError {
    pub fn new(status: Status, detail: impl Into<String>) -> Self {
        DeviceError {
            status,
            detail: Some(detail.into()),
        }
    }

    /// The detail, or "" when the device gave none (for logs).
    pub fn detail(&self) -> &str {
        self.detail.as_deref().unwrap_or("")
    }
}

impl From<Status> for DeviceError {
    fn from(status: Status) -> Self {
        DeviceError {
            status,
            detail: None,
        }
    }
}

impl From<DeviceError> for Status {
    fn from(e: DeviceError) -> Status {
        e.status
    }
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Some(d) => write!(f, "status {}: {d}", self.status),
            None => write!(f, "status {}", self.status),
        }
    }
}

impl std::error::Error for DeviceError {}
