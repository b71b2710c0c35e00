//! The exported driver functions, by area. Each module ends by including its generated
//! per-thread-stream aliases.

pub mod array;
pub mod context;
pub mod copy;
pub mod device;
pub mod graph;
pub mod graph_exec;
pub mod graph_nodes;
pub mod init;
pub mod ipc;
pub mod launch;
pub mod link;
pub mod listing;
pub mod managed;
pub mod memory;
pub mod module;
pub mod occupancy;
pub mod stream;
pub mod texture;
pub mod vmm;
