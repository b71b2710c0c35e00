//! One worker process per session, and the control socket that carries its ledger requests.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use gpufuse_transport::Conn;
use gpufuse_worker::control::Op;

use crate::{lock, refuse, NodeConfig, Shared, WINDOW};

/// Starts `gpufuse worker` for session `id` with the client connection as its stdin and a
/// control socket as its stdout, serves the control socket until the worker exits, then
/// releases everything the session held.
#[allow(clippy::too_many_arguments)]
pub fn run_worker(
    mut conn: Conn,
    tcp: bool,
    id: u64,
    device: u32,
    base: u64,
    limit: Option<u64>,
    state: &Shared,
    config: &NodeConfig,
) {
    let (total, kind) = {
        let s = lock(state);
        let d = &s.devices[device as usize];
        (d.total, d.kind)
    };
    let (mut control, child_end) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            release(state, id);
            return refuse(&mut conn, format!("cannot start a worker: {e}"));
        }
    };
    let client_fd: OwnedFd = match conn_into_fd(conn) {
        Some(fd) => fd,
        None => return release(state, id),
    };
    let mut cmd = Command::new(&config.worker_exe);
    cmd.arg("worker")
        .args(["--session", &id.to_string()])
        .args(["--device-index", &device.to_string()])
        .args(["--device-total", &total.to_string()])
        .args(["--window-base", &base.to_string()])
        .args(["--window-size", &WINDOW.to_string()])
        .args([
            "--backend",
            match kind {
                gpufuse_proto::DeviceKind::Cuda => "cuda",
                gpufuse_proto::DeviceKind::Emulated => "emu",
            },
        ])
        .stdin(Stdio::from(client_fd))
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::inherit());
    if tcp {
        cmd.arg("--tcp");
    }
    if let Some(l) = limit {
        cmd.args(["--limit", &l.to_string()]);
    }
    let spawned = cmd.spawn();
    // The command holds the parent's copies of the client socket and the worker's end of the
    // control socket: close them now, or neither the client's exit nor the worker's would be
    // seen.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("cannot start a worker for session {id}: {e}");
            return release(state, id);
        }
    };
    if let Some(s) = lock(state).sessions.get_mut(&id) {
        s.worker_pid = child.id();
    }
    tracing::info!(session = id, worker = child.id(), "session started");
    serve_control(&mut control, id, device, state);
    let status = child.wait();
    tracing::info!(session = id, "session ended ({status:?})");
    release(state, id);
}

fn conn_into_fd(conn: Conn) -> Option<OwnedFd> {
    // The hello was the only frame read; nothing the client sent after it is buffered, because
    // a client waits for the hello's answer before it sends requests.
    let stream = conn_stream(conn)?;
    Some(stream.into_fd())
}

fn conn_stream(conn: Conn) -> Option<gpufuse_transport::Stream> {
    Some(conn.into_stream())
}

/// Answers ledger requests until the worker closes the socket (exit, crash or kill).
fn serve_control(control: &mut UnixStream, id: u64, device: u32, state: &Shared) {
    let mut req = [0u8; 9];
    while control.read_exact(&mut req).is_ok() {
        let arg = u64::from_le_bytes(req[1..].try_into().expect("8 bytes"));
        let (ok, value) = {
            let mut s = lock(state);
            let s = &mut *s;
            let d = &mut s.devices[device as usize];
            match Op::from_u8(req[0]) {
                Some(Op::Reserve) => {
                    if d.used + arg <= d.total {
                        d.used += arg;
                        if let Some(rec) = s.sessions.get_mut(&id) {
                            rec.used += arg;
                        }
                        (true, d.used)
                    } else {
                        (false, d.used)
                    }
                }
                Some(Op::Release) => {
                    let rec_used = s.sessions.get(&id).map_or(0, |r| r.used);
                    let n = arg.min(rec_used);
                    d.used = d.used.saturating_sub(n);
                    if let Some(rec) = s.sessions.get_mut(&id) {
                        rec.used -= n;
                    }
                    (true, d.used)
                }
                Some(Op::DeviceUsed) => (true, d.used),
                Some(Op::DeviceTime) => {
                    if let Some(rec) = s.sessions.get_mut(&id) {
                        rec.device_time_us += arg;
                    }
                    (true, 0)
                }
                None => break,
            }
        };
        let mut ans = [0u8; 9];
        ans[0] = ok as u8;
        ans[1..].copy_from_slice(&value.to_le_bytes());
        if control.write_all(&ans).is_err() {
            break;
        }
    }
}

/// Forgets session `id` and returns everything it held to its device.
fn release(state: &Shared, id: u64) {
    let mut s = lock(state);
    if let Some(rec) = s.sessions.remove(&id) {
        let d = &mut s.devices[rec.device as usize];
        d.used = d.used.saturating_sub(rec.used);
        if let Some(l) = rec.limit {
            d.promised = d.promised.saturating_sub(l);
        }
    }
}
