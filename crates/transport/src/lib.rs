//! Framed transports: unix sockets, shared-memory rings for a client on the node's host
//! ([`shm`]), TCP and TCP with TLS (`tcp+tls:`, rustls: see [`tls`]), all carrying
//! [`gpufuse_proto`] frames; and the host arena ([`arena`]), a local client's pinned memory that
//! its worker maps too.
//!
//! A [`Conn`] reads whole frames out of a buffered stream (many small frames cost one read
//! system call) and writes pre-encoded frames. It knows nothing about the messages; it checks
//! the header (magic, version, length cap) before it reads a body, so a peer cannot make it
//! allocate more than [`gpufuse_proto::MAX_BODY_LEN`].
//!
//! It must not start threads or touch global state: the shim uses it from inside the
//! application process.

#![deny(unsafe_code)] // allowed three times in conn.rs: `recv_fd_now`, a non-blocking read,
                      // `peek_exact`, a read that consumes nothing, and `poll_hang_up`, a poll
                      // that reads nothing; and in `shm` and `arena`, the modules that
                      // touch shared mappings

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
