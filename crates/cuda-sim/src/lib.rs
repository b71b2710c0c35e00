//! A simulated NVIDIA driver: a stand-in `libcuda.so.1` for CI.
//!
//! **This is a test double, never a product path.** It runs no kernel code and talks to no
//! GPU. It exists so that gpufuse's real-GPU backend (`gpufuse-cuda-driver` and the code on
//! top of it) can be exercised on machines without NVIDIA hardware: its control flow, its
//! ordering of asynchronous work, its waits, its error handling. It is loaded from an explicit
//! path only (`GPUFUSE_CUDA_DRIVER=/path/to/libgpufuse_cuda_sim.so`, see
//! `gpufuse_cuda_driver::Driver::load`); it does not export `gpufuse_shim_version`, which the
//! loader refuses.
//!
//! # What it exports
//!
//! Every entry point `gpufuse-cuda-driver` resolves (`crates/cuda-driver/src/raw.rs`), with
//! cuda.h's C signatures. Each export catches panics and returns a `CUresult`; bad handles and
//! arguments get the codes NVIDIA's driver gives (`CUDA_ERROR_INVALID_VALUE` for NULL
//! out-pointers and bad sizes, `CUDA_ERROR_INVALID_HANDLE` for unknown streams, events,
//! functions, modules and graphs, `CUDA_ERROR_INVALID_DEVICE`, `CUDA_ERROR_INVALID_CONTEXT`
//! without a current context, `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`, `CUDA_ERROR_NOT_READY`
//! from queries, ...).
//!
//! # What it simulates
//!
//! * **Devices**: `GPUFUSE_SIM_DEVICES` of them, each "gpufuse simulated GPU", an H200-like
//!   device (compute capability 9.0, 132 SMs, 1024 threads per block, unified addressing,
//!   virtual memory management) with `GPUFUSE_SIM_MEM` bytes of memory and a 16-byte UUID
//!   derived from its ordinal. One primary context each (`cuDevicePrimaryCtxRetain`,
//!   `cuCtxSetCurrent` makes it current on the calling thread).
//! * **Memory**: the virtual memory management API only (granularity 2 MiB): reservations,
//!   physical allocations backed by zeroed host memory allocated on demand (only pages touched
//!   cost RAM), mappings, access. A copy or memset to memory not mapped with read/write access
//!   is refused with `CUDA_ERROR_INVALID_VALUE`. Copies and memsets really move the bytes.
//!   `cuMemHostRegister_v2` keeps a registry of page-locked host ranges: a copy from or to a
//!   registered range is "DMA" (fast, asynchronous), any other host memory is "pageable".
//! * **Modules**: PTX text only (anything else is `CUDA_ERROR_INVALID_IMAGE`). The sim reads
//!   each `.entry`'s name and parameter list (for `cuFuncGetParamInfo`, launches), `.maxntid`,
//!   static `.shared` sizes, and the module's `.global`/`.const` variables (allocated in
//!   simulated memory, with their initializers, for `cuModuleGetGlobal_v2`). A `.target`
//!   newer than `sm_90` is `CUDA_ERROR_INVALID_PTX`.
//! * **Kernels**: run no code. A kernel takes, on the simulated timeline, the number of
//!   microseconds its name says: a name containing `_us<N>` (`spin_us20`) runs N us, any other
//!   5 us. A kernel whose name starts with `sim_add_u32` and whose parameters are
//!   `(.u64 ptr, .u32 n, .u32 value)` adds `value` (wrapping) to the `n` 32-bit words at
//!   `ptr` when it completes, so tests can check ordering. If those words are not mapped (or
//!   any op's memory was unmapped before it completed), the context gets
//!   `CUDA_ERROR_ILLEGAL_ADDRESS`, returned once, by the next `cuCtxSynchronize`,
//!   `cuStreamSynchronize` or `cuStreamQuery`.
//! * **The timeline** is wall time. Each device has one compute engine (kernels, device to
//!   device copies and memsets at 1000 GB/s, one op at a time) and two copy engines (host to
//!   device, device to host), which run concurrently with compute at
//!   `GPUFUSE_SIM_PINNED_GBPS` for page-locked host memory and `GPUFUSE_SIM_PAGEABLE_GBPS`
//!   for pageable memory. An op is ready at the latest of: its enqueue time, the end of its
//!   stream's previous op, and the events its stream waits for; it starts at the first time
//!   from then on that its engine is free for as long as it takes (an engine runs what is
//!   ready: an op ready early may run before work enqueued earlier that still waits).
//!   Its effects (bytes written to device memory or to page-locked host memory, a
//!   `sim_add_u32`) happen at its completion time: they are applied whenever a call enters the
//!   library and when a wait ends, so a caller reading page-locked host memory before
//!   synchronizing can see stale data, as on a GPU; host memory handed to an asynchronous copy
//!   must stay mapped until the copy completes, as CUDA requires.
//!   CUDA's pageable rules: `cuMemcpyHtoDAsync` from pageable memory reads the source at the
//!   call and returns after its transfer time; `cuMemcpyDtoHAsync` into pageable memory
//!   returns when the copy has completed. Synchronous copies and memsets run on the legacy
//!   default stream and return when done.
//! * **Streams**: blocking (flags 0) and non-blocking (`CU_STREAM_NON_BLOCKING`) streams, and
//!   the legacy NULL stream (also `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, both treated
//!   as the legacy stream) with its implicit synchronization: its work waits for all earlier
//!   work of the context's blocking streams, and their later work waits for it.
//! * **Events**: record, query, synchronize, elapsed time (milliseconds between completion
//!   times), `CU_EVENT_DISABLE_TIMING`, `cuStreamWaitEvent`.
//! * **Graphs by stream capture**: work issued to a capturing stream is recorded, not run;
//!   `cuStreamEndCapture` gives a graph, `cuGraphInstantiateWithFlags` an executable graph,
//!   and one `cuGraphLaunch` enqueues all its nodes in order. Synchronizing or querying a
//!   capturing stream is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the capture;
//!   legacy-stream work while a blocking stream captures is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
//!
//! # Environment
//!
//! Read once, at the first successful `cuInit`:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GPUFUSE_SIM_DEVICES` | number of devices (0: `cuInit` fails with `CUDA_ERROR_NO_DEVICE`) | 1 |
//! | `GPUFUSE_SIM_MEM` | memory per device, bytes (suffixes `K`, `M`, `G`, `T`, `KiB`, ... are binary) | 8 GiB |
//! | `GPUFUSE_SIM_PINNED_GBPS` | host to device and device to host rate for page-locked memory, GB/s | 50 |
//! | `GPUFUSE_SIM_PAGEABLE_GBPS` | the same for pageable memory, GB/s | 8 |
//!
//! An unparsable value makes `cuInit` fail with `CUDA_ERROR_INVALID_VALUE` (and a message on
//! stderr).
//!
//! # The test double's own exports
//!
//! Not part of NVIDIA's API: [`gpufuse_sim_stats`] fills a [`SimStats`] (counters since load
//! or since the last [`gpufuse_sim_reset_stats`]), for tests and benchmarks that check what
//! the backend asked of the driver: how many calls, launches, graph launches, synchronizations,
//! how many bytes went page-locked versus pageable, how busy the compute engine was, how deep
//! the queues got. Resolve them with `dlsym` from the same library handle as the driver.

mod api;
mod config;
mod ffi;
mod guard;
mod memory;
mod ptx;
mod state;
mod tables;
mod timeline;

/// Counters the test double keeps (its own export, [`gpufuse_sim_stats`]; not NVIDIA's).
/// All counters are since the library was loaded or since [`gpufuse_sim_reset_stats`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Calls to the driver's entry points (the `gpufuse_sim_*` exports not included).
    pub driver_calls: u64,
    /// Accepted `cuLaunchKernel` and `cuLaunchCooperativeKernel` calls, captured or not.
    pub kernel_launches: u64,
    /// Kernels put on the timeline, by launches or by graph launches.
    pub kernels_run: u64,
    /// Accepted `cuGraphLaunch` calls.
    pub graph_launches: u64,
    /// `cuCtxSynchronize` calls.
    pub ctx_synchronizes: u64,
    /// `cuStreamSynchronize` calls.
    pub stream_synchronizes: u64,
    /// `cuEventSynchronize` calls.
    pub event_synchronizes: u64,
    /// `cuStreamQuery` calls.
    pub stream_queries: u64,
    /// `cuEventQuery` calls.
    pub event_queries: u64,
    /// Host to device bytes copied from page-locked (registered) host memory: DMA.
    pub htod_dma_bytes: u64,
    /// Host to device bytes copied from pageable host memory.
    pub htod_pageable_bytes: u64,
    /// Device to host bytes copied into page-locked host memory: DMA.
    pub dtoh_dma_bytes: u64,
    /// Device to host bytes copied into pageable host memory.
    pub dtoh_pageable_bytes: u64,
    /// Device to device bytes copied.
    pub dtod_bytes: u64,
    /// Bytes set by memsets.
    pub memset_bytes: u64,
    /// Nanoseconds the compute engines were busy with completed ops (kernels, device to device
    /// copies, memsets), all devices together.
    pub compute_busy_ns: u64,
    /// Nanoseconds callers spent blocked in the library (synchronizations, synchronous and
    /// pageable copies).
    pub host_blocked_ns: u64,
    /// Ops put on the timeline (kernels, copies, memsets).
    pub ops_enqueued: u64,
    /// The most ops that were enqueued and not yet complete at once.
    pub max_queued_ops: u64,
    /// Ops that found their memory unmapped when they completed (each sets
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` on its context).
    pub faults: u64,
}

/// Copies the test double's counters to `*out`. Returns 0, or 1 (`CUDA_ERROR_INVALID_VALUE`)
/// for a NULL `out`. The test double's own export, not NVIDIA's.
///
/// # Safety
/// `out` must be NULL or valid for writing one [`SimStats`].
#[no_mangle]
pub unsafe extern "C" fn gpufuse_sim_stats(out: *mut SimStats) -> i32 {
    guard::stats_call(|s| {
        // SAFETY: `out` is NULL or writable, as this function's contract says.
        unsafe { ffi::put(out, s.stats) }
    })
}

/// Sets every counter of [`SimStats`] to zero. Returns 0. The test double's own export, not
/// NVIDIA's.
#[no_mangle]
pub extern "C" fn gpufuse_sim_reset_stats() -> i32 {
    guard::stats_call(|s| {
        s.stats = SimStats::default();
        s.stats.max_queued_ops = s.pending.len() as u64;
        Ok(())
    })
}
