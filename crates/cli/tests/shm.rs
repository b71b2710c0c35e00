//! The shared-memory transport against a real `gpufuse serve`: sessions over its unix socket
//! move to the rings (or keep the socket when told to), bulk copies larger than a ring cross
//! intact, and a client that writes nonsense into the rings (a corrupt record, a corrupt ring
//! position) ends its own session only. Killed clients and workers over the rings are
//! `node.rs`'s tests, which run over the rings by default (`scripts/test-all.sh` runs them over
//! the socket as well).

use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::{Connection, Transport};
use gpufuse_proto::{
    decode_owned, encode_frame, FrameKind, ReplyBody, Request, ResourceRequest, ServerHello,
    SessionKind,
};
use gpufuse_proto::{ContextHandle, DevicePtr, StreamHandle};
use gpufuse_transport::shm::{ShmRegion, ShmStream, Side, DEFAULT_RING};
use gpufuse_transport::{Address, Conn, Stream, TransportError};

struct Server {
    child: Child,
    dir: std::path::PathBuf,
    sock: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(name: &str) -> Server {
    let dir = std::env::temp_dir().join(format!("gpufuse-shm-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(["--devices", "emu:1:1GiB"])
        .args(["--image-cache", &dir.join("images").display().to_string()])
        .stderr(
            if std::env::var_os("GPUFUSE_TEST_SERVER_STDERR").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            },
        )
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, dir, sock }
}

fn hello() -> gpufuse_proto::ClientHello {
    Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default())
}

fn open(addr: &Address, transport: Transport) -> Connection {
    let (mut c, _) = Connection::open_with(addr, &hello(), transport).unwrap();
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

fn sessions(s: &Server) -> usize {
    Connection::query_status(&Address::Unix(s.sock.clone()), String::new())
        .unwrap()
        .sessions
        .len()
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A copy there and back, larger than a ring: its bytes come back intact.
fn round_trip_copy(c: &mut Connection, size: usize) {
    let p = alloc(c, size as u64);
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    c.quiet_with_tail(
        &Request::MemcpyHtoD {
            dst: DevicePtr(p),
            stream: StreamHandle(0),
            data: &[],
        },
        &data,
    )
    .unwrap();
    let mut back = vec![0u8; size];
    c.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(p),
            size: size as u64,
            stream: StreamHandle(0),
        },
        &mut back,
    )
    .unwrap();
    assert!(back == data, "a {size}-byte copy came back changed");
    c.quiet(&Request::MemFree { ptr: DevicePtr(p) }).unwrap();
}

#[test]
fn unix_sessions_move_to_the_rings_unless_told_not_to() {
    let s = start("choose");
    let unix = Address::Unix(s.sock.clone());
    let mut auto = open(&unix, Transport::Auto);
    assert_eq!(auto.transport(), "shm");
    let mut socket = open(&unix, Transport::Socket);
    assert_eq!(socket.transport(), "unix");
    let mut forced = open(&Address::Shm(s.sock.clone()), Transport::Socket);
    assert_eq!(
        forced.transport(),
        "shm",
        "a shm: address requires the rings"
    );
    for c in [&mut auto, &mut socket, &mut forced] {
        c.call(&Request::Ping).unwrap();
        round_trip_copy(c, 3 * DEFAULT_RING + 12345);
        round_trip_copy(c, 100);
    }
    assert_eq!(sessions(&s), 3);
}

/// Says hello over the node's socket and moves to the rings by hand, as a client does, but
/// keeps the raw stream and the mapping so that the test can write what it likes.
fn raw_shm_session(s: &Server) -> (ShmStream, std::fs::File) {
    let mut conn = Conn::new(Stream::Unix(UnixStream::connect(&s.sock).unwrap()));
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::Hello, 0, 0, &hello());
    conn.send(&frame).unwrap();
    let (_, body) = conn.recv().unwrap();
    assert!(matches!(
        decode_owned::<ServerHello>(body).unwrap(),
        ServerHello::Accepted { .. }
    ));
    let region = ShmRegion::create(DEFAULT_RING, DEFAULT_RING).unwrap();
    let memfd = std::fs::File::from(region.fds()[0].try_clone_to_owned().unwrap());
    frame.clear();
    encode_frame(
        &mut frame,
        FrameKind::Request,
        0,
        1,
        &Request::ShmAttach {
            request_ring: DEFAULT_RING as u64,
            reply_ring: DEFAULT_RING as u64,
        },
    );
    conn.send_with_fds(&frame, &region.fds()).unwrap();
    let (h, body) = conn.recv().unwrap();
    assert_eq!((h.kind, h.request_id), (FrameKind::Reply, 1));
    let reply = gpufuse_proto::decode_reply(&h, body).unwrap();
    assert_eq!(reply.status, 0, "the worker took the rings");
    let Stream::Unix(sock) = conn.into_stream() else {
        unreachable!()
    };
    (region.into_stream(sock, Side::Client), memfd)
}

/// The worker of a session that broke the ring protocol ends: its socket closes, so the
/// client's next read of the rings is the end of the stream, within the deadline.
fn assert_session_ended(stream: ShmStream) {
    stream.set_read_timeout(Some(Duration::from_secs(15)));
    let mut conn = Conn::new(Stream::Shm(stream));
    match conn.recv() {
        Err(TransportError::Closed) => {}
        other => panic!("expected the worker to end the session, got {other:?}"),
    }
}

#[test]
fn a_corrupt_ring_record_or_position_ends_only_its_session() {
    let s = start("corrupt");
    let unix = Address::Unix(s.sock.clone());
    let mut good = open(&unix, Transport::Shm);
    let p = alloc(&mut good, 4096);

    // A record whose header is valid and whose body is no request.
    let (bad, _memfd) = raw_shm_session(&s);
    let mut garbage = Vec::new();
    encode_frame(&mut garbage, FrameKind::Request, 0, 2, &[0xFFu8; 16]);
    std::io::Write::write_all(&mut &bad, &garbage).unwrap();
    assert_session_ended(bad);

    // A record with a bad magic.
    let (bad, _memfd) = raw_shm_session(&s);
    std::io::Write::write_all(&mut &bad, &[0xAB; 64]).unwrap();
    assert_session_ended(bad);

    // A request ring whose write position claims more bytes than the ring holds (control page
    // offset 256), written behind the worker's back while it waits for the rest of a frame:
    // it finds the position when it next looks (its doorbell, or its park's 100 ms backstop).
    let (bad, memfd) = raw_shm_session(&s);
    std::io::Write::write_all(&mut &bad, &[0]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    memfd
        .write_all_at(&(1u64 << 40).to_le_bytes(), 256)
        .unwrap();
    assert_session_ended(bad);

    eventually("only the good session is left", || sessions(&s) == 1);
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
fn a_worker_killed_while_its_client_waits_is_an_error_not_a_hang() {
    let s = start("killed");
    let unix = Address::Unix(s.sock.clone());
    let mut c = open(&unix, Transport::Shm);
    c.call(&Request::Ping).unwrap();
    let st = Connection::query_status(&unix, String::new()).unwrap();
    let worker = st.sessions[0].worker_pid;
    // The client parks waiting for a reply the worker will never send.
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: signalling a worker process of our own server.
        unsafe { libc::kill(worker as i32, libc::SIGKILL) };
    });
    let started = Instant::now();
    // Stopped first, the worker cannot answer: the call waits (spins, then parks) until the
    // kill closes the socket.
    // SAFETY: signalling a worker process of our own server.
    unsafe { libc::kill(worker as i32, libc::SIGSTOP) };
    let err = c.call(&Request::Ping).unwrap_err();
    t.join().unwrap();
    assert!(
        matches!(err, gpufuse_client::ClientError::Lost(_)),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "noticed after {:?}",
        started.elapsed()
    );
    eventually("the session is released", || sessions(&s) == 0);
}

/// The host arena's block of `size` bytes, and its offset.
fn arena_block(c: &Connection, size: usize) -> (*mut u8, u64) {
    let arena = c.host_arena().expect("a shm session has a host arena");
    let p = arena.alloc(size).expect("room in the arena");
    (p, arena.offset_of(p as usize, size).unwrap())
}

#[test]
fn pinned_copies_go_through_the_host_arena_intact_both_ways() {
    let s = start("pinned");
    let mut c = open(&Address::Unix(s.sock.clone()), Transport::Shm);
    let size = 3 * DEFAULT_RING + 12345;
    let arena = c.host_arena().unwrap().clone();
    let (_, src) = arena_block(&c, size);
    let (_, dst) = arena_block(&c, size);
    let data: Vec<u8> = (0..size).map(|i| (i * 13 + i / 4096) as u8).collect();
    assert!(arena.write(src, &data));
    let dev = alloc(&mut c, size as u64);
    // Host arena to device; read back the ordinary way (through the rings).
    c.quiet(&Request::MemcpyHtoDHost {
        dst: DevicePtr(dev),
        stream: StreamHandle(0),
        offset: src,
        size: size as u64,
    })
    .unwrap();
    let mut back = vec![0u8; size];
    c.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(dev),
            size: size as u64,
            stream: StreamHandle(0),
        },
        &mut back,
    )
    .unwrap();
    assert!(back == data, "host arena -> device changed the bytes");
    // Device to the host arena, in place once a later call is answered.
    let other: Vec<u8> = data.iter().map(|b| b ^ 0xA5).collect();
    c.quiet_with_tail(
        &Request::MemcpyHtoD {
            dst: DevicePtr(dev),
            stream: StreamHandle(0),
            data: &[],
        },
        &other,
    )
    .unwrap();
    c.quiet(&Request::MemcpyDtoHHost {
        src: DevicePtr(dev),
        stream: StreamHandle(0),
        offset: dst,
        size: size as u64,
    })
    .unwrap();
    let reply = c.call_raw(&Request::Ping).unwrap();
    assert_eq!((reply.status, reply.deferred_error), (0, None));
    let mut got = vec![0u8; size];
    assert!(arena.read(dst, &mut got));
    assert!(got == other, "device -> host arena changed the bytes");
    // A session over the socket has no arena; the request is an error there.
    let mut socket = open(&Address::Unix(s.sock.clone()), Transport::Socket);
    assert!(socket.host_arena().is_none());
    let dev2 = alloc(&mut socket, 4096);
    socket
        .quiet(&Request::MemcpyHtoDHost {
            dst: DevicePtr(dev2),
            stream: StreamHandle(0),
            offset: 0,
            size: 4096,
        })
        .unwrap();
    let reply = socket.call_raw(&Request::Ping).unwrap();
    assert_eq!(
        reply.deferred_error,
        Some(1),
        "no arena: CUDA_ERROR_INVALID_VALUE"
    );
}

#[test]
fn a_bogus_arena_offset_is_an_error_and_the_session_goes_on() {
    let s = start("bogus-arena");
    let mut c = open(&Address::Unix(s.sock.clone()), Transport::Shm);
    let len = c.host_arena().unwrap().len() as u64;
    let dev = alloc(&mut c, 1 << 20);
    let bogus = [
        (len - 100, 4096),     // runs past the end
        (len, 1),              // starts at the end
        (u64::MAX - 10, 4096), // wraps around
        (0, u64::MAX),         // larger than everything
    ];
    for (offset, size) in bogus {
        for req in [
            Request::MemcpyHtoDHost {
                dst: DevicePtr(dev),
                stream: StreamHandle(0),
                offset,
                size,
            },
            Request::MemcpyDtoHHost {
                src: DevicePtr(dev),
                stream: StreamHandle(0),
                offset,
                size,
            },
        ] {
            c.quiet(&req).unwrap();
            let reply = c.call_raw(&Request::Ping).unwrap();
            assert_eq!(
                reply.deferred_error,
                Some(1),
                "{req:?}: CUDA_ERROR_INVALID_VALUE"
            );
        }
    }
    // The session goes on: a good copy through the arena still works.
    let (p, off) = arena_block(&c, 4096);
    let arena = c.host_arena().unwrap().clone();
    assert!(arena.write(off, &[0x77; 4096]));
    c.quiet(&Request::MemcpyHtoDHost {
        dst: DevicePtr(dev + 8192),
        stream: StreamHandle(0),
        offset: off,
        size: 4096,
    })
    .unwrap();
    let mut back = vec![0u8; 4096];
    c.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(dev + 8192),
            size: 4096,
            stream: StreamHandle(0),
        },
        &mut back,
    )
    .unwrap();
    assert!(back.iter().all(|&b| b == 0x77));
    assert!(arena.free(p, 4096));
    assert_eq!(sessions(&s), 1);
}

fn status(s: &Server) -> gpufuse_proto::NodeStatus {
    Connection::query_status(&Address::Unix(s.sock.clone()), String::new()).unwrap()
}

fn alloc_shared(c: &mut Connection, size: u64, offset: u64) -> Result<u64, i32> {
    match c.call(&Request::MemAllocShared {
        device: 0,
        size,
        offset,
    }) {
        Ok(ReplyBody::Ptr(DevicePtr(p))) => Ok(p),
        Ok(other) => panic!("{other:?}"),
        Err(gpufuse_client::ClientError::Cuda(e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

/// Managed memory shared with the device (`MemAllocShared`): the allocation's memory is the
/// client's arena block, both ways at once (no copy between them); it is charged to the session
/// and the device's ledger like any allocation, released by `MemFree`, and by the session's end
/// when the client dies holding it. Bad arena ranges and sessions without an arena are errors.
#[test]
fn shared_allocations_are_arena_blocks_charged_and_released_with_the_session() {
    let s = start("shared-managed");
    let mut c = open(&Address::Unix(s.sock.clone()), Transport::Shm);
    let arena = c.host_arena().unwrap().clone();
    let size = 3 * 4096 + 100;
    let (block, off) = arena_block(&c, size);
    let p = alloc_shared(&mut c, size as u64, off).unwrap();
    assert_eq!(
        p % (64 << 10),
        0,
        "a shared allocation starts on a 64 KiB boundary"
    );
    // Host writes are the device's contents at once, and device writes the host's.
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    assert!(arena.write(off, &data));
    let mut back = vec![0u8; size];
    c.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(p),
            size: size as u64,
            stream: StreamHandle(0),
        },
        &mut back,
    )
    .unwrap();
    assert!(back == data, "the device reads the client's words");
    c.quiet(&Request::Memset {
        dst: DevicePtr(p + 5),
        value: 0xab,
        elem_size: 1,
        count: 10,
        stream: StreamHandle(0),
    })
    .unwrap();
    let reply = c.call_raw(&Request::Ping).unwrap();
    assert_eq!((reply.status, reply.deferred_error), (0, None));
    let mut got = vec![0u8; 20];
    assert!(arena.read(off, &mut got));
    assert_eq!(&got[..5], &data[..5]);
    assert_eq!(&got[5..15], &[0xab; 10]);
    assert_eq!(&got[15..], &data[15..20]);
    // Charged like any allocation, to the session and the device.
    eventually("the session is charged", || {
        let st = status(&s);
        st.sessions
            .first()
            .is_some_and(|x| x.used_bytes == size as u64)
            && st.devices[0].used_bytes >= size as u64
    });
    // Bad ranges: unaligned, past the arena's end, empty.
    let len = arena.len() as u64;
    assert_eq!(alloc_shared(&mut c, 4096, 8), Err(1));
    assert_eq!(alloc_shared(&mut c, 8192, len - 4096), Err(1));
    assert_eq!(alloc_shared(&mut c, 0, 0), Err(1));
    // Freed: uncharged; the arena block is the client's to give back.
    c.quiet(&Request::MemFree { ptr: DevicePtr(p) }).unwrap();
    let reply = c.call_raw(&Request::Ping).unwrap();
    assert_eq!(reply.deferred_error, None);
    assert!(arena.free(block, size));
    eventually("the free is uncharged", || {
        status(&s)
            .sessions
            .first()
            .is_some_and(|x| x.used_bytes == 0)
    });
    // A session over the socket has no arena to share.
    let mut socket = open(&Address::Unix(s.sock.clone()), Transport::Socket);
    assert_eq!(alloc_shared(&mut socket, 4096, 0), Err(1));
    drop(socket);
    // A client that dies holding shared memory: its session ends and the ledger lets go.
    let (_, off) = arena_block(&c, 1 << 20);
    alloc_shared(&mut c, 1 << 20, off).unwrap();
    eventually("the second allocation is charged", || {
        status(&s).devices[0].used_bytes >= 1 << 20
    });
    drop(c);
    drop(arena);
    eventually(
        "the dead client's session ends and its memory is released",
        || {
            let st = status(&s);
            st.sessions.is_empty() && st.devices[0].used_bytes == 0
        },
    );
}

fn open_req(handle: &[u8]) -> Request<'_> {
    Request::IpcOpenMemHandle { device: 0, handle }
}

fn call_status(c: &mut Connection, req: &Request) -> Result<ReplyBody, i32> {
    match c.call(req) {
        Ok(body) => Ok(body),
        Err(gpufuse_client::ClientError::Cuda(e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

fn read(c: &mut Connection, src: u64, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    c.call_read_into(
        &Request::MemcpyDtoH {
            src: DevicePtr(src),
            size: len as u64,
            stream: StreamHandle(0),
        },
        &mut back,
    )
    .unwrap();
    back
}

fn write(c: &mut Connection, dst: u64, data: &[u8]) {
    c.quiet(&Request::MemcpyHtoD {
        dst: DevicePtr(dst),
        stream: StreamHandle(0),
        data,
    })
    .unwrap();
    assert_eq!(c.call_raw(&Request::Ping).unwrap().deferred_error, None);
}

/// CUDA IPC between two sessions (two worker processes): the memory one exports is the very
/// memory the other opens (each side's writes are the other's reads), charged to the exporter
/// only; it outlives its exporter in the opener until closed; a freed export, a forged handle
/// and a session's own handle are refused. Over the socket too: the rings play no part.
#[test]
fn ipc_memory_is_shared_between_sessions_and_stale_handles_are_refused() {
    let s = start("ipc");
    for transport in [Transport::Shm, Transport::Socket] {
        let addr = Address::Unix(s.sock.clone());
        let (mut a, mut b) = (open(&addr, transport), open(&addr, transport));
        let size = 10_000;
        let p = alloc(&mut a, size);
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        write(&mut a, p, &data);
        let ipc = Request::IpcGetMemHandle { ptr: DevicePtr(p) };
        let Ok(ReplyBody::Data(handle)) = call_status(&mut a, &ipc) else {
            panic!("no handle")
        };
        assert_eq!(handle.len(), 64);
        assert_eq!(
            call_status(&mut a, &ipc),
            Ok(ReplyBody::Data(handle.clone())),
            "the same handle again"
        );
        assert_eq!(
            call_status(
                &mut a,
                &Request::IpcGetMemHandle {
                    ptr: DevicePtr(p + 8)
                }
            ),
            Err(1),
            "not an allocation's base"
        );
        assert_eq!(read(&mut a, p, size as usize), data, "contents kept");
        assert_eq!(
            call_status(&mut a, &open_req(&handle)),
            Err(201),
            "a session's own handle"
        );
        let Ok(ReplyBody::Opened {
            ptr: DevicePtr(q),
            size: got,
        }) = call_status(&mut b, &open_req(&handle))
        else {
            panic!("not opened")
        };
        assert_eq!(got, size);
        assert_eq!(read(&mut b, q, size as usize), data);
        write(&mut b, q + 100, b"from b");
        assert_eq!(&read(&mut a, p + 100, 6), b"from b");
        write(&mut a, p + 200, b"from a");
        assert_eq!(&read(&mut b, q + 200, 6), b"from a");
        // The exporter is charged; the opener is not.
        eventually("only the exporter is charged", || {
            let st = status(&s);
            let used: Vec<u64> = st.sessions.iter().map(|x| x.used_bytes).collect();
            used.len() == 2 && used.contains(&size) && used.contains(&0)
        });
        b.quiet(&Request::MemFree { ptr: DevicePtr(q) }).unwrap();
        assert_eq!(
            b.call_raw(&Request::Ping).unwrap().deferred_error,
            Some(1),
            "opened memory is not freed with cuMemFree"
        );
        // Forged handles: another magic, another secret.
        let mut forged = handle.clone();
        forged[0] ^= 1;
        assert_eq!(call_status(&mut b, &open_req(&forged)), Err(1));
        let mut forged = handle.clone();
        forged[20] ^= 1;
        assert_eq!(call_status(&mut b, &open_req(&forged)), Err(1));
        assert_eq!(call_status(&mut b, &open_req(&handle[..63])), Err(1));
        // The exporter frees and ends: the opener keeps the memory until it closes it, and
        // the handle opens no more.
        a.quiet(&Request::MemFree { ptr: DevicePtr(p) }).unwrap();
        assert_eq!(a.call_raw(&Request::Ping).unwrap().deferred_error, None);
        drop(a);
        assert_eq!(&read(&mut b, q + 100, 6), b"from b");
        let mut c = open(&addr, transport);
        assert_eq!(call_status(&mut c, &open_req(&handle)), Err(1));
        let close = Request::IpcCloseMemHandle { ptr: DevicePtr(q) };
        assert_eq!(call_status(&mut b, &close), Ok(ReplyBody::None));
        assert_eq!(call_status(&mut b, &close), Err(1), "closed twice");
        eventually("both sessions hold nothing", || {
            status(&s).sessions.iter().all(|x| x.used_bytes == 0)
        });
    }
}
