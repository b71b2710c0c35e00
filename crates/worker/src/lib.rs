//! One session's server. The node hands a worker process the client's connection after the
//! hello; the worker answers the hello, then runs requests on its [`Device`] until the client
//! goes away, and frees everything the session held.
//!
//! Every handle (context, stream, event, module, function: ids the client minted) and every
//! device pointer is checked against this session's own tables, so a session can name only
//! what it created. Quiet requests produce no reply: their first failure is kept and returned
//! as the next reply's `deferred_error`. A malformed frame ends the session; it never panics.
//!
//! The session's state is split by area, each module owning its tables and the requests that
//! touch them: [`memory`] (the slice, allocations, copies, VMM books), [`modules`] (images by
//! content hash: the session's, then the node's image cache on disk; module and function
//! handles), [`streams`] (contexts, streams, events, checked and handed to the device; a wait
//! that finds a fault poisons the session), [`textures`], `ipc.rs` (CUDA IPC: exports moved
//! into memfds, other sessions' exports opened), [`launch`] (the device lease from the node's
//! launch queue, charged from the device's measured time: a lease spent while work is in
//! flight settles it first, an idle lease end does not wait for the GPU; the launch log,
//! device time), and [`serve`] (the connection). [`Session::handle`] only routes a request to
//! its area; [`control`] holds the control-socket operations.
//!
//! Elastic sessions and moves: `residency.rs` (memory out to host memory or disk and back,
//! idle TTLs), `migrate.rs` (moving to another device: pre-copy rounds over any `MoveTarget`),
//! `remote.rs` (moving to another node: the leaving side's target and the receiving side's
//! `serve_incoming`), `forward.rs` (after a stop while the client was quiet, its requests are
//! forwarded to the new worker until it next waits) and `books.rs` (the worker's tables as
//! they travel with a move between nodes, `GFBOOKS` v1); `docs/migration.md`.
//!
//! Every launch path of the driver API (plain, `_ptsz`, `Ex`, cooperative, graph replays)
//! arrives here as a `LaunchKernel` request, and graphs the worker keeps ([`graphs`]) as a
//! `GraphLaunch`.

mod books;
pub mod control;
mod forward;
mod graphs;
pub mod heartbeat;
mod ipc;
mod launch;
mod memory;
mod migrate;
mod modules;
mod remote;
mod residency;
mod serve;
mod streams;
mod textures;

use std::collections::HashMap;

use gpufuse_device::Device;
use gpufuse_proto::{
    ContextHandle, DevicePtr, EventHandle, FunctionHandle, ModuleHandle, PhysicalHandle,
    StreamHandle, TexHandle,
};
use gpufuse_proto::{Reply, ReplyBody, Request, StagedCopy, Status};
use gpufuse_transport::TransportError;

pub use control::{ControlLedger, Ledger, LocalLedger};
pub use migrate::DeviceOpener;
pub use remote::serve_incoming;
pub use residency::ElasticConfig;
pub use serve::{refuse, serve, serve_elastic, Elastic};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("connection")]
    Transport(#[from] TransportError),
    #[error("malformed request")]
    Proto(#[from] gpufuse_proto::ProtoError),
    #[error("unexpected frame kind {0:?}")]
    UnexpectedFrame(gpufuse_proto::FrameKind),
}

type R<T> = Result<T, Status>;

/// The device a session runs on: the one it was given, or one it moved to (migration).
enum DeviceSlot<'a> {
    Given(&'a mut dyn Device),
    Moved(Box<dyn Device>),
}

impl<'a> std::ops::Deref for DeviceSlot<'a> {
    type Target = dyn Device + 'a;
    fn deref(&self) -> &Self::Target {
        match self {
            DeviceSlot::Given(d) => &**d,
            DeviceSlot::Moved(d) => d.as_ref(),
        }
    }
}

impl<'a> std::ops::DerefMut for DeviceSlot<'a> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            DeviceSlot::Given(d) => &mut **d,
            DeviceSlot::Moved(d) => d.as_mut(),
        }
    }
}

/// The session's view of its device and what it holds.
pub struct Session<'a> {
    device: DeviceSlot<'a>,
    ledger: &'a mut dyn Ledger,
    memory: memory::MemoryBooks,
    modules: modules::ModuleBooks,
    sync: streams::SyncBooks,
    launch: launch::LaunchBooks,
    /// Where the session's memory is (resident, host, disk) and the idle clock.
    residency: residency::Residency,
    /// Graphs of device work the client defined (`GraphDefine`).
    graphs: graphs::GraphBooks,
    /// Live texture and surface objects and what they describe.
    textures: HashMap<u64, gpufuse_proto::TexObjectDesc>,
    /// Memory exported to and opened from other sessions (CUDA IPC).
    ipc: ipc::IpcBooks,
    deferred: Option<Status>,
    staged: Vec<StagedCopy>,
    /// Reused for large device-to-host replies.
    scratch: Vec<u8>,
    /// A device range the current reply's data is sent from, in place.
    view: Option<(u64, u64)>,
    /// A fault (illegal or misaligned address, trap, failed device assert) that poisoned the
    /// session until a device reset.
    sticky: Option<Status>,
    /// Device-side printf output the device the session left had not handed over.
    carried_output: Vec<u8>,
}

impl<'a> Session<'a> {
    pub fn new(device: &'a mut dyn Device, ledger: &'a mut dyn Ledger, limit: Option<u64>) -> Self {
        Self {
            device: DeviceSlot::Given(device),
            ledger,
            memory: memory::MemoryBooks::new(limit),
            residency: residency::Residency::new(ElasticConfig::default(), 0),
            modules: Default::default(),
            sync: Default::default(),
            launch: Default::default(),
            graphs: Default::default(),
            textures: HashMap::new(),
            ipc: Default::default(),
            deferred: None,
            staged: Vec::new(),
            scratch: Vec::new(),
            view: None,
            sticky: None,
            carried_output: Vec::new(),
        }
    }

    /// The same session, whose memory may leave the device as `config` says (`session` names
    /// its swap files).
    pub fn with_elastic(mut self, config: ElasticConfig, session: u64) -> Self {
        self.residency = residency::Residency::new(config, session);
        self
    }

    /// The session's id on its node.
    pub fn session_id(&self) -> u64 {
        self.residency.session
    }

    /// Bytes this session holds.
    pub fn used(&self) -> u64 {
        self.memory.used
    }

    /// Frees everything: at reset and when the session ends.
    pub fn release_all(&mut self) {
        // Work in flight finishes before its memory goes (a fault it meets changes nothing now).
        let _ = self.device.synchronize();
        self.end_lease();
        self.release_graphs();
        self.residency.forget_away();
        self.release_memory();
        self.release_modules();
        self.release_textures();
        self.forget_arena_events();
        self.release_sync();
        self.deferred = None;
        self.staged.clear();
    }

    /// Runs one request. `Ok` carries the reply body for synchronous requests.
    pub fn handle(&mut self, req: Request) -> R<ReplyBody> {
        use Request::*;
        let none = |r: R<()>| r.map(|()| ReplyBody::None);
        match req {
            Ping => Ok(ReplyBody::None),
            CtxSynchronize { .. } => none(self.ctx_synchronize()),
            CtxCreate {
                ctx: ContextHandle(ctx),
                device,
                ..
            } => none(self.ctx_create(ctx, device)),
            CtxDestroy {
                ctx: ContextHandle(ctx),
            } => none(self.ctx_destroy(ctx)),
            DeviceReset { device } => {
                self.check_device(device)?;
                self.release_all();
                Ok(ReplyBody::None)
            }
            MemAlloc { device, size } => {
                self.check_device(device)?;
                Ok(ReplyBody::Ptr(DevicePtr(self.alloc(size)?)))
            }
            MemAllocShared {
                device,
                size,
                offset,
            } => {
                self.check_device(device)?;
                Ok(ReplyBody::Ptr(DevicePtr(self.alloc_shared(size, offset)?)))
            }
            MapHostArena { base } => none(self.map_host_arena(base)),
            IpcGetMemHandle {
                ptr: DevicePtr(ptr),
            } => self.ipc_get_mem_handle(ptr),
            IpcOpenMemHandle { device, handle } => {
                self.check_device(device)?;
                self.ipc_open_mem_handle(handle)
            }
            IpcCloseMemHandle {
                ptr: DevicePtr(ptr),
            } => none(self.ipc_close_mem_handle(ptr)),
            IpcExportPhysical {
                handle: PhysicalHandle(handle),
            } => self.ipc_export_physical(handle),
            IpcImportPhysical {
                handle: PhysicalHandle(handle),
                shared,
            } => none(self.ipc_import_physical(handle, shared)),
            SetLimit {
                device,
                limit,
                value,
            } => {
                self.check_device(device)?;
                none(self.set_limit(limit, value))
            }
            GraphDefine { graph, nodes } => none(self.graph_define(graph, nodes)),
            GraphLaunch {
                graph,
                stream: StreamHandle(stream),
            } => none(self.graph_launch(graph, stream)),
            GraphDestroy { graph } => none(self.graph_destroy(graph)),
            GetLimit { device, limit } => {
                self.check_device(device)?;
                Ok(ReplyBody::Count(self.device.limit(limit)?))
            }
            Occupancy {
                function: FunctionHandle(function),
                block,
                dyn_smem,
                max_dyn_smem,
                flags,
            } => {
                let (id, name) = self.kernel(function)?;
                let n = self.device.occupancy(
                    id,
                    &name,
                    gpufuse_device::Occupancy {
                        block,
                        dyn_smem,
                        max_dyn_smem,
                        flags,
                    },
                )?;
                Ok(ReplyBody::Count(u64::try_from(n).unwrap_or(0)))
            }
            MemAllocPitch {
                device,
                width,
                height,
                elem_size,
            } => {
                self.check_device(device)?;
                self.mem_alloc_pitch(width, height, elem_size)
            }
            MemFree {
                ptr: DevicePtr(ptr),
            } => none(self.free(ptr)),
            MemGetInfo { device } => {
                self.check_device(device)?;
                Ok(self.mem_get_info())
            }
            MemcpyHtoD {
                dst: DevicePtr(dst),
                stream: StreamHandle(stream),
                data,
            } => {
                self.check_htod(dst, stream, data.len() as u64)?;
                none(self.device.write_on(dst, data, stream))
            }
            MemcpyDtoH {
                src: DevicePtr(src),
                size,
                stream: StreamHandle(stream),
            } => self.memcpy_dtoh(src, size, stream),
            MemcpyDtoHAsync {
                src: DevicePtr(src),
                size,
                stream: StreamHandle(stream),
                tag,
            } => none(self.memcpy_dtoh_async(src, size, stream, tag)),
            MemcpyDtoD {
                dst: DevicePtr(dst),
                src: DevicePtr(src),
                size,
                stream: StreamHandle(stream),
            } => none(self.memcpy_dtod(dst, src, size, stream)),
            Memcpy2DDtoD {
                dst,
                src,
                width,
                height,
                stream: StreamHandle(stream),
            } => none(self.memcpy_2d_dtod(dst, src, width, height, stream)),
            Memcpy2DHtoD {
                dst,
                width,
                height,
                stream: StreamHandle(stream),
                data,
            } => none(self.memcpy_2d_htod(dst, width, height, stream, data)),
            Memcpy2DDtoH {
                src,
                width,
                height,
                stream: StreamHandle(stream),
            } => self.memcpy_2d_dtoh(src, width, height, stream),
            Memset {
                dst: DevicePtr(dst),
                value,
                elem_size,
                count,
                stream: StreamHandle(stream),
            } => none(self.memset(dst, value, elem_size, count, stream)),
            Memset2D {
                dst,
                value,
                elem_size,
                width,
                height,
                stream: StreamHandle(stream),
            } => none(self.memset_2d(dst, value, elem_size, width, height, stream)),
            StreamCreate {
                stream: StreamHandle(stream),
                flags,
                priority,
            } => none(self.stream_create(stream, flags, priority)),
            StreamDestroy {
                stream: StreamHandle(stream),
            } => none(self.stream_destroy(stream)),
            StreamSynchronize {
                stream: StreamHandle(stream),
            } => none(self.stream_synchronize(stream)),
            StreamQuery {
                stream: StreamHandle(stream),
            } => none(self.stream_query(stream)),
            StreamWaitEvent {
                stream: StreamHandle(stream),
                event: EventHandle(event),
            } => none(self.stream_wait_event(stream, event)),
            EventCreate {
                event: EventHandle(event),
                flags,
            } => none(self.event_create(event, flags)),
            EventDestroy {
                event: EventHandle(event),
            } => none(self.event_destroy(event)),
            EventRecord {
                event: EventHandle(event),
                stream: StreamHandle(stream),
            } => none(self.event_record(event, stream)),
            EventQuery {
                event: EventHandle(event),
            } => none(self.event_query(event)),
            EventSynchronize {
                event: EventHandle(event),
            } => none(self.event_synchronize(event)),
            EventElapsedTime {
                start: EventHandle(start),
                end: EventHandle(end),
            } => self.event_elapsed(start, end),
            ModuleLoad {
                module: ModuleHandle(module),
                device,
                hash,
                image,
            } => {
                self.check_device(device)?;
                self.module_load(module, hash, image)
            }
            ModuleUnload {
                module: ModuleHandle(module),
            } => none(self.module_unload(module)),
            ModuleGetFunction {
                module: ModuleHandle(module),
                name,
                function: FunctionHandle(function),
            } => self.module_get_function(module, name, function),
            ModuleGetGlobal {
                module: ModuleHandle(module),
                name,
            } => self.module_get_global(module, name),
            LaunchKernel(l) => none(self.launch_kernel(&l)),
            DebugLaunchLog { max } => Ok(ReplyBody::Launches(self.launch_log(max))),
            ModuleImagePart {
                hash,
                total,
                offset,
                data,
            } => none(self.module_image_part(hash, total, offset, data)),
            MemCreate {
                handle: PhysicalHandle(handle),
                device,
                size,
            } => {
                self.check_device(device)?;
                none(self.mem_create(handle, size))
            }
            MemRelease {
                handle: PhysicalHandle(handle),
            } => none(self.mem_release(handle)),
            MemAddressReserve { size, align } => self.mem_address_reserve(size, align),
            MemAddressFree {
                ptr: DevicePtr(ptr),
                size,
            } => none(self.mem_address_free(ptr, size)),
            MemMap {
                ptr: DevicePtr(ptr),
                size,
                handle: PhysicalHandle(handle),
            } => none(self.mem_map(ptr, size, handle)),
            MemUnmap {
                ptr: DevicePtr(ptr),
                size,
            } => none(self.mem_unmap(ptr, size)),
            TexObjectCreate {
                handle: TexHandle(handle),
                desc,
            } => none(self.tex_object_create(handle, &desc)),
            TexObjectDestroy {
                handle: TexHandle(handle),
            } => none(self.tex_object_destroy(handle)),
            // The serving loop takes it (`serve.rs`) on a unix socket; anywhere else (TCP, a
            // worker driven in process) there is nothing to attach.
            ShmAttach { .. } => Err(gpufuse_device::status::NOT_SUPPORTED),
            MemcpyHtoDHost {
                dst: DevicePtr(dst),
                stream: StreamHandle(stream),
                offset,
                size,
            } => none(self.memcpy_htod_host(dst, stream, offset, size)),
            MemcpyDtoHHost {
                src: DevicePtr(src),
                stream: StreamHandle(stream),
                offset,
                size,
            } => none(self.memcpy_dtoh_host(src, stream, offset, size)),
        }
    }

    /// Where a large quiet host-to-device copy of `len` bytes to `dst` lands, checked as
    /// `MemcpyHtoD` is: the device bytes to receive it into, or `Discard` (the failure is kept
    /// as for any quiet request), or `Unsupported` when the backend has no host view.
    pub fn htod_target(&mut self, dst: u64, stream: u64, len: u64) -> HtodTarget<'_> {
        self.end_lease();
        // As `dispatch` runs a quiet request: a poisoned session fails it, else `handle`'s checks.
        let checked = match self.sticky {
            Some(e) => Err(e),
            None => self
                .ensure_resident()
                .and_then(|()| self.check_htod(dst, stream, len)),
        };
        self.residency.touch();
        if let Err(e) = checked {
            self.deferred.get_or_insert(e);
            return HtodTarget::Discard;
        }
        match self.device.view_mut(dst, len) {
            Some(bytes) => HtodTarget::Write(bytes),
            None => HtodTarget::Unsupported,
        }
    }

    /// Runs a request as the wire sees it: a reply for synchronous requests, and a kept
    /// failure for quiet ones.
    pub fn dispatch(&mut self, req: Request, quiet: bool) -> Option<Reply> {
        // Only consecutive launches share a lease: any other request ends it once it has run,
        // so a wait charges the work it waited for, and copies and synchronization do not
        // hold the device for others afterwards.
        let ends_lease = !matches!(req, Request::LaunchKernel(_) | Request::GraphLaunch { .. });
        let result = match (self.sticky, &req) {
            (Some(_), Request::DeviceReset { .. }) => {
                self.sticky = None;
                self.handle(req)
            }
            (Some(e), Request::Ping | Request::DebugLaunchLog { .. }) => {
                self.handle(req).map_err(|_| e)
            }
            (Some(e), _) => Err(e),
            (None, _) if residency::touches_memory(&req) => {
                self.ensure_resident().and_then(|()| self.handle(req))
            }
            (None, _) => self.handle(req),
        };
        if ends_lease {
            self.end_lease();
        }
        self.residency.touch();
        if quiet {
            if let Err(e) = result {
                tracing::debug!(
                    status = e,
                    "a quiet request failed; reported with the next reply"
                );
                self.deferred.get_or_insert(e);
            }
            return None;
        }
        if self.memory.arena_all || !self.memory.arena_pending.is_empty() {
            // The protocol promises arena copies done by any reply: they may still be running.
            if let Err(e) = self.wait_arena_copies() {
                self.deferred.get_or_insert(e);
            }
        }
        let mut reply = match result {
            Ok(body) => Reply::ok(body),
            Err(e) => Reply::err(e),
        };
        reply.deferred_error = self.deferred.take();
        reply.staged = std::mem::take(&mut self.staged);
        // Device-side printf of the launches so far: the client prints it on this reply.
        reply.output = self.device.take_output();
        if !self.carried_output.is_empty() {
            let mut out = std::mem::take(&mut self.carried_output);
            out.append(&mut reply.output);
            reply.output = out;
        }
        Some(reply)
    }
}

/// See [`Session::htod_target`].
pub enum HtodTarget<'a> {
    Write(&'a mut [u8]),
    Discard,
    Unsupported,
}
