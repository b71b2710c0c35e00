//! The session's connection: the hello answer, then requests read, run and answered until the
//! client leaves. Large host-to-device copies are received straight into device memory and
//! large device-to-host replies sent from it in place.

use gpufuse_device::Device;
use gpufuse_proto::{
    decode_borrowed, decode_request, encode_frame, encode_frame_head, FrameKind, ReplyBody,
    Request, ServerHello,
};
use gpufuse_transport::{Conn, TransportError};

use crate::{heartbeat, HtodTarget, Ledger, Session, WorkerError};

/// Copies at least this large are received straight into device memory.
const DIRECT_HTOD: u32 = 1 << 20;
/// A copy's message is a few dozen bytes; anything longer is not one to take the direct path.
const MAX_DIRECT_HEAD: u32 = 256;

/// Serves one session on `conn` until the client leaves, then frees everything it held.
/// Sends the hello answer first.
pub fn serve(
    mut conn: Conn,
    session_id: u64,
    device: &mut dyn Device,
    ledger: &mut dyn Ledger,
    limit: Option<u64>,
) -> Result<(), WorkerError> {
    let info = device.info(limit);
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Accepted {
            session_id,
            devices: vec![info],
        },
    );
    conn.send(&out).map_err(TransportError::from)?;
    let beat =
        heartbeat::Heartbeat::start(conn.stream().try_clone().map_err(TransportError::from)?)
            .map_err(TransportError::from)?;
    let mut session = Session::new(device, ledger, limit);
    let result = run(&mut conn, &mut session, &mut out, &beat);
    session.release_all();
    match result {
        Err(WorkerError::Transport(TransportError::Closed)) => Ok(()),
        other => other,
    }
}

/// Answers the hello with a refusal (the worker could not open its device).
pub fn refuse(mut conn: Conn, reason: String) -> Result<(), WorkerError> {
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Refused { reason },
    );
    conn.send(&out).map_err(TransportError::from)?;
    Ok(())
}

/// How often, at most, the worker looks whether its client is gone while launches arrive.
const HANGUP_CHECK: std::time::Duration = std::time::Duration::from_millis(1);

fn run(
    conn: &mut Conn,
    session: &mut Session,
    out: &mut Vec<u8>,
    beat: &heartbeat::Heartbeat,
) -> Result<(), WorkerError> {
    let mut last_check = std::time::Instant::now();
    loop {
        // A client that died with launches still queued in the socket: its work is dropped at
        // once instead of holding the device for the others (CUDA abandons a dead process's
        // work too). Looked at once a millisecond at most, so request rates do not pay for it.
        if last_check.elapsed() >= HANGUP_CHECK {
            last_check = std::time::Instant::now();
            if conn.peer_hung_up() {
                tracing::info!("the client is gone: dropping its queued work");
                return Err(WorkerError::Transport(TransportError::Closed));
            }
        }
        // Idle while waiting for the client (no heartbeats), busy from its next frame on.
        beat.busy(conn.has_frame());
        let header = conn.peek_header()?;
        beat.busy(true);
        // A large host-to-device copy: its data (the frame's tail) is received straight into
        // device memory.
        if header.kind == FrameKind::Request
            && header.is_quiet()
            && header.tail >= DIRECT_HTOD
            && header.message_len() <= MAX_DIRECT_HEAD
        {
            let head = header.message_len() as usize;
            if let Ok(Request::MemcpyHtoD { dst, stream, data }) =
                decode_borrowed::<Request>(conn.peek_body(head)?)
            {
                if data.is_empty() {
                    match session.htod_target(dst, stream, u64::from(header.tail)) {
                        HtodTarget::Write(bytes) => {
                            conn.recv_tail_into(head, bytes)?;
                            continue;
                        }
                        HtodTarget::Discard => {
                            conn.skip_frame()?;
                            continue;
                        }
                        HtodTarget::Unsupported => {}
                    }
                }
            }
        }
        let (header, body) = conn.recv()?;
        if header.kind != FrameKind::Request {
            return Err(WorkerError::UnexpectedFrame(header.kind));
        }
        let quiet = header.is_quiet();
        let id = header.request_id;
        let req: Request = decode_request(&header, body)?;

        if tracing::enabled!(tracing::Level::TRACE) {
            let mut text = format!("{req:?}");
            text.truncate(200);
            tracing::trace!(quiet, "request {text}");
        }
        let reply = session.dispatch(req, quiet);
        if session.holds_lease() && !conn.poll_frame() {
            // Nothing more has arrived: do not hold the device while waiting for the client.
            session.end_lease();
        }
        if let Some(mut reply) = reply {
            let _writing = beat.writing();
            out.clear();
            if let Some((src, size)) = session.view.take() {
                if reply.status == 0 {
                    encode_frame_head(out, FrameKind::Reply, 0, id, &reply, size as usize);
                    conn.send(out).map_err(TransportError::from)?;
                    let data = session
                        .device
                        .view(src, size)
                        .expect("checked when the request ran");
                    conn.send(data).map_err(TransportError::from)?;
                    continue;
                }
            }
            match &mut reply.body {
                // Bulk data goes out from its own buffer, not copied into the frame.
                ReplyBody::Data(d) if d.len() >= 64 * 1024 => {
                    let data = std::mem::take(d);
                    encode_frame_head(out, FrameKind::Reply, 0, id, &reply, data.len());
                    conn.send(out).map_err(TransportError::from)?;
                    conn.send(&data).map_err(TransportError::from)?;
                    session.scratch = data;
                }
                _ => {
                    encode_frame(out, FrameKind::Reply, 0, id, &reply);
                    conn.send(out).map_err(TransportError::from)?;
                }
            }
            if out.capacity() > 1 << 20 {
                *out = Vec::new();
            }
        }
    }
}
