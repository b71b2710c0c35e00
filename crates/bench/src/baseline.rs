//! Baselines measured in the same run: raw socket ping-pong and throughput, a raw ping-pong
//! and throughput over the shared-memory rings (the transport's own streams, no frames, no
//! worker), in-process memcpy.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use anyhow::Result;
use gpufuse_transport::shm::{ShmRegion, ShmStream, Side, DEFAULT_RING};

#[derive(Clone, Copy)]
pub enum Kind {
    Unix,
    Tcp,
    /// Two [`ShmStream`]s over one mapping (the same rings, spinning and doorbells as a
    /// session's), each with its end of a socket pair for liveness.
    Shm,
}

/// A client end and a worker end of one shared-memory region, in this process.
fn shm_pair() -> Result<(ShmStream, ShmStream)> {
    let (a, b) = UnixStream::pair()?;
    let ours = ShmRegion::create(DEFAULT_RING, DEFAULT_RING)?;
    let fds = ours
        .fds()
        .into_iter()
        .map(|fd| fd.try_clone_to_owned())
        .collect::<std::io::Result<Vec<_>>>()?;
    let theirs = ShmRegion::adopt(fds, DEFAULT_RING as u64, DEFAULT_RING as u64)?;
    Ok((
        ours.into_stream(a, Side::Client),
        theirs.into_stream(b, Side::Worker),
    ))
}

/// A connected pair of sockets of `kind`.
fn pair(kind: Kind) -> Result<(Box<dyn ReadWrite>, Box<dyn ReadWrite>)> {
    Ok(match kind {
        Kind::Unix => {
            let (a, b) = UnixStream::pair()?;
            (Box::new(a), Box::new(b))
        }
        Kind::Tcp => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let a = TcpStream::connect(l.local_addr()?)?;
            let (b, _) = l.accept()?;
            a.set_nodelay(true)?;
            b.set_nodelay(true)?;
            (Box::new(a), Box::new(b))
        }
        Kind::Shm => {
            let (a, b) = shm_pair()?;
            (Box::new(a), Box::new(b))
        }
    })
}

pub trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

/// Mean round trip of a 32-byte request and a 32-byte answer between two threads, in µs.
pub fn ping_pong_us(kind: Kind, n: usize) -> Result<f64> {
    let (mut a, mut b) = pair(kind)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 32];
        for _ in 0..n {
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
        }
        Ok(())
    });
    let mut buf = [0u8; 32];
    let t = Instant::now();
    for _ in 0..n {
        a.write_all(&buf)?;
        a.read_exact(&mut buf)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    echo.join().expect("echo thread")?;
    Ok(us)
}

/// Throughput of sending `reps` buffers of `size` bytes to a thread that reads them, GiB/s.
pub fn stream_gib_s(kind: Kind, size: usize, reps: usize) -> Result<f64> {
    let (mut a, mut b) = pair(kind)?;
    let sink = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; 256 * 1024];
        let mut left = size * reps;
        while left > 0 {
            let n = b.read(&mut buf)?;
            if n == 0 {
                break;
            }
            left -= n.min(left);
        }
        b.write_all(&[1])?;
        Ok(())
    });
    let data = vec![7u8; size];
    let t = Instant::now();
    for _ in 0..reps {
        a.write_all(&data)?;
    }
    let mut ack = [0u8; 1];
    a.read_exact(&mut ack)?;
    let s = t.elapsed().as_secs_f64();
    sink.join().expect("sink thread")?;
    Ok((size * reps) as f64 / s / (1u64 << 30) as f64)
}

/// In-process memcpy bandwidth for `size` bytes, GiB/s (best of several).
pub fn memcpy_gib_s(size: usize) -> f64 {
    let src = vec![3u8; size];
    let mut dst = vec![0u8; size];
    let mut best = f64::MAX;
    for _ in 0..8 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    size as f64 / best / (1u64 << 30) as f64
}
