//! The gpufuse client core: everything the shim needs that is not FFI.
//!
//! It owns the session's connection ([`connection`]), the batching of quiet calls, the
//! staging of device-to-host data that arrives with a later reply, and the handle and
//! allocation tables ([`state`]) that let most queries and checks be answered locally.
//!
//! It must not do I/O or start threads until the first CUDA call asks for the session (the shim
//! is loaded into arbitrary processes), and it never panics on anything the server sends.

pub mod connection;
pub mod error;
pub mod graph;
pub mod handles;
pub mod state;
pub mod status;

pub use connection::Connection;
pub use error::ClientError;
pub use state::{Session, SessionConfig};
