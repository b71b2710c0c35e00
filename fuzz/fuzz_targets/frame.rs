//! Everything a peer's bytes reach before a request is handled: the frame header, every
//! message type's decoder (sessions' requests and replies, hellos, the worker-node control
//! socket's `ControlRequest`/`NodeCommand`/`ControlAnswer`/`MoveOutcome`, the pool's agent
//! link, and a move between nodes' `MoveMessage`/`MoveAck`/`Moved`), and the split of a bulk tail (declared by the header) from its
//! message. None may panic; what decodes must encode back to a frame that decodes to the same
//! message.
#![no_main]

use gpufuse_proto::{
    AgentAnswer, ClientHello, ControlAnswer, ControlRequest, MoveAck, MoveMessage, MoveOutcome,
    Moved, NodeCommand, NodeReport, Reply, Request, ServerHello,
};
use gpufuse_proto::{FrameHeader, FrameKind, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

/// What decodes as `$t` re-encodes, in a frame of kind `$kind`, to a body that decodes to the
/// same value (these types hold no floats, so values compare).
macro_rules! round_trip {
    ($t:ty, $kind:expr, $body:expr) => {
        if let Ok(v) = gpufuse_proto::decode_owned::<$t>($body) {
            let mut frame = Vec::new();
            gpufuse_proto::encode_frame(&mut frame, $kind, 0, 1, &v);
            let back: $t = gpufuse_proto::decode_owned(&frame[HEADER_LEN..]).unwrap();
            assert_eq!(back, v);
        }
    };
}

fuzz_target!(|data: &[u8]| {
    if let Some(head) = data.first_chunk::<HEADER_LEN>() {
        if let Ok(h) = FrameHeader::decode(head) {
            assert_eq!(FrameHeader::decode(&h.encode()).ok(), Some(h));
        }
    }
    let body = data.get(HEADER_LEN.min(data.len())..).unwrap_or_default();
    // Round trips compare encodings, not values: a float field may hold NaN, which is not
    // equal to itself.
    if let Ok(req) = gpufuse_proto::decode_borrowed::<Request>(body) {
        let mut frame = Vec::new();
        gpufuse_proto::encode_frame(&mut frame, FrameKind::Request, 0, 1, &req);
        let back: Request = gpufuse_proto::decode_borrowed(&frame[HEADER_LEN..]).unwrap();
        let mut again = Vec::new();
        gpufuse_proto::encode_frame(&mut again, FrameKind::Request, 0, 1, &back);
        assert_eq!(again, frame);
    }
    let _ = gpufuse_proto::decode_owned::<Reply>(body);
    round_trip!(ClientHello, FrameKind::Hello, body);
    round_trip!(ServerHello, FrameKind::HelloReply, body);
    // The worker's control socket and command socket.
    round_trip!(ControlRequest, FrameKind::Control, body);
    round_trip!(NodeCommand, FrameKind::Control, body);
    round_trip!(ControlAnswer, FrameKind::ControlReply, body);
    round_trip!(MoveOutcome, FrameKind::ControlReply, body);
    // The pool: a node agent's link to the controller (the pool's view is a `ServerHello`;
    // grants and end orders travel as signed JSON tokens, checked before they are decoded).
    round_trip!(NodeReport, FrameKind::Control, body);
    round_trip!(AgentAnswer, FrameKind::ControlReply, body);
    // A move between nodes: the leaving worker's state stream, the answer, the client's note.
    round_trip!(MoveMessage, FrameKind::Move, body);
    round_trip!(MoveAck, FrameKind::MoveReply, body);
    round_trip!(Moved, FrameKind::Moved, body);
    for tail in [0, 1, 8, body.len() / 2, body.len(), body.len() + 1] {
        let mut h = FrameHeader::new(FrameKind::Request, 0, body.len() as u32, 1);
        h.tail = tail as u32;
        if let Ok(req) = gpufuse_proto::decode_request(&h, body) {
            // A request with a tail re-encodes, tail and all, to one that decodes the same.
            let mut frame = Vec::new();
            gpufuse_proto::encode_frame(&mut frame, FrameKind::Request, 0, 1, &req);
            let whole = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
            let back = gpufuse_proto::decode_request(&whole, &frame[HEADER_LEN..]).unwrap();
            let mut again = Vec::new();
            gpufuse_proto::encode_frame(&mut again, FrameKind::Request, 0, 1, &back);
            assert_eq!(again, frame);
        }
        h.kind = FrameKind::Reply;
        let _ = gpufuse_proto::decode_reply(&h, body);
    }
});
