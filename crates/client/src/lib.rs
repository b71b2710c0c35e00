//! The gpufuse client core: everything the shim needs that is not FFI, and CUDA's meaning.
//!
//! It owns the session's connection ([`connection`]), the batching of quiet calls, the
//! staging of device-to-host data that arrives with a later reply, and the session's tables
//! ([`state`], private to the crate) that let most queries and checks be answered locally.
//! Each driver operation is one method of the locked session (`Session::lock()`), by area:
//! - [`context`]; [`memory`] (allocation kinds as one [`memory::MemoryKind`]; managed memory's
//!   hand-over); [`ipc`] (CUDA IPC handles; a record of an interprocess event waits for its
//!   work); [`host`]; [`registered`] (`cuMemHostRegister`ed memory's whole pages moved into the
//!   host arena in place, and back); [`pools`]; [`copy`]; [`vmm`]; [`texture`];
//! - [`launch`] (parameter packing, `Session::launch_kernel`); [`stream`];
//! - [`module`] (lazy loading: a fatbin or cubin reaches the worker, by content hash first,
//!   when one of its kernels or variables is first asked for; libraries are loaded again after
//!   a reset; `docs/module-loading.md`);
//! - [`graph`] and [`graph_ops`] (capture, instantiation, replay), [`graph_update`].
//!
//! Quiet launches on streams other than the legacy default stream go through per-stream
//! [`lanes`] without the session lock; `Session::lock()` drains them first. Device work
//! reaches the worker only through [`work`], where managed memory is handed to the device, and
//! every synchronizing call ends in its one synchronize sequence. [`reconnect`]:
//! `Session::reconnect(addr)` issues everything the session owns again on another worker, with
//! the same handles and addresses (the migration hook). [`status`]: `CUresult` with every value
//! of `cuda.h`, generated (`gpufuse_cuda_types::short`).
//!
//! `tests/session.rs` drives the core against real workers on emulated GPUs over unix sockets.
//!
//! It must not do I/O or start threads until the first CUDA call asks for the session (the shim
//! is loaded into arbitrary processes), and it never panics on anything the server sends.

pub mod connection;
pub mod context;
pub mod copy;
pub mod error;
pub mod graph;
pub mod graph_ops;
pub mod graph_update;
pub mod handles;
pub mod host;
pub mod ipc;
pub mod lanes;
pub mod launch;
pub mod memory;
pub mod module;
pub mod pools;
pub mod reconnect;
pub mod registered;
pub mod state;
pub mod status;
pub mod stream;
pub mod texture;
pub mod vmm;
pub mod work;

pub use connection::{Connection, Transport};
pub use error::ClientError;
pub use state::{Session, SessionConfig};
