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
//! device virtual addresses chosen by the server. Both are typed ids (`ids.rs`).
//!
//! # Bulk data
//! A frame's body is its message followed by a raw tail whose length the header declares
//! ([`FrameHeader::tail`]): the data of a copy. Senders write it from the caller's buffer and
//! receivers read it straight into its destination; the message's bulk field is sent empty
//! and [`decode_request`]/[`decode_reply`] put the tail there.
//!
//! # The pool
//! A controller (`gpufuse controller`) speaks the same frames: see [`pool`] for node
//! registration, heartbeats, redirects and grants.
//!
//! # Compatibility
//! Every header's protocol version must be in [`SUPPORTED_VERSIONS`]; any change to the header
//! or to a message bumps [`PROTOCOL_VERSION`]. A node answers a hello of another version with
//! a refusal in the older of the two versions, naming both (the header and the refusal keep
//! their layout, so an older client can read it). Requests have explicit, append-only opcodes
//! ([`Request::opcode`]); `tests/golden.rs` pins the bytes of every message and of the header.
//! Unknown frame kinds, unknown opcodes, trailing bytes after a message and bodies longer than
//! [`MAX_BODY_LEN`] are typed errors; the server closes only the connection that sent them.

#![forbid(unsafe_code)]

mod frame;
mod ids;
mod messages;
pub mod pool;

pub use frame::*;
pub use ids::*;
pub use messages::*;
pub use pool::*;

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
    #[error("the header declares a tail of {tail} bytes in a body of {len}")]
    TailTooLong { tail: u32, len: u32 },
    #[error("a tail of {0} bytes on a message that carries no bulk data")]
    UnexpectedTail(usize),
    #[error("{0} bytes after the end of the message")]
    TrailingBytes(usize),
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

/// Appends the header and message of a frame whose body ends in `tail_len` raw bytes that the
/// caller sends right after (bulk data is never copied into the frame buffer). The header
/// declares the tail; `msg` has its bulk field empty, and the receiver puts the tail there
/// ([`decode_request`], [`decode_reply`]).
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
    let message = out.len() - start - HEADER_LEN;
    let tail =
        u32::try_from(tail_len).expect("a frame's tail fits in 32 bits (copies are chunked)");
    let len = u32::try_from(message + tail_len).expect("a frame's body fits in 32 bits");
    out[start + 8..start + 12].copy_from_slice(&len.to_le_bytes());
    out[start + 12..start + 16].copy_from_slice(&tail.to_le_bytes());
}

/// Rewrites the protocol version in the header of the frame that starts `frame` (an answer to
/// a peer of another version, in its own version: see the node's version refusal).
pub fn set_frame_version(frame: &mut [u8], version: u16) {
    if let Some(v) = frame.get_mut(4..6) {
        v.copy_from_slice(&version.to_le_bytes());
    }
}

/// Decodes a message that must fill `bytes` exactly: trailing bytes are an error, not ignored.
fn strict<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ProtoError> {
    let (msg, rest) = postcard::take_from_bytes(bytes).map_err(ProtoError::Malformed)?;
    if !rest.is_empty() {
        return Err(ProtoError::TrailingBytes(rest.len()));
    }
    Ok(msg)
}

/// Splits a frame's body into its message and its tail (`header.tail` bytes).
pub fn split_body<'a>(
    header: &FrameHeader,
    body: &'a [u8],
) -> Result<(&'a [u8], &'a [u8]), ProtoError> {
    let message = header.message_len() as usize;
    if body.len() != header.len as usize || message > body.len() {
        return Err(ProtoError::TailTooLong {
            tail: header.tail,
            len: body.len() as u32,
        });
    }
    Ok(body.split_at(message))
}

/// Decodes a request frame's body; a tail becomes the request's bulk field (which must have
/// been sent empty), and a tail on a request without one is an error.
pub fn decode_request<'a>(header: &FrameHeader, body: &'a [u8]) -> Result<Request<'a>, ProtoError> {
    let (message, tail) = split_body(header, body)?;
    let mut req: Request<'a> = strict(message)?;
    if !tail.is_empty() && !req.attach_tail(tail) {
        return Err(ProtoError::UnexpectedTail(tail.len()));
    }
    Ok(req)
}

/// Decodes a reply frame's body; a tail becomes its `Data` (sent empty).
pub fn decode_reply(header: &FrameHeader, body: &[u8]) -> Result<Reply, ProtoError> {
    let (message, tail) = split_body(header, body)?;
    let mut reply: Reply = strict(message)?;
    if !tail.is_empty() {
        match &mut reply.body {
            ReplyBody::Data(d) if d.is_empty() => d.extend_from_slice(tail),
            _ => return Err(ProtoError::UnexpectedTail(tail.len())),
        }
    }
    Ok(reply)
}

/// Decodes a message that borrows from the frame.
pub fn decode_borrowed<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtoError> {
    strict(body)
}

/// Decodes an owned message (hellos; the message part of a reply).
pub fn decode_owned<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    postcard::take_from_bytes(body)
        .map_err(ProtoError::Malformed)
        .and_then(|(msg, rest): (T, &[u8])| {
            if rest.is_empty() {
                Ok(msg)
            } else {
                Err(ProtoError::TrailingBytes(rest.len()))
            }
        })
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
            dst: DevicePtr(0x1000),
            stream: StreamHandle(0),
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

    fn header_of(frame: &[u8]) -> FrameHeader {
        FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap()
    }

    #[test]
    fn a_tail_declared_in_the_header_lands_in_the_bulk_field() {
        for n in [0usize, 1, 127, 128, 300, 70_000] {
            let data = vec![3u8; n];
            let mut split = Vec::new();
            encode_frame_head(
                &mut split,
                FrameKind::Request,
                FLAG_QUIET,
                9,
                &Request::MemcpyHtoD {
                    dst: DevicePtr(7),
                    stream: StreamHandle(2),
                    data: &[],
                },
                n,
            );
            split.extend_from_slice(&data);
            let h = header_of(&split);
            assert_eq!(
                (h.tail as usize, h.len as usize),
                (n, split.len() - HEADER_LEN)
            );
            let back = decode_request(&h, body_of(&split)).unwrap();
            assert_eq!(
                back,
                Request::MemcpyHtoD {
                    dst: DevicePtr(7),
                    stream: StreamHandle(2),
                    data: &data,
                },
                "{n}"
            );
            let mut reply = Reply::ok(ReplyBody::Data(Vec::new()));
            reply.deferred_error = Some(700);
            let mut frame = Vec::new();
            encode_frame_head(&mut frame, FrameKind::Reply, 0, 1, &reply, n);
            frame.extend_from_slice(&data);
            let back = decode_reply(&header_of(&frame), body_of(&frame)).unwrap();
            reply.body = ReplyBody::Data(data.clone());
            assert_eq!(back, reply, "reply {n}");
        }
    }

    #[test]
    fn a_tail_where_no_bulk_field_is_or_trailing_bytes_are_errors() {
        let mut frame = Vec::new();
        encode_frame_head(
            &mut frame,
            FrameKind::Request,
            FLAG_QUIET,
            1,
            &Request::MemFree { ptr: DevicePtr(5) },
            3,
        );
        frame.extend_from_slice(&[1, 2, 3]);
        assert!(matches!(
            decode_request(&header_of(&frame), body_of(&frame)),
            Err(ProtoError::UnexpectedTail(3))
        ));
        // A bulk field sent full and a tail as well: which bytes are the data is ambiguous.
        let mut frame = Vec::new();
        encode_frame_head(
            &mut frame,
            FrameKind::Request,
            FLAG_QUIET,
            1,
            &Request::MemcpyHtoD {
                dst: DevicePtr(1),
                stream: StreamHandle(0),
                data: &[9],
            },
            1,
        );
        frame.push(8);
        assert!(decode_request(&header_of(&frame), body_of(&frame)).is_err());
        // Bytes after a complete message are not ignored.
        let mut frame = Vec::new();
        encode_frame(&mut frame, FrameKind::Request, 0, 1, &Request::Ping);
        let mut body = body_of(&frame).to_vec();
        body.push(0);
        assert!(matches!(
            decode_borrowed::<Request>(&body),
            Err(ProtoError::TrailingBytes(1))
        ));
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
            function: FunctionHandle(1),
            grid: [1; 3],
            block: [1; 3],
            shared_mem: 0,
            stream: StreamHandle(0),
            params: &[],
            attributes: vec![],
        })
        .is_quiet());
        assert!(!Request::MemAlloc { device: 0, size: 1 }.is_quiet());
        assert!(!Request::StreamSynchronize {
            stream: StreamHandle(0)
        }
        .is_quiet());
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
