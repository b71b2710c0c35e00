//! The real-GPU backend: one NVIDIA GPU driven through NVIDIA's `libcuda.so.1`, loaded at run
//! time by `gpufuse-cuda-driver` (building needs no CUDA).
//!
//! Memory: the session's whole address window is reserved once with `cuMemAddressReserve`
//! (at the window's base when the driver grants it), and each allocation maps fresh physical
//! memory (`cuMemCreate` + `cuMemMap`, then zeroed: nothing another session left in reused
//! pages reaches this one) at the next free range of that reservation. Device
//! addresses therefore belong to gpufuse, not to the driver's allocator: evicting a session's
//! memory or moving it to another GPU can remap the same addresses later.
//!
//! Modules are the client's own images (fatbins with SASS and PTX, cubins, PTX), loaded with
//! `cuModuleLoadData`; parameter layouts come from `cuFuncGetParamInfo` (driver >= 12.4).
//!
//! Work is asynchronous, as on the GPU: each of the session's streams is a driver stream with
//! the application's flags and priority, the legacy default stream is the context's NULL
//! stream (so CUDA's implicit ordering between them is the driver's own), events are driver
//! events, and launches, copies and memsets are enqueued without waiting. Device time is
//! measured by the GPU ([`Timing`]): a pair of events brackets each stream's run of launches,
//! and the pairs are read when they have completed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gpufuse_cuda_driver::{
    CUdevice, Driver, DriverError, Event, Function, GraphExec, HostSpan, Module, Stream,
};
use gpufuse_proto::{DeviceInfo, DeviceKind, FunctionInfo, ParamSlot};

use crate::host_pins::HostPins;
use crate::status::*;
use crate::{Device, EventId, GraphNode, KernelLaunch, ModuleId, StreamId};

/// Dynamic shared memory a launch may use without the function's opt-in.
const DEFAULT_SHARED_LIMIT: u32 = 48 << 10;
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;

/// One mapping: its size as asked, its mapped (granularity-rounded) size, its physical handle.
struct Mapping {
    size: u64,
    mapped: u64,
    handle: u64,
}

struct Loaded {
    module: Module,
    functions: HashMap<String, Function>,
    /// The module variables asked for: address -> size. They live where the driver put them,
    /// outside the session's window, and copies to and from them are allowed.
    globals: BTreeMap<u64, u64>,
    /// Parameter layouts of the functions launched cooperatively.
    layouts: HashMap<String, Vec<(u32, u32)>>,
}

/// A GPU as one session sees it.
pub struct CudaDevice {
    driver: Driver,
    dev: CUdevice,
    index: u32,
    /// The reserved window: `[base, base + window)`.
    base: u64,
    window: u64,
    next: u64,
    granularity: u64,
    mappings: BTreeMap<u64, Mapping>,
    modules: HashMap<ModuleId, Loaded>,
    next_module: ModuleId,
    info: DeviceInfo,
    /// The client's host arena and the parts of it page-locked with the driver.
    pins: HostPins,
    arena: Option<HostSpan>,
    /// The arena's pin map: one byte per `host_pins::CHUNK`, set before locking there.
    pin_map: Option<HostSpan>,
    /// The session's streams (0, the legacy default stream, is the driver's NULL stream).
    streams: HashMap<StreamId, Stream>,
    /// The session's events; `bool`: recorded at least once.
    events: HashMap<EventId, (Event, bool)>,
    timing: Timing,
    /// Graphs made driver graphs (`define_graph`), and the private stream they are captured on.
    graphs: HashMap<u64, GraphExec>,
    capture: Option<Stream>,
}

/// Device time as the GPU measures it: each stream's run of launches is bracketed by a start
/// event (recorded before its first launch) and an end event (recorded when the run is closed:
/// when the worker waits, ends its lease or reads the time), and a bracket's time is read once
/// its end event has completed. Runs on different streams that overlap are each counted, as
/// CPU time is counted per thread.
#[derive(Default)]
struct Timing {
    /// Streams with a run open: the driver's stream (a stream is destroyed only after its
    /// run is closed) and the run's start event.
    open: HashMap<StreamId, (Stream, Event)>,
    /// Closed runs not yet read, oldest first.
    pending: std::collections::VecDeque<(Event, Event)>,
    completed: Duration,
    /// Events to reuse.
    spare: Vec<Event>,
    /// When the pending runs were last looked at ([`POLL_EVERY`]).
    polled: Option<std::time::Instant>,
}

/// How often [`Device::device_time`] asks the driver about pending runs: often enough for a
/// lease's 1 ms quantum, rarely enough that a launch does not pay an event query.
const POLL_EVERY: Duration = Duration::from_micros(100);

impl Timing {
    fn event(&mut self, driver: &Driver) -> Result<Event, DriverError> {
        match self.spare.pop() {
            Some(e) => Ok(e),
            None => driver.event_create(0),
        }
    }

    /// Before a launch on `stream` (`s`): opens its run.
    fn open(&mut self, driver: &Driver, stream: StreamId, s: Stream) -> Result<(), DriverError> {
        if self.open.contains_key(&stream) {
            return Ok(());
        }
        let start = self.event(driver)?;
        driver.event_record(start, s)?;
        self.open.insert(stream, (s, start));
        Ok(())
    }

    /// Closes every open run (an end event on its stream).
    fn close(&mut self, driver: &Driver) {
        for (_, (s, start)) in std::mem::take(&mut self.open) {
            let end = match self.event(driver) {
                Ok(e) => e,
                Err(_) => {
                    self.spare.push(start);
                    continue;
                }
            };
            match driver.event_record(end, s) {
                Ok(()) => self.pending.push_back((start, end)),
                Err(_) => self.spare.extend([start, end]),
            }
        }
    }

    /// Reads the closed runs that have completed.
    fn poll(&mut self, driver: &Driver) {
        while let Some(&(start, end)) = self.pending.front() {
            match driver.event_query(end) {
                Ok(false) => break,
                done => {
                    if done.is_ok() {
                        if let Ok(ms) = driver.event_elapsed_ms(start, end) {
                            self.completed += Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
                        }
                    }
                    self.pending.pop_front();
                    self.spare.extend([start, end]);
                }
            }
        }
    }

    fn busy(&self) -> bool {
        !self.open.is_empty() || !self.pending.is_empty()
    }

    fn destroy(&mut self, driver: &Driver) {
        let open = self.open.drain().map(|(_, (_, e))| e);
        let pending = self.pending.drain(..).flat_map(|(a, b)| [a, b]);
        for e in open.chain(pending).chain(self.spare.drain(..)) {
            let _ = driver.event_destroy(e);
        }
    }
}

fn status_of(e: &DriverError) -> Status {
    match Driver::status(e) {
        999 => UNKNOWN,
        c => c,
    }
}

impl CudaDevice {
    /// GPU `index` through `driver`, with this session's window `[base, base + window)`.
    pub fn new(driver: Driver, index: u32, base: u64, window: u64) -> Result<Self, DriverError> {
        let dev = driver.device(index as i32)?;
        driver.primary_context(dev)?;
        let granularity = driver.granularity(dev)?.max(1) as u64;
        let window = window / granularity * granularity;
        let base = driver.reserve(window as usize, base)?;
        let info = describe(&driver, dev)?;
        Ok(Self {
            driver,
            dev,
            index,
            base,
            window,
            next: base,
            granularity,
            mappings: BTreeMap::new(),
            modules: HashMap::new(),
            next_module: 1,
            info,
            pins: HostPins::default(),
            arena: None,
            pin_map: None,
            streams: HashMap::new(),
            events: HashMap::new(),
            timing: Timing::default(),
            graphs: HashMap::new(),
            capture: None,
        })
    }

    fn fail(&mut self, e: DriverError) -> Status {
        status_of(&e)
    }

    /// The driver's failure with what it said, for a launch or a module load.
    /// New physical memory mapped at `addr`, zeroed before the session sees it: the driver
    /// may hand out pages another session's worker released, and no data crosses tenants
    /// through reuse (what the emulated device gives by allocating zeroed memory).
    fn map_zeroed(&mut self, addr: u64, mapped: u64) -> Result<u64, Status> {
        let handle = self
            .driver
            .map_new(self.dev, addr, mapped as usize)
            .map_err(|e| match status_of(&e) {
                OUT_OF_MEMORY => OUT_OF_MEMORY,
                _ => self.fail(e),
            })?;
        if let Err(e) = self.driver.memset_d8(addr, 0, mapped as usize) {
            let _ = self.driver.unmap_release(addr, mapped as usize, handle);
            return Err(self.fail(e));
        }
        Ok(handle)
    }

    /// Page-locks the pages of the arena a large copy of `span` touches that are not yet
    /// ([`host_pins`]), each run's chunks marked in the client's pin map first; nothing
    /// without a pin map.
    fn lock_for(&mut self, span: HostSpan) {
        let Some(map) = self.pin_map else {
            return;
        };
        for run in self.pins.runs_for(span.addr() as u64, span.len() as u64) {
            let marked = self.pins.chunks(run).all(|c| {
                map.sub(c as usize, 1)
                    .map(|byte| byte.copy_from(&[1]))
                    .is_some()
            });
            let locked = marked
                && self
                    .arena_part(run.0, run.1)
                    .is_some_and(|part| self.driver.host_register(part).is_ok());
            match locked {
                true => self.pins.locked(run),
                false => self.pins.refused(),
            }
        }
    }

    /// `[addr, addr + len)` of the arena, if it lies inside it.
    fn arena_part(&self, addr: u64, len: u64) -> Option<HostSpan> {
        let arena = self.arena?;
        let offset = (addr as usize).checked_sub(arena.addr() as usize)?;
        arena.sub(offset, len as usize)
    }

    fn unlock(&mut self, runs: Vec<(u64, u64)>) {
        for (addr, len) in runs {
            if let Some(part) = self.arena_part(addr, len) {
                let _ = self.driver.host_unregister(part);
            }
        }
    }

    /// The driver's stream for the session's `stream`.
    fn stream(&self, stream: StreamId) -> Result<Stream, Status> {
        match stream {
            0 => Ok(Stream::NULL),
            id => self.streams.get(&id).copied().ok_or(INVALID_HANDLE),
        }
    }

    fn event(&self, event: EventId) -> Result<Event, Status> {
        self.events
            .get(&event)
            .map(|&(e, _)| e)
            .ok_or(INVALID_HANDLE)
    }

    /// Closes the timing runs before a wait, so that the wait covers their end events.
    fn close_runs(&mut self) {
        self.timing.close(&self.driver);
    }

    /// Enqueues a kernel on `stream` (no timing: a graph's capture records it too).
    #[allow(clippy::too_many_arguments)]
    fn enqueue_kernel(
        &mut self,
        module: ModuleId,
        function: &str,
        [grid, block]: [[u32; 3]; 2],
        shared_mem: u32,
        params: &[u8],
        cooperative: bool,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        let f = self.function_handle(module, function)?;
        if shared_mem > DEFAULT_SHARED_LIMIT {
            // More than 48 KiB of dynamic shared memory needs the function's opt-in, which
            // the application set on its own (client-side) function.
            self.driver
                .set_function_attribute(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem as i32)
                .map_err(|e| self.error(e))?;
        }
        let launched = if cooperative {
            let layout = self.layout(module, function, f)?;
            self.driver
                .launch_cooperative(f, grid, block, shared_mem, stream, params, &layout)
        } else {
            self.driver
                .launch(f, grid, block, shared_mem, stream, params)
        };
        launched.map_err(|e| self.error(e))
    }

    /// One graph node enqueued on `stream` (capturing).
    fn enqueue_node(&mut self, node: &GraphNode, stream: Stream) -> Result<(), DeviceError> {
        match node {
            GraphNode::Launch {
                module,
                function,
                grid,
                block,
                shared_mem,
                params,
                cooperative,
            } => self.enqueue_kernel(
                *module,
                function,
                [*grid, *block],
                *shared_mem,
                params,
                *cooperative,
                stream,
            ),
            &GraphNode::Copy { dst, src, len } => self
                .driver
                .dtod_async(dst, src, len as usize, stream)
                .map_err(|e| self.error(e)),
            &GraphNode::Memset {
                dst,
                value,
                elem_size,
                count,
            } => self
                .driver
                .memset_async(dst, value, elem_size, count as usize, stream)
                .map_err(|e| self.error(e)),
        }
    }

    fn error(&self, e: DriverError) -> DeviceError {
        DeviceError::new(status_of(&e), format!("GPU {}: {e}", self.index))
    }

    fn loaded(&self, m: ModuleId) -> Result<&Loaded, Status> {
        self.modules.get(&m).ok_or(INVALID_HANDLE)
    }

    /// A function's parameter layout, asked of the driver once.
    fn layout(
        &mut self,
        m: ModuleId,
        name: &str,
        f: Function,
    ) -> Result<Vec<(u32, u32)>, DeviceError> {
        if let Some(l) = self.loaded(m).ok().and_then(|l| l.layouts.get(name)) {
            return Ok(l.clone());
        }
        let layout = self.driver.param_layout(f).map_err(|e| self.error(e))?;
        if let Some(l) = self.modules.get_mut(&m) {
            l.layouts.insert(name.to_string(), layout.clone());
        }
        Ok(layout)
    }

    fn function_handle(&mut self, m: ModuleId, name: &str) -> Result<Function, Status> {
        if let Some(&f) = self.loaded(m)?.functions.get(name) {
            return Ok(f);
        }
        let module = self.loaded(m)?.module;
        let f = self
            .driver
            .function(module, name)
            .map_err(|e| status_of(&e))?;
        if let Some(l) = self.modules.get_mut(&m) {
            l.functions.insert(name.to_string(), f);
        }
        Ok(f)
    }
}

/// Name, memory, identity and every attribute the driver answers, as the client caches them.
/// Attributes a session on this backend does not have, whatever the GPU says: virtual memory
/// management for the application (`cuMemCreate`/`cuMemMap` are the emulated GPU's only; an
/// application that sees 1, PyTorch's expandable segments, would fail at its first mapping)
/// and shareable handles for it (POSIX file descriptor, Win32, KMT).
const NOT_FOR_SESSIONS: [i32; 4] = [102, 103, 104, 105];

fn describe(driver: &Driver, dev: CUdevice) -> Result<DeviceInfo, DriverError> {
    let attributes: Vec<(i32, i32)> = (1..=161)
        .map(|a| match NOT_FOR_SESSIONS.contains(&a) {
            true => (a, 0),
            false => (a, driver.attribute(dev, a).unwrap_or(0)),
        })
        .collect();
    Ok(DeviceInfo {
        index: dev as u32,
        name: driver.device_name(dev)?,
        kind: DeviceKind::Cuda,
        uuid: driver.uuid(dev)?,
        total_mem: driver.total_mem(dev)?,
        attributes,
    })
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.driver.synchronize();
        self.timing.destroy(&self.driver);
        for (_, g) in self.graphs.drain() {
            let _ = self.driver.graph_destroy(g);
        }
        for (_, s) in self
            .streams
            .drain()
            .chain(self.capture.take().map(|s| (0, s)))
        {
            let _ = self.driver.stream_destroy(s);
        }
        for (_, (e, _)) in self.events.drain() {
            let _ = self.driver.event_destroy(e);
        }
        let runs = self.pins.take_runs();
        self.unlock(runs);
        for (_, l) in self.modules.drain() {
            let _ = self.driver.unload_module(l.module);
        }
        for (addr, m) in std::mem::take(&mut self.mappings) {
            if m.handle == EVICTED {
                continue;
            }
            let _ = self.driver.unmap_release(addr, m.mapped as usize, m.handle);
        }
        let _ = self
            .driver
            .free_reservation(self.base, self.window as usize);
    }
}

impl Device for CudaDevice {
    fn info(&self, limit: Option<u64>) -> DeviceInfo {
        let mut info = self.info.clone();
        if let Some(l) = limit {
            info.total_mem = info.total_mem.min(l);
        }
        info
    }

    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let mapped = size.div_ceil(self.granularity) * self.granularity;
        let addr = self.next;
        if addr + mapped > self.base + self.window {
            return Err(OUT_OF_MEMORY);
        }
        let handle = self.map_zeroed(addr, mapped)?;
        self.next += mapped;
        self.mappings.insert(
            addr,
            Mapping {
                size,
                mapped,
                handle,
            },
        );
        Ok(addr)
    }

    fn free(&mut self, ptr: u64) -> Result<u64, Status> {
        let m = self.mappings.remove(&ptr).ok_or(INVALID_VALUE)?;
        if m.handle == EVICTED {
            return Ok(m.size);
        }
        // The GPU may still be using the memory: free is ordered after earlier work.
        self.driver.synchronize().map_err(|e| self.fail(e))?;
        self.driver
            .unmap_release(ptr, m.mapped as usize, m.handle)
            .map_err(|e| self.fail(e))?;
        Ok(m.size)
    }

    fn contains(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let in_mapping = self
            .mappings
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&a, m)| end <= a + m.size);
        in_mapping
            || self.modules.values().any(|l| {
                l.globals
                    .range(..=ptr)
                    .next_back()
                    .is_some_and(|(&a, &size)| end <= a + size)
            })
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Status> {
        self.driver.htod(dst, data).map_err(|e| self.fail(e))
    }

    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<(), Status> {
        self.driver.dtoh(out, src).map_err(|e| self.fail(e))
    }

    fn write_on(&mut self, dst: u64, data: &[u8], stream: StreamId) -> Result<(), Status> {
        let s = self.stream(stream)?;
        self.driver
            .htod_async_bytes(dst, data, s)
            .map_err(|e| self.fail(e))
    }

    fn read_on(&mut self, src: u64, out: &mut [u8], stream: StreamId) -> Result<(), Status> {
        let s = self.stream(stream)?;
        self.close_runs();
        self.driver
            .dtoh_bytes_on(out, src, s)
            .map_err(|e| self.fail(e))
    }

    fn write_span(&mut self, dst: u64, src: HostSpan, stream: StreamId) -> Result<(), Status> {
        let s = self.stream(stream)?;
        self.lock_for(src);
        self.driver
            .htod_async(dst, src, s)
            .map_err(|e| self.fail(e))
    }

    fn read_span(&mut self, src: u64, dst: HostSpan, stream: StreamId) -> Result<(), Status> {
        let s = self.stream(stream)?;
        self.lock_for(dst);
        self.driver
            .dtoh_async(dst, src, s)
            .map_err(|e| self.fail(e))
    }

    fn host_arena(&mut self, arena: HostSpan, pin_map: Option<HostSpan>) -> Result<(), Status> {
        let old = self.pins.set_arena(arena.addr() as u64, arena.len() as u64);
        self.unlock(old);
        self.arena = Some(arena);
        self.pin_map = pin_map;
        Ok(())
    }

    fn copy(&mut self, dst: u64, src: u64, len: u64, stream: StreamId) -> Result<(), Status> {
        let s = self.stream(stream)?;
        self.driver
            .dtod_async(dst, src, len as usize, s)
            .map_err(|e| self.fail(e))
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: StreamId,
    ) -> Result<(), Status> {
        if !matches!(elem_size, 1 | 2 | 4) {
            return Err(INVALID_VALUE);
        }
        let s = self.stream(stream)?;
        self.driver
            .memset_async(dst, value, elem_size, count as usize, s)
            .map_err(|e| self.fail(e))
    }

    fn create_stream(&mut self, stream: StreamId, flags: u32, priority: i32) -> Result<(), Status> {
        if stream == 0 || self.streams.contains_key(&stream) {
            return Err(INVALID_VALUE);
        }
        let s = self
            .driver
            .stream_create(flags, priority)
            .map_err(|e| self.fail(e))?;
        self.streams.insert(stream, s);
        Ok(())
    }

    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), Status> {
        if !self.streams.contains_key(&stream) {
            return Err(INVALID_HANDLE);
        }
        // Its timing run ends before it goes (work on it still runs, as CUDA's does).
        self.close_runs();
        let s = self.streams.remove(&stream).ok_or(INVALID_HANDLE)?;
        self.driver.stream_destroy(s).map_err(|e| self.fail(e))
    }

    fn create_event(&mut self, event: EventId, flags: u32) -> Result<(), Status> {
        if self.events.contains_key(&event) {
            return Err(INVALID_VALUE);
        }
        let e = self.driver.event_create(flags).map_err(|e| self.fail(e))?;
        self.events.insert(event, (e, false));
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), Status> {
        let (e, _) = self.events.remove(&event).ok_or(INVALID_HANDLE)?;
        self.driver.event_destroy(e).map_err(|e| self.fail(e))
    }

    fn record(&mut self, event: EventId, stream: StreamId) -> Result<(), Status> {
        let (e, s) = (self.event(event)?, self.stream(stream)?);
        self.driver.event_record(e, s).map_err(|e| self.fail(e))?;
        if let Some(entry) = self.events.get_mut(&event) {
            entry.1 = true;
        }
        Ok(())
    }

    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), Status> {
        let (e, s) = (self.event(event)?, self.stream(stream)?);
        self.driver
            .stream_wait_event(s, e)
            .map_err(|e| self.fail(e))
    }

    fn event_done(&mut self, event: EventId) -> Result<bool, Status> {
        let e = self.event(event)?;
        self.driver.event_query(e).map_err(|e| self.fail(e))
    }

    fn sync_event(&mut self, event: EventId) -> Result<(), Status> {
        let e = self.event(event)?;
        self.close_runs();
        self.driver.event_synchronize(e).map_err(|e| self.fail(e))
    }

    fn elapsed(&mut self, start: EventId, end: EventId) -> Result<f32, Status> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        self.driver.event_elapsed_ms(a, b).map_err(|e| self.fail(e))
    }

    fn stream_done(&mut self, stream: StreamId) -> Result<bool, Status> {
        let s = self.stream(stream)?;
        self.driver.stream_query(s).map_err(|e| self.fail(e))
    }

    fn sync_stream(&mut self, stream: StreamId) -> Result<(), Status> {
        let s = self.stream(stream)?;
        self.close_runs();
        self.driver.stream_synchronize(s).map_err(|e| self.fail(e))
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        self.close_runs();
        self.driver.synchronize().map_err(|e| self.fail(e))?;
        self.timing.poll(&self.driver);
        Ok(())
    }

    fn device_time(&mut self) -> Duration {
        let due = self.timing.polled.is_none_or(|t| t.elapsed() >= POLL_EVERY);
        if due && !self.timing.pending.is_empty() {
            self.timing.poll(&self.driver);
            self.timing.polled = Some(std::time::Instant::now());
        }
        self.timing.completed
    }

    fn flush_timing(&mut self) {
        self.close_runs();
    }

    fn busy(&mut self) -> bool {
        self.timing.busy()
    }

    fn load_module(&mut self, image: &[u8]) -> Result<ModuleId, DeviceError> {
        // A PTX image must end in NUL for the driver; fatbins and cubins carry their sizes.
        let owned;
        let image = if gpufuse_fatbin::classify(image) == gpufuse_fatbin::ImageKind::Ptx
            && image.last() != Some(&0)
        {
            owned = [image, &[0]].concat();
            &owned[..]
        } else {
            image
        };
        let module = self.driver.load_module(image).map_err(|e| self.error(e))?;
        let id = self.next_module;
        self.next_module += 1;
        self.modules.insert(
            id,
            Loaded {
                module,
                functions: HashMap::new(),
                globals: BTreeMap::new(),
                layouts: HashMap::new(),
            },
        );
        Ok(id)
    }

    fn unload_module(&mut self, module: ModuleId) -> Result<(), Status> {
        let l = self.modules.remove(&module).ok_or(INVALID_HANDLE)?;
        self.driver
            .unload_module(l.module)
            .map_err(|e| self.fail(e))
    }

    fn function(&mut self, module: ModuleId, name: &str) -> Result<FunctionInfo, Status> {
        let f = self.function_handle(module, name)?;
        let params = self
            .driver
            .param_layout(f)
            .map_err(|e| self.fail(e))?
            .into_iter()
            .map(|(offset, size)| ParamSlot { offset, size })
            .collect();
        // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK .. SHARED_MEMORY_MODE (CUDA 13; a driver
        // that lacks the newest answers without them).
        let attributes = (0..=17)
            .filter_map(|a| Some((a, self.driver.function_attribute(f, a).ok()?)))
            .collect();
        Ok(FunctionInfo { params, attributes })
    }

    fn global(&mut self, module: ModuleId, name: &str) -> Result<(u64, u64), Status> {
        let m = self.loaded(module)?.module;
        let (addr, size) = self.driver.global(m, name).map_err(|e| status_of(&e))?;
        if let Some(l) = self.modules.get_mut(&module) {
            l.globals.insert(addr, size);
        }
        Ok((addr, size))
    }

    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        let limit = i32::try_from(limit).map_err(|_| INVALID_VALUE)?;
        let v = self.driver.limit(limit).map_err(|e| self.fail(e))?;
        Ok(v as u64)
    }

    fn occupancy(
        &mut self,
        module: ModuleId,
        function: &str,
        q: crate::Occupancy,
    ) -> Result<i32, Status> {
        let f = self.function_handle(module, function)?;
        // The application's opt-in lives on its (client-side) function: the worker's copy gets
        // it before the driver is asked, as before a launch.
        if let Ok(max) = i32::try_from(q.max_dyn_smem) {
            self.driver
                .set_function_attribute(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, max)
                .map_err(|e| self.fail(e))?;
        }
        let block = i32::try_from(q.block).map_err(|_| INVALID_VALUE)?;
        let smem = usize::try_from(q.dyn_smem).map_err(|_| INVALID_VALUE)?;
        self.driver
            .occupancy(f, block, smem, q.flags)
            .map_err(|e| self.fail(e))
    }

    fn launch(&mut self, l: &KernelLaunch) -> Result<(), DeviceError> {
        let stream = self.stream(l.stream)?;
        self.timing
            .open(&self.driver, l.stream, stream)
            .map_err(|e| self.error(e))?;
        let (grid, block, shared) = (l.grid, l.block, l.shared_mem);
        self.enqueue_kernel(
            l.module,
            l.function,
            [grid, block],
            shared,
            l.params,
            l.cooperative,
            stream,
        )
    }

    fn define_graph(&mut self, graph: u64, nodes: &[GraphNode]) -> Result<(), DeviceError> {
        let s = match self.capture {
            Some(s) => s,
            None => {
                // Non-blocking: the legacy stream's work never joins a capture.
                let s = self.driver.stream_create(1, 0).map_err(|e| self.error(e))?;
                self.capture = Some(s);
                s
            }
        };
        if let Some(old) = self.graphs.remove(&graph) {
            let _ = self.driver.graph_destroy(old);
        }
        self.driver.begin_capture(s).map_err(|e| self.error(e))?;
        let enqueued = nodes.iter().try_for_each(|n| self.enqueue_node(n, s));
        // The capture ends whatever happened, so the stream is usable again.
        let exec = self.driver.end_capture(s);
        enqueued?;
        let exec = exec.map_err(|e| self.error(e))?;
        self.graphs.insert(graph, exec);
        Ok(())
    }

    fn launch_graph(&mut self, graph: u64, stream: StreamId) -> Result<(), DeviceError> {
        let exec = *self.graphs.get(&graph).ok_or(INVALID_HANDLE)?;
        let s = self.stream(stream)?;
        self.timing
            .open(&self.driver, stream, s)
            .map_err(|e| self.error(e))?;
        self.driver.graph_launch(exec, s).map_err(|e| self.error(e))
    }

    fn destroy_graph(&mut self, graph: u64) -> Result<(), Status> {
        let exec = self.graphs.remove(&graph).ok_or(INVALID_HANDLE)?;
        self.driver.graph_destroy(exec).map_err(|e| self.fail(e))
    }

    // Eviction keeps the address (the window stays reserved) and gives back the physical
    // memory: its contents are copied out (`cuMemcpyDtoH`), then `cuMemUnmap` + `cuMemRelease`;
    // bringing it back is `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` at the same address and
    // a copy in. Not yet run on hardware: the lane of 2026-11-27 (an H200) evicted nothing.

    fn resident(&self) -> Vec<(u64, u64)> {
        self.mappings
            .iter()
            .filter(|(_, m)| m.handle != EVICTED)
            .map(|(&a, m)| (a, m.size))
            .collect()
    }

    fn evict(&mut self, ptr: u64) -> Result<Vec<u8>, Status> {
        let (size, mapped, handle) = match self.mappings.get(&ptr) {
            Some(m) if m.handle != EVICTED => (m.size, m.mapped, m.handle),
            _ => return Err(INVALID_VALUE),
        };
        let mut contents = vec![0u8; size as usize];
        self.driver.synchronize().map_err(|e| self.fail(e))?;
        self.driver
            .dtoh(&mut contents, ptr)
            .map_err(|e| self.fail(e))?;
        self.driver
            .unmap_release(ptr, mapped as usize, handle)
            .map_err(|e| self.fail(e))?;
        if let Some(m) = self.mappings.get_mut(&ptr) {
            m.handle = EVICTED;
        }
        Ok(contents)
    }

    fn bring_back(&mut self, ptr: u64, contents: &[u8]) -> Result<(), Status> {
        let mapped = match self.mappings.get(&ptr) {
            Some(m) if m.handle == EVICTED && m.size == contents.len() as u64 => m.mapped,
            _ => return Err(INVALID_VALUE),
        };
        let handle = self.map_zeroed(ptr, mapped)?;
        if let Some(m) = self.mappings.get_mut(&ptr) {
            m.handle = handle;
        }
        self.driver.htod(ptr, contents).map_err(|e| self.fail(e))
    }
}

/// The physical handle of a mapping whose contents are evicted (no physical memory).
const EVICTED: u64 = 0;
