//! What the move tests share (`migrate.rs`, `drain.rs`): a client session (the client core,
//! in the test's process) holding a large patterned range and a counter that a kernel
//! bumps, a load that keeps bumping it while the session moves, the checks that nothing was
//! lost, and a pool of processes (a controller and `gpufuse node`s) on unix sockets.
#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufuse_client::Connection;
use gpufuse_proto::{DevicePtr, FunctionHandle, ModuleHandle, StreamHandle};
use gpufuse_proto::{Launch, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

/// A kernel that adds one to a word.
pub const BUMP_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\
    .visible .entry bump(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
    ld.param.u64 %rd1, [p];\nld.global.u32 %r1, [%rd1];\nadd.u32 %r1, %r1, 1;\n\
    st.global.u32 [%rd1], %r1;\nret;\n}\n\0";

pub const BIG: u64 = 96 << 20;

pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 13 + i / 4096) as u8) ^ 0x3c).collect()
}

/// The client's session: a large range filled with a pattern, a 4 KiB counter, `bump` loaded.
pub fn session_at(addr: &Address, resources: ResourceRequest) -> (Connection, u64, u64, u64) {
    session_with_token(addr, String::new(), resources)
}

/// [`session_at`] with a session token.
pub fn session_with_token(
    addr: &Address,
    token: String,
    resources: ResourceRequest,
) -> (Connection, u64, u64, u64) {
    let hello = Connection::hello(SessionKind::Cuda, token, resources);
    let (mut c, accepted) = Connection::open(addr, &hello).unwrap();
    let ptr = |r| match r {
        ReplyBody::Ptr(DevicePtr(p)) => p,
        other => panic!("{other:?}"),
    };
    let big = ptr(c
        .call(&Request::MemAlloc {
            device: 0,
            size: BIG,
        })
        .unwrap());
    for (i, part) in pattern(BIG as usize).chunks(8 << 20).enumerate() {
        c.quiet(&Request::MemcpyHtoD {
            dst: DevicePtr(big + (i as u64) * (8 << 20)),
            stream: StreamHandle(0),
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
    c.quiet(&Request::MemcpyHtoD {
        dst: DevicePtr(counter),
        stream: StreamHandle(0),
        data: &[0; 4],
    })
    .unwrap();
    let image = BUMP_PTX.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    c.call(&Request::ModuleLoad {
        module: ModuleHandle(1),
        device: 0,
        hash,
        image: Some(image),
    })
    .unwrap();
    c.call(&Request::ModuleGetFunction {
        module: ModuleHandle(1),
        name: "bump",
        function: FunctionHandle(1),
    })
    .unwrap();
    (c, accepted.session_id, big, counter)
}

/// Launches `bump` on `counter` without waiting for it.
pub fn launch_bump(c: &mut Connection, counter: u64) {
    c.quiet(&Request::LaunchKernel(Launch {
        function: FunctionHandle(1),
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        stream: StreamHandle(0),
        params: &counter.to_le_bytes(),
        attributes: Vec::new(),
    }))
    .unwrap();
}

/// Bumps `counter` and reads it back.
pub fn bump(c: &mut Connection, counter: u64) -> u32 {
    launch_bump(c, counter);
    match c
        .call(&Request::MemcpyDtoH {
            src: DevicePtr(counter),
            size: 4,
            stream: StreamHandle(0),
        })
        .unwrap()
    {
        ReplyBody::Data(d) => u32::from_le_bytes(d.try_into().unwrap()),
        other => panic!("{other:?}"),
    }
}

pub fn check_big(c: &mut Connection, big: u64) {
    let want = pattern(BIG as usize);
    for (i, part) in want.chunks(8 << 20).enumerate() {
        let src = big + (i as u64) * (8 << 20);
        match c
            .call(&Request::MemcpyDtoH {
                src: DevicePtr(src),
                size: part.len() as u64,
                stream: StreamHandle(0),
            })
            .unwrap()
        {
            ReplyBody::Data(d) => assert!(d == part, "the large range changed at {src:#x}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Keeps bumping the counter on another thread until told to stop; every update must land.
pub fn keep_bumping(
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

/// Stops a load [`keep_bumping`] started and checks that nothing was lost: the large range is
/// intact and the next bump comes right after the load's last.
pub fn stop_and_check(
    done: Arc<AtomicBool>,
    load: std::thread::JoinHandle<(Connection, u32)>,
    big: u64,
    counter: u64,
) -> Connection {
    done.store(true, Ordering::Relaxed);
    let (mut c, n) = load.join().unwrap();
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), n + 1);
    c
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pool of processes: a controller and `gpufuse node`s (each `emu:` devices), on unix
/// sockets in a directory of their own, all ended when it drops.
pub struct Pool {
    pub dir: std::path::PathBuf,
    /// The controller's address (`unix:...`).
    pub ctrl: String,
    children: Vec<Child>,
}

fn quiet_or_logs() -> Stdio {
    if std::env::var_os("GPUFUSE_TEST_LOGS").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

impl Pool {
    /// A controller (100 ms heartbeats) with `args` besides.
    pub fn start(name: &str, args: &[&str]) -> Pool {
        let dir = std::env::temp_dir().join(format!("gpufuse-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ctrl = format!("unix:{}", dir.join("c.sock").display());
        let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(["controller", "--listen", &ctrl, "--heartbeat-ms", "100"])
            .args(["--node-timeout-ms", "3000"])
            .args(args)
            .stderr(quiet_or_logs())
            .spawn()
            .unwrap();
        let pool = Pool {
            children: vec![child],
            ctrl,
            dir,
        };
        let sock = pool.dir.join("c.sock");
        wait_until("the controller listens", || {
            UnixStream::connect(&sock).is_ok()
        });
        pool
    }

    /// Starts node `name` with `devices` and waits until the pool shows it ready.
    pub fn add_node(&mut self, name: &str, devices: &str) {
        let sock = self.dir.join(format!("{name}.sock"));
        let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(["node", "--controller", &self.ctrl, "--name", name])
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .args(["--devices", devices, "--image-cache"])
            .arg(self.dir.join(format!("{name}-images")))
            .stderr(quiet_or_logs())
            .spawn()
            .unwrap();
        self.children.push(child);
        wait_until(&format!("node {name} is ready"), || {
            self.status()["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().any(|n| n["name"] == name && n["state"] == "ready"))
        });
    }

    pub fn addr(&self) -> Address {
        self.ctrl.parse().unwrap()
    }

    /// `gpufuse status --server CONTROLLER --json`.
    pub fn status(&self) -> serde_json::Value {
        let o = self.gpufuse(&["status", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// `gpufuse ARGS --server CONTROLLER`.
    pub fn gpufuse(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(args)
            .args(["--server", &self.ctrl])
            .output()
            .unwrap()
    }

    /// The pool's view of session `id` (pool id).
    pub fn session(&self, id: u64) -> Option<serde_json::Value> {
        self.status()["sessions"]
            .as_array()?
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
    }

    /// The pool's running sessions, by id: (node, device).
    pub fn running(&self) -> Vec<(u64, String, u64)> {
        self.status()["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["state"] == "running")
            .map(|s| {
                (
                    s["id"].as_u64().unwrap(),
                    s["node"].as_str().unwrap().to_string(),
                    s["device"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
