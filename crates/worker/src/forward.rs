//! After a session moved to another node (`remote.rs`): the old worker sends its client on.
//!
//! A client batches quiet requests (launches, asynchronous copies) and sends them whenever it
//! likes; only while it waits for an answer does it send nothing. A move that stops at a
//! synchronous request answers that request with where the session went ([`send_on`]). A
//! move that stops while the client is quiet (an idle session, or one that only sends quiet
//! requests) cannot tell it yet: until its next synchronous request, everything it sends here
//! is forwarded to the new worker over the move's connection, in order, and runs there
//! ([`forward`]); that request is then answered with where to go, and the client sends it
//! again there. The new worker runs the forwarded requests before it takes the client.
//!
//! A forwarded copy from the client's page-locked arena (the shared-memory transport) is
//! sent with its bytes, read from the arena here; a copy into the arena is read on the new
//! device when it runs and written into the arena once the client attaches it there.

use gpufuse_proto::{decode_request, encode_frame, FrameKind, Moved, Request, FLAG_QUIET};
use gpufuse_transport::{Conn, TransportError};

use crate::remote::RemoteTarget;
use crate::{heartbeat, Session, WorkerError};
use gpufuse_proto::{DevicePtr, StreamHandle};

/// How often the old worker tells the new one its client is still quiet.
pub(crate) const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(10);

/// Forwards the client's quiet requests to `target` until it sends a synchronous one, which
/// is answered with where its session went (`key`: what it resumes with there).
pub(crate) fn forward(
    conn: &mut Conn,
    session: &mut Session,
    mut target: RemoteTarget,
    key: u64,
    beat: &heartbeat::Heartbeat,
) -> Result<(), WorkerError> {
    beat.busy(false);
    let mut forwarded = 0u64;
    loop {
        // A quiet client: the new worker hears that this one is still here.
        if !conn.wait_readable(None, Some(KEEPALIVE)).unwrap_or(true) {
            if let Err(why) = target.still_waiting() {
                tracing::warn!("the new worker is gone: {why}");
                return Err(WorkerError::Transport(TransportError::Closed));
            }
            continue;
        }
        let (header, body) = match conn.recv() {
            Ok(f) => f,
            Err(TransportError::Closed) => {
                // The client ended; the new worker, whose connection closes, ends it there.
                tracing::info!(forwarded, "the client of the moved session is gone");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        if header.kind != FrameKind::Request {
            return Err(WorkerError::UnexpectedFrame(header.kind));
        }
        let id = header.request_id;
        if !header.is_quiet() {
            if forwarded > 0 {
                tracing::info!(forwarded, "forwarded the client's requests to the session");
            }
            return send_on(conn, target, key, id, beat);
        }
        let req = decode_request(&header, body)?;
        let frame = forwarded_frame(session, &req, id);
        if let Err(why) = target.forward(frame) {
            // The new worker is gone: the session is lost with it.
            tracing::warn!("cannot forward the client's request: {why}");
            return Err(WorkerError::Transport(TransportError::Closed));
        }
        forwarded += 1;
    }
}

/// Tells the new worker nothing more comes, then answers the client's synchronous request
/// `id` with where its session went.
pub(crate) fn send_on(
    client: &mut Conn,
    mut target: RemoteTarget,
    key: u64,
    id: u64,
    beat: &heartbeat::Heartbeat,
) -> Result<(), WorkerError> {
    if let Err(why) = target.end_forwarding() {
        tracing::warn!("the new worker did not hear the end of the forwarded requests: {why}");
    }
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::Moved,
        0,
        id,
        &Moved {
            address: target.address.clone(),
            key,
        },
    );
    let _writing = beat.writing();
    client.send(&out).map_err(TransportError::from)?;
    Ok(())
}

/// Quiet request `req` (id `id`) as a frame the new worker runs: a copy from the client's
/// arena carries its bytes instead of an offset in an arena the new worker cannot see.
fn forwarded_frame(session: &Session, req: &Request<'_>, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    if let &Request::MemcpyHtoDHost {
        dst: DevicePtr(dst),
        stream: StreamHandle(stream),
        offset,
        size,
    } = req
    {
        if let Some(data) = session.arena_bytes(offset, size) {
            let copy = Request::MemcpyHtoD {
                dst: DevicePtr(dst),
                stream: StreamHandle(stream),
                data: &data,
            };
            encode_frame(&mut out, FrameKind::Request, FLAG_QUIET, id, &copy);
            return out;
        }
    }
    encode_frame(&mut out, FrameKind::Request, FLAG_QUIET, id, req);
    out
}
