//! Everything a peer's bytes reach before a request is handled: the frame header, every
//! message type's decoder, and the split of a bulk tail (declared by the header) from its
//! message. None may panic; what decodes must encode back to a frame that decodes to the same
//! message.
#![no_main]

use gpufuse_proto::{ClientHello, Reply, Request, ServerHello};
use gpufuse_proto::{FrameHeader, FrameKind, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

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
    let _ = gpufuse_proto::decode_owned::<ClientHello>(body);
    let _ = gpufuse_proto::decode_owned::<ServerHello>(body);
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
