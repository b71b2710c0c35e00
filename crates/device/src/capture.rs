//! A session's device state, captured so that it can be rebuilt at the same device addresses
//! and module ids on the same or another device (`docs/state-capture.md`).
//!
//! Two granularities:
//! - *Contents* of one allocation ([`crate::Device::evict`], [`crate::Device::bring_back`]):
//!   what oversubscription and scale to zero move between device memory, host memory and
//!   disk. The address stays the session's while its contents are away.
//! - The whole device state ([`DeviceImage`], [`crate::Device::capture`],
//!   [`crate::Device::rebuild`]): allocations with their contents, VMM physical memory,
//!   reservations and mappings, modules (their images, re-loaded with their variables at
//!   the same addresses), texture and surface objects and the cooperative-launch workspace:
//!   what migration moves.
//!
//! The image is plain data (serde), encoded with postcard behind a magic and a version
//! ([`DeviceImage::encode`]); a reader refuses any other version by name.

use serde::{Deserialize, Serialize};

use crate::status::{self, Status};

/// The version of [`DeviceImage`]'s encoding; bumped on any change to its fields.
pub const STATE_VERSION: u32 = 1;
/// The first bytes of an encoded image.
pub const MAGIC: [u8; 8] = *b"GFSTATE\0";

/// One allocation: its address, size and contents (`None` while they are away: swapped by
/// the worker, which captures them itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationImage {
    pub addr: u64,
    pub size: u64,
    #[serde(with = "serde_bytes")]
    pub contents: Vec<u8>,
}

/// VMM physical memory: its id, size, where it is mapped, whether the client released it
/// (it then lives until unmapped), and its contents while unmapped (mapped contents are in
/// [`DeviceImage::allocations`] at the mapped address).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhysicalImage {
    pub id: u64,
    pub size: u64,
    pub mapped_at: Option<u64>,
    pub released: bool,
    #[serde(with = "serde_bytes")]
    pub contents: Vec<u8>,
}

/// A loaded module: its id, the image it was loaded from, and its variables' addresses (their
/// contents are allocations).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleImage {
    pub id: u64,
    #[serde(with = "serde_bytes")]
    pub image: Vec<u8>,
    pub variables: Vec<(String, u64, u64)>,
}

/// A session's whole device state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceImage {
    /// The session's address window: its start, the next free address and its end.
    pub window: (u64, u64, u64),
    pub allocations: Vec<AllocationImage>,
    pub physical: Vec<PhysicalImage>,
    pub next_physical: u64,
    /// Reserved ranges (start, size).
    pub reserved: Vec<(u64, u64)>,
    pub modules: Vec<ModuleImage>,
    pub next_module: u64,
    /// Texture and surface objects by handle.
    pub textures: Vec<(u64, gpufuse_proto::TexObjectDesc)>,
    /// The cooperative-launch grid workspace, if a cooperative launch made one.
    pub workspace: Option<u64>,
}

/// Why an encoded image cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("not a gpufuse device state image")]
    NotAnImage,
    #[error("device state image version {0}; this build reads version {STATE_VERSION}")]
    Version(u32),
    #[error("malformed device state image: {0}")]
    Malformed(#[from] postcard::Error),
}

impl DeviceImage {
    /// Bytes of device memory the image holds (allocations and unmapped physical memory).
    pub fn bytes(&self) -> u64 {
        self.allocations.iter().map(|a| a.size).sum::<u64>()
            + self
                .physical
                .iter()
                .filter(|p| p.mapped_at.is_none())
                .map(|p| p.size)
                .sum::<u64>()
    }

    /// `MAGIC`, the version (u32 little-endian), then the image in postcard.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&STATE_VERSION.to_le_bytes());
        // Encoding plain data into a Vec cannot fail.
        out.extend_from_slice(&postcard::to_stdvec(self).unwrap_or_default());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<DeviceImage, ImageError> {
        let rest = bytes.strip_prefix(&MAGIC).ok_or(ImageError::NotAnImage)?;
        let (version, body) = rest.split_at_checked(4).ok_or(ImageError::NotAnImage)?;
        let version = u32::from_le_bytes(version.try_into().map_err(|_| ImageError::NotAnImage)?);
        if version != STATE_VERSION {
            return Err(ImageError::Version(version));
        }
        Ok(postcard::from_bytes(body)?)
    }
}

/// Why a session's state cannot be captured: the status and a reason for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureRefused {
    pub status: Status,
    pub why: String,
}

impl CaptureRefused {
    pub fn not_supported(why: impl Into<String>) -> Self {
        Self {
            status: status::NOT_SUPPORTED,
            why: why.into(),
        }
    }
}

impl std::fmt::Display for CaptureRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (CUDA status {})", self.why, self.status)
    }
}
