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
