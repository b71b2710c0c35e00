//! The node's life cycle as a process: what it does with the socket path it is given, its
//! workers when it is killed, a clean shutdown on SIGTERM, idle connections, and clients
//! talking to a peer that never answers. Unix sockets in a temporary directory only.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::Connection;
use gpufuse_proto::DevicePtr;
use gpufuse_proto::{ReplyBody, Request, SessionKind};
use gpufuse_transport::Address;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufuse-life-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn serve(sock: &Path, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args([
            "serve",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--devices",
            "emu:1:1GiB",
            "--image-cache",
            &sock.with_file_name("images").display().to_string(),
        ])
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: u32) -> bool {
    // Zombies count as gone: the worker's parent (the node) is dead and cannot reap it. Every
    // thread counts: a leader thread is a zombie while the others still run and hold the
    // process's descriptors (its node lock among them).
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    })
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: sending a signal has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, sig) };
}

#[test]
fn serve_refuses_a_path_that_is_not_a_stale_socket() {
    let dir = temp_dir("path");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "keep").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["serve", "--listen", &format!("unix:{}", file.display())])
        .args(["--devices", "emu:1:1GiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a socket") && err.contains("notes.txt"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn workers_die_with_a_killed_node_and_sigterm_shuts_down_cleanly() {
    let dir = temp_dir("death");
    let (sock, log) = (dir.join("s.sock"), dir.join("log"));
    let mut node = serve(&sock, &log);
    wait_for("the node listens", 20, || {
        UnixStream::connect(&sock).is_ok()
    });
    let addr = Address::Unix(sock.clone());
    let hello = Connection::hello(SessionKind::Cuda, String::new(), Default::default());
    let (mut c, _) = Connection::open(&addr, &hello).unwrap();
    assert!(matches!(
        c.call(&Request::MemAlloc {
            device: 0,
            size: 1 << 20
        }),
        Ok(ReplyBody::Ptr(DevicePtr(_)))
    ));
    let status = Connection::query_status(&addr, String::new()).unwrap();
    let worker = status.sessions[0].worker_pid;
    assert!(alive(worker));
    node.kill().unwrap();
    let _ = node.wait();
    wait_for("the worker dies with its node", 10, || !alive(worker));
    drop(c);

    // A new node on the same path (the socket left behind is stale), then SIGTERM.
    let mut node = serve(&sock, &log);
    wait_for("the restarted node listens", 20, || {
        Connection::query_status(&addr, String::new()).is_ok()
    });
    // SIGTERM ends the sessions too.
    let (c, _) = Connection::open(&addr, &hello).unwrap();
    let worker = Connection::query_status(&addr, String::new())
        .unwrap()
        .sessions[0]
        .worker_pid;
    kill(node.id(), libc::SIGTERM);
    let status = node.wait().unwrap();
    assert!(status.success(), "a clean exit: {status:?}");
    assert!(!sock.exists(), "the socket file is removed");
    wait_for("SIGTERM ends the node's workers", 10, || !alive(worker));
    drop(c);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("SIGTERM: shutting down; ending 1 session(s)"),
        "{text}"
    );
    assert!(text.contains("SIGTERM: stopped"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_peer_that_never_answers_is_an_error_not_a_hang() {
    let dir = temp_dir("silent");
    let sock = dir.join("silent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let held = std::thread::spawn(move || {
        // Accepts and never answers.
        let conns: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(5));
        drop(conns);
    });
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["status", "--server", &format!("unix:{}", sock.display())])
        .env("GPUFUSE_HELLO_TIMEOUT", "1")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "status gave up within its timeout"
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not answer"), "{err}");
    let _ = held.join();
    let _ = std::fs::remove_dir_all(&dir);
}

fn threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[test]
fn idle_connections_cannot_use_up_the_nodes_threads() {
    let dir = temp_dir("idle");
    let (sock, log) = (dir.join("s.sock"), dir.join("log"));
    let mut node = serve(&sock, &log);
    wait_for("the node listens", 20, || {
        UnixStream::connect(&sock).is_ok()
    });
    let idle: Vec<UnixStream> = (0..300)
        .filter_map(|_| UnixStream::connect(&sock).ok())
        .collect();
    assert!(idle.len() >= 250);
    std::thread::sleep(Duration::from_millis(500));
    let n = threads(node.id());
    assert!(
        n <= gpufuse_node::MAX_HANDSHAKES + 16,
        "{n} threads for {} idle connections",
        idle.len()
    );
    // Real clients still get through once the idle ones are closed or time out.
    drop(idle);
    let addr = Address::Unix(sock.clone());
    wait_for("a status query is served", 20, || {
        Connection::query_status(&addr, String::new()).is_ok()
    });
    kill(node.id(), libc::SIGTERM);
    let _ = node.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The backstop to the parent-death signal: a worker whose node's end of the control socket
/// closes (the node died) ends, even while its client is still connected and idle.
#[test]
fn a_worker_ends_when_its_node_goes_away() {
    use std::io::Read;
    let (client, worker_in) = UnixStream::pair().unwrap();
    let (control, worker_out) = UnixStream::pair().unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["worker", "--session", "1", "--device-index", "0"])
        .args(["--device-total", &(1u64 << 30).to_string()])
        .args(["--window-base", &(0x2000_0000_0000u64).to_string()])
        .args(["--window-size", &(1u64 << 40).to_string()])
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(worker_in)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(worker_out)))
        .spawn()
        .unwrap();
    // The worker answers the hello on the client connection: it is serving.
    let mut head = [0u8; 24];
    (&client).read_exact(&mut head).unwrap();
    assert_eq!(&head[..4], b"GFUS");
    let pid = worker.id();
    assert!(alive(pid));
    drop(control);
    wait_for("the worker ends once its node is gone", 20, || {
        worker.try_wait().unwrap().is_some()
    });
    drop(client);
}

fn holds(pid: u32, path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
}

/// A node restarted on a socket whose earlier node's workers still run must not hand out the
/// memory they hold: every worker keeps the node lock (`PATH.lock`), and a new node refuses to
/// start while anyone holds it, naming the holders.
#[test]
fn a_restarted_node_refuses_while_workers_of_the_earlier_one_live() {
    let dir = temp_dir("lock");
    let (sock, log) = (dir.join("s.sock"), dir.join("log"));
    let lock = dir.join("s.sock.lock");
    let mut node = serve(&sock, &log);
    wait_for("the node listens", 20, || {
        UnixStream::connect(&sock).is_ok()
    });
    let addr = Address::Unix(sock.clone());
    let hello = Connection::hello(SessionKind::Cuda, String::new(), Default::default());
    let (c, _) = Connection::open(&addr, &hello).unwrap();
    let status = Connection::query_status(&addr, String::new()).unwrap();
    let worker = status.sessions[0].worker_pid;
    assert!(holds(worker, &lock), "the worker holds the node lock");
    drop(c);
    kill(node.id(), libc::SIGTERM);
    let _ = node.wait();

    // An orphaned worker of that node, still running: here, this process holding its lock.
    let held = std::fs::File::open(&lock).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    let r = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&held),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    assert_eq!(
        r, 0,
        "the earlier node's lock is free once it and its workers are gone"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(["--devices", "emu:1:1GiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("still running") && err.contains(&std::process::id().to_string()),
        "{err}"
    );
    assert!(!sock.exists(), "the refused node leaves no socket behind");
    // A restart right after a kill, while the workers are still ending: the node waits a
    // moment for the lock (it is let go 300 ms after the start here) instead of refusing.
    let mut node = serve(&sock, &log);
    std::thread::sleep(Duration::from_millis(300));
    drop(held);
    wait_for("a node starts once the lock is free", 20, || {
        Connection::query_status(&addr, String::new()).is_ok()
    });
    kill(node.id(), libc::SIGTERM);
    let _ = node.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpufuse run` against a TCP listener that accepts and never answers (a stopped server, an
/// unrelated program): a message and a non-zero exit, and the program is not started.
#[test]
fn run_gives_up_on_a_silent_tcp_peer() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        let conns: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(5));
        drop(conns);
    });
    let dir = temp_dir("silent-run");
    let marker = dir.join("started");
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["run", "--server", &format!("tcp:{addr}"), "--", "touch"])
        .arg(&marker)
        .env("GPUFUSE_HELLO_TIMEOUT", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not answer"), "{err}");
    assert!(!marker.exists(), "the program was not started");
    let _ = held.join();
    let _ = std::fs::remove_dir_all(&dir);
}
