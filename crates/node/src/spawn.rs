//! One worker process per session, and the control socket that carries its ledger requests.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use gpufuse_transport::Conn;

use std::sync::Arc;

use crate::{lock, refuse, Admitted, DeviceQueue, NodeConfig, Shared, WINDOW};

/// A session moving here from another node (a `MoveIn` hello): its worker starts at the
/// session's own address window and receives its state on the connection; its client later
/// resumes it with `key` (a `Resume` hello, [`resume`]).
#[derive(Clone, Copy, Debug)]
pub struct Incoming {
    pub window_base: u64,
    pub key: u64,
}

/// Whether device `device` has room for the `bytes` a session moving in holds (its memory
/// comes with it, slice or not), as a move between a node's devices checks.
pub fn room_for_incoming(state: &Shared, device: u32, bytes: u64) -> Result<(), String> {
    let s = lock(state);
    let d = s
        .devices
        .get(device as usize)
        .ok_or_else(|| format!("this node has no device {device}"))?;
    let free = d.total.saturating_sub(d.used);
    if bytes > free {
        return Err(format!(
            "device {device} has {} free; the session holds {}",
            crate::admin::human_bytes(free),
            crate::admin::human_bytes(bytes)
        ));
    }
    Ok(())
}

impl Incoming {
    /// For a session arriving at `window_base`, with a fresh one-time key.
    pub fn new(window_base: u64) -> Self {
        let random = gpufuse_auth::new_secret();
        let mut key = [0u8; 8];
        key.copy_from_slice(&random[..8]);
        Self {
            window_base,
            key: u64::from_le_bytes(key),
        }
    }
}

/// Starts `gpufuse worker` for session `id` with the client connection as its stdin and a
/// control socket as its stdout, serves the control socket until the worker exits, then
/// releases everything the session held. `incoming`: the session moves in from another node
/// (the connection is the leaving worker's, bringing its state).
pub fn run_worker(
    mut conn: Conn,
    tcp: bool,
    admitted: Admitted,
    limit: Option<u64>,
    state: &Shared,
    config: &NodeConfig,
    incoming: Option<Incoming>,
) {
    let Admitted { id, device, base } = admitted;
    let base = incoming.map_or(base, |i| i.window_base);
    let (total, kind, cc, queue, tenant, host) = {
        let s = lock(state);
        let tenant = s.sessions.get(&id).and_then(|r| r.subject.clone());
        let host = s.observed.host().to_string();
        let d = s.devices.get(device as usize);
        (
            d.map_or(0, |d| d.total),
            d.map_or(gpufuse_proto::DeviceKind::Emulated, |d| d.kind),
            d.map_or((10, 0), |d| d.compute_capability),
            s.queues.get(device as usize).cloned(),
            tenant.unwrap_or_else(|| "-".into()),
            host,
        )
    };
    // Everything logged about the session on this thread (started, ended, control-socket
    // trouble) carries its span; the worker opens the same span (`--tenant`).
    let _span =
        tracing::info_span!("session", id, tenant = %tenant, node = %host, device).entered();
    let Some(queue) = queue else {
        release(state, id);
        return refuse(&mut conn, format!("device {device} has no launch queue"));
    };
    let (control, child_end) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            release(state, id);
            return refuse(&mut conn, format!("cannot start a worker: {e}"));
        }
    };
    // The node's commands to the worker (evict, migrate): a second socket pair, whose
    // worker end the worker inherits (`--commands-fd`).
    let (commands, commands_child) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            release(state, id);
            return refuse(&mut conn, format!("cannot start a worker: {e}"));
        }
    };
    // The session's lease offers (`gpufuse_transport::lease_offer`): without one the worker
    // asks for every lease, which works, only slower.
    let offer = match gpufuse_transport::lease_offer::LeaseOffer::create() {
        Ok(o) => Some(Arc::new(o)),
        Err(e) => {
            tracing::warn!("no lease offers for this session: {e}");
            None
        }
    };
    let lease_fd = offer
        .as_ref()
        .and_then(|o| o.fd().try_clone_to_owned().ok());
    let client_fd: OwnedFd = match conn_into_fd(conn, id) {
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
        .args(["--arch", &(cc.0 * 10 + cc.1).to_string()])
        .args(["--tenant", &tenant])
        .stdin(Stdio::from(client_fd))
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::inherit());
    if tcp {
        cmd.arg("--tcp");
    }
    if let Some(l) = limit {
        cmd.args(["--limit", &l.to_string()]);
    }
    if let Some(i) = incoming {
        cmd.args(["--incoming-key", &i.key.to_string()]);
    }
    let commands_fd = {
        use std::os::fd::AsRawFd;
        commands_child.as_raw_fd()
    };
    cmd.args(["--commands-fd", &commands_fd.to_string()]);
    let lease_raw = lease_fd.as_ref().map(|fd| {
        use std::os::fd::AsRawFd;
        fd.as_raw_fd()
    });
    if let Some(fd) = lease_raw {
        cmd.args(["--lease-fd", &fd.to_string()]);
    }
    let e = &config.elastic;
    if let Some(t) = e.idle_ttl {
        cmd.args(["--idle-ttl-ms", &t.as_millis().to_string()]);
    }
    if let Some(t) = e.idle_disk_ttl {
        cmd.args(["--idle-disk-ttl-ms", &t.as_millis().to_string()]);
    }
    if let Some(d) = &e.swap_dir {
        cmd.arg("--swap-dir").arg(d);
    }
    if e.oversubscribes() {
        cmd.arg("--oversubscribed");
    }
    crate::image_cache::configure_worker(&mut cmd, config.image_cache.as_ref());
    // The worker dies with the node: a node killed by any signal (SIGKILL included) must not
    // leave workers holding device memory that no ledger shows. PR_SET_PDEATHSIG fires when
    // the thread that spawned the child exits; this thread serves the worker's control socket
    // until the worker exits, so it outlives it.
    // The worker also keeps the node lock (`lifecycle.rs`) until it exits: a node restarted on
    // the same socket refuses to start while a worker of this one still holds device memory.
    let inherited = crate::lifecycle::inherited_fds();
    // SAFETY: prctl, getppid and fcntl are async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            for &fd in inherited
                .iter()
                .chain([&commands_fd])
                .chain(lease_raw.iter())
            {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The node may have died before the call above.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    // The command holds the parent's copies of the client socket and the worker's end of the
    // control socket: close them now, or neither the client's exit nor the worker's would be
    // seen.
    drop(cmd);
    drop(commands_child);
    drop(lease_fd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("cannot start a worker for session {id}: {e}");
            return release(state, id);
        }
    };
    if let Some(s) = lock(state).sessions.get_mut(&id) {
        s.worker_pid = child.id();
        s.elastic.commands = Some(crate::elastic::CommandLine::new(commands));
        s.elastic.incoming_key = incoming.map(|i| i.key);
    }
    crate::admin::log_started(state, id);
    if let Some(o) = &offer {
        queue.register_offer(id, o.clone());
    }
    serve_control(control, id, state, queue);
    // The worker is gone or going: its place in the launch queue goes first, so that nobody
    // waits on a dead session (on the device it runs on now: it may have moved).
    let device = lock(state).sessions.get(&id).map_or(device, |s| s.device);
    if let Some(q) = lock(state).queues.get(device as usize).cloned() {
        q.remove(id);
    }
    let status = child.wait();
    crate::admin::log_ended(state, id, &status);
    release(state, id);
}

/// A client resumes its session, moved here from another node (a `Resume` hello with the key
/// the move gave it): its connection goes to the worker that holds the session, which
/// answers the hello. The key works once.
pub fn resume(mut conn: Conn, key: u64, state: &Shared) {
    let found = {
        let mut s = lock(state);
        s.sessions
            .iter_mut()
            .find(|(_, r)| r.elastic.incoming_key == Some(key))
            .map(|(&id, r)| {
                r.elastic.incoming_key = None;
                (id, r.elastic.commands.clone())
            })
    };
    let Some((id, Some(line))) = found else {
        return refuse(
            &mut conn,
            "no session here is waiting for a client with that key (it was used, or the \
             session ended)"
                .into(),
        );
    };
    // Plain TCP stays TCP; a TLS client's worker end is a unix socket pair (the relay carries
    // the TLS), as for any session.
    let tcp = conn.stream().is_tcp();
    let _ = conn.stream().set_read_timeout(None);
    let Some(fd) = conn_into_fd(conn, id) else {
        return;
    };
    match line.hand_over(fd, tcp, std::time::Duration::from_secs(10)) {
        Some(a) if a.ok => tracing::info!(session = id, "its client resumed the moved session"),
        _ => tracing::warn!(
            session = id,
            "the moved session's worker did not take its client"
        ),
    }
}

/// The descriptor the worker serves its client on: the client's socket itself, or for TLS one
/// end of a socket pair whose other end the relay (`relay.rs`) carries to the client.
fn conn_into_fd(conn: Conn, id: u64) -> Option<OwnedFd> {
    // The hello was the only frame read; nothing the client sent after it is buffered, because
    // a client waits for the hello's answer before it sends requests.
    match conn.into_stream() {
        gpufuse_transport::Stream::TlsServer(tls) => {
            let (worker_end, relay_end) = match UnixStream::pair() {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!("session {id}: cannot start its TLS relay: {e}");
                    return None;
                }
            };
            std::thread::spawn(move || crate::relay::run(*tls, relay_end, id));
            Some(worker_end.into())
        }
        stream => match stream.into_fd() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::error!("session {id}: cannot hand the connection to a worker: {e}");
                None
            }
        },
    }
}

/// Answers ledger and launch-queue requests until the worker closes the socket (exit, crash
/// or kill).
fn serve_control(control: UnixStream, id: u64, state: &Shared, mut queue: Arc<DeviceQueue>) {
    use gpufuse_proto::{ControlAnswer, ControlRequest, FrameKind};
    let mut conn = gpufuse_transport::Conn::new(gpufuse_transport::Stream::Unix(control));
    let mut out = Vec::with_capacity(64);
    let mut moved: Option<(Arc<DeviceQueue>, Arc<DeviceQueue>)> = None;
    loop {
        let (req_id, req) = match conn.recv() {
            Ok((h, body)) if h.kind == FrameKind::Control => {
                match gpufuse_proto::decode_owned::<ControlRequest>(body) {
                    Ok(req) => (h.request_id, req),
                    Err(e) => {
                        tracing::warn!(session = id, "malformed control request: {e}");
                        break;
                    }
                }
            }
            Ok((h, _)) => {
                tracing::warn!(
                    session = id,
                    "unexpected {:?} frame on the control socket",
                    h.kind
                );
                break;
            }
            // The worker exited (or sent bytes that are not a frame).
            Err(_) => break,
        };
        // The session's launch queue is its device's: a session that moved asks the new one.
        // Activity is noted for oversubscription (least recently active sessions go first).
        {
            let mut s = lock(state);
            let device = s.sessions.get_mut(&id).map(|r| {
                r.elastic.last_active = std::time::Instant::now();
                r.device
            });
            if let Some(q) = device.and_then(|d| s.queues.get(d as usize)) {
                if !Arc::ptr_eq(q, &queue) {
                    // The lease offer moves with the session (after the node lock: the
                    // queues take their own).
                    moved = Some((queue.clone(), q.clone()));
                    queue = q.clone();
                }
            }
        }
        if let Some((old, new)) = moved.take() {
            if let Some(o) = old.unregister_offer(id) {
                new.register_offer(id, o);
            }
        }
        let (ok, value) = match req {
            ControlRequest::Reserve { bytes } | ControlRequest::ReserveWaiting { bytes } => {
                let granted = lock(state).reserve(id, bytes);
                let oversubscribed = lock(state).elastic.oversubscribes();
                if granted.0 || !oversubscribed {
                    granted
                } else {
                    let wait = matches!(req, ControlRequest::ReserveWaiting { .. });
                    crate::elastic::make_room(state, id, bytes, wait);
                    lock(state).reserve(id, bytes)
                }
            }
            ControlRequest::Swapped { host, disk } => {
                if let Some(r) = lock(state).sessions.get_mut(&id) {
                    r.elastic.swapped_host = host;
                    r.elastic.swapped_disk = disk;
                }
                (true, 0)
            }
            ControlRequest::Images(counts) => {
                lock(state).image_cache.record(counts);
                (true, 0)
            }
            ControlRequest::Release { bytes } => (true, lock(state).release(id, bytes)),
            ControlRequest::DeviceUsed => (true, lock(state).device_used(id)),
            ControlRequest::Acquire => (true, queue.acquire(id)),
            ControlRequest::Done { micros } => {
                // Not answered: the worker does not wait for it.
                queue.done(id, micros);
                continue;
            }
            ControlRequest::Renew { micros } => (true, queue.renew(id, micros)),
        };
        out.clear();
        gpufuse_proto::encode_frame(
            &mut out,
            FrameKind::ControlReply,
            0,
            req_id,
            &ControlAnswer { ok, value },
        );
        if conn.send(&out).is_err() {
            break;
        }
    }
}

/// Forgets session `id` and returns everything it held to its device.
fn release(state: &Shared, id: u64) {
    let idle = {
        let mut s = lock(state);
        s.end_session(id);
        s.sessions.is_empty()
    };
    trim_heap(idle);
}

/// Gives the heap memory freed by ended sessions back to the system. glibc keeps freed memory
/// in its heaps until the top of a heap is free, so a node that served many sessions at once
/// kept tens of MiB it no longer used (`docs/soak.md`: 418 KiB still allocated, 22 MiB kept).
/// At most once a second, and whenever the last session ends.
fn trim_heap(idle: bool) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let last = LAST_MS.load(Ordering::Relaxed);
    if !idle && now.saturating_sub(last) < 1000 {
        return;
    }
    LAST_MS.store(now, Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own free lists, under its own locks; any thread
    // may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
