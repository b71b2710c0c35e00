//! The gpufuse wire protocol: frame header, messages, codec and version handshake. No I/O.
//!
//! # Frames
//! Every frame is a 24-byte little-endian [`FrameHeader`] followed by a body of `len` bytes
//! encoded with postcard. The first frame on a connection is the client's [`ClientHello`]
//! (kind `Hello`); the server answers with a [`ServerHello`] (kind `HelloReply`). A hello with
//! another protocol version is answered with `Refused` naming both versions and the connection
//! closes. After an accepted hello the client sends [`Request`]s and the server sends a [`Reply`]
//! for each request that is not quiet, with the request's id.
//!
//! ```text
//!  client                                   worker
//!    | Hello{version, token, resources} ------> |   (node authenticates, admits, hands off)
//!    | <------------- HelloReply{devices, ...}  |
//!    | Request(quiet) MemcpyHtoD ------------>  |   no reply; a failure is kept
//!    | Request(quiet) LaunchKernel ---------->  |
//!    | Request StreamSynchronize ------------>  |
//!    | <------ Reply{status, deferred_error, staged device-to-host data}
//! ```
//!
//! # Handles
//! Contexts, modules, functions, streams and events are ids minted by the client, so creating
//! them is quiet and the ids survive anything the server does underneath. Device pointers are
//! device virtual addresses chosen by the server.
//!
//! # Compatibility
//! The protocol version in every header must equal [`PROTOCOL_VERSION`]; any change to the header
//! or to a message bumps it. Unknown frame kinds, unknown opcodes (an out-of-range variant index)
//! and bodies longer than [`MAX_BODY_LEN`] are typed errors; the server closes only the
//! connection that sent them.

#![forbid(unsafe_code)]

mod frame;
mod messages;

pub use frame::*;
pub use messages::*;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Everything that can be wrong with bytes read from the wire.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("bad frame magic {0:#010x}")]
    BadMagic(u32),
    #[error("protocol version mismatch: this side speaks {ours}, the peer speaks {theirs}")]
    VersionMismatch { ours: u16, theirs: u16 },
    #[error("unknown frame kind {0}")]
    UnknownFrameKind(u8),
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLong { len: u64, max: u64 },
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    #[error("malformed body (unknown opcode or bad field)")]
    Malformed(#[source] postcard::Error),
    #[error("expected a {expected:?} frame, got {got:?}")]
    UnexpectedFrame { expected: FrameKind, got: FrameKind },
}

/// Appends a complete frame (header and body) for `msg` to `out`.
pub fn encode_frame<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    kind: FrameKind,
    flags: u8,
    request_id: u64,
    msg: &T,
) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    let out_vec = std::mem::take(out);
    let mut out_vec = postcard::to_extend(msg, out_vec).expect("encoding into a Vec cannot fail");
    let len = (out_vec.len() - start - HEADER_LEN) as u32;
    let header = FrameHeader::new(kind, flags, len, request_id);
    out_vec[start..start + HEADER_LEN].copy_from_slice(&header.encode());
    *out = out_vec;
}

/// Appends the header and body of a frame for `msg` **except the bytes of its last field**, a
/// byte slice the caller sends right after (`tail_len` bytes), so bulk data is never copied into
/// the frame buffer. `msg` must have that last field set to an empty slice: the bytes on the
/// wire are exactly those [`encode_frame`] would produce for the full message.
pub fn encode_frame_head<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    kind: FrameKind,
    flags: u8,
    request_id: u64,
    msg: &T,
    tail_len: usize,
) {
    let start = out.len();
    encode_frame(out, kind, flags, request_id, msg);
    // The empty slice encoded as its length, varint 0: replace it with the real length.
    debug_assert_eq!(out.last(), Some(&0));
    out.pop();
    varint(tail_len as u64, out);
    let len = (out.len() - start - HEADER_LEN + tail_len) as u32;
    out[start + 8..start + 12].copy_from_slice(&len.to_le_bytes());
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The inverse of [`encode_frame_head`]: if `body` ends in a byte-slice field of exactly
/// `tail_len` bytes, decodes the message with that field empty and returns the bytes, which
/// stay where they are in the frame (no copy). `None` if the body is not of that shape.
pub fn decode_with_tail<T: DeserializeOwned>(body: &[u8], tail_len: usize) -> Option<(T, &[u8])> {
    let split = body.len().checked_sub(tail_len)?;
    let (head, tail) = body.split_at(split);
    Some((decode_head(head, tail_len)?, tail))
}

/// Like [`decode_with_tail`], from the body's head alone (everything before the `tail_len`
/// bytes): a client decodes a reply from its head, then receives the data straight into its
/// destination.
pub fn decode_head<T: DeserializeOwned>(head: &[u8], tail_len: usize) -> Option<T> {
    let mut len = Vec::with_capacity(10);
    varint(tail_len as u64, &mut len);
    let head = head.strip_suffix(len.as_slice())?;
    let mut patched = Vec::with_capacity(head.len() + 1);
    patched.extend_from_slice(head);
    patched.push(0);
    postcard::from_bytes(&patched).ok()
}

/// Decodes a body that borrows from the frame (requests).
pub fn decode_borrowed<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtoError> {
    postcard::from_bytes(body).map_err(ProtoError::Malformed)
}

/// Decodes an owned body (replies, hellos).
pub fn decode_owned<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    postcard::from_bytes(body).map_err(ProtoError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body_of(frame: &[u8]) -> &[u8] {
        &frame[HEADER_LEN..]
    }

    #[test]
    fn request_round_trips_borrowing_its_data() {
        let data = vec![7u8; 1000];
        let req = Request::MemcpyHtoD {
            dst: 0x1000,
            stream: 0,
            data: &data,
        };
        let mut buf = Vec::new();
        encode_frame(&mut buf, FrameKind::Request, FLAG_QUIET, 5, &req);
        let h = FrameHeader::decode(buf[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.len as usize, buf.len() - HEADER_LEN);
        assert!(h.is_quiet());
        let back: Request = decode_borrowed(body_of(&buf)).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn split_frames_are_byte_identical_to_whole_ones() {
        for n in [0usize, 1, 127, 128, 300, 70_000] {
            let data = vec![3u8; n];
            let mut whole = Vec::new();
            encode_frame(
                &mut whole,
                FrameKind::Request,
                FLAG_QUIET,
                9,
                &Request::MemcpyHtoD {
                    dst: 7,
                    stream: 2,
                    data: &data,
                },
            );
            let mut split = Vec::new();
            encode_frame_head(
                &mut split,
                FrameKind::Request,
                FLAG_QUIET,
                9,
                &Request::MemcpyHtoD {
                    dst: 7,
                    stream: 2,
                    data: &[],
                },
                n,
            );
            split.extend_from_slice(&data);
            assert_eq!(whole, split, "{n}");
            let mut reply = Reply::ok(ReplyBody::Data(data.clone()));
            reply.deferred_error = Some(700);
            let mut whole = Vec::new();
            encode_frame(&mut whole, FrameKind::Reply, 0, 1, &reply);
            reply.body = ReplyBody::Data(Vec::new());
            let mut split = Vec::new();
            encode_frame_head(&mut split, FrameKind::Reply, 0, 1, &reply, n);
            split.extend_from_slice(&data);
            assert_eq!(whole, split, "reply {n}");
            let (back, tail) = decode_with_tail::<Reply>(&whole[HEADER_LEN..], n).unwrap();
            assert_eq!(back, reply);
            assert_eq!(tail, &data[..]);
        }
    }

    #[test]
    fn unknown_opcode_is_a_typed_error() {
        // Variant index 200 does not exist.
        let body = [200u8, 1];
        assert!(matches!(
            decode_borrowed::<Request>(&body),
            Err(ProtoError::Malformed(_))
        ));
    }

    #[test]
    fn quiet_requests_are_the_documented_ones() {
        assert!(Request::LaunchKernel(Launch {
            function: 1,
            grid: [1; 3],
            block: [1; 3],
            shared_mem: 0,
            stream: 0,
            params: &[],
            attributes: vec![],
        })
        .is_quiet());
        assert!(!Request::MemAlloc { device: 0, size: 1 }.is_quiet());
        assert!(!Request::StreamSynchronize { stream: 0 }.is_quiet());
    }

    proptest! {
        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_borrowed::<Request>(&body);
            let _ = decode_owned::<Reply>(&body);
            let _ = decode_owned::<ClientHello>(&body);
        }

        #[test]
        fn random_headers_never_panic(h in proptest::array::uniform24(any::<u8>())) {
            let _ = FrameHeader::decode(&h);
        }
    }
}

/// If `prefix` begins a `MemcpyHtoD` request, its destination, stream, data length and the
/// length of everything before the data: a worker receives a large copy's data straight into
/// device memory. (postcard: the variant index and the fields as
/// varints, the data as a varint length and then the bytes.)
pub fn htod_prefix(prefix: &[u8]) -> Option<(u64, u64, u64, usize)> {
    static VARIANT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let variant = *VARIANT.get_or_init(|| {
        let sample = crate::Request::MemcpyHtoD {
            dst: 0,
            stream: 0,
            data: &[],
        };
        let bytes = postcard::to_allocvec(&sample).unwrap_or_default();
        postcard::take_from_bytes::<u32>(&bytes).map_or(u32::MAX, |(v, _)| v)
    });
    let ((v, dst, stream, len), rest) =
        postcard::take_from_bytes::<(u32, u64, u64, u64)>(prefix).ok()?;
    (v == variant).then_some((dst, stream, len, prefix.len() - rest.len()))
}

#[cfg(test)]
mod htod_prefix_tests {
    use super::*;

    #[test]
    fn a_copys_head_is_found_and_nothing_else_is_taken_for_one() {
        let data = vec![7u8; 300_000];
        let req = Request::MemcpyHtoD {
            dst: 0x2000_0000_1234,
            stream: 77,
            data: &data,
        };
        let body = postcard::to_allocvec(&req).unwrap();
        let (dst, stream, len, head) = htod_prefix(&body[..32]).unwrap();
        assert_eq!((dst, stream, len), (0x2000_0000_1234, 77, 300_000));
        assert_eq!(head as u64 + len, body.len() as u64);
        assert_eq!(&body[head..head + 4], &[7, 7, 7, 7]);
        let other = postcard::to_allocvec(&Request::MemFree { ptr: 5 }).unwrap();
        assert_eq!(htod_prefix(&other), None);
        assert_eq!(htod_prefix(&[]), None);
    }
}
