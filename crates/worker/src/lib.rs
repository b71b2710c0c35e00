//! One session's server. The node hands a worker process the client's connection after the
//! hello; the worker answers the hello, then runs requests on its [`Device`] until the client
//! goes away, and frees everything the session held.
//!
//! Every handle (context, stream, event, module, function: ids the client minted) and every
//! device pointer is checked against this session's own tables, so a session can name only
//! what it created. Quiet requests produce no reply: their first failure is kept and returned
//! as the next reply's `deferred_error`. A malformed frame ends the session; it never panics.
//!
//! Kernels run under a *lease* from the node's launch queue ([`Ledger::acquire`]): the worker
//! asks before a launch, keeps the lease while launches follow one another (already received)
//! within the quantum, and ends it with the measured device time they took, which is what the
//! session's compute share is charged. Every launch path of the driver API (plain, `_ptsz`,
//! `Ex`, cooperative, graph replays) arrives here as a `LaunchKernel` request.

pub mod control;
pub mod heartbeat;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use gpufuse_device::{status as st, Device, KernelLaunch};
use gpufuse_proto::{
    decode_borrowed, decode_request, encode_frame, encode_frame_head, FrameKind, LaunchRecord,
    Rect, Reply, ReplyBody, Request, ServerHello, StagedCopy, Status,
};
use gpufuse_transport::{Conn, TransportError};
use sha2::{Digest, Sha256};

pub use control::{ControlLedger, Ledger, LocalLedger};

/// How many launches the diagnostic launch log keeps.
const LAUNCH_LOG: usize = 1024;
/// Images kept for deduplication (by content hash) per session.
const MAX_CACHED_IMAGES: usize = 256;
/// The largest module image accepted in parts (CuPy's thrust module holds about 75 MB).
const MAX_IMAGE_BYTES: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("connection")]
    Transport(#[from] TransportError),
    #[error("malformed request")]
    Proto(#[from] gpufuse_proto::ProtoError),
    #[error("unexpected frame kind {0:?}")]
    UnexpectedFrame(FrameKind),
}

/// A session's virtual-memory books: client handle -> (device physical id, size), reserved
/// ranges and mapped ranges (start -> size).
#[derive(Default)]
struct VmmBooks {
    physical: HashMap<u64, (u64, u64)>,
    reserved: HashMap<u64, u64>,
    mapped: HashMap<u64, u64>,
}

/// The session's view of its device and what it holds.
pub struct Session<'a> {
    device: &'a mut dyn Device,
    ledger: &'a mut dyn Ledger,
    limit: Option<u64>,
    used: u64,
    allocations: HashMap<u64, u64>,
    contexts: HashSet<u64>,
    streams: HashSet<u64>,
    events: HashMap<u64, Option<Instant>>,
    modules: HashMap<u64, u64>,
    /// Virtual memory management: what the session created, reserved and mapped.
    vmm: VmmBooks,
    functions: HashMap<u64, (u64, std::sync::Arc<str>)>,
    images: HashMap<[u8; 32], Vec<u8>>,
    /// An image arriving in parts (`ModuleImagePart`): its hash and the bytes so far.
    partial_image: Option<([u8; 32], Vec<u8>)>,
    deferred: Option<Status>,
    staged: Vec<StagedCopy>,
    /// The last launches received (diagnostics); records are reused, so logging allocates
    /// nothing once the log is full.
    launches: VecDeque<LaunchRecord>,
    device_time: std::time::Duration,
    /// Reused for large device-to-host replies.
    scratch: Vec<u8>,
    /// A device range the current reply's data is sent from, in place.
    view: Option<(u64, u64)>,
    /// A fault (illegal or misaligned address, trap, failed device assert) that poisoned the session until a device reset.
    sticky: Option<Status>,
    /// The launch queue's lease, while this session holds the device.
    lease: Option<Lease>,
    /// Live texture and surface objects.
    textures: HashSet<u64>,
}

/// The bytes a texture or surface object spans from its first element: whole rows and slices
/// but the last, whose row ends at its last element.
fn texture_span(d: &gpufuse_proto::TexObjectDesc) -> R<u64> {
    let elem = match d.format {
        0x01 | 0x08 => 1u64,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return Err(st::INVALID_VALUE),
    } * u64::from(d.channels);
    let row = d.width.checked_mul(elem).ok_or(st::INVALID_VALUE)?;
    if d.width == 0 || d.height == 0 || d.depth == 0 || d.pitch < row {
        return Err(st::INVALID_VALUE);
    }
    let slice = d.pitch.checked_mul(d.height).ok_or(st::INVALID_VALUE)?;
    slice
        .checked_mul(d.depth - 1)
        .and_then(|s| s.checked_add(d.pitch.checked_mul(d.height - 1)?))
        .and_then(|s| s.checked_add(row))
        .ok_or(st::INVALID_VALUE)
}

/// A lease on the device: its quantum and the device time used so far.
#[derive(Debug, Clone, Copy)]
struct Lease {
    quantum: std::time::Duration,
    used: std::time::Duration,
}

type R<T> = Result<T, Status>;

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl<'a> Session<'a> {
    pub fn new(device: &'a mut dyn Device, ledger: &'a mut dyn Ledger, limit: Option<u64>) -> Self {
        Self {
            device,
            ledger,
            limit,
            used: 0,
            allocations: HashMap::new(),
            contexts: HashSet::new(),
            streams: HashSet::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            vmm: VmmBooks::default(),
            functions: HashMap::new(),
            images: HashMap::new(),
            partial_image: None,
            deferred: None,
            staged: Vec::new(),
            launches: VecDeque::new(),
            device_time: std::time::Duration::ZERO,
            scratch: Vec::new(),
            view: None,
            sticky: None,
            lease: None,
            textures: HashSet::new(),
        }
    }

    /// Device time this session's kernels have run.
    pub fn device_time(&self) -> std::time::Duration {
        self.device_time
    }

    /// Before a launch: waits for the device unless this session holds it, and renews a lease
    /// whose quantum is used up (it ends and the session queues again, in one request).
    fn lease_for_launch(&mut self) {
        let quantum = match self.lease {
            Some(l) if l.used < l.quantum => return,
            Some(l) => self.ledger.renew(micros(l.used)),
            None => self.ledger.acquire(),
        };
        self.lease = Some(Lease {
            quantum: std::time::Duration::from_micros(quantum),
            used: std::time::Duration::ZERO,
        });
    }

    /// Whether this session holds the device now.
    pub fn holds_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// Gives the device back, charging what the lease's launches used.
    pub fn end_lease(&mut self) {
        if let Some(l) = self.lease.take() {
            self.ledger.done(micros(l.used));
        }
    }

    /// Bytes this session holds.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// A session sees one device, its ordinal 0, whichever of the node's devices serves it.
    fn check_device(&self, device: u32) -> R<()> {
        if device == 0 {
            Ok(())
        } else {
            Err(101) // CUDA_ERROR_INVALID_DEVICE
        }
    }

    fn check_stream(&self, stream: u64) -> R<()> {
        if stream == 0 || self.streams.contains(&stream) {
            Ok(())
        } else {
            Err(st::INVALID_HANDLE)
        }
    }

    /// What a host-to-device copy of `len` bytes to `dst` on `stream` must pass.
    fn check_htod(&self, dst: u64, stream: u64, len: u64) -> R<()> {
        self.check_stream(stream)?;
        self.check_range(dst, len)
    }

    /// `[ptr, ptr+len)` must be inside one of this session's allocations.
    fn check_range(&self, ptr: u64, len: u64) -> R<()> {
        if len == 0 || self.device.contains(ptr, len) {
            Ok(())
        } else {
            Err(st::INVALID_VALUE)
        }
    }

    /// Counts `size` bytes against the session's limit and the device's ledger.
    fn charge(&mut self, size: u64) -> R<()> {
        if size == 0 {
            return Ok(());
        }
        if self
            .limit
            .is_some_and(|l| self.used.checked_add(size).is_none_or(|u| u > l))
            || !self.ledger.reserve(size)
        {
            return Err(st::OUT_OF_MEMORY);
        }
        self.used += size;
        Ok(())
    }

    fn uncharge(&mut self, size: u64) {
        self.used -= size;
        self.ledger.release(size);
    }

    /// Unloads a device module and gives back what its variables were charged (the device
    /// says how much, as it did at load).
    fn unload_module(&mut self, id: u64) -> R<()> {
        let bytes = self.device.module_bytes(id);
        self.device.unload_module(id)?;
        self.uncharge(bytes);
        Ok(())
    }

    fn alloc(&mut self, size: u64) -> R<u64> {
        if size == 0 {
            return Err(st::INVALID_VALUE);
        }
        self.charge(size)?;
        match self.device.alloc(size) {
            Ok(p) => {
                self.allocations.insert(p, size);
                Ok(p)
            }
            Err(e) => {
                self.uncharge(size);
                Err(e)
            }
        }
    }

    fn free(&mut self, ptr: u64) -> R<()> {
        let size = self.allocations.remove(&ptr).ok_or(st::INVALID_VALUE)?;
        self.device.free(ptr)?;
        self.uncharge(size);
        Ok(())
    }

    /// Frees everything: at reset and when the session ends.
    pub fn release_all(&mut self) {
        self.end_lease();
        let ptrs: Vec<u64> = self.allocations.keys().copied().collect();
        for p in ptrs {
            let _ = self.free(p);
        }
        let mapped: Vec<(u64, u64)> = self.vmm.mapped.drain().collect();
        for (ptr, size) in mapped {
            let _ = self.device.unmap(ptr, size);
        }
        let physical: Vec<(u64, u64)> = self.vmm.physical.drain().map(|(_, p)| p).collect();
        for (id, size) in physical {
            let _ = self.device.release_physical(id);
            self.uncharge(size);
        }
        let reserved: Vec<(u64, u64)> = self.vmm.reserved.drain().collect();
        for (ptr, size) in reserved {
            let _ = self.device.unreserve(ptr, size);
        }
        let modules: Vec<u64> = self.modules.drain().map(|(_, id)| id).collect();
        for id in modules {
            let _ = self.unload_module(id);
        }
        for h in std::mem::take(&mut self.textures) {
            let _ = self.device.destroy_texture(h);
        }
        self.functions.clear();
        self.streams.clear();
        self.events.clear();
        self.contexts.clear();
        self.deferred = None;
        self.staged.clear();
    }

    /// Checks `height` rows of `width` bytes at `r` against the session; returns the bytes
    /// they hold (`width * height`, checked: both come from the wire).
    fn rows(&mut self, r: Rect, width: u64, height: u64) -> R<u64> {
        if width > r.pitch && height > 1 {
            return Err(st::INVALID_VALUE);
        }
        let span = r
            .pitch
            .checked_mul(height.saturating_sub(1))
            .and_then(|s| s.checked_add(width))
            .ok_or(st::INVALID_VALUE)?;
        self.check_range(r.ptr, span)?;
        width.checked_mul(height).ok_or(st::INVALID_VALUE)
    }

    /// Runs one request. `Ok` carries the reply body for synchronous requests.
    pub fn handle(&mut self, req: Request) -> R<ReplyBody> {
        use Request::*;
        match req {
            Ping => {}
            CtxCreate { ctx, device, .. } => {
                self.check_device(device)?;
                self.contexts.insert(ctx);
            }
            CtxDestroy { ctx } => {
                self.contexts.remove(&ctx).then_some(()).ok_or(201)?;
            }
            CtxSynchronize { .. } => {}
            DeviceReset { device } => {
                self.check_device(device)?;
                self.release_all();
            }
            MemAlloc { device, size } => {
                self.check_device(device)?;
                return Ok(ReplyBody::Ptr(self.alloc(size)?));
            }
            MemAllocPitch {
                device,
                width,
                height,
                elem_size,
            } => {
                self.check_device(device)?;
                if width == 0 || height == 0 || !matches!(elem_size, 4 | 8 | 16) {
                    return Err(st::INVALID_VALUE);
                }
                let pitch = width.div_ceil(512) * 512;
                let ptr = self.alloc(pitch.checked_mul(height).ok_or(st::OUT_OF_MEMORY)?)?;
                return Ok(ReplyBody::Pitch { ptr, pitch });
            }
            MemFree { ptr } => self.free(ptr)?,
            MemGetInfo { device } => {
                self.check_device(device)?;
                let total = self.device.info(self.limit).total_mem;
                let free = match self.limit {
                    Some(_) => total.saturating_sub(self.used),
                    None => total.saturating_sub(self.ledger.device_used()),
                };
                return Ok(ReplyBody::MemInfo { free, total });
            }
            MemcpyHtoD { dst, stream, data } => {
                self.check_htod(dst, stream, data.len() as u64)?;
                self.device.write(dst, data)?;
            }
            MemcpyDtoH { src, size, stream } => {
                self.check_stream(stream)?;
                self.check_range(src, size)?;
                if size >= 64 * 1024 && self.device.view(src, size).is_some() {
                    // Sent straight from device memory by `run`.
                    self.view = Some((src, size));
                    return Ok(ReplyBody::Data(Vec::new()));
                }
                // The buffer of the last large reply is reused: no fresh pages per copy.
                let mut out = std::mem::take(&mut self.scratch);
                out.clear();
                out.resize(size as usize, 0);
                self.device.read(src, &mut out)?;
                return Ok(ReplyBody::Data(out));
            }
            MemcpyDtoHAsync {
                src,
                size,
                stream,
                tag,
            } => {
                self.check_stream(stream)?;
                self.check_range(src, size)?;
                let mut data = vec![0u8; size as usize];
                self.device.read(src, &mut data)?;
                self.staged.push(StagedCopy { tag, data });
            }
            MemcpyDtoD {
                dst,
                src,
                size,
                stream,
            } => {
                self.check_stream(stream)?;
                self.check_range(dst, size)?;
                self.check_range(src, size)?;
                self.device.copy(dst, src, size)?;
            }
            Memcpy2DDtoD {
                dst,
                src,
                width,
                height,
                stream,
            } => {
                self.check_stream(stream)?;
                self.rows(dst, width, height)?;
                self.rows(src, width, height)?;
                for row in 0..height {
                    self.device.copy(
                        dst.ptr + row * dst.pitch,
                        src.ptr + row * src.pitch,
                        width,
                    )?;
                }
            }
            Memcpy2DHtoD {
                dst,
                width,
                height,
                stream,
                data,
            } => {
                self.check_stream(stream)?;
                let total = self.rows(dst, width, height)?;
                if data.len() as u64 != total {
                    return Err(st::INVALID_VALUE);
                }
                // Zero-width rows copy nothing (and `chunks(0)` would panic).
                if total > 0 {
                    for (row, chunk) in data.chunks(width as usize).enumerate() {
                        self.device.write(dst.ptr + row as u64 * dst.pitch, chunk)?;
                    }
                }
            }
            Memcpy2DDtoH {
                src,
                width,
                height,
                stream,
            } => {
                self.check_stream(stream)?;
                let total = self.rows(src, width, height)?;
                let mut out = vec![0u8; usize::try_from(total).map_err(|_| st::INVALID_VALUE)?];
                if total > 0 {
                    for (row, chunk) in out.chunks_mut(width as usize).enumerate() {
                        self.device.read(src.ptr + row as u64 * src.pitch, chunk)?;
                    }
                }
                return Ok(ReplyBody::Data(out));
            }
            Memset {
                dst,
                value,
                elem_size,
                count,
                stream,
            } => {
                self.check_stream(stream)?;
                self.check_range(dst, count.saturating_mul(elem_size as u64))?;
                self.device.memset(dst, value, elem_size, count)?;
            }
            Memset2D {
                dst,
                value,
                elem_size,
                width,
                height,
                stream,
            } => {
                self.check_stream(stream)?;
                let row_bytes = width
                    .checked_mul(elem_size as u64)
                    .ok_or(st::INVALID_VALUE)?;
                self.rows(dst, row_bytes, height)?;
                for row in 0..height {
                    self.device
                        .memset(dst.ptr + row * dst.pitch, value, elem_size, width)?;
                }
            }
            StreamCreate { stream, .. } => {
                self.streams.insert(stream);
            }
            StreamDestroy { stream } => {
                self.streams
                    .remove(&stream)
                    .then_some(())
                    .ok_or(st::INVALID_HANDLE)?;
            }
            StreamSynchronize { stream } | StreamQuery { stream } => self.check_stream(stream)?,
            StreamWaitEvent { stream, event } => {
                self.check_stream(stream)?;
                self.events.get(&event).ok_or(st::INVALID_HANDLE)?;
            }
            EventCreate { event, .. } => {
                self.events.insert(event, None);
            }
            EventDestroy { event } => {
                self.events.remove(&event).ok_or(st::INVALID_HANDLE)?;
            }
            EventRecord { event, stream } => {
                self.check_stream(stream)?;
                *self.events.get_mut(&event).ok_or(st::INVALID_HANDLE)? = Some(Instant::now());
            }
            EventQuery { event } | EventSynchronize { event } => {
                self.events.get(&event).ok_or(st::INVALID_HANDLE)?;
            }
            EventElapsedTime { start, end } => {
                let a = self
                    .events
                    .get(&start)
                    .ok_or(st::INVALID_HANDLE)?
                    .ok_or(st::INVALID_HANDLE)?;
                let b = self
                    .events
                    .get(&end)
                    .ok_or(st::INVALID_HANDLE)?
                    .ok_or(st::INVALID_HANDLE)?;
                let ms = if b >= a {
                    (b - a).as_secs_f32() * 1e3
                } else {
                    -((a - b).as_secs_f32() * 1e3)
                };
                return Ok(ReplyBody::Elapsed(ms));
            }
            ModuleLoad {
                module,
                device,
                hash,
                image,
            } => {
                self.check_device(device)?;
                let image = match image {
                    Some(img) => {
                        if Sha256::digest(img).as_slice() != hash {
                            return Err(st::INVALID_VALUE);
                        }
                        if self.images.len() >= MAX_CACHED_IMAGES {
                            self.images.clear();
                        }
                        self.images
                            .entry(hash)
                            .or_insert_with(|| img.to_vec())
                            .clone()
                    }
                    None => match self.images.get(&hash) {
                        Some(img) => img.clone(),
                        None => return Ok(ReplyBody::NeedImage),
                    },
                };
                let id = self.device.load_module(&image)?;
                // Module variables are device memory: charged like an allocation.
                let bytes = self.device.module_bytes(id);
                if let Err(e) = self.charge(bytes) {
                    let _ = self.device.unload_module(id);
                    return Err(e);
                }
                if let Some(old) = self.modules.insert(module, id) {
                    let _ = self.unload_module(old);
                }
            }
            ModuleUnload { module } => {
                let id = self.modules.remove(&module).ok_or(st::INVALID_HANDLE)?;
                self.functions.retain(|_, (m, _)| *m != module);
                self.unload_module(id)?;
            }
            ModuleGetFunction {
                module,
                name,
                function,
            } => {
                let id = *self.modules.get(&module).ok_or(st::INVALID_HANDLE)?;
                let info = self.device.function(id, name)?;
                self.functions.insert(function, (module, name.into()));
                return Ok(ReplyBody::Function(info));
            }
            ModuleGetGlobal { module, name } => {
                let id = *self.modules.get(&module).ok_or(st::INVALID_HANDLE)?;
                let (ptr, size) = self.device.global(id, name)?;
                return Ok(ReplyBody::Global { ptr, size });
            }
            LaunchKernel(l) => {
                self.check_stream(l.stream)?;
                let (module, name) = self
                    .functions
                    .get(&l.function)
                    .map(|(m, n)| (*m, n.clone()))
                    .ok_or(st::INVALID_HANDLE)?;
                let id = *self.modules.get(&module).ok_or(st::INVALID_HANDLE)?;
                let mut record = if self.launches.len() == LAUNCH_LOG {
                    self.launches.pop_front().unwrap_or_default()
                } else {
                    LaunchRecord::default()
                };
                if *record.function_name != *name {
                    record.function_name.clear();
                    record.function_name.push_str(&name);
                }
                record.grid = l.grid;
                record.block = l.block;
                record.shared_mem = l.shared_mem;
                record.stream = l.stream;
                record.params.clear();
                record.params.extend_from_slice(l.params);
                self.launches.push_back(record);
                tracing::debug!(
                    kernel = %name,
                    grid = ?l.grid,
                    block = ?l.block,
                    shared = l.shared_mem,
                    params = %hex(l.params),
                    "launch"
                );
                let k = KernelLaunch {
                    module: id,
                    function: &name,
                    grid: l.grid,
                    block: l.block,
                    shared_mem: l.shared_mem,
                    params: l.params,
                    // CU_LAUNCH_ATTRIBUTE_COOPERATIVE (2), nonzero.
                    cooperative: l
                        .attributes
                        .iter()
                        .any(|&(id, v)| id == 2 && v[0] as u32 != 0),
                };
                self.lease_for_launch();
                let result = self.device.launch(&k);
                if let (Ok(t), Some(lease)) = (result, self.lease.as_mut()) {
                    lease.used += t;
                }
                match result {
                    Ok(t) => self.device_time += t,
                    Err(e) => {
                        let detail = self.device.take_error_detail().unwrap_or_default();
                        tracing::warn!(kernel = %name, status = e, "launch failed: {detail}");
                        if matches!(
                            e,
                            st::ILLEGAL_ADDRESS
                                | st::MISALIGNED_ADDRESS
                                | st::ASSERT
                                | st::LAUNCH_FAILED
                        ) {
                            // Like a GPU context after a fault: every later call fails until reset.
                            self.sticky = Some(e);
                        }
                        return Err(e);
                    }
                }
            }
            DebugLaunchLog { max } => {
                let n = self.launches.len().saturating_sub(max as usize);
                return Ok(ReplyBody::Launches(
                    self.launches.iter().skip(n).cloned().collect(),
                ));
            }
            ModuleImagePart {
                hash,
                total,
                offset,
                data,
            } => {
                if total > MAX_IMAGE_BYTES {
                    return Err(st::INVALID_VALUE);
                }
                let mut part = match self.partial_image.take() {
                    Some((h, bytes)) if h == hash && bytes.len() as u64 == offset => bytes,
                    _ if offset == 0 => Vec::new(),
                    _ => return Err(st::INVALID_VALUE),
                };
                if offset + data.len() as u64 > total {
                    return Err(st::INVALID_VALUE);
                }
                part.extend_from_slice(data);
                if part.len() as u64 == total {
                    if Sha256::digest(&part).as_slice() != hash {
                        return Err(st::INVALID_VALUE);
                    }
                    if self.images.len() >= MAX_CACHED_IMAGES {
                        self.images.clear();
                    }
                    self.images.insert(hash, part);
                } else {
                    self.partial_image = Some((hash, part));
                }
            }
            MemCreate {
                handle,
                device,
                size,
            } => {
                self.check_device(device)?;
                if self.vmm.physical.contains_key(&handle) {
                    return Err(st::INVALID_VALUE);
                }
                self.charge(size)?;
                match self.device.create_physical(size) {
                    Ok(id) => {
                        self.vmm.physical.insert(handle, (id, size));
                    }
                    Err(e) => {
                        self.uncharge(size);
                        return Err(e);
                    }
                }
            }
            MemRelease { handle } => {
                let (id, size) = self.vmm.physical.remove(&handle).ok_or(st::INVALID_VALUE)?;
                self.device.release_physical(id)?;
                self.uncharge(size);
            }
            MemAddressReserve { size, align } => {
                let ptr = self.device.reserve(size, align)?;
                self.vmm.reserved.insert(ptr, size);
                return Ok(ReplyBody::Ptr(ptr));
            }
            MemAddressFree { ptr, size } => {
                self.device.unreserve(ptr, size)?;
                self.vmm.reserved.remove(&ptr);
            }
            MemMap { ptr, size, handle } => {
                let &(id, psize) = self.vmm.physical.get(&handle).ok_or(st::INVALID_VALUE)?;
                if size != psize {
                    // Part of a physical allocation, or several: not supported yet.
                    return Err(st::NOT_SUPPORTED);
                }
                self.device.map(ptr, id)?;
                self.vmm.mapped.insert(ptr, size);
            }
            MemUnmap { ptr, size } => {
                self.device.unmap(ptr, size)?;
                let end = ptr.saturating_add(size);
                self.vmm.mapped.retain(|&p, _| p < ptr || p >= end);
            }
            TexObjectCreate { handle, desc } => {
                if self.textures.contains(&handle) {
                    return Err(st::INVALID_VALUE);
                }
                self.check_range(desc.ptr, texture_span(&desc)?)?;
                self.device.create_texture(handle, &desc)?;
                self.textures.insert(handle);
            }
            TexObjectDestroy { handle } => {
                if !self.textures.remove(&handle) {
                    return Err(st::INVALID_HANDLE);
                }
                self.device.destroy_texture(handle)?;
            }
        }
        Ok(ReplyBody::None)
    }

    /// Runs a request as the wire sees it: a reply for synchronous requests, and a kept
    /// failure for quiet ones.
    /// Where a large quiet host-to-device copy of `len` bytes to `dst` lands, checked as
    /// `MemcpyHtoD` is: the device bytes to receive it into, or `Discard` (the failure is kept
    /// as for any quiet request), or `Unsupported` when the backend has no host view.
    pub fn htod_target(&mut self, dst: u64, stream: u64, len: u64) -> HtodTarget<'_> {
        self.end_lease();
        // As `dispatch` runs a quiet request: a poisoned session fails it, else `handle`'s checks.
        let checked = match self.sticky {
            Some(e) => Err(e),
            None => self.check_htod(dst, stream, len),
        };
        if let Err(e) = checked {
            self.deferred.get_or_insert(e);
            return HtodTarget::Discard;
        }
        match self.device.view_mut(dst, len) {
            Some(bytes) => HtodTarget::Write(bytes),
            None => HtodTarget::Unsupported,
        }
    }

    pub fn dispatch(&mut self, req: Request, quiet: bool) -> Option<Reply> {
        if !matches!(req, Request::LaunchKernel(_)) {
            // Only consecutive launches share a lease: copies and synchronization do not hold
            // the device for others.
            self.end_lease();
        }
        let result = match (self.sticky, &req) {
            (Some(_), Request::DeviceReset { .. }) => {
                self.sticky = None;
                self.handle(req)
            }
            (Some(e), Request::Ping | Request::DebugLaunchLog { .. }) => {
                self.handle(req).map_err(|_| e)
            }
            (Some(e), _) => Err(e),
            (None, _) => self.handle(req),
        };
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
        let mut reply = match result {
            Ok(body) => Reply::ok(body),
            Err(e) => Reply::err(e),
        };
        reply.deferred_error = self.deferred.take();
        reply.staged = std::mem::take(&mut self.staged);
        // Device-side printf of the launches so far: the client prints it on this reply.
        reply.output = self.device.take_output();
        Some(reply)
    }
}

/// See [`Session::htod_target`].
pub enum HtodTarget<'a> {
    Write(&'a mut [u8]),
    Discard,
    Unsupported,
}

/// Copies at least this large are received straight into device memory.
const DIRECT_HTOD: u32 = 1 << 20;
/// A copy's message is a few dozen bytes; anything longer is not one to take the direct path.
const MAX_DIRECT_HEAD: u32 = 256;

/// Serves one session on `conn` until the client leaves, then frees everything it held.
/// Sends the hello answer first.
pub fn serve(
    mut conn: Conn,
    session_id: u64,
    device: &mut dyn Device,
    ledger: &mut dyn Ledger,
    limit: Option<u64>,
) -> Result<(), WorkerError> {
    let info = device.info(limit);
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Accepted {
            session_id,
            devices: vec![info],
        },
    );
    conn.send(&out).map_err(TransportError::from)?;
    let beat =
        heartbeat::Heartbeat::start(conn.stream().try_clone().map_err(TransportError::from)?)
            .map_err(TransportError::from)?;
    let mut session = Session::new(device, ledger, limit);
    let result = run(&mut conn, &mut session, &mut out, &beat);
    session.release_all();
    match result {
        Err(WorkerError::Transport(TransportError::Closed)) => Ok(()),
        other => other,
    }
}

/// Answers the hello with a refusal (the worker could not open its device).
pub fn refuse(mut conn: Conn, reason: String) -> Result<(), WorkerError> {
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::HelloReply,
        0,
        0,
        &ServerHello::Refused { reason },
    );
    conn.send(&out).map_err(TransportError::from)?;
    Ok(())
}

/// How often, at most, the worker looks whether its client is gone while launches arrive.
const HANGUP_CHECK: std::time::Duration = std::time::Duration::from_millis(1);

fn run(
    conn: &mut Conn,
    session: &mut Session,
    out: &mut Vec<u8>,
    beat: &heartbeat::Heartbeat,
) -> Result<(), WorkerError> {
    let mut last_check = std::time::Instant::now();
    loop {
        // A client that died with launches still queued in the socket: its work is dropped at
        // once instead of holding the device for the others (CUDA abandons a dead process's
        // work too). Looked at once a millisecond at most, so request rates do not pay for it.
        if last_check.elapsed() >= HANGUP_CHECK {
            last_check = std::time::Instant::now();
            if conn.peer_hung_up() {
                tracing::info!("the client is gone: dropping its queued work");
                return Err(WorkerError::Transport(TransportError::Closed));
            }
        }
        // Idle while waiting for the client (no heartbeats), busy from its next frame on.
        beat.busy(conn.has_frame());
        let header = conn.peek_header()?;
        beat.busy(true);
        // A large host-to-device copy: its data (the frame's tail) is received straight into
        // device memory.
        if header.kind == FrameKind::Request
            && header.is_quiet()
            && header.tail >= DIRECT_HTOD
            && header.message_len() <= MAX_DIRECT_HEAD
        {
            let head = header.message_len() as usize;
            if let Ok(Request::MemcpyHtoD { dst, stream, data }) =
                decode_borrowed::<Request>(conn.peek_body(head)?)
            {
                if data.is_empty() {
                    match session.htod_target(dst, stream, u64::from(header.tail)) {
                        HtodTarget::Write(bytes) => {
                            conn.recv_tail_into(head, bytes)?;
                            continue;
                        }
                        HtodTarget::Discard => {
                            conn.skip_frame()?;
                            continue;
                        }
                        HtodTarget::Unsupported => {}
                    }
                }
            }
        }
        let (header, body) = conn.recv()?;
        if header.kind != FrameKind::Request {
            return Err(WorkerError::UnexpectedFrame(header.kind));
        }
        let quiet = header.is_quiet();
        let id = header.request_id;
        let req: Request = decode_request(&header, body)?;

        if tracing::enabled!(tracing::Level::TRACE) {
            let mut text = format!("{req:?}");
            text.truncate(200);
            tracing::trace!(quiet, "request {text}");
        }
        let reply = session.dispatch(req, quiet);
        if session.holds_lease() && !conn.poll_frame() {
            // Nothing more has arrived: do not hold the device while waiting for the client.
            session.end_lease();
        }
        if let Some(mut reply) = reply {
            let _writing = beat.writing();
            out.clear();
            if let Some((src, size)) = session.view.take() {
                if reply.status == 0 {
                    encode_frame_head(out, FrameKind::Reply, 0, id, &reply, size as usize);
                    conn.send(out).map_err(TransportError::from)?;
                    let data = session
                        .device
                        .view(src, size)
                        .expect("checked when the request ran");
                    conn.send(data).map_err(TransportError::from)?;
                    continue;
                }
            }
            match &mut reply.body {
                // Bulk data goes out from its own buffer, not copied into the frame.
                ReplyBody::Data(d) if d.len() >= 64 * 1024 => {
                    let data = std::mem::take(d);
                    encode_frame_head(out, FrameKind::Reply, 0, id, &reply, data.len());
                    conn.send(out).map_err(TransportError::from)?;
                    conn.send(&data).map_err(TransportError::from)?;
                    session.scratch = data;
                }
                _ => {
                    encode_frame(out, FrameKind::Reply, 0, id, &reply);
                    conn.send(out).map_err(TransportError::from)?;
                }
            }
            if out.capacity() > 1 << 20 {
                *out = Vec::new();
            }
        }
    }
}

/// Lower-case hex of `bytes`, for logs.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
