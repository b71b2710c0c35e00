//! The TLS relay: a `tcp+tls:` session's worker talks plain frames over a unix socket pair,
//! and a thread of the node carries them to and from the TLS connection.
//!
//! Plain connections are handed to their worker as a descriptor, so the node is out of the
//! data path. A TLS connection cannot be: its session keys and sequence numbers live in this
//! process's rustls state, which cannot be moved to another process (kernel TLS could carry
//! it, but is not available on every host). The relay costs one more hop per message; the
//! benchmark (`gpufuse-bench remote`) reports TLS beside plain TCP.
//!
//! One thread per session, non-blocking sockets and `poll`: it moves what either side has,
//! never holds more than [`MAX_PENDING`] bytes for a side that does not read (the other side
//! then waits), and ends when either side closes: a client that leaves closes the worker's
//! socket (the worker sees its client hang up), a worker that exits sends the client a TLS
//! close_notify.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;

use rustls::{ServerConnection, StreamOwned};

/// Most bytes held for a side that is not reading.
const MAX_PENDING: usize = 4 << 20;
const CHUNK: usize = 256 * 1024;

/// Carries bytes between the client's TLS connection and the worker's socket until either
/// ends. `tls` has finished its handshake (the node read the hello through it).
pub fn run(tls: StreamOwned<ServerConnection, TcpStream>, worker: UnixStream, session: u64) {
    match relay(tls, worker) {
        Ok(()) => tracing::debug!("session {session}: TLS relay ended"),
        Err(e) => tracing::debug!("session {session}: TLS relay ended: {e}"),
    }
}

fn relay(tls: StreamOwned<ServerConnection, TcpStream>, mut worker: UnixStream) -> io::Result<()> {
    let StreamOwned { mut conn, mut sock } = tls;
    sock.set_nonblocking(true)?;
    worker.set_nonblocking(true)?;
    conn.set_buffer_limit(Some(MAX_PENDING));
    let mut to_worker: Vec<u8> = Vec::new();
    let mut from_worker: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    // Plaintext rustls decrypted while the node read the hello (none, normally).
    drain_plaintext(&mut conn, &mut to_worker)?;
    let mut client_closed = false;
    loop {
        // Client -> worker.
        if !client_closed && to_worker.len() < MAX_PENDING {
            match conn.read_tls(&mut sock) {
                Ok(0) => client_closed = true,
                Ok(_) => {
                    let state = conn
                        .process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    drain_plaintext(&mut conn, &mut to_worker)?;
                    client_closed = state.peer_has_closed();
                }
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
        write_some(&mut worker, &mut to_worker)?;
        if client_closed && to_worker.is_empty() {
            return Ok(()); // dropping `worker` tells the worker its client left
        }
        // Worker -> client.
        let mut worker_closed = false;
        if from_worker.is_empty() {
            match worker.read(&mut buf) {
                Ok(0) => worker_closed = true,
                Ok(n) => from_worker.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if !from_worker.is_empty() {
            let n = conn.writer().write(&from_worker)?;
            from_worker.drain(..n);
        }
        if worker_closed {
            conn.send_close_notify();
        }
        while conn.wants_write() {
            match conn.write_tls(&mut sock) {
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(e),
            }
        }
        if worker_closed && !conn.wants_write() {
            return Ok(());
        }
        let room = !client_closed && to_worker.len() < MAX_PENDING;
        wait(
            &sock,
            &worker,
            &conn,
            room,
            to_worker.len(),
            from_worker.len(),
        )?;
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

fn drain_plaintext(conn: &mut ServerConnection, out: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match conn.reader().read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            // The client's socket closed without close_notify: the next read_tls sees it.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

fn write_some(worker: &mut UnixStream, pending: &mut Vec<u8>) -> io::Result<()> {
    while !pending.is_empty() {
        match worker.write(pending) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if would_block(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sleeps until a side can make progress: readable where there is room, writable where
/// bytes wait.
#[allow(unsafe_code)]
fn wait(
    sock: &TcpStream,
    worker: &UnixStream,
    conn: &ServerConnection,
    room: bool,
    to_worker: usize,
    from_worker: usize,
) -> io::Result<()> {
    let mut sock_events = 0;
    if room {
        sock_events |= libc::POLLIN;
    }
    if conn.wants_write() {
        sock_events |= libc::POLLOUT;
    }
    let mut worker_events = 0;
    if from_worker == 0 {
        worker_events |= libc::POLLIN;
    }
    if to_worker > 0 {
        worker_events |= libc::POLLOUT;
    }
    let mut fds = [
        libc::pollfd {
            fd: sock.as_fd().as_raw_fd(),
            events: sock_events,
            revents: 0,
        },
        libc::pollfd {
            fd: worker.as_fd().as_raw_fd(),
            events: worker_events,
            revents: 0,
        },
    ];
    // A pending write rustls refused (its buffer is full) waits for the socket to drain.
    let timeout = if from_worker > 0 && !conn.wants_write() {
        1
    } else {
        -1
    };
    // SAFETY: `fds` is a live array of two pollfds for the call; both descriptors are owned
    // by `sock` and `worker`, borrowed for the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
