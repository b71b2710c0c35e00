//! `gpufuse migrate` as processes: a `gpufuse serve` with two emulated devices, a client (the
//! client core, in this process) that keeps launching kernels, and the `gpufuse migrate`
//! command. The move copies the session's memory while the kernels run (pre-copy); the stop
//! copies only what they wrote; every byte is intact; a move that cannot happen leaves the
//! session where it was.

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
    let dir = std::env::temp_dir().join(format!("gpufuse-migrate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args([
            "serve",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--devices",
            "emu:2:1GiB",
            "--image-cache",
            &dir.join("images").display().to_string(),
        ])
        .stderr(Stdio::null())
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
    Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["migrate", &id.to_string(), "--to", to, "--server"])
        .arg(s.addr.to_string())
        .output()
        .unwrap()
}

/// The client's session: a large range filled with a pattern, a 4 KiB counter, `bump` loaded.
fn session(s: &Server) -> (Connection, u64, u64, u64) {
    let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
    let (mut c, accepted) = Connection::open(&s.addr, &hello).unwrap();
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
    let (mut c, id, big, counter) = session(&s);
    let from = status(&s).sessions[0].device;
    let to = 1 - from;
    let done = Arc::new(AtomicBool::new(false));
    let load = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !done.load(Ordering::Relaxed) {
                let got = bump(&mut c, counter);
                assert_eq!(got, n + 1, "a kernel's update was lost");
                n = got;
            }
            (c, n)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let out = migrate(&s, id, &to.to_string());
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::Relaxed);
    let (mut c, n) = load.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
