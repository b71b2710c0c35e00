//! `gpufuse migrate` as processes: a `gpufuse serve` with two emulated devices, a client (the
//! client core, in this process) that keeps launching kernels, and the `gpufuse migrate`
//! command. The move copies the session's memory while the kernels run (pre-copy); the stop
//! copies only what they wrote; every byte is intact; a move that cannot happen leaves the
//! session where it was. The same between two `gpufuse serve` nodes, and between two
//! `gpufuse node`s of a pool through their controller: the client follows its session to
//! the other node without an error.

mod moving;

use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpufuse_client::Connection;
use gpufuse_proto::{NodeStatus, ResourceRequest};
use gpufuse_transport::Address;

use gpufuse_proto::{DevicePtr, StreamHandle};
use moving::*;

struct Server {
    child: Child,
    dir: std::path::PathBuf,
    addr: Address,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(name: &str) -> Server {
    start_with(name, "emu:2:1GiB")
}

fn start_with(name: &str, devices: &str) -> Server {
    start_with_args(name, devices, &[])
}

/// A `gpufuse serve` on a unix socket in a directory of its own, with `extra` arguments.
fn start_with_args(name: &str, devices: &str, extra: &[&str]) -> Server {
    let dir = std::env::temp_dir().join(format!("gpufuse-migrate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args([
            "serve",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--devices",
            devices,
            "--image-cache",
            &dir.join("images").display().to_string(),
        ])
        .args(extra)
        .stderr(if std::env::var_os("GPUFUSE_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        dir,
        addr: Address::Unix(sock),
    }
}

fn status(s: &Server) -> NodeStatus {
    Connection::query_status(&s.addr, String::new()).unwrap()
}

fn migrate(s: &Server, id: u64, to: &str) -> std::process::Output {
    migrate_at(&s.addr, id, to)
}

fn migrate_at(server: &Address, id: u64, to: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["migrate", &id.to_string(), "--to", to, "--server"])
        .arg(server.to_string())
        .output()
        .unwrap()
}

/// The client's session: a large range filled with a pattern, a 4 KiB counter, `bump` loaded.
fn session(s: &Server) -> (Connection, u64, u64, u64) {
    session_at(&s.addr, ResourceRequest::default())
}

/// A running session moves to the other device while its kernels run: the command reports
/// pre-copy and a stop that copied only the counter's 4 KiB; no kernel's update is lost; the
/// large range is intact; the node's books move; a move to a device that does not exist or
/// where it already is changes nothing.
#[test]
fn a_session_moves_with_precopy_while_its_kernels_run() {
    let s = start("precopy");
    let (c, id, big, counter) = session(&s);
    let from = status(&s).sessions[0].device;
    let to = 1 - from;
    let (mut c, n, stdout) = move_while_bumping(c, counter, &s.addr, id, &to.to_string());
    assert!(stdout.contains(&format!("runs on device {to}")), "{stdout}");
    assert!(stdout.contains("pre-copy"), "{stdout}");
    assert!(
        stdout.contains("the stop 4.0 KiB") || stdout.contains("the stop 0.0 KiB"),
        "the stop copied more than the counter: {stdout}"
    );
    assert!(n > 2, "the kernels ran during the test ({n})");
    let st = status(&s);
    assert_eq!(st.sessions[0].device, to);
    assert_eq!(st.devices[from as usize].used_bytes, 0);
    assert!(st.devices[to as usize].used_bytes >= BIG);
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), n + 1);
    for bad in [to.to_string(), "7".to_string()] {
        let out = migrate(&s, id, &bad);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("refused"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(status(&s).sessions[0].device, to);
    assert_eq!(bump(&mut c, counter), n + 2);
}

/// Reads the large range back and compares it with the pattern.
/// Moves session `id` (asked of `server`, `--to to`) while another thread keeps bumping the
/// counter; the move must succeed. Returns the connection, the updates made and what
/// `gpufuse migrate` printed.
fn move_while_bumping(
    c: Connection,
    counter: u64,
    server: &Address,
    id: u64,
    to: &str,
) -> (Connection, u32, String) {
    let (done, load) = keep_bumping(c, counter);
    std::thread::sleep(Duration::from_millis(200));
    let out = migrate_at(server, id, to);
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::Relaxed);
    let (c, n) = load.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (c, n, stdout)
}

/// A running session moves to another `gpufuse serve` node while its kernels run: pre-copy
/// over the nodes' connection, the stop at the client's next synchronous call, which the
/// client sends again to the other node; no kernel update is lost, every byte is intact, the
/// old node frees everything and the new one holds the session. A node whose device cannot
/// hold the session refuses and the session stays, untouched.
#[test]
fn a_session_moves_to_another_node_while_its_kernels_run() {
    let a = start_with("node-a", "emu:1:1GiB");
    let b = start_with("node-b", "emu:1:1GiB");
    let small = start_with("node-small", "emu:1:64MiB");
    let (c, id, big, counter) = session_at(&a.addr, ResourceRequest::default());
    let (mut c, n, stdout) = move_while_bumping(c, counter, &a.addr, id, &format!("{}:0", b.addr));
    assert!(stdout.contains("runs on node"), "{stdout}");
    assert!(stdout.contains("pre-copy"), "{stdout}");
    assert!(n > 2, "the kernels ran during the test ({n})");
    // The client follows its session: every later call runs on node b.
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), n + 1);
    let on_b = status(&b);
    assert_eq!(on_b.sessions.len(), 1, "{on_b:?}");
    assert!(on_b.devices[0].used_bytes >= BIG, "{on_b:?}");
    wait_until("node a frees the moved session", || {
        let st = status(&a);
        st.sessions.is_empty() && st.devices[0].used_bytes == 0
    });
    // Node b's device is the only one the session can leave to now; the small node cannot
    // hold it: refused, and nothing changes.
    let moved_id = on_b.sessions[0].id.get();
    let out = migrate(&b, moved_id, &format!("{}:0", small.addr));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused"), "{err}");
    assert_eq!(bump(&mut c, counter), n + 2);
    check_big(&mut c, big);
    assert!(status(&small).sessions.is_empty());
    assert_eq!(status(&b).sessions.len(), 1);
    drop(c);
    wait_until("node b frees the session when its client ends", || {
        let st = status(&b);
        st.sessions.is_empty() && st.devices[0].used_bytes == 0
    });
}

/// An idle session (its program makes no CUDA call during the move) moves to another node:
/// the stop comes while the client is quiet, the first node's books let it go at once, and
/// the quiet requests the client then sends (launches, a copy) still reach the first node's
/// worker, which forwards them in order to the session's new worker; the next synchronous
/// call sends the client on, and every result is there.
#[test]
fn an_idle_session_moves_to_another_node_and_what_it_sends_next_follows() {
    let a = start_with("idle-a", "emu:1:1GiB");
    let b = start_with("idle-b", "emu:1:1GiB");
    let (mut c, id, big, counter) = session_at(&a.addr, ResourceRequest::default());
    assert_eq!(bump(&mut c, counter), 1);
    // A graph the worker keeps (two bumps): it moves with the session's books.
    let bump_node = gpufuse_proto::GraphNode::Launch {
        function: gpufuse_proto::FunctionHandle(1),
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        params: counter.to_le_bytes().to_vec(),
        cooperative: false,
    };
    c.quiet(&gpufuse_proto::Request::GraphDefine {
        graph: 77,
        nodes: vec![bump_node.clone(), bump_node],
    })
    .unwrap();
    let out = migrate(&a, id, &format!("{}:0", b.addr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("runs on node"), "{stdout}");
    // Node a let the session go; node b holds it, before its client knows.
    let st = status(&a);
    assert!(st.sessions.is_empty(), "{st:?}");
    assert_eq!(st.devices[0].used_bytes, 0, "{st:?}");
    let on_b = status(&b);
    assert_eq!(on_b.sessions.len(), 1, "{on_b:?}");
    assert!(on_b.devices[0].used_bytes >= BIG, "{on_b:?}");
    // Quiet requests go to node a's worker, which forwards them; the read that follows is
    // answered by node b.
    for _ in 0..5 {
        launch_bump(&mut c, counter);
    }
    c.quiet(&gpufuse_proto::Request::GraphLaunch {
        graph: 77,
        stream: StreamHandle(0),
    })
    .unwrap();
    c.quiet(&gpufuse_proto::Request::MemcpyHtoD {
        dst: DevicePtr(big),
        stream: StreamHandle(0),
        data: &[7; 16],
    })
    .unwrap();
    assert_eq!(
        bump(&mut c, counter),
        9,
        "the forwarded graph launch ran where the session went"
    );
    let mut head = [0u8; 16];
    head.copy_from_slice(&pattern(16));
    let got = match c
        .call(&gpufuse_proto::Request::MemcpyDtoH {
            src: DevicePtr(big),
            size: 32,
            stream: StreamHandle(0),
        })
        .unwrap()
    {
        gpufuse_proto::ReplyBody::Data(d) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(&got[..16], &[7; 16]);
    assert_eq!(&got[16..], &pattern(32)[16..]);
    wait_until("node b's log says the client resumed", || {
        status(&a).sessions.is_empty() && status(&b).sessions.len() == 1
    });
}

/// Two nodes whose listeners are `tcp+tls:` (certificates from `gpufuse certs`): the state
/// stream between the workers and the client's hello at the new node both go over TLS,
/// checked against the CA in `GPUFUSE_TLS_CA`.
#[test]
fn a_session_moves_between_nodes_over_tls() {
    let certs = std::env::temp_dir().join(format!("gpufuse-migrate-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&certs);
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["certs", "--dir"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The test's client and both nodes' workers check the nodes' certificate with this CA.
    std::env::set_var("GPUFUSE_TLS_CA", certs.join("ca.pem"));
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (cert, key) = (certs.join("server.pem"), certs.join("server-key.pem"));
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let tls_node = |name: &str| {
        let port = free_port();
        let listen = format!("tcp+tls:127.0.0.1:{port}");
        let s = start_with_args(
            name,
            "emu:1:1GiB",
            &["--listen", &listen, "--tls-cert", cert, "--tls-key", key],
        );
        (s, listen)
    };
    let (a, a_tls) = tls_node("tls-a");
    let (b, b_tls) = tls_node("tls-b");
    let a_addr: Address = a_tls.parse().unwrap();
    let (c, id, big, counter) = session_at(&a_addr, ResourceRequest::default());
    let (mut c, n, stdout) = move_while_bumping(c, counter, &a.addr, id, &format!("{b_tls}:0"));
    assert!(stdout.contains("runs on node"), "{stdout}");
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), n + 1);
    assert_eq!(status(&b).sessions.len(), 1);
    wait_until("node a frees the moved session", || {
        status(&a).sessions.is_empty()
    });
    let _ = std::fs::remove_dir_all(&certs);
}

/// A pool: a controller and two nodes. `gpufuse migrate POOL_ID --to NODE:DEVICE --server
/// CONTROLLER` moves a running session to the other node: the controller charges the target,
/// grants the place, and its status shows the session there; the client notices nothing.
#[test]
fn the_controller_moves_a_pool_session_to_another_node() {
    let mut pool = Pool::start("migrate-pool", &[]);
    pool.add_node("na", "emu:1:1GiB");
    pool.add_node("nb", "emu:1:1GiB");
    let ctrl_addr = pool.addr();
    let (c, _node_session, big, counter) = session_at(
        &ctrl_addr,
        ResourceRequest {
            vram_bytes: Some(256 << 20),
            ..Default::default()
        },
    );
    let mut pool_id = 0;
    let mut from = String::new();
    wait_until("the pool shows the session running", || {
        let Some((id, node, _)) = pool.running().first().cloned() else {
            return false;
        };
        (pool_id, from) = (id, node);
        true
    });
    let to = if from == "na" { "nb" } else { "na" };
    let (mut c, n, stdout) =
        move_while_bumping(c, counter, &ctrl_addr, pool_id, &format!("{to}:0"));
    assert!(stdout.contains(&format!("runs on node {to}")), "{stdout}");
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), n + 1);
    wait_until("the pool shows the session on the other node", || {
        pool.running() == [(pool_id, to.to_string(), 0)]
    });
    // A move to a node that does not exist changes nothing.
    let out = migrate_at(&ctrl_addr, pool_id, "nowhere:0");
    assert!(!out.status.success());
    assert_eq!(bump(&mut c, counter), n + 2);
}
