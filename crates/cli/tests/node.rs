//! `gpufuse serve` as a process: sessions, status, faults. Each test starts its own server on a
//! temporary unix socket.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::Connection;
use gpufuse_proto::SessionId;
use gpufuse_proto::{
    encode_frame, FrameHeader, FrameKind, NodeStatus, ReplyBody, Request, ResourceRequest,
    ServerHello, SessionKind, HEADER_LEN,
};
use gpufuse_proto::{
    ContextHandle, DevicePtr, FunctionHandle, ModuleHandle, PhysicalHandle, StreamHandle,
};
use gpufuse_transport::Address;

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

fn start(name: &str, devices: &str) -> Server {
    start_with_env(name, devices, &[])
}

fn start_with_env(name: &str, devices: &str, env: &[(&str, &str)]) -> Server {
    let dir = std::env::temp_dir().join(format!("gpufuse-node-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args([
            "serve",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--devices",
            devices,
            // Its own image cache: nothing from an earlier run (CI runs this suite twice),
            // nothing in ~/.cache.
            "--image-cache",
            &dir.join("images").display().to_string(),
        ])
        .envs(env.iter().copied())
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

fn session(s: &Server, vram: Option<u64>) -> Connection {
    let hello = Connection::hello(
        SessionKind::Cuda,
        String::new(),
        ResourceRequest {
            vram_bytes: vram,
            ..Default::default()
        },
    );
    let (mut c, _) = Connection::open(&s.addr, &hello).unwrap();
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    c
}

fn alloc(c: &mut Connection, size: u64) -> u64 {
    match c.call(&Request::MemAlloc { device: 0, size }).unwrap() {
        ReplyBody::Ptr(DevicePtr(p)) => p,
        other => panic!("{other:?}"),
    }
}

/// Polls until `f` holds (the node reaps workers asynchronously).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn status_shows_sessions_and_their_memory() {
    let s = start("status", "emu:1:1GiB");
    let mut c = session(&s, None);
    alloc(&mut c, 100 << 20);
    let st = status(&s);
    assert_eq!(st.devices.len(), 1);
    assert_eq!(st.devices[0].total_bytes, 1 << 30);
    assert_eq!(st.devices[0].used_bytes, 100 << 20);
    assert_eq!(st.sessions.len(), 1);
    assert_eq!(st.sessions[0].used_bytes, 100 << 20);
    assert_eq!(st.sessions[0].pid, std::process::id());
    drop(c);
    eventually("session freed after disconnect", || {
        let st = status(&s);
        st.sessions.is_empty() && st.devices[0].used_bytes == 0
    });
}

#[test]
fn sigkilled_client_frees_everything_it_held() {
    let s = start("sigkill", "emu:1:1GiB");
    // A child process holds a session with memory, then is killed mid-stream.
    let me = std::env::current_exe().unwrap();
    let mut child = Command::new(me)
        .args([
            "--exact",
            "hold_memory_until_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("GPUFUSE_TEST_SERVER", s.addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("client holds 256 MiB", || {
        status(&s).devices[0].used_bytes == 256 << 20
    });
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    eventually("ledger back at baseline", || {
        let st = status(&s);
        st.sessions.is_empty() && st.devices[0].used_bytes == 0
    });
}

/// Helper process for `sigkilled_client_frees_everything_it_held` (run only by it).
#[test]
#[ignore = "helper process: run by sigkilled_client_frees_everything_it_held"]
fn hold_memory_until_killed() {
    let addr: Address = std::env::var("GPUFUSE_TEST_SERVER")
        .unwrap()
        .parse()
        .unwrap();
    let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
    let (mut c, _) = Connection::open(&addr, &hello).unwrap();
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    alloc(&mut c, 256 << 20);
    loop {
        let data = vec![1u8; 4096];
        let p = alloc(&mut c, 4096);
        c.quiet(&Request::MemcpyHtoD {
            dst: DevicePtr(p),
            stream: StreamHandle(0),
            data: &data,
        })
        .unwrap();
        c.quiet(&Request::MemFree { ptr: DevicePtr(p) }).unwrap();
        c.call(&Request::Ping).unwrap();
    }
}

#[test]
fn killing_one_worker_leaves_other_sessions_running() {
    let s = start("killworker", "emu:1:1GiB");
    let mut a = session(&s, None);
    let mut b = session(&s, None);
    alloc(&mut a, 1 << 20);
    let pb = alloc(&mut b, 1 << 20);
    let st = status(&s);
    let worker_a = st
        .sessions
        .iter()
        .find(|x| x.id == SessionId(1))
        .unwrap()
        .worker_pid;
    // SAFETY: signalling a worker process of our own server.
    unsafe { libc::kill(worker_a as i32, libc::SIGKILL) };
    assert!(a.call(&Request::Ping).is_err(), "session a lost its worker");
    // b is untouched.
    b.quiet(&Request::MemcpyHtoD {
        dst: DevicePtr(pb),
        stream: StreamHandle(0),
        data: &[7; 16],
    })
    .unwrap();
    let mut out = [0u8; 16];
    b.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(pb),
            size: 16,
            stream: StreamHandle(0),
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [7; 16]);
    eventually("a's memory released", || {
        status(&s).devices[0].used_bytes == 1 << 20
    });
}

#[test]
fn a_malformed_frame_closes_only_its_connection() {
    let s = start("malformed", "emu:1:1GiB");
    let mut good = session(&s, None);
    let mut bad = session(&s, None);
    let p = alloc(&mut good, 4096);
    // A valid header announcing a body that is not a request.
    let Address::Unix(path) = &s.addr else {
        unreachable!()
    };
    let _ = path;
    let mut raw = Vec::new();
    encode_frame(&mut raw, FrameKind::Request, 0, 99, &[0xFFu8; 16]);
    assert!(bad.call(&Request::Ping).is_ok());
    // Send garbage through a fresh raw connection too: a header with a bad magic.
    let mut stream = UnixStream::connect(path).unwrap();
    stream.write_all(&[0xAB; HEADER_LEN]).unwrap();
    drop(stream);
    // And an undecodable request on an established session.
    let mut sock = UnixStream::connect(path).unwrap();
    let mut hello = Vec::new();
    encode_frame(
        &mut hello,
        FrameKind::Hello,
        0,
        0,
        &Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default()),
    );
    sock.write_all(&hello).unwrap();
    let mut h = [0u8; HEADER_LEN];
    std::io::Read::read_exact(&mut sock, &mut h).unwrap();
    let len = FrameHeader::decode(&h).unwrap().len as usize;
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(&mut sock, &mut body).unwrap();
    sock.write_all(&raw).unwrap();
    let mut buf = [0u8; 1];
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        std::io::Read::read(&mut sock, &mut buf).unwrap_or(0),
        0,
        "the malformed session is closed"
    );
    // The good session still works.
    good.quiet(&Request::MemcpyHtoD {
        dst: DevicePtr(p),
        stream: StreamHandle(0),
        data: &[5; 8],
    })
    .unwrap();
    let mut out = [0u8; 8];
    good.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(p),
            size: 8,
            stream: StreamHandle(0),
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [5; 8]);
}

#[test]
fn a_protocol_version_mismatch_is_refused_with_both_versions() {
    let s = start("version", "emu:1:1GiB");
    let Address::Unix(path) = &s.addr else {
        unreachable!()
    };
    let mut sock = UnixStream::connect(path).unwrap();
    let mut hello = Vec::new();
    encode_frame(
        &mut hello,
        FrameKind::Hello,
        0,
        0,
        &Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default()),
    );
    hello[4] = 99; // protocol version in the header
    sock.write_all(&hello).unwrap();
    let mut h = [0u8; HEADER_LEN];
    std::io::Read::read_exact(&mut sock, &mut h).unwrap();
    let header = FrameHeader::decode(&h).unwrap();
    let mut body = vec![0u8; header.len as usize];
    std::io::Read::read_exact(&mut sock, &mut body).unwrap();
    match gpufuse_proto::decode_owned::<ServerHello>(&body).unwrap() {
        ServerHello::Refused { reason } => assert!(
            reason.contains("99") && reason.contains("version") && reason.contains("server"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

/// An older client (protocol 5, before the header declared tails) is answered in its own
/// version, so it can read why it was refused.
#[test]
fn an_older_client_reads_its_refusal_in_its_own_version() {
    let s = start("oldversion", "emu:1:1GiB");
    let Address::Unix(path) = &s.addr else {
        unreachable!()
    };
    let mut sock = UnixStream::connect(path).unwrap();
    let mut hello = Vec::new();
    let mut old = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
    old.protocol_version = 5;
    encode_frame(&mut hello, FrameKind::Hello, 0, 0, &old);
    gpufuse_proto::set_frame_version(&mut hello, 5);
    sock.write_all(&hello).unwrap();
    let mut h = [0u8; HEADER_LEN];
    std::io::Read::read_exact(&mut sock, &mut h).unwrap();
    // Version 5's header: magic, version 5, kind, flags, length, four zero bytes, id.
    assert_eq!(&h[0..4], b"GFUS");
    assert_eq!(u16::from_le_bytes([h[4], h[5]]), 5);
    assert_eq!(&h[12..16], &[0, 0, 0, 0]);
    let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(&mut sock, &mut body).unwrap();
    match gpufuse_proto::decode_owned::<ServerHello>(&body).unwrap() {
        ServerHello::Refused { reason } => assert!(
            reason.contains("client speaks 5") && reason.contains("upgrade the client"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_slice_larger_than_the_device_is_refused_and_limits_apply() {
    let s = start("slice", "emu:1:1GiB");
    let hello = Connection::hello(
        SessionKind::Cuda,
        String::new(),
        ResourceRequest {
            vram_bytes: Some(2 << 30),
            ..Default::default()
        },
    );
    let err = Connection::open(&s.addr, &hello).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    let mut c = session(&s, Some(64 << 20));
    match c.call(&Request::MemGetInfo { device: 0 }).unwrap() {
        ReplyBody::MemInfo { free, total } => assert_eq!((free, total), (64 << 20, 64 << 20)),
        other => panic!("{other:?}"),
    }
    alloc(&mut c, 60 << 20);
    assert!(matches!(
        c.call(&Request::MemAlloc {
            device: 0,
            size: 8 << 20
        }),
        Err(gpufuse_client::ClientError::Cuda(2))
    ));
    // The process goes on: a smaller allocation still works.
    alloc(&mut c, 1 << 20);
}

/// Without NVIDIA's driver, `--devices cuda` exits non-zero within seconds naming it.
#[test]
fn devices_cuda_without_a_driver_names_the_missing_driver() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args([
            "serve",
            "--listen",
            "unix:/nonexistent-dir/s.sock",
            "--devices",
            "cuda",
        ])
        .env("GPUFUSE_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("libcuda.so.1"), "{err}");
}

/// Without NVIDIA's driver, `--devices auto` serves one emulated GPU and says why in status.
#[test]
fn devices_auto_without_a_driver_falls_back_and_says_so() {
    let s = start_with_env(
        "auto",
        "auto",
        &[("GPUFUSE_CUDA_DRIVER", "/nonexistent/libcuda.so.1")],
    );
    let st = status(&s);
    assert_eq!(st.devices.len(), 1);
    assert_eq!(st.devices[0].kind, gpufuse_proto::DeviceKind::Emulated);
    assert!(
        st.notes
            .iter()
            .any(|n| n.contains("emulated") && n.contains("libcuda.so.1")),
        "{:?}",
        st.notes
    );
}

/// A session can name only its own memory: reads, writes, memsets, copies and frees of another
/// session's allocation on the same device fail with CUDA_ERROR_INVALID_VALUE, and the owner's
/// data and allocation are untouched.
#[test]
fn a_session_cannot_touch_another_sessions_memory() {
    const INVALID_VALUE: i32 = 1;
    let s = start("isolation", "emu:1:1GiB");
    let mut a = session(&s, None);
    let mut b = session(&s, None);
    let pa = alloc(&mut a, 4096);
    let pb = alloc(&mut b, 4096);
    a.quiet(&Request::MemcpyHtoD {
        dst: DevicePtr(pa),
        stream: StreamHandle(0),
        data: &[0xA5; 64],
    })
    .unwrap();
    let read = |c: &mut Connection, src: u64| {
        let mut out = [0u8; 64];
        c.call_read_into(
            &Request::MemcpyDtoH {
                src: DevicePtr(src),
                size: 64,
                stream: StreamHandle(0),
            },
            &mut out,
        )
        .map(|_| out)
    };
    assert!(matches!(
        read(&mut b, pa),
        Err(gpufuse_client::ClientError::Cuda(INVALID_VALUE))
    ));
    // Each quiet trespass is reported by the next reply.
    let trespasses = [
        Request::MemcpyHtoD {
            dst: DevicePtr(pa),
            stream: StreamHandle(0),
            data: &[0; 64],
        },
        Request::Memset {
            dst: DevicePtr(pa),
            value: 0,
            elem_size: 1,
            count: 64,
            stream: StreamHandle(0),
        },
        Request::MemcpyDtoD {
            dst: DevicePtr(pb),
            src: DevicePtr(pa),
            size: 64,
            stream: StreamHandle(0),
        },
        Request::MemcpyDtoD {
            dst: DevicePtr(pa),
            src: DevicePtr(pb),
            size: 64,
            stream: StreamHandle(0),
        },
        Request::MemFree { ptr: DevicePtr(pa) },
    ];
    for t in &trespasses {
        b.quiet(t).unwrap();
        let reply = b.call_raw(&Request::Ping).unwrap();
        assert_eq!(reply.deferred_error, Some(INVALID_VALUE), "{t:?}");
    }
    // b still works with its own memory; a's data and allocation are intact.
    read(&mut b, pb).unwrap();
    assert_eq!(read(&mut a, pa).unwrap(), [0xA5; 64]);
    a.quiet(&Request::MemFree { ptr: DevicePtr(pa) }).unwrap();
    assert_eq!(a.call_raw(&Request::Ping).unwrap().deferred_error, None);
}

/// One thread spinning `n` times.
const SPIN_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\n.visible .entry spin(\n\t.param .u32 spin_param_0\n)\n{\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\n\tld.param.u32 %r1, [spin_param_0];\n\tmov.u32 %r2, 0;\n$L__BB0_1:\n\tsetp.ge.u32 %p1, %r2, %r1;\n\t@%p1 bra $L__BB0_2;\n\tadd.s32 %r2, %r2, 1;\n\tbra.uni $L__BB0_1;\n$L__BB0_2:\n\tret;\n}\n\0";

fn compute_session(
    s: &Server,
    compute: Option<u32>,
    qos: gpufuse_proto::Qos,
) -> Result<Connection, gpufuse_client::ClientError> {
    let hello = Connection::hello(
        SessionKind::Cuda,
        String::new(),
        ResourceRequest {
            compute_percent: compute,
            qos,
            ..Default::default()
        },
    );
    let (mut c, _) = Connection::open(&s.addr, &hello)?;
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })?;
    let image = SPIN_PTX.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    c.call(&Request::ModuleLoad {
        module: ModuleHandle(2),
        device: 0,
        hash,
        image: Some(image),
    })?;
    c.call(&Request::ModuleGetFunction {
        module: ModuleHandle(2),
        name: "spin",
        function: FunctionHandle(3),
    })?;
    Ok(c)
}

fn spin(c: &mut Connection, n: u32) {
    let params = n.to_le_bytes();
    c.quiet(&Request::LaunchKernel(gpufuse_proto::Launch {
        function: FunctionHandle(3),
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        stream: StreamHandle(0),
        params: &params,
        attributes: Vec::new(),
    }))
    .unwrap();
}

#[test]
fn compute_shares_are_admitted_recorded_and_charged() {
    use gpufuse_proto::Qos;
    let s = start("compute", "emu:1:1GiB");
    let mut a = compute_session(&s, Some(70), Qos::High).unwrap();
    // 70 + 40 > 100: refused, with the reason.
    let err = compute_session(&s, Some(40), Qos::Low).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    for bad in [0, 101] {
        assert!(compute_session(&s, Some(bad), Qos::Low).is_err(), "{bad}%");
    }
    let mut b = compute_session(&s, Some(30), Qos::Low).unwrap();
    let mut c = compute_session(&s, None, Qos::Medium).unwrap();
    for conn in [&mut a, &mut b, &mut c] {
        spin(conn, 1000);
        conn.call(&Request::CtxSynchronize {
            ctx: ContextHandle(1),
        })
        .unwrap();
        assert_eq!(conn.take_async_error(), None);
    }
    let st = status(&s);
    assert_eq!(st.compute_policy, gpufuse_proto::ComputePolicy::Elastic);
    let shares: Vec<_> = st
        .sessions
        .iter()
        .map(|x| (x.qos, x.compute_percent))
        .collect();
    assert_eq!(
        shares,
        [
            (Qos::High, Some(70)),
            (Qos::Low, Some(30)),
            (Qos::Medium, None)
        ]
    );
    for x in &st.sessions {
        assert!(x.device_time_us > 0, "session {} was charged", x.id);
        assert!(!x.on_device);
    }
    // Only the ended session's share is given back.
    drop(a);
    eventually("a's share released", || status(&s).sessions.len() == 2);
    compute_session(&s, Some(70), Qos::Low).unwrap();
}

#[test]
fn a_killed_worker_holding_the_device_lets_the_queue_go_on() {
    use gpufuse_proto::Qos;
    let s = start("queuekill", "emu:1:1GiB");
    let mut a = compute_session(&s, None, Qos::Low).unwrap();
    // A kernel that would run for minutes.
    spin(&mut a, u32::MAX);
    a.flush().unwrap();
    let a_id = 1;
    eventually("a's kernel holds the device", || {
        status(&s)
            .sessions
            .iter()
            .any(|x| x.id == SessionId(a_id) && x.on_device)
    });
    let mut b = compute_session(&s, None, Qos::Critical).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        spin(&mut b, 10);
        let r = b
            .call(&Request::CtxSynchronize {
                ctx: ContextHandle(1),
            })
            .map(|_| ());
        let _ = tx.send(r.map_err(|e| e.to_string()));
        b
    });
    // Kernels are not preempted: b waits while a's kernel runs, whatever its QoS.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let worker_a = status(&s)
        .sessions
        .iter()
        .find(|x| x.id == SessionId(a_id))
        .unwrap()
        .worker_pid;
    // SAFETY: signalling a worker process of our own server.
    unsafe { libc::kill(worker_a as i32, libc::SIGKILL) };
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("b ran after a's worker died");
    assert_eq!(r, Ok(()));
    let mut b = waiter.join().unwrap();
    assert_eq!(b.take_async_error(), None);
    eventually("a is gone, b was charged", || {
        let st = status(&s);
        st.sessions.len() == 1 && st.sessions[0].device_time_us > 0
    });
}

/// Module variables are device memory: a module's `__device__` array is charged to the session
/// (status, the slice's limit: over it the load fails with CUDA_ERROR_OUT_OF_MEMORY), and
/// unloading gives it back.
#[test]
fn module_variables_count_against_the_slice() {
    const OUT_OF_MEMORY: i32 = 2;
    let s = start("module-bytes", "emu:1:1GiB");
    let mut c = session(&s, Some(4 << 20));
    let ptx = ".version 7.0\n.target sm_80\n.address_size 64\n.global .align 8 .b8 table[3145728];\n.visible .entry k()\n{\n\tret;\n}\n\0";
    let image = ptx.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    let load = |c: &mut Connection, module: u64| {
        c.call(&Request::ModuleLoad {
            module: ModuleHandle(module),
            device: 0,
            hash,
            image: Some(image),
        })
    };
    load(&mut c, 7).unwrap();
    assert_eq!(status(&s).sessions[0].used_bytes, 3 << 20);
    // 3 MiB more would pass the 4 MiB slice.
    assert!(matches!(
        load(&mut c, 8),
        Err(gpufuse_client::ClientError::Cuda(OUT_OF_MEMORY))
    ));
    assert_eq!(status(&s).sessions[0].used_bytes, 3 << 20);
    c.quiet(&Request::ModuleUnload {
        module: ModuleHandle(7),
    })
    .unwrap();
    c.call(&Request::Ping).unwrap();
    assert_eq!(status(&s).sessions[0].used_bytes, 0);
    assert_eq!(status(&s).devices[0].used_bytes, 0);
    load(&mut c, 8).unwrap();
    alloc(&mut c, 1 << 20);
    assert_eq!(status(&s).sessions[0].used_bytes, 4 << 20);
}

/// `--tflops N` is a compute share of the device's peak FP32 throughput (the emulated GPU's
/// model: 148 SMs x 128 lanes x 2 FLOPs x 1.965 GHz = 74.4 TFLOPS): 30 TFLOPS is 41%, more
/// than the device has is refused, and asking both ways is refused.
#[test]
fn tflops_requests_are_shares_of_the_devices_peak() {
    let s = start("tflops", "emu:1:1GiB");
    let hello = |compute_percent: Option<u32>, tflops: Option<u32>| {
        Connection::hello(
            SessionKind::Cuda,
            String::new(),
            ResourceRequest {
                compute_percent,
                tflops,
                ..Default::default()
            },
        )
    };
    let (_c, _) = Connection::open(&s.addr, &hello(None, Some(30))).unwrap();
    let st = status(&s);
    assert_eq!(st.sessions[0].compute_percent, Some(41));
    for (percent, tflops, why) in [
        (None, Some(200), "TFLOPS"),
        (Some(10), Some(10), "not both"),
        (None, Some(50), "promised"),
    ] {
        let Err(err) = Connection::open(&s.addr, &hello(percent, tflops)) else {
            panic!("{percent:?}% / {tflops:?} TFLOPS was accepted");
        };
        let err = err.to_string();
        assert!(err.contains(why), "{err}");
    }
}

/// Physical memory from `cuMemCreate` is charged to the slice when created (over it:
/// CUDA_ERROR_OUT_OF_MEMORY) and given back when released; a session's end releases it all.
#[test]
fn vmm_physical_memory_counts_against_the_slice() {
    const OUT_OF_MEMORY: i32 = 2;
    const CHUNK: u64 = 2 << 20;
    let s = start("vmm-quota", "emu:1:1GiB");
    let mut c = session(&s, Some(2 * CHUNK));
    let create = |c: &mut Connection, handle: u64| {
        c.call(&Request::MemCreate {
            handle: PhysicalHandle(handle),
            device: 0,
            size: CHUNK,
        })
    };
    create(&mut c, 1).unwrap();
    create(&mut c, 2).unwrap();
    assert!(matches!(
        create(&mut c, 3),
        Err(gpufuse_client::ClientError::Cuda(OUT_OF_MEMORY))
    ));
    let ReplyBody::Ptr(DevicePtr(va)) = c
        .call(&Request::MemAddressReserve {
            size: 2 * CHUNK,
            align: 0,
        })
        .unwrap()
    else {
        panic!("no address");
    };
    c.call(&Request::MemMap {
        ptr: DevicePtr(va),
        size: CHUNK,
        handle: PhysicalHandle(1),
    })
    .unwrap();
    assert_eq!(status(&s).sessions[0].used_bytes, 2 * CHUNK);
    c.quiet(&Request::MemRelease {
        handle: PhysicalHandle(2),
    })
    .unwrap();
    c.call(&Request::Ping).unwrap();
    assert_eq!(status(&s).sessions[0].used_bytes, CHUNK);
    create(&mut c, 3).unwrap();
    drop(c);
    eventually("the session's memory is back", || {
        let st = status(&s);
        st.sessions.is_empty() && st.devices[0].used_bytes == 0
    });
}

/// An image larger than one frame arrives in parts, in order, and loads by its hash; parts out
/// of order or with the wrong hash are refused and nothing is loaded.
#[test]
fn large_images_arrive_in_parts() {
    const INVALID_VALUE: i32 = 1;
    let s = start("image-parts", "emu:1:1GiB");
    let mut c = session(&s, None);
    let ptx = format!(
        ".version 7.0\n.target sm_80\n.address_size 64\n// {}\n.visible .entry k()\n{{\n\tret;\n}}\n\0",
        "x".repeat(3 << 20)
    );
    let image = ptx.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    let part = |offset: usize, len: usize, hash: [u8; 32]| Request::ModuleImagePart {
        hash,
        total: image.len() as u64,
        offset: offset as u64,
        data: &image[offset..offset + len],
    };
    let load = Request::ModuleLoad {
        module: ModuleHandle(5),
        device: 0,
        hash,
        image: None,
    };
    // Out of order: refused, reported by the next reply.
    c.quiet(&part(1 << 20, 1 << 20, hash)).unwrap();
    assert_eq!(
        c.call_raw(&Request::Ping).unwrap().deferred_error,
        Some(INVALID_VALUE)
    );
    // All of it under the wrong hash: refused, and the load still needs the image.
    let mut wrong = hash;
    wrong[0] ^= 1;
    let third = image.len() / 3;
    for (offset, len) in [
        (0, third),
        (third, third),
        (2 * third, image.len() - 2 * third),
    ] {
        c.quiet(&part(offset, len, wrong)).unwrap();
    }
    assert_eq!(
        c.call_raw(&Request::Ping).unwrap().deferred_error,
        Some(INVALID_VALUE)
    );
    assert_eq!(c.call(&load).unwrap(), ReplyBody::NeedImage);
    for (offset, len) in [
        (0, third),
        (third, third),
        (2 * third, image.len() - 2 * third),
    ] {
        c.quiet(&part(offset, len, hash)).unwrap();
    }
    assert_eq!(c.call(&load).unwrap(), ReplyBody::None);
    let ReplyBody::Function(_) = c
        .call(&Request::ModuleGetFunction {
            module: ModuleHandle(5),
            name: "k",
            function: FunctionHandle(6),
        })
        .unwrap()
    else {
        panic!("no function");
    };
}

/// Large host-to-device copies are received straight into device memory: the data arrives
/// intact, and one that names memory outside the session's allocations is discarded with
/// CUDA_ERROR_INVALID_VALUE while the connection and the next copies carry on.
#[test]
fn large_copies_land_in_device_memory_and_bad_ones_are_discarded() {
    const INVALID_VALUE: i32 = 1;
    let s = start("direct-htod", "emu:1:1GiB");
    let mut c = session(&s, None);
    let size = 3 << 20;
    let p = alloc(&mut c, size);
    let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    let htod = |c: &mut Connection, dst: u64, data: &[u8]| {
        c.quiet_with_tail(
            &Request::MemcpyHtoD {
                dst: DevicePtr(dst),
                stream: StreamHandle(0),
                data: &[],
            },
            data,
        )
        .unwrap()
    };
    let read_back = |c: &mut Connection| {
        let mut out = vec![0u8; size as usize];
        c.call_read_into(
            &Request::MemcpyDtoH {
                src: DevicePtr(p),
                size,
                stream: StreamHandle(0),
            },
            &mut out,
        )
        .unwrap();
        out
    };
    htod(&mut c, p, &data);
    assert!(read_back(&mut c) == data);
    // One byte past the allocation, then a pointer that is no allocation: both discarded.
    htod(&mut c, p + 1, &data);
    assert_eq!(
        c.call_raw(&Request::Ping).unwrap().deferred_error,
        Some(INVALID_VALUE)
    );
    htod(&mut c, 0x10, &data[..2 << 20]);
    assert_eq!(
        c.call_raw(&Request::Ping).unwrap().deferred_error,
        Some(INVALID_VALUE)
    );
    assert!(read_back(&mut c) == data);
    let reversed: Vec<u8> = data.iter().rev().copied().collect();
    htod(&mut c, p, &reversed);
    assert!(read_back(&mut c) == reversed);
}

/// Sessions spread over the node's devices: with two emulated GPUs, a second 700 MiB slice
/// goes to the device that still has room, a third one that fits nowhere is refused, and each
/// session works on its own device (which it sees as its device 0).
#[test]
fn sessions_spread_over_devices() {
    let s = start("spread", "emu:2:1GiB");
    let mut a = session(&s, Some(700 << 20));
    let mut b = session(&s, Some(700 << 20));
    let st = status(&s);
    let mut devices: Vec<u32> = st.sessions.iter().map(|x| x.device).collect();
    devices.sort();
    assert_eq!(devices, [0, 1]);
    let hello = Connection::hello(
        SessionKind::Cuda,
        String::new(),
        ResourceRequest {
            vram_bytes: Some(700 << 20),
            ..Default::default()
        },
    );
    let Err(err) = Connection::open(&s.addr, &hello) else {
        panic!("a third 700 MiB slice was admitted on two 1 GiB devices");
    };
    assert!(err.to_string().contains("VRAM"), "{err}");
    for c in [&mut a, &mut b] {
        let p = alloc(c, 600 << 20);
        c.quiet(&Request::MemcpyHtoD {
            dst: DevicePtr(p),
            stream: StreamHandle(0),
            data: &[7; 4096],
        })
        .unwrap();
        let mut out = [0u8; 4096];
        c.call_read_into(
            &Request::MemcpyDtoH {
                src: DevicePtr(p),
                size: 4096,
                stream: StreamHandle(0),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [7; 4096]);
    }
    let st = status(&s);
    assert!(
        st.devices.iter().all(|d| d.used_bytes == 600 << 20),
        "{:?}",
        st.devices
    );
}

#[test]
fn an_emulated_model_is_chosen_by_its_compute_capability() {
    let s = start("model", "emu:1:1GiB:sm_120");
    let hello = Connection::hello(SessionKind::Cuda, String::new(), Default::default());
    let (_c, accepted) = Connection::open(&s.addr, &hello).unwrap();
    let attr = |id: i32| {
        accepted.devices[0]
            .attributes
            .iter()
            .find(|(k, _)| *k == id)
            .map(|&(_, v)| v)
    };
    assert_eq!((attr(75), attr(76)), (Some(12), Some(0)));
    assert_eq!(attr(16), Some(188), "the sm_120 model's multiprocessors");
    assert_eq!(status(&s).devices[0].compute_capability, (12, 0));
}

/// A client that dies with launches queued: its worker used to execute them all (minutes here)
/// while holding the device; now it notices the hang-up between launches and drops them.
#[test]
fn a_dead_clients_queued_launches_are_dropped() {
    use gpufuse_proto::Qos;
    let s = start("deadqueue", "emu:1:1GiB");
    let mut c = compute_session(&s, None, Qos::Low).unwrap();
    // Minutes of kernels: 1,000 launches of tenths of a second each.
    for _ in 0..1000 {
        spin(&mut c, 200_000);
    }
    c.flush().unwrap();
    eventually("the first kernels run", || {
        status(&s)
            .sessions
            .first()
            .is_some_and(|x| x.device_time_us > 0)
    });
    drop(c);
    eventually("the dead client's session ends", || {
        status(&s).sessions.is_empty()
    });
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: sending a signal has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Runs `f` on its own thread and fails the test (instead of hanging it) if it does not
/// return within a generous bound.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

/// A stopped worker (SIGSTOP) used to hang its client's synchronous calls for ever, reads and
/// writes alike; now a call that hears nothing from the worker for the call timeout fails with
/// a clear error (CUDA_ERROR_DEVICE_UNAVAILABLE to the application), and so does every later
/// call, at once.
#[test]
fn a_stopped_worker_is_an_error_not_a_hang() {
    use gpufuse_client::ClientError;
    let s = start("stopped", "emu:1:1GiB");
    let mut a = session(&s, None);
    alloc(&mut a, 1 << 20);
    let mut b = session(&s, None);
    let p = alloc(&mut b, 16 << 20);
    let workers: Vec<u32> = status(&s).sessions.iter().map(|x| x.worker_pid).collect();
    assert_eq!(workers.len(), 2);
    for &w in &workers {
        signal(w, libc::SIGSTOP);
    }
    // A read: the reply never comes.
    let (a, e) = within("a synchronous call to a stopped worker", move || {
        a.set_call_timeout(Duration::from_secs(1));
        let e = a
            .call(&Request::CtxSynchronize {
                ctx: ContextHandle(1),
            })
            .unwrap_err();
        (a, e)
    });
    assert!(matches!(e, ClientError::Hung { .. }), "{e:?}");
    assert_eq!(e.status(), 46, "CUDA_ERROR_DEVICE_UNAVAILABLE");
    assert!(e.to_string().contains("GPUFUSE_CALL_TIMEOUT"), "{e}");
    let (_a, later) = within("a later call", move || {
        let mut a = a;
        let e = a.call(&Request::Ping).unwrap_err();
        (a, e)
    });
    assert_eq!(later.status(), 46, "{later:?}");
    // A write: 16 MiB cannot all go into the socket of a worker that does not read.
    let e = within("a large copy to a stopped worker", move || {
        b.set_call_timeout(Duration::from_secs(1));
        let data = vec![7u8; 16 << 20];
        b.quiet_with_tail(
            &Request::MemcpyHtoD {
                dst: DevicePtr(p),
                stream: StreamHandle(0),
                data: &[],
            },
            &data,
        )
        .and_then(|()| b.call(&Request::Ping).map(|_| ()))
        .unwrap_err()
    });
    assert!(matches!(e, ClientError::Hung { .. }), "{e:?}");
    for &w in &workers {
        signal(w, libc::SIGCONT);
    }
}

/// The call timeout is about silence, not the call's length: a worker busy with kernels for
/// longer than the timeout sends heartbeats, and the call waits for it.
#[test]
fn a_long_call_outlives_the_call_timeout_on_heartbeats() {
    use gpufuse_proto::Qos;
    let s = start("heartbeat", "emu:1:1GiB");
    let mut c = compute_session(&s, None, Qos::Low).unwrap();
    // Four heartbeat intervals.
    let timeout = Duration::from_secs(1);
    c.set_call_timeout(timeout);
    // How long one kernel takes here (debug and release builds differ tenfold): enough of them
    // that the one synchronize below outlasts the timeout about three times.
    let t = Instant::now();
    spin(&mut c, 200_000);
    c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(1),
    })
    .unwrap();
    let one = t.elapsed().max(Duration::from_millis(1));
    let mut n = (3 * timeout.as_nanos() / one.as_nanos() + 1).min(100_000) as usize;
    // A loaded machine makes that estimate wrong either way: until one synchronize has outlasted
    // the timeout twice, try again with more kernels.
    for _ in 0..4 {
        let started = Instant::now();
        let (back, r) = within("a long synchronize", move || {
            for _ in 0..n {
                spin(&mut c, 200_000);
            }
            let r = c.call(&Request::CtxSynchronize {
                ctx: ContextHandle(1),
            });
            (c, r)
        });
        c = back;
        let took = started.elapsed();
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(c.take_async_error(), None);
        if took > 2 * timeout {
            return;
        }
        n *= 2;
    }
    panic!("the kernels never ran for twice the timeout: this test showed nothing");
}

/// A client killed (SIGKILL) while its kernel runs: the kernel would loop for minutes, and its
/// worker used to run it to the end holding the device from every other session (26 minutes
/// for one of NVIDIA's samples). Now the worker stops the kernel when it finds its client gone,
/// gives the device back and ends the session.
#[test]
fn a_killed_clients_running_kernel_stops() {
    use gpufuse_proto::Qos;
    let s = start("killedkernel", "emu:1:1GiB");
    let me = std::env::current_exe().unwrap();
    let mut child = Command::new(me)
        .args([
            "--exact",
            "run_a_kernel_until_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("GPUFUSE_TEST_SERVER", s.addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the client's kernel holds the device", || {
        status(&s).sessions.iter().any(|x| x.on_device)
    });
    // Let it run: the kernel is well under way, not about to start.
    std::thread::sleep(Duration::from_millis(300));
    signal(child.id(), libc::SIGKILL);
    let _ = child.wait();
    let killed = Instant::now();
    eventually("the killed client's session ends", || {
        status(&s).sessions.is_empty()
    });
    let ended = killed.elapsed();
    eprintln!("session ended {ended:?} after its client was killed");
    // The heartbeat thread looks every 250 ms; a loaded machine gets slack, not minutes.
    assert!(ended < Duration::from_secs(5), "took {ended:?}");
    // The device is free and its memory given back: another session runs a kernel at once.
    assert_eq!(status(&s).devices[0].used_bytes, 0);
    let mut b = compute_session(&s, None, Qos::Low).unwrap();
    spin(&mut b, 10);
    within("another session's kernel", move || {
        b.call(&Request::CtxSynchronize {
            ctx: ContextHandle(1),
        })
        .unwrap();
        assert_eq!(b.take_async_error(), None);
    });
}

/// Helper process for `a_killed_clients_running_kernel_stops` (run only by it): a kernel of
/// minutes, waited for.
#[test]
#[ignore = "helper process: run by a_killed_clients_running_kernel_stops"]
fn run_a_kernel_until_killed() {
    let addr: Address = std::env::var("GPUFUSE_TEST_SERVER")
        .unwrap()
        .parse()
        .unwrap();
    let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
    let (mut c, _) = Connection::open(&addr, &hello).unwrap();
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    let image = SPIN_PTX.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    c.call(&Request::ModuleLoad {
        module: ModuleHandle(2),
        device: 0,
        hash,
        image: Some(image),
    })
    .unwrap();
    c.call(&Request::ModuleGetFunction {
        module: ModuleHandle(2),
        name: "spin",
        function: FunctionHandle(3),
    })
    .unwrap();
    spin(&mut c, u32::MAX);
    let _ = c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(1),
    });
}
