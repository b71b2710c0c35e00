//! `gpufuse serve --devices cuda` on the simulated driver (`gpufuse-cuda-sim`, a stand-in
//! `libcuda.so.1` with a wall-time timeline; no GPU), through a real client session on the
//! shared-memory transport: what the asynchronous device layer promises end to end.
//!
//! - A reply waits for the host-arena copies in flight on the copy's stream only: a long
//!   kernel on another stream does not hold it up, and the copied bytes are in place.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::{Connection, Transport};
use gpufuse_proto::{
    ContextHandle, DevicePtr, FunctionHandle, Launch, ModuleHandle, ReplyBody, Request,
    ResourceRequest, SessionKind, StreamHandle,
};
use gpufuse_transport::Address;

const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\
.visible .entry spin_us20000() { ret; }\n";

/// The simulated driver cargo built with the workspace: beside the test (`deps/`) or in the
/// profile directory, the newer.
fn sim_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        Some(deps.to_path_buf()),
        deps.parent().map(|p| p.to_path_buf()),
    ]
    .into_iter()
    .flatten()
    .map(|d| d.join("libgpufuse_cuda_sim.so"))
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max_by_key(|(t, _)| *t)
    .map(|(_, p)| p)
    .expect("libgpufuse_cuda_sim.so (cargo builds it with the workspace)")
}

struct Server {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start() -> Server {
    let dir = std::env::temp_dir().join(format!("gpufuse-sim-driver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(["--devices", "cuda", "--image-cache"])
        .arg(dir.join("images"))
        .env("GPUFUSE_CUDA_DRIVER", sim_path())
        .stderr(if std::env::var_os("GPUFUSE_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "gpufuse serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, dir, sock }
}

#[test]
fn a_reply_waits_for_arena_copies_on_their_stream_only() {
    let server = start();
    let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
    let (mut c, _) =
        Connection::open_with(&Address::Shm(server.sock.clone()), &hello, Transport::Shm)
            .expect("a session on the simulated driver");
    let arena = c.host_arena().cloned().expect("a host arena on the rings");
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    let image = format!("{PTX}\0");
    let hash: [u8; 32] = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(
        image.as_bytes(),
    ))
    .into();
    c.call(&Request::ModuleLoad {
        module: ModuleHandle(2),
        device: 0,
        hash,
        image: Some(image.as_bytes()),
    })
    .unwrap();
    c.call(&Request::ModuleGetFunction {
        module: ModuleHandle(2),
        name: "spin_us20000",
        function: FunctionHandle(3),
    })
    .unwrap();
    for s in [0x51, 0x52] {
        c.quiet(&Request::StreamCreate {
            stream: StreamHandle(s),
            flags: 1,
            priority: 0,
        })
        .unwrap();
    }
    let size = 2usize << 20;
    let ReplyBody::Ptr(DevicePtr(dev)) = c
        .call(&Request::MemAlloc {
            device: 0,
            size: size as u64,
        })
        .unwrap()
    else {
        panic!("alloc")
    };
    let host = arena.alloc(size).unwrap();
    let offset = arena.offset_of(host as usize, size).unwrap();
    let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    arena.write(offset, &pattern);
    // A 20 ms kernel on one stream, the arena copy on another; then a reply.
    c.quiet(&Request::LaunchKernel(Launch {
        function: FunctionHandle(3),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        stream: StreamHandle(0x51),
        params: &[],
        attributes: Vec::new(),
    }))
    .unwrap();
    c.quiet(&Request::MemcpyHtoDHost {
        dst: DevicePtr(dev),
        stream: StreamHandle(0x52),
        offset,
        size: size as u64,
    })
    .unwrap();
    let t = Instant::now();
    c.call(&Request::Ping).unwrap();
    let waited = t.elapsed();
    assert!(
        waited < Duration::from_millis(15),
        "the reply waited {waited:?}: for the 20 ms kernel on the other stream too"
    );
    // The copy had run when the reply came: the bytes read back (on the copy's stream).
    let ReplyBody::Data(back) = c
        .call(&Request::MemcpyDtoH {
            src: DevicePtr(dev),
            size: size as u64,
            stream: StreamHandle(0x52),
        })
        .unwrap()
    else {
        panic!("data")
    };
    assert!(back == pattern, "the arena copy's bytes are on the device");
    arena.free(host, size);
}
