//! `gpufuse migrate` as processes: a `gpufuse serve` with two emulated devices, a client (the
//! client core, in this process) that keeps launching kernels, and the `gpufuse migrate`
//! command. The move copies the session's memory while the kernels run (pre-copy); the stop
//! copies only what they wrote; every byte is intact; a move that cannot happen leaves the
//! session where it was. The same between two `gpufuse serve` nodes, and between two
//! `gpufuse node`s of a pool through their controller: the client follows its session to
//! the other node without an error.

use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufuse_client::Connection;
use gpufuse_proto::{Launch, NodeStatus, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

/// A kernel that adds one to a word.
const BUMP_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\
    .visible .entry bump(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
    ld.param.u64 %rd1, [p];\nld.global.u32 %r1, [%rd1];\nadd.u32 %r1, %r1, 1;\n\
    st.global.u32 [%rd1], %r1;\nret;\n}\n\0";

const BIG: u64 = 96 << 20;

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

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 13 + i / 4096) as u8) ^ 0x3c).collect()
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

fn session_at(addr: &Address, resources: ResourceRequest) -> (Connection, u64, u64, u64) {
    let hello = Connection::hello(SessionKind::Cuda, String::new(), resources);
    let (mut c, accepted) = Connection::open(addr, &hello).unwrap();
    let ptr = |r| match r {
        ReplyBody::Ptr(p) => p,
        other => panic!("{other:?}"),
    };
    let big = ptr(c
        .call(&Request::MemAlloc {
            device: 0,
            size: BIG,
        })
        .unwrap());
    for (i, part) in pattern(BIG as usize).chunks(8 << 20).enumerate() {
        c.call(&Request::MemcpyHtoD {
            dst: big + (i as u64) * (8 << 20),
            stream: 0,
            data: part,
        })
        .unwrap();
    }
    let counter = ptr(c
        .call(&Request::MemAlloc {
            device: 0,
            size: 4096,
        })
        .unwrap());
    c.call(&Request::MemcpyHtoD {
        dst: counter,
        stream: 0,
        data: &[0; 4],
    })
    .unwrap();
    let image = BUMP_PTX.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    c.call(&Request::ModuleLoad {
        module: 1,
        device: 0,
        hash,
        image: Some(image),
    })
    .unwrap();
    c.call(&Request::ModuleGetFunction {
        module: 1,
        name: "bump",
        function: 1,
    })
    .unwrap();
    (c, accepted.session_id, big, counter)
}

fn bump(c: &mut Connection, counter: u64) -> u32 {
    c.quiet(&Request::LaunchKernel(Launch {
        function: 1,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        stream: 0,
        params: &counter.to_le_bytes(),
        attributes: Vec::new(),
    }))
    .unwrap();
    match c
        .call(&Request::MemcpyDtoH {
            src: counter,
            size: 4,
            stream: 0,
        })
        .unwrap()
    {
        ReplyBody::Data(d) => u32::from_le_bytes(d.try_into().unwrap()),
        other => panic!("{other:?}"),
    }
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
fn check_big(c: &mut Connection, big: u64) {
    let want = pattern(BIG as usize);
    for (i, part) in want.chunks(8 << 20).enumerate() {
        let src = big + (i as u64) * (8 << 20);
        match c
            .call(&Request::MemcpyDtoH {
                src,
                size: part.len() as u64,
                stream: 0,
            })
            .unwrap()
        {
            ReplyBody::Data(d) => assert!(d == part, "the large range changed at {src:#x}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Keeps bumping the counter on another thread until told to stop; every update must land.
fn keep_bumping(
    mut c: Connection,
    counter: u64,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<(Connection, u32)>) {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let load = std::thread::spawn(move || {
        let mut n = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let got = bump(&mut c, counter);
            assert_eq!(got, n + 1, "a kernel's update was lost");
            n = got;
        }
        (c, n)
    });
    (done, load)
}

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

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let moved_id = on_b.sessions[0].id;
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

/// A pool: a controller and two nodes. `gpufuse migrate POOL_ID --to NODE:DEVICE --server
/// CONTROLLER` moves a running session to the other node: the controller charges the target,
/// grants the place, and its status shows the session there; the client notices nothing.
#[test]
fn the_controller_moves_a_pool_session_to_another_node() {
    let dir = std::env::temp_dir().join(format!("gpufuse-migrate-pool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ctrl = format!("unix:{}", dir.join("c.sock").display());
    let gpufuse = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let wait_socket = |p: &std::path::Path| {
        wait_until(&format!("{} listens", p.display()), || {
            UnixStream::connect(p).is_ok()
        })
    };
    let mut children = vec![gpufuse(&[
        "controller",
        "--listen",
        &ctrl,
        "--heartbeat-ms",
        "100",
        "--node-timeout-ms",
        "3000",
    ])];
    wait_socket(&dir.join("c.sock"));
    for name in ["na", "nb"] {
        let sock = dir.join(format!("{name}.sock"));
        children.push(gpufuse(&[
            "node",
            "--controller",
            &ctrl,
            "--listen",
            &format!("unix:{}", sock.display()),
            "--devices",
            "emu:1:1GiB",
            "--name",
            name,
            "--image-cache",
            &dir.join(format!("{name}-images")).display().to_string(),
        ]));
        wait_socket(&sock);
    }
    struct Reap(Vec<Child>, std::path::PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _reap = Reap(children, dir.clone());
    let ctrl_addr: Address = ctrl.parse().unwrap();
    let pool_status = || -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(["status", "--server", &ctrl, "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    wait_until("both nodes are ready", || {
        pool_status()["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["state"] == "ready"))
    });
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
        let st = pool_status();
        let Some(s) = st["sessions"].as_array().and_then(|s| s.first().cloned()) else {
            return false;
        };
        pool_id = s["id"].as_u64().unwrap_or(0);
        from = s["node"].as_str().unwrap_or_default().to_string();
        s["state"] == "running"
    });
    let to = if from == "na" { "nb" } else { "na" };
    let (mut c, n, stdout) =
        move_while_bumping(c, counter, &ctrl_addr, pool_id, &format!("{to}:0"));
    assert!(stdout.contains(&format!("runs on node {to}")), "{stdout}");
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), n + 1);
    wait_until("the pool shows the session on the other node", || {
        let st = pool_status();
        st["sessions"].as_array().is_some_and(|s| {
            s.len() == 1
                && s[0]["id"] == pool_id
                && s[0]["node"] == to
                && s[0]["state"] == "running"
        })
    });
    // A move to a node that does not exist changes nothing.
    let out = migrate_at(&ctrl_addr, pool_id, "nowhere:0");
    assert!(!out.status.success());
    assert_eq!(bump(&mut c, counter), n + 2);
}
