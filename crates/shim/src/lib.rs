//! gpufuse's `libcuda.so.1`: the CUDA driver API, exported for unmodified applications and
//! NVIDIA's own libraries, forwarded to a gpufuse server through [`gpufuse_client`].
//!
//! Every export has one shape: [`guard::guard`] around a body that checks its pointers through
//! [`ffi`] (the only code that dereferences application memory), talks to the session, and maps
//! the outcome to a `CUresult`. No panic crosses the FFI boundary.
//!
//! The export surface is every name a real driver exports (`gpufuse_cuda_types::DRIVER_EXPORTS`).
//! The implemented ones are declared as data in `exports.toml` (name, area, quiet or
//! synchronous, per-thread alias); `build.rs` generates from it the `_ptds`/`_ptsz` aliases, a
//! stub returning `CUDA_ERROR_NOT_SUPPORTED` for every other name, and the name-to-address map
//! that `cuGetProcAddress` serves after version resolution (`gpufuse_cuda_types::resolve_proc`).
//!
//! Nothing happens at load: no I/O, no threads. `cuInit` connects to `GPUFUSE_SERVER`.
//!
//! # Modules
//!
//! - [`api`], the exports by area: `init` (versions, `cuGetProcAddress`, `cuGetExportTable`,
//!   error strings), `context`, `device`, `memory`, `managed`, `vmm`, `array`, `texture`
//!   (texture and surface objects), `copy`, `stream`, `module`, `launch`, `occupancy`, `ipc`,
//!   `graph`, `graph_exec`, `listing` (`cuModuleEnumerateFunctions` and its kin, from the
//!   module's image: `gpufuse_fatbin::kernel_names`), `link` (the JIT linker `cuLink*`: inputs
//!   checked and linked in the client, the image a fatbin of the units' PTX that the device
//!   links again at load) and `graph_nodes` (`cuGraphAdd*Node` and the generic `cuGraphAddNode`:
//!   kernel, memcpy, memset, host, empty, memory allocation and free nodes become the
//!   operations a capture would record, replayed in the order added; conditional nodes (IF,
//!   WHILE, SWITCH) with their body graphs; child-graph nodes are not supported).
//!   `managed.rs`: the managed-memory exports; the client core keeps managed memory as a device
//!   allocation mapped at the same address in the client, moved whole to the device before
//!   device work and back after a synchronize, reporting no concurrent managed access; on a
//!   same-host session on an emulated GPU it is shared with the device through the host arena
//!   instead, reporting concurrent managed access (`ARCHITECTURE.md`, "Managed memory used by
//!   the host and the device at once"). `vmm.rs`: physical memory is charged at creation, and a
//!   mapping covers one whole physical allocation.
//! - [`dark_api`], the export tables ("dark API"): one registry of known UUIDs, each table
//!   sized as NVIDIA's driver 580 sizes it; unimplemented slots are per-slot fallbacks that
//!   report themselves once; a UUID nobody registered gets a table of fallbacks, never NULL,
//!   and only the UUIDs in `REFUSED` are refused, each with its reason. `cudart.rs`: the
//!   runtime's tables and its integrity check (computed by `gpufuse_runtime_integrity`);
//!   `tools.rs`: cuFFT's walk over a module's functions; `topology.rs`: cuBLASLt's `1734dc26`,
//!   whose refusal crashed every bf16/fp16 matmul. `docs/export-tables.md`, with
//!   `scripts/export_table_scan.py`'s static list of every UUID NVIDIA's libraries ask for.
//! - [`ffi`], [`guard`], [`image`] (module images from a bare pointer), [`global`] (the session,
//!   found without a process-wide lock), [`status`].
//!
//! `tests/export_table.rs` checks that the table, the built library and NVIDIA's list agree.
//! What the shim relies on from NVIDIA's runtime: `docs/driver-interception.md`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod api;
pub mod dark_api;
pub mod ffi;
pub mod global;
pub mod guard;
pub mod image;
pub mod status;

/// Stubs for driver functions gpufuse does not implement, the export address map, and the
/// export table (`exports.toml`) as [`exports::DECLARED`].
pub mod exports {
    /// How an export answers.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Call {
        /// Returns before the server has done the work; a failure is reported by a later
        /// synchronizing call, as CUDA reports asynchronous errors.
        Quiet,
        /// Answers with the outcome of the call itself.
        Sync,
    }

    /// One implemented export, as `exports.toml` declares it.
    #[derive(Debug, Clone, Copy)]
    pub struct Declared {
        pub name: &'static str,
        /// The module under `crate::api` that defines it.
        pub area: &'static str,
        pub call: Call,
        /// Its generated `_ptds`/`_ptsz` alias, if any.
        pub per_thread: Option<&'static str>,
    }

    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}

/// Marks this library as gpufuse's shim, so gpufuse's real-GPU backend never loads it as
/// NVIDIA's driver.
#[no_mangle]
pub static gpufuse_shim_version: [u8; 6] = *b"0.1.0\0";
