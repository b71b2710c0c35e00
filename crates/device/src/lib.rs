//! The `Device` trait: what a gpufuse worker needs from a GPU, and its backends.
//!
//! - [`emu`]: the emulated GPU (host memory, modules from PTX, kernels run by the PTX
//!   interpreter with a launch's blocks spread over the host's cores). Allocations are kept as
//!   64-bit words so that a launch's threads share them atomically (`emu/words.rs`, the crate's
//!   only `unsafe`); virtual memory management keeps physical memory apart from addresses and
//!   moves it into the address map when it is mapped (`emu/vmm.rs`). Modules come from PTX or
//!   fatbins, the PTX parsed once by `gpufuse_ptx` ([`ptx_layout`] reads kernels' parameter
//!   layouts and module variables, managed ones marked, from that parse): PTX that does not
//!   parse fails the load with `CUDA_ERROR_INVALID_PTX` and the reason; an image with only
//!   sm_10x SASS loads, its kernels listed from the cubin, and only its launches fail with
//!   `CUDA_ERROR_NO_BINARY_FOR_GPU`; an image of several units' PTX is linked at load, a link
//!   error failing it with `CUDA_ERROR_INVALID_IMAGE`. [`eager`] keeps its streams and events.
//!   Device models by compute capability ([`model`], `--devices emu:N:SIZE:sm_120`): B200-like
//!   10.0 by default; `sm_90`, the H200 as its driver reported itself (the conformance
//!   fixture); `sm_130`, a future model newer than any architecture CUDA 13.5 knows, on which
//!   cuBLAS and cuBLASLt take their PTX kernels for every GEMM shape; each with the occupancy
//!   rules (`model::blocks_per_sm`) and the limits' defaults (`model::default_limit`) the
//!   device answers with.
//! - [`cuda`]: a real NVIDIA GPU through NVIDIA's driver, loaded at run time (run on an H200 on
//!   2026-11-27: `docs/gpu-validation.md`). The session's window is reserved with
//!   `cuMemAddressReserve` and each allocation mapped with `cuMemCreate`/`cuMemMap`; modules are
//!   the client's own images, their layouts from `cuFuncGetParamInfo`; streams are driver
//!   streams with the application's flags and priority, events driver events; launches are
//!   enqueued and never waited for (cooperative ones with `cuLaunchCooperativeKernel`, more than
//!   48 KiB of dynamic shared memory opted in); device time comes from event pairs around each
//!   stream's run of launches (`Timing`, read once complete); occupancy and limits are asked of
//!   the driver; copies to module variables go where the driver put them. The client's host
//!   arena is copied in place through [`HostSpan`] (`Device::write_span`/`read_span`,
//!   asynchronous DMA on the stream) and page-locked by default: the pages large copies touch,
//!   each run's 2 MiB chunks marked first in the arena's pin map so that the client keeps
//!   (zeroes) those pages instead of giving them back ([`host_pins`],
//!   `gpufuse_transport::arena`). Applications get no virtual memory management here
//!   (attributes 102-105 read 0), only on [`emu`].
//!
//! The session state image is [`capture`]'s, versioned (`docs/state-capture.md`): per-range
//! `evict`/`bring_back` and whole-state `capture`/`rebuild` (on [`emu`] in `emu/capture.rs`).
//!
//! A device owns memory at stable device addresses (each session gets its own address window),
//! loaded modules and their functions, and the session's streams and events.
//!
//! **Work is enqueued, not waited for.** Launches, copies between device memory, memsets,
//! stream-ordered host copies and event records go on a stream ([`StreamId`]; 0 is the legacy
//! default stream, ordered against the session's blocking streams as CUDA orders it) and the
//! call returns. The worker waits only where the application waits: [`Device::synchronize`],
//! [`Device::sync_stream`], [`Device::sync_event`], the queries, and copies whose data the
//! application is waiting for ([`Device::read_on`]). The real GPU ([`cuda`]) maps streams and
//! events to the driver's; the emulated GPU ([`emu`]) runs each piece of work when it is
//! enqueued, so everything it is given has completed by the time the call returns: its queue
//! is always empty, and the same worker code serves both.
//!
//! Device time (what a session's compute share is charged) comes from the device:
//! [`Device::device_time`] reads it without waiting, [`Device::settle`] waits for the work in
//! flight first.
//!
//! Errors are CUDA status codes (`CUresult`), because that is what reaches the application;
//! launches and module loads return a [`DeviceError`], the status with its detail ([`status`]:
//! the generated `CUresult` values, `gpufuse_cuda_types::short`).

#![deny(unsafe_code)] // allowed only in emu/words.rs, the word views of device memory

pub mod capture;
pub mod cuda;
pub mod eager;
pub mod emu;
pub mod host_pins;
pub mod model;
pub mod ptx_layout;
pub mod status;

use gpufuse_proto::{DeviceInfo, FunctionInfo};

pub use capture::{CaptureRefused, DeviceImage};
pub use gpufuse_cuda_driver::HostSpan;
pub use status::{DeviceError, Status};

/// A loaded module, as the device knows it.
pub type ModuleId = u64;
/// A stream of the session, named by the worker's id for it; 0 is the legacy default stream.
pub type StreamId = u64;
/// An event of the session, named by the worker's id for it.
pub type EventId = u64;

/// What a worker asks of a GPU. Every call validates its arguments and returns a CUDA status
/// for bad ones; none panics on input from a client.
pub trait Device: Send {
    /// Name, UUID, memory and every attribute, with `total_mem` set to `limit` if given.
    fn info(&self, limit: Option<u64>) -> DeviceInfo;
    /// Allocates `size` bytes; returns the device address.
    fn alloc(&mut self, size: u64) -> Result<u64, Status>;
    /// Frees the allocation starting at `ptr`; returns its size.
    fn free(&mut self, ptr: u64) -> Result<u64, Status>;
    /// Whether `[ptr, ptr+len)` lies inside one allocation.
    fn contains(&self, ptr: u64, len: u64) -> bool;
    /// Writes `data` at `dst` now, outside every stream: for a session none of whose work is
    /// in flight (migration, eviction, module set-up), after [`Device::synchronize`].
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Status>;
    /// Reads `[src, src + out.len())` now, as [`Device::write`].
    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<(), Status>;
    /// Writes `data` at `dst` on `stream`, after the stream's earlier work; `data` has been
    /// taken when this returns.
    fn write_on(&mut self, dst: u64, data: &[u8], _stream: StreamId) -> Result<(), Status> {
        self.write(dst, data)
    }
    /// Reads `[src, src + out.len())` on `stream`: waits for the stream's earlier work and the
    /// copy (the application is waiting for these bytes).
    fn read_on(&mut self, src: u64, out: &mut [u8], _stream: StreamId) -> Result<(), Status> {
        self.read(src, out)
    }
    /// The bytes at `[src, src+len)` in place, if the backend keeps device memory in host
    /// memory (the emulated GPU): device-to-host replies are then sent without a copy.
    fn view(&self, _src: u64, _len: u64) -> Option<&[u8]> {
        None
    }
    /// The bytes at `[dst, dst+len)` to write in place, if the backend keeps device memory in
    /// host memory: large host-to-device copies are then received straight into them.
    fn view_mut(&mut self, _dst: u64, _len: u64) -> Option<&mut [u8]> {
        None
    }
    /// Copies `src` (host memory another process may write too: the client's host arena) to
    /// `dst` on `stream`. The copy may read `src` until the stream passes it (page-locked
    /// memory: DMA), as CUDA's asynchronous copies from page-locked memory do. The default
    /// reads it into a buffer first.
    fn write_span(&mut self, dst: u64, src: HostSpan, stream: StreamId) -> Result<(), Status> {
        let mut data = vec![0u8; src.len()];
        src.copy_to(&mut data);
        self.write_on(dst, &data, stream)
    }
    /// Copies `[src, src + dst.len())` into `dst` (as [`Device::write_span`]'s `src`) on
    /// `stream`; the bytes are in place once the stream has passed the copy.
    fn read_span(&mut self, src: u64, dst: HostSpan, stream: StreamId) -> Result<(), Status> {
        let mut data = vec![0u8; dst.len()];
        self.read_on(src, &mut data, stream)?;
        dst.copy_from(&data);
        Ok(())
    }
    /// The client's host arena, which later `*_span` copies lie in, and its pin map (`None`:
    /// the client keeps none): a backend may page-lock the parts large copies use so that they
    /// run as DMA, marking them in the map first (the real GPU: [`host_pins`]). Both stay
    /// mapped while the device lives.
    fn host_arena(&mut self, _arena: HostSpan, _pin_map: Option<HostSpan>) -> Result<(), Status> {
        Ok(())
    }
    /// Allocates `size` bytes whose memory is `backing`: host memory another process (a
    /// same-host client) maps at the returned address and uses at the same time as the device
    /// (managed memory with concurrent access). The backend never views it as plain bytes:
    /// copies are word copies, kernels' accesses atomics on the same words. Freed with
    /// [`Device::free`]; never evicted ([`Device::resident`] leaves it out), and a capture is
    /// refused while one exists. `backing` must stay mapped while the device lives. The
    /// address is a multiple of 64 KiB. Backends that keep device memory elsewhere refuse
    /// (`CUDA_ERROR_NOT_SUPPORTED`).
    fn alloc_shared(&mut self, _size: u64, _backing: HostSpan) -> Result<u64, Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Moves the allocation at `ptr` (its base) into `backing`, host memory another process may
    /// map too (CUDA IPC: `cuIpcGetMemHandle`), contents and address kept: from then on it is
    /// [`Device::alloc_shared`]'s memory (word accesses only, never evicted, no capture while it
    /// lives) until [`Device::free`]. `backing` must stay mapped while the allocation lives and
    /// hold its whole words. `CUDA_ERROR_INVALID_VALUE` for a pointer that is not an
    /// allocation's base or an allocation already shared; backends that keep device memory
    /// elsewhere refuse (`CUDA_ERROR_NOT_SUPPORTED`).
    fn share(&mut self, _ptr: u64, _backing: HostSpan) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// As [`Device::share`], for physical memory (`create_physical`'s id), mapped or not.
    fn share_physical(&mut self, _physical: u64, _backing: HostSpan) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Physical memory of `size` bytes whose memory is `backing` (memory another process
    /// exported, [`Device::share_physical`]'s there): word accesses only, never evicted, no
    /// capture while it lives. `backing` must stay mapped while the device lives.
    fn create_physical_shared(&mut self, _size: u64, _backing: HostSpan) -> Result<u64, Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Makes the client's whole host arena (the last [`Device::host_arena`]) addressable by
    /// kernels at `base`, where the client maps it: page-locked memory under unified
    /// addressing, host memory the client uses at the same time (the backend treats it as
    /// [`Device::alloc_shared`]'s memory: word accesses only). Not an allocation: nothing
    /// charges, frees, copies, evicts or captures it; a later call (a new arena) replaces it.
    /// Refused with `CUDA_ERROR_NOT_SUPPORTED` by backends that keep device memory elsewhere,
    /// and when the range would overlap the session's device addresses.
    fn map_host_arena(&mut self, _base: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// `cuCtxSetLimit` of a limit the device applies itself: `CU_LIMIT_PRINTF_FIFO_SIZE` (1)
    /// and `CU_LIMIT_MALLOC_HEAP_SIZE` (2; `CUDA_ERROR_INVALID_VALUE` once a kernel's heap
    /// exists). Backends that keep no such limit answer `CUDA_ERROR_NOT_SUPPORTED`.
    fn set_limit(&mut self, _limit: u32, _value: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// The value of a `CUlimit` the application has not set: what the device's driver
    /// answers (`CUDA_ERROR_INVALID_VALUE` for a limit it does not know).
    fn limit(&mut self, limit: u32) -> Result<u64, Status>;
    /// Blocks that one multiprocessor holds at once for `function` of `module` in the
    /// configuration `q` (`cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`): the device
    /// decides, so the answer is the GPU's own on a real one.
    fn occupancy(&mut self, module: ModuleId, function: &str, q: Occupancy) -> Result<i32, Status>;
    /// Copies device memory on `stream`.
    fn copy(&mut self, dst: u64, src: u64, len: u64, stream: StreamId) -> Result<(), Status>;
    /// Sets `count` elements of `elem_size` (1, 2 or 4) bytes at `dst` to `value`, on `stream`.
    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: StreamId,
    ) -> Result<(), Status>;
    /// A stream with CUDA's `flags` (`CU_STREAM_NON_BLOCKING` = 1: not ordered against the
    /// legacy default stream) and `priority` (0 the lowest, negative higher, as CUDA's).
    fn create_stream(&mut self, stream: StreamId, flags: u32, priority: i32) -> Result<(), Status>;
    /// Forgets a stream; work already on it still runs.
    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), Status>;
    /// An event with CUDA's `flags` (`CU_EVENT_DISABLE_TIMING` = 2).
    fn create_event(&mut self, event: EventId, flags: u32) -> Result<(), Status>;
    fn destroy_event(&mut self, event: EventId) -> Result<(), Status>;
    /// The event completes when `stream`'s work before it has.
    fn record(&mut self, event: EventId, stream: StreamId) -> Result<(), Status>;
    /// `stream`'s later work waits for the event's last record.
    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), Status>;
    /// Whether the event's last record has completed (never recorded: complete).
    fn event_done(&mut self, event: EventId) -> Result<bool, Status>;
    /// Waits for the event's last record.
    fn sync_event(&mut self, event: EventId) -> Result<(), Status>;
    /// Milliseconds between two completed records (`cuEventElapsedTime`).
    fn elapsed(&mut self, start: EventId, end: EventId) -> Result<f32, Status>;
    /// Whether all of `stream`'s work has completed.
    fn stream_done(&mut self, stream: StreamId) -> Result<bool, Status>;
    /// Waits for `stream`'s work (the legacy stream: and the blocking streams' before it).
    fn sync_stream(&mut self, stream: StreamId) -> Result<(), Status>;
    /// Waits for all the session's work. A fault of work in flight (an illegal address) is
    /// returned here, by the other waits and the queries.
    fn synchronize(&mut self) -> Result<(), Status>;
    /// The device time the session's kernels have used, read without waiting: what completed
    /// work measured, plus, while work is in flight, the time since the device started on it.
    fn device_time(&mut self) -> std::time::Duration;
    /// Ends the timing of the work enqueued so far, so that [`Device::device_time`] reads it
    /// once it has completed (the worker gives its lease back).
    fn flush_timing(&mut self) {}
    /// When the event's last record completed, as a time ago (a move carries it), if the
    /// device can tell.
    fn event_age(&mut self, _event: EventId) -> Option<std::time::Duration> {
        None
    }
    /// Makes the event's last record `age` ago (a session moved here).
    fn set_event_age(&mut self, _event: EventId, _age: std::time::Duration) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Whether work may still be in flight (a device that runs work when it is enqueued: never).
    fn busy(&mut self) -> bool {
        false
    }
    /// Waits for the work in flight, then [`Device::device_time`]: exact.
    fn settle(&mut self) -> std::time::Duration {
        let _ = self.synchronize();
        self.device_time()
    }
    /// Loads a module image (fatbin, cubin or PTX); a refusal says why (the PTX error, what a
    /// link lacks).
    fn load_module(&mut self, image: &[u8]) -> Result<ModuleId, DeviceError>;
    fn unload_module(&mut self, module: ModuleId) -> Result<(), Status>;
    /// Virtual memory management: physical memory of `size` bytes, mapped nowhere yet.
    fn create_physical(&mut self, _size: u64) -> Result<u64, Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Frees physical memory now, or when it is unmapped.
    fn release_physical(&mut self, _physical: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Reserves `size` bytes of the session's address space, aligned to `align`.
    fn reserve(&mut self, _size: u64, _align: u64) -> Result<u64, Status> {
        Err(status::NOT_SUPPORTED)
    }
    fn unreserve(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Maps all of `physical` at `ptr`, which must lie in a reservation.
    fn map(&mut self, _ptr: u64, _physical: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Unmaps every mapping inside `[ptr, ptr+size)`.
    fn unmap(&mut self, _ptr: u64, _size: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Device memory a loaded module holds (its `__device__` and `__constant__` variables),
    /// which the session is charged for. A backend that cannot tell says 0.
    fn module_bytes(&self, _module: ModuleId) -> u64 {
        0
    }
    /// A kernel's parameter layout and attributes.
    fn function(&mut self, module: ModuleId, name: &str) -> Result<FunctionInfo, Status>;
    /// A module variable's address and size.
    fn global(&mut self, module: ModuleId, name: &str) -> Result<(u64, u64), Status>;
    /// Enqueues a kernel on its stream. A failure says why where the device can (an
    /// unsupported instruction, the illegal address), for the worker's log; a fault while the
    /// kernel runs may instead come from a later wait.
    fn launch(&mut self, launch: &KernelLaunch) -> Result<(), DeviceError>;
    /// Makes `nodes` one graph of the device's own, `graph`, launched whole by
    /// [`Device::launch_graph`] (a real GPU: one driver graph, one driver call per launch).
    /// Defining it again replaces it. A device without graphs refuses
    /// (`CUDA_ERROR_NOT_SUPPORTED`): the worker then runs the nodes one by one.
    fn define_graph(&mut self, _graph: u64, _nodes: &[GraphNode]) -> Result<(), DeviceError> {
        Err(status::NOT_SUPPORTED.into())
    }
    /// Enqueues a defined graph on `stream`.
    fn launch_graph(&mut self, _graph: u64, _stream: StreamId) -> Result<(), DeviceError> {
        Err(status::NOT_SUPPORTED.into())
    }
    /// Forgets a defined graph (work it launched still runs).
    fn destroy_graph(&mut self, _graph: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Device-side `printf` output of the launches so far, not yet taken, in order.
    fn take_output(&mut self) -> Vec<u8> {
        Vec::new()
    }
    /// Makes `handle` a texture or surface object over the memory `desc` describes (the
    /// worker has checked that the memory lies in one allocation). Kernels get the handle.
    fn create_texture(
        &mut self,
        _handle: u64,
        _desc: &gpufuse_proto::TexObjectDesc,
    ) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Forgets a texture or surface object.
    fn destroy_texture(&mut self, _handle: u64) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Every range of device memory the session holds now, resident: its allocations, mapped
    /// VMM memory, module variables and what the device made for itself (the device heap, the
    /// cooperative workspace), as (address, size). Unmapped VMM physical memory, which has no
    /// address, is named by a key outside every address window (the emulated GPU's
    /// `PHYSICAL_KEY` bit with its id): it is evicted and brought back like a range, and is no
    /// address to copy from.
    fn resident(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }
    /// Moves the contents of the range at `ptr` (one of [`Device::resident`]'s) out of device
    /// memory and gives its device memory back; the address stays the session's. Until
    /// [`Device::bring_back`], nothing may touch it.
    fn evict(&mut self, _ptr: u64) -> Result<Vec<u8>, Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// Makes an evicted range resident again at the same address with `contents`.
    fn bring_back(&mut self, _ptr: u64, _contents: &[u8]) -> Result<(), Status> {
        Err(status::NOT_SUPPORTED)
    }
    /// The session's whole device state (every range resident), for [`Device::rebuild`] on
    /// this or another device. What cannot be captured is refused with the reason, and the
    /// device is left as it was.
    fn capture(&mut self) -> Result<DeviceImage, CaptureRefused> {
        Err(CaptureRefused::not_supported(
            "this backend cannot capture a session's state",
        ))
    }
    /// Rebuilds a captured state on this device, which must be fresh (nothing allocated or
    /// loaded) and serve the same address window: the same addresses, module ids, VMM ids and
    /// texture handles as where it was captured.
    fn rebuild(&mut self, _image: &DeviceImage) -> Result<(), CaptureRefused> {
        Err(CaptureRefused::not_supported(
            "this backend cannot rebuild a session's state",
        ))
    }
    /// [`Device::capture`] without the allocations' contents (each `contents` empty): the
    /// session's layout, which [`Device::rebuild`] makes on a fresh device with those ranges
    /// zeroed, for a migration that copies the contents itself while the session runs
    /// (pre-copy). A backend without it captures everything.
    fn capture_layout(&mut self) -> Result<DeviceImage, CaptureRefused> {
        self.capture()
    }
    /// The start addresses of the resident ranges ([`Device::resident`]) the last launch
    /// looked up (read or written: a superset of what it wrote), or `None` when the device
    /// cannot tell (then any range may have been written).
    fn last_launch_touched(&self) -> Option<Vec<u64>> {
        None
    }
    /// After the session moved away: takes every resident range out of this device, returned
    /// as one owner the caller may drop elsewhere (giving a large range's pages back takes a
    /// while), or `None` when the backend frees them only through [`Device::free`]. The device
    /// serves nothing afterwards.
    fn detach_memory(&mut self) -> Option<Box<dyn Send>> {
        None
    }
}

/// An occupancy question: blocks of `block` threads with `dyn_smem` bytes of dynamic shared
/// memory, for a function that may use at most `max_dyn_smem` bytes of it (its
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; `u32::MAX`: not known, no limit), with
/// the driver's `flags`.
#[derive(Clone, Copy, Debug)]
pub struct Occupancy {
    pub block: u32,
    pub dyn_smem: u64,
    pub max_dyn_smem: u32,
    pub flags: u32,
}

/// One node of a device graph ([`Device::define_graph`]).
#[derive(Debug, Clone)]
pub enum GraphNode {
    Launch {
        module: ModuleId,
        function: String,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        params: Vec<u8>,
        cooperative: bool,
    },
    Copy {
        dst: u64,
        src: u64,
        len: u64,
    },
    Memset {
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
    },
}

/// A kernel launch as the device runs it.
#[derive(Debug, Clone)]
pub struct KernelLaunch<'a> {
    pub module: ModuleId,
    pub function: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub params: &'a [u8],
    pub stream: StreamId,
    /// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE` (`cuLaunchCooperativeKernel`): every block resident
    /// at once, the grid no larger than the device holds at a time.
    pub cooperative: bool,
    /// Once set, the launch stops early and fails (the emulated GPU looks at it between turns
    /// of each block's warps); the worker sets it when the session's client is gone. A real
    /// GPU's kernel cannot be stopped this way: it ends with its process.
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
}
