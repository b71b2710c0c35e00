//! Framed transports: unix sockets, shared-memory rings for a client on the node's host
//! ([`shm`]), TCP and TCP with TLS (`tcp+tls:`, rustls: see [`tls`]), all carrying
//! [`gpufuse_proto`] frames; and the shared memory a session's processes use besides frames:
//! the host arena ([`arena`]), a local client's pinned memory that its worker maps too, CUDA
//! IPC's memfds ([`ipc`]) and the lease offer a worker shares with its node ([`lease_offer`]).
//!
//! A [`Conn`] reads whole frames out of a buffered stream (many small frames cost one read
//! system call) and writes pre-encoded frames. It knows nothing about the messages; it checks
//! the header (magic, version, length cap) before it reads a body, so a peer cannot make it
//! allocate more than [`gpufuse_proto::MAX_BODY_LEN`].
//!
//! - [`shm`]: the rings a local session moves to after its hello: a sealed memfd, eventfd
//!   doorbells, and the socket kept open for liveness only (`docs/protocol.md`, "Transports").
//! - [`ipc`]: CUDA IPC's shared memfds, each named with a random secret, and the 64-byte handle
//!   that finds one again through `/proc/PID/fd/N`.
//! - [`arena`]: the host arena that holds a local client's pinned memory (a second sealed memfd,
//!   sparse).
//!
//! The crate's only unsafe code is in the modules that touch shared mappings ([`shm`],
//! [`arena`], [`lease_offer`]) and in three system-call helpers of the connection.
//!
//! It must not start threads or touch global state: the shim uses it from inside the
//! application process.

#![deny(unsafe_code)] // allowed three times in conn.rs: `recv_fd_now`, a non-blocking read,
                      // `peek_exact`, a read that consumes nothing, and `poll_hang_up`, a poll
                      // that reads nothing; and in `shm`, `arena` and `lease_offer`, the
                      // modules that touch shared mappings

mod address;
pub mod arena;
mod conn;
pub mod ipc;
pub mod lease_offer;
pub mod shm;
pub mod tls;

pub use address::{Address, AddressError, Listener};
pub use conn::{wait_for_hang_up, Conn, Stream, TransportError};
pub use tls::{ClientTls, ServerTls, TlsError};
