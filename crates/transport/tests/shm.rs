//! The shared-memory transport between two ends in one process (a thread each): set-up over a
//! socket pair with the descriptors passed as a real client passes them, frames both ways,
//! wrapping, a dead peer, deadlines, and a peer that scribbles on the control page.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use gpufuse_proto::{encode_frame, FrameKind, Request};
use gpufuse_proto::{DevicePtr, StreamHandle};
use gpufuse_transport::shm::{ShmRegion, ShmStream, Side};
use gpufuse_transport::{Conn, Stream, TransportError};

/// A client end and a worker end, the worker's region adopted from descriptors received over
/// the socket pair (`SCM_RIGHTS`), as in a session.
fn pair(ring: usize) -> (ShmStream, ShmStream) {
    let (a, b) = UnixStream::pair().unwrap();
    let region = ShmRegion::create(ring, ring).unwrap();
    let mut client = Conn::new(Stream::Unix(a.try_clone().unwrap()));
    let mut frame = Vec::new();
    encode_frame(
        &mut frame,
        FrameKind::Request,
        0,
        1,
        &Request::ShmAttach {
            request_ring: ring as u64,
            reply_ring: ring as u64,
        },
    );
    client.send_with_fds(&frame, &region.fds()).unwrap();
    let mut worker = Conn::new(Stream::Unix(b.try_clone().unwrap()));
    worker.accept_fds();
    let (h, _) = worker.recv().unwrap();
    assert_eq!(h.request_id, 1);
    let fds: Vec<OwnedFd> = worker.take_fds();
    assert_eq!(fds.len(), 5, "a memfd and four doorbells");
    let theirs = ShmRegion::adopt(fds, ring as u64, ring as u64).unwrap();
    (
        region.into_stream(a, Side::Client),
        theirs.into_stream(b, Side::Worker),
    )
}

#[test]
fn frames_cross_both_ways_and_wrap_around_the_rings() {
    let (client, worker) = pair(4096);
    let echo = std::thread::spawn(move || {
        let mut conn = Conn::new(Stream::Shm(worker));
        let mut out = Vec::new();
        loop {
            let (h, body) = match conn.recv() {
                Ok(f) => f,
                Err(TransportError::Closed) => return,
                Err(e) => panic!("{e:?}"),
            };
            out.clear();
            out.extend_from_slice(
                &gpufuse_proto::FrameHeader::new(
                    FrameKind::Reply,
                    0,
                    body.len() as u32,
                    h.request_id,
                )
                .encode(),
            );
            out.extend_from_slice(body);
            conn.send(&out).unwrap();
        }
    });
    let mut conn = Conn::new(Stream::Shm(client));
    // Sizes around and well past the 4 KiB rings: a frame larger than a ring streams through.
    for (i, size) in [0usize, 1, 100, 4000, 4096, 5000, 100_000, 3_000_000]
        .into_iter()
        .enumerate()
    {
        let data: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();
        let mut frame = Vec::new();
        encode_frame(
            &mut frame,
            FrameKind::Request,
            0,
            i as u64,
            &Request::MemcpyHtoD {
                dst: DevicePtr(1),
                stream: StreamHandle(0),
                data: &data,
            },
        );
        conn.send(&frame).unwrap();
        let (h, body) = conn.recv().unwrap();
        assert_eq!(h.request_id, i as u64);
        assert_eq!(body, &frame[gpufuse_proto::HEADER_LEN..], "size {size}");
    }
    drop(conn);
    echo.join().unwrap();
}

#[test]
fn a_dead_peer_ends_the_stream_and_a_waiting_reader_wakes() {
    let (client, worker) = pair(4096);
    let reader = std::thread::spawn(move || {
        let mut w = worker;
        let mut buf = [0u8; 16];
        let t = Instant::now();
        let mut got = Vec::new();
        loop {
            match w.read(&mut buf) {
                Ok(0) => return (got, t.elapsed()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => panic!("{e}"),
            }
        }
    });
    let mut c = client;
    c.write_all(b"last words").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(c); // closes the socket, as a killed client's kernel does
    let (got, waited) = reader.join().unwrap();
    assert_eq!(got, b"last words", "bytes sent before the end still arrive");
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
}

#[test]
fn writing_to_a_dead_peer_is_a_broken_pipe_not_a_hang() {
    let (client, worker) = pair(4096);
    drop(worker);
    let mut c = client;
    let err = c.write_all(&vec![1u8; 64 * 1024]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
}

#[test]
fn a_read_deadline_fails_like_a_socket_timeout() {
    let (client, _worker) = pair(4096);
    client.set_read_timeout(Some(Duration::from_millis(150)));
    let mut c = client;
    let t = Instant::now();
    let err = c.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert!(t.elapsed() >= Duration::from_millis(150));
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_parked_reader_is_woken_by_the_doorbell() {
    let (client, worker) = pair(4096);
    let t = std::thread::spawn(move || {
        let mut w = worker;
        let mut b = [0u8; 1];
        w.read_exact(&mut b).unwrap();
        b[0]
    });
    // Long enough for the reader to stop spinning and park.
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    let mut c = client;
    c.write_all(&[42]).unwrap();
    assert_eq!(t.join().unwrap(), 42);
    assert!(
        sent.elapsed() < Duration::from_millis(90),
        "woken by the doorbell, not the 100 ms backstop: {:?}",
        sent.elapsed()
    );
}

/// A client that writes nonsense over the control page: the worker's reads fail with
/// `InvalidData` instead of reading outside the ring.
#[test]
fn a_corrupt_write_position_is_an_error() {
    let (a, b) = UnixStream::pair().unwrap();
    let region = ShmRegion::create(4096, 4096).unwrap();
    let memfd = region.fds()[0].try_clone_to_owned().unwrap();
    let mut client = Conn::new(Stream::Unix(a.try_clone().unwrap()));
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::Request, 0, 1, &Request::Ping);
    client.send_with_fds(&frame, &region.fds()).unwrap();
    let mut w = Conn::new(Stream::Unix(b.try_clone().unwrap()));
    w.accept_fds();
    w.recv().unwrap();
    let worker = ShmRegion::adopt(w.take_fds(), 4096, 4096)
        .unwrap()
        .into_stream(b, Side::Worker);
    // The request ring's write position (control page offset 256) claims a million bytes.
    let f = std::fs::File::from(memfd);
    use std::os::unix::fs::FileExt;
    f.write_all_at(&1_000_000u64.to_le_bytes(), 256).unwrap();
    let mut conn = Conn::new(Stream::Shm(worker));
    match conn.recv() {
        Err(TransportError::Io(e)) => {
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("corrupt"), "{e}");
        }
        other => panic!("expected a corrupt-ring error, got {other:?}"),
    }
    drop(a);
}

#[test]
fn adopt_refuses_what_is_not_a_sealed_region() {
    let region = ShmRegion::create(4096, 4096).unwrap();
    let dup = |f: &ShmRegion| -> Vec<OwnedFd> {
        f.fds()
            .into_iter()
            .map(|fd| fd.try_clone_to_owned().unwrap())
            .collect()
    };
    // Wrong sizes.
    let err = ShmRegion::adopt(dup(&region), 8192, 4096).unwrap_err();
    assert!(err.to_string().contains("bytes"), "{err}");
    // Not a power of two.
    let err = ShmRegion::adopt(dup(&region), 5000, 4096).unwrap_err();
    assert!(err.to_string().contains("powers of two"), "{err}");
    // Too few descriptors.
    let mut fds = dup(&region);
    fds.pop();
    assert!(ShmRegion::adopt(fds, 4096, 4096).is_err());
    // A doorbell that is a socket.
    let (s, _t) = UnixStream::pair().unwrap();
    let mut fds = dup(&region);
    fds[1] = OwnedFd::from(s);
    let err = ShmRegion::adopt(fds, 4096, 4096).unwrap_err();
    assert!(err.to_string().contains("eventfd"), "{err}");
    // An unsealed memfd (a plain file would do too).
    let file = std::fs::File::from(unsealed_file());
    file.set_len(4096 * 3).unwrap();
    let mut fds = dup(&region);
    fds[0] = OwnedFd::from(file);
    let err = ShmRegion::adopt(fds, 4096, 4096).unwrap_err();
    assert!(err.to_string().contains("seal"), "{err}");
    assert!(region.fds()[0].as_raw_fd() >= 0);
}

fn unsealed_file() -> OwnedFd {
    let p = std::env::temp_dir().join(format!("gpufuse-shm-test-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let _ = std::fs::remove_file(&p);
    OwnedFd::from(f)
}
