//! The fixed frame header that precedes every message on every transport.

use crate::ProtoError;

/// "GFUS" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"GFUS");
/// Bumped on any incompatible change to the header or to a message. 6: the header declares
/// the bulk tail's length (bytes 12..16, reserved before); texture and surface objects.
/// 7: the pool (node agents, redirects and grants, the pool's status), elastic sessions
/// (node commands, migration, swapped bytes in a session's status). 8: a node's status carries
/// the sessions waiting for capacity (`gpufuse serve`'s own controller). 9: pinned-memory
/// arena copies, pre-copy moves, claim ends. 10: moves between nodes (`MoveIn`, `Resume`,
/// `MigrateTo` hellos; `Move`, `MoveReply` and `Moved` frames). 11: drain and cordon (`Drain`,
/// `Cordon` hellos, `Drained`, `Cordoned` answers, a node's `cordoned` in the pool's status),
/// quiet requests forwarded by a session's old worker after a move (`MoveMessage::Forward`).
/// 12: the Kubernetes claim of a session a pool node admitted on a claim's token, in the
/// node's report (`PoolSessionReport::claim`) and the pool's status (`PoolSessionView::claim`).
/// 13: managed memory shared between a same-host client and its device (`MemAllocShared`).
/// 14: a same-host client's page-locked memory addressable by its device (`MapHostArena`);
/// device limits (`SetLimit`).
/// 15: CUDA IPC between sessions of one host (`IpcGetMemHandle`, `IpcOpenMemHandle`,
/// `IpcCloseMemHandle`) and POSIX file descriptors of physical memory (`IpcExportPhysical`,
/// `IpcImportPhysical`).
/// 16: occupancy and limits answered by the device serving the session (`Occupancy`,
/// `GetLimit`, `ReplyBody::Count`).
/// 17: graphs of device work kept by the worker, one driver graph on a real GPU
/// (`GraphDefine`, `GraphLaunch`, `GraphDestroy`); a lease's `Done` is not answered.
pub const PROTOCOL_VERSION: u16 = 17;
/// The protocol versions this build speaks. Both sides check every header against it; the
/// node refuses a hello outside it with a reason naming both sides' versions.
pub const SUPPORTED_VERSIONS: std::ops::RangeInclusive<u16> = 12..=PROTOCOL_VERSION;
/// Largest body accepted from the wire. A 64 MiB copy chunk plus its envelope fits.
pub const MAX_BODY_LEN: u32 = 64 * 1024 * 1024 + 64 * 1024;
/// Host-to-device copies larger than this are split into several requests.
pub const MAX_COPY_CHUNK: usize = 64 * 1024 * 1024;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// The client's first frame: [`crate::ClientHello`].
    Hello = 1,
    /// The server's answer to the hello: [`crate::ServerHello`].
    HelloReply = 2,
    /// A [`crate::Request`].
    Request = 3,
    /// A [`crate::Reply`] to the request with the same id.
    Reply = 4,
    /// No body: the worker is alive and working on the client's requests. Sent every 250 ms
    /// while it is busy, so a client waiting on a long kernel can tell it from a stopped
    /// worker; clients skip it wherever they read a reply.
    Heartbeat = 5,
    /// A worker's request to its node on the control socket: [`crate::ControlRequest`].
    Control = 6,
    /// The node's answer to a control request, with its id: [`crate::ControlAnswer`].
    ControlReply = 7,
    /// A worker moving its session to another node sends its state to the worker there:
    /// [`crate::MoveMessage`].
    Move = 8,
    /// The receiving worker's answer to a [`crate::MoveMessage::Commit`]: [`crate::MoveAck`].
    MoveReply = 9,
    /// Instead of a reply: the session has moved to another node, and the request this frame
    /// answers (same id) was not run; the client says hello there ([`crate::Moved`]) and
    /// sends the request again.
    Moved = 10,
}

impl FrameKind {
    fn from_u8(v: u8) -> Result<Self, ProtoError> {
        Ok(match v {
            1 => Self::Hello,
            2 => Self::HelloReply,
            3 => Self::Request,
            4 => Self::Reply,
            5 => Self::Heartbeat,
            6 => Self::Control,
            7 => Self::ControlReply,
            8 => Self::Move,
            9 => Self::MoveReply,
            10 => Self::Moved,
            other => return Err(ProtoError::UnknownFrameKind(other)),
        })
    }
}

/// Flag: the request is quiet; no reply is sent. A failure is kept and reported later.
pub const FLAG_QUIET: u8 = 1;

/// The 24-byte little-endian header.
///
/// | off | size | field |
/// |-----|------|-------|
/// | 0 | 4 | magic `GFUS` |
/// | 4 | 2 | protocol version |
/// | 6 | 1 | frame kind |
/// | 7 | 1 | flags |
/// | 8 | 4 | body length (message and tail) |
/// | 12 | 4 | tail length: raw bytes that end the body, after the message |
/// | 16 | 8 | request id |
///
/// The body is the postcard-encoded message followed by `tail` raw bytes: the bulk data of a
/// copy, which then travels without being copied into (or parsed out of) the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u16,
    pub kind: FrameKind,
    pub flags: u8,
    pub len: u32,
    /// How many of the body's `len` bytes are the raw tail (at most `len`).
    pub tail: u32,
    pub request_id: u64,
}

/// Size of the encoded header.
pub const HEADER_LEN: usize = 24;

impl FrameHeader {
    pub fn new(kind: FrameKind, flags: u8, len: u32, request_id: u64) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            kind,
            flags,
            len,
            tail: 0,
            request_id,
        }
    }

    /// The body's message bytes: `len - tail` (the tail never exceeds `len`, checked when
    /// the header was decoded).
    pub fn message_len(&self) -> u32 {
        self.len - self.tail
    }

    pub fn is_quiet(&self) -> bool {
        self.flags & FLAG_QUIET != 0
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = self.flags;
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..16].copy_from_slice(&self.tail.to_le_bytes());
        b[16..24].copy_from_slice(&self.request_id.to_le_bytes());
        b
    }

    /// Decodes and validates a header: magic, version, kind and the body length cap.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, ProtoError> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(ProtoError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: version,
            });
        }
        let kind = FrameKind::from_u8(b[6])?;
        let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if len > MAX_BODY_LEN {
            return Err(ProtoError::TooLong {
                len: len as u64,
                max: MAX_BODY_LEN as u64,
            });
        }
        let tail = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        if tail > len {
            return Err(ProtoError::TailTooLong { tail, len });
        }
        let request_id = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
        Ok(Self {
            version,
            kind,
            flags: b[7],
            len,
            tail,
            request_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader::new(FrameKind::Request, FLAG_QUIET, 1234, 99);
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn unsupported_version_is_rejected() {
        let mut b = FrameHeader::new(FrameKind::Hello, 0, 0, 0).encode();
        b[4] = 77;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::VersionMismatch { theirs: 77, .. })
        ));
    }

    #[test]
    fn oversized_body_is_rejected() {
        let h = FrameHeader::new(FrameKind::Request, 0, MAX_BODY_LEN + 1, 0);
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(ProtoError::TooLong { .. })
        ));
    }

    #[test]
    fn a_tail_longer_than_the_body_is_rejected() {
        let mut h = FrameHeader::new(FrameKind::Request, 0, 10, 0);
        h.tail = 10;
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap().message_len(), 0);
        h.tail = 11;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(ProtoError::TailTooLong { tail: 11, len: 10 })
        ));
    }

    #[test]
    fn bad_magic_and_kind_are_rejected() {
        let mut b = FrameHeader::new(FrameKind::Request, 0, 0, 0).encode();
        b[0] = 0;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::BadMagic(_))
        ));
        let mut b = FrameHeader::new(FrameKind::Request, 0, 0, 0).encode();
        b[6] = 11;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::UnknownFrameKind(11))
        ));
        b[6] = 0;
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(ProtoError::UnknownFrameKind(0))
        ));
    }
}
