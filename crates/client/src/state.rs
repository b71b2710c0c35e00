//! The session: its connection and everything the client knows locally (devices and their
//! attributes, allocations, contexts, modules, functions, streams and events).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpufuse_proto::{DeviceInfo, FunctionInfo, Qos, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

use crate::connection::Connection;
use crate::error::ClientError;
use crate::handles::{self, Kind};
use crate::lanes::Lanes;

/// How to reach the server, from the environment `gpufuse run` sets.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub address: Address,
    pub token: String,
    pub resources: ResourceRequest,
}

impl SessionConfig {
    pub fn from_env() -> Result<Self, ClientError> {
        let addr = std::env::var("GPUFUSE_SERVER").map_err(|_| ClientError::NoServerConfigured)?;
        let address = addr.parse().map_err(ClientError::BadAddress)?;
        let token = std::env::var("GPUFUSE_TOKEN").unwrap_or_default();
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        let qos = match std::env::var("GPUFUSE_QOS").as_deref() {
            Ok("low") => Qos::Low,
            Ok("high") => Qos::High,
            Ok("critical") => Qos::Critical,
            _ => Qos::Medium,
        };
        let resources = ResourceRequest {
            vram_bytes: num("GPUFUSE_VRAM"),
            compute_percent: num("GPUFUSE_COMPUTE").map(|v| v as u32),
            tflops: num("GPUFUSE_TFLOPS").map(|v| v as u32),
            qos,
        };
        Ok(Self {
            address,
            token,
            resources,
        })
    }
}

pub use crate::memory::{Allocation, MemoryKind};

/// Device attributes the client answers for managed memory: MANAGED_MEMORY 1,
/// PAGEABLE_MEMORY_ACCESS 0, CONCURRENT_MANAGED_ACCESS 0, PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
/// 0, DIRECT_MANAGED_MEM_ACCESS_FROM_HOST 0. A device whose managed memory is shared
/// ([`shares_managed_memory`]) reports CONCURRENT_MANAGED_ACCESS 1 instead.
const MANAGED_ATTRIBUTES: [(usize, i32); 5] = [(83, 1), (88, 0), (89, 0), (100, 0), (101, 0)];
/// `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`.
const CONCURRENT_MANAGED_ACCESS: usize = 89;

/// Whether managed memory on `device` is shared between this process and the device
/// (`crate::memory`, `MemoryKind::SharedManaged`): the session is on the shared-memory
/// transport with a host arena, the device keeps its memory in host memory (an emulated GPU),
/// and `GPUFUSE_SHARED_MANAGED` is not `0`.
fn shares_managed_memory(conn: &Connection, device: &gpufuse_proto::DeviceInfo) -> bool {
    conn.host_arena().is_some()
        && device.kind == gpufuse_proto::DeviceKind::Emulated
        && std::env::var("GPUFUSE_SHARED_MANAGED").map_or(true, |v| v.trim() != "0")
}

/// A CUDA array, kept as linear device memory: rows of `pitch` bytes, `height` rows per
/// slice, `depth` slices (the layout is private to the driver, so any layout serves copies).
#[derive(Debug, Clone, Copy)]
pub struct ArrayInfo {
    pub ptr: u64,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: i32,
    pub channels: u32,
    pub flags: u32,
    pub pitch: u64,
}

/// A texture or surface object: the device memory it reads, and the descriptors it was created
/// with as the application gave them (the shim's own types, for `cuTexObjectGet*Desc`).
#[derive(Debug, Clone)]
pub struct TexObjectInfo {
    pub ptr: u64,
    pub descriptors: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

/// What a device's memory pool holds. Freed pool memory goes back to the device at once (no
/// caching), so reserved equals used.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolStats {
    /// The device the pool allocates on.
    pub device: u32,
    /// Largest size the pool may reach (`CUmemPoolProps::maxSize`); 0: the device's memory.
    pub max_size: u64,
    pub used: u64,
    pub high: u64,
    pub reserved_high: u64,
    pub release_threshold: u64,
    /// An exportable pool's secret (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), which its
    /// descriptors' names and its pointers' export data carry (`crate::ipc`).
    pub shareable: Option<[u8; 16]>,
    /// Imported from another process (`cuMemPoolImportFromShareableHandle`): it gives out
    /// that process's pointers (`cuMemPoolImportPointer`), never allocations of its own.
    pub imported: bool,
}

/// Page-locked host memory handed out by `cuMemHostAlloc` and friends.
#[derive(Debug, Clone, Copy)]
pub struct HostAllocation {
    pub size: usize,
    pub flags: u32,
    /// Registered by the application (`cuMemHostRegister`), not allocated by us.
    pub registered: bool,
    /// Mapped pinned memory (`CU_MEMHOSTALLOC_DEVICEMAP`): kept like managed memory, a device
    /// allocation at the same address, so kernels reach it through the same pointer.
    pub device_mapped: bool,
}

#[derive(Debug, Clone)]
pub struct Context {
    pub device: u32,
    pub flags: u32,
    pub(crate) primary: bool,
}

#[derive(Debug, Clone, Default)]
pub struct PrimaryContext {
    pub handle: u64,
    pub refcount: u32,
    pub flags: u32,
    pub created: bool,
}

#[derive(Debug, Clone)]
pub struct Module {
    pub device: u32,
    pub(crate) functions: HashMap<String, u64>,
    /// The library this module belongs to, if loaded through `cuLibraryLoadData`.
    pub library: Option<u64>,
    /// The image it was loaded from (to load it again on another worker).
    pub image: std::sync::Arc<[u8]>,
    /// Its globals the application asked for: name -> address.
    pub globals: HashMap<String, u64>,
    /// When it was loaded on the worker, among everything that takes device address space.
    pub(crate) order: u64,
    /// Whether the worker has it yet: images load lazily, at their first use.
    pub(crate) state: crate::module::LoadState,
}

#[derive(Debug, Clone)]
pub struct Function {
    pub module: u64,
    pub name: String,
    pub info: FunctionInfo,
}

impl Function {
    /// One of its attributes (`CUfunction_attribute`), if the device gave it or the
    /// application set it.
    pub fn attribute(&self, attr: i32) -> Option<i32> {
        self.info
            .attributes
            .iter()
            .find(|(a, _)| *a == attr)
            .map(|&(_, v)| v)
    }

    /// Sets attribute `attr` to `value` (`cuFuncSetAttribute`).
    pub fn set_attribute(&mut self, attr: i32, value: i32) {
        match self.info.attributes.iter_mut().find(|(a, _)| *a == attr) {
            Some(slot) => slot.1 = value,
            None => self.info.attributes.push((attr, value)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Library {
    /// The library's module, or the status loading it gave. A library whose code the device
    /// cannot run still loads, as with the driver's lazy loading: using its kernels or globals
    /// returns that status.
    pub module: Result<u64, i32>,
    /// The device the library's code was loaded on.
    pub device: u32,
    /// The image, kept because a library outlives contexts: a device reset loads it again.
    pub image: std::sync::Arc<[u8]>,
    pub(crate) kernels: HashMap<String, u64>,
}

#[derive(Debug, Clone)]
pub struct Kernel {
    pub library: u64,
    pub function: u64,
}

#[derive(Debug, Clone)]
pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub flags: u32,
    pub recorded: bool,
}

/// Everything guarded by the session lock.
#[derive(Debug)]
pub struct Inner {
    /// The connection: only the core builds requests (each operation is a method).
    pub(crate) conn: Connection,
    pub(crate) allocations: BTreeMap<u64, Allocation>,
    pub(crate) host: BTreeMap<usize, HostAllocation>,
    /// Registered memory moved into the host arena in place ([`crate::registered`]).
    pub(crate) aliases: crate::registered::Aliases,
    pub(crate) contexts: HashMap<u64, Context>,
    pub(crate) primary: Vec<PrimaryContext>,
    pub(crate) modules: HashMap<u64, Module>,
    pub(crate) functions: HashMap<u64, Function>,
    pub(crate) libraries: HashMap<u64, Library>,
    pub(crate) kernels: HashMap<u64, Kernel>,
    pub(crate) streams: HashMap<u64, Stream>,
    pub(crate) events: HashMap<u64, Event>,
    /// Memory pools by handle: each device's default pool (made on first use) and the pools
    /// `cuMemPoolCreate` made.
    pub(crate) pools: HashMap<u64, PoolStats>,
    /// Per device: the pool `cuMemAllocAsync` allocates from when it is not the default
    /// (`cuDeviceSetMemPool`).
    pub(crate) current_pools: HashMap<u32, u64>,
    /// Whether the device holds the current contents of managed memory (device work has been
    /// issued since the host last had them).
    pub(crate) managed_on_device: bool,
    /// How many moved managed allocations exist (none: nothing to move at all).
    pub(crate) managed_count: usize,
    /// Per device: whether its managed memory is shared rather than moved
    /// (`MemoryKind::SharedManaged`).
    pub(crate) shared_managed: Vec<bool>,
    /// How many shared managed allocations exist: while any does, device work is sent at once
    /// (the host may be waiting on what it does) and launches take no lane.
    pub(crate) shared_count: usize,
    /// Allocations exported for CUDA IPC (`cuIpcGetMemHandle`): by base address.
    pub(crate) ipc_exports: std::collections::HashSet<u64>,
    /// Memory opened with `cuIpcOpenMemHandle`: address -> its handle and how many opens it
    /// has (CUDA gives the same pointer to a second open and counts it).
    pub(crate) ipc_opened: HashMap<u64, ([u8; 64], u32)>,
    /// Physical memory made with `cuMemCreate`: handle -> (size, device, compressible: made with
    /// `CU_MEM_ALLOCATION_COMP_GENERIC` on a device that supports it).
    pub(crate) physical: HashMap<u64, (u64, u32, bool)>,
    /// References `cuMemRetainAllocationHandle` added to physical memory, by handle: each
    /// `cuMemRelease` takes one back before the last releases the memory.
    pub(crate) physical_retains: HashMap<u64, u32>,
    /// Mapped physical memory: address -> handle.
    pub(crate) mappings: HashMap<u64, u64>,
    /// CUDA arrays: handle -> their linear device memory and shape.
    pub(crate) arrays: HashMap<u64, ArrayInfo>,
    /// Texture and surface objects: handle -> what they were created with.
    pub(crate) textures: HashMap<u64, TexObjectInfo>,
    /// CUDA graphs and stream capture.
    pub(crate) graphs: crate::graph::Graphs,
    /// How many allocations and module loads the server placed (their order).
    pub(crate) placements: u64,
    /// The session's per-stream lanes ([`crate::lanes`]): the locked path grants them and
    /// invalidates them when something they rely on changes.
    pub(crate) lanes: Arc<Lanes>,
    /// `CUlimit` values by (device, limit): those the application set, and the device's own
    /// values once asked (`Request::GetLimit`).
    pub(crate) limits: HashMap<(u32, i32), usize>,
    /// Occupancy answers of the device, by (function, block size, dynamic shared memory, the
    /// function's dynamic shared memory opt-in, flags) (`Request::Occupancy`).
    pub(crate) occupancy: HashMap<(u64, u32, u64, u32, u32), i32>,
}

impl Inner {
    /// Moves every lane's queued frames into the connection.
    pub(crate) fn drain_lanes(&mut self) {
        if self.lanes.pending() {
            let lanes = self.lanes.clone();
            self.conn.append_frames(|out| lanes.drain_into(out));
        }
    }

    /// Something a lane or a thread's launch cache relies on changed (a stream, function,
    /// module, library or context went away, a stream started capturing, managed memory
    /// appeared): the next launch on every lane takes the locked path and is checked again.
    pub(crate) fn lanes_changed(&self) {
        self.lanes.invalidate();
    }

    /// The host allocation containing `ptr`, as (base, allocation).
    pub fn find_host(&self, ptr: usize) -> Option<(usize, HostAllocation)> {
        let (&base, &h) = self.host.range(..=ptr).next_back()?;
        (ptr < base + h.size.max(1)).then_some((base, h))
    }
}

/// A connected session.
#[derive(Debug)]
pub struct Session {
    /// The server's id of the session (a reconnect changes it).
    session_id: std::sync::atomic::AtomicU64,
    pub devices: Vec<DeviceInfo>,
    /// The hello this session connects with (again, when it reconnects).
    pub(crate) hello: gpufuse_proto::ClientHello,
    /// Per device: attribute id -> value (0 when the device did not answer it).
    attributes: Vec<Vec<i32>>,
    inner: Mutex<Inner>,
    /// Quiet launches queued per stream without the session lock ([`crate::lanes`]).
    pub(crate) lanes: Arc<Lanes>,
}

/// Attribute ids at or above this are not cached (and answered with an error).
pub const MAX_ATTRIBUTE: usize = 512;

impl Session {
    /// Connects with `config` and opens a CUDA session.
    pub fn connect(config: &SessionConfig) -> Result<Self, ClientError> {
        let hello = Connection::hello(
            SessionKind::Cuda,
            config.token.clone(),
            config.resources.clone(),
        );
        let (conn, accepted) = Connection::open(&config.address, &hello)?;
        Ok(Self::over(conn, accepted, hello))
    }

    /// A session over a connection whose hello was accepted (`Connection::open`, or
    /// `Connection::handshake` on a stream of the caller's: a socket pair in tests).
    pub fn over(
        conn: Connection,
        accepted: crate::connection::Accepted,
        hello: gpufuse_proto::ClientHello,
    ) -> Self {
        let attributes = accepted
            .devices
            .iter()
            .map(|d| {
                let mut v = vec![0; MAX_ATTRIBUTE];
                for &(id, value) in &d.attributes {
                    if let Some(slot) = usize::try_from(id).ok().and_then(|i| v.get_mut(i)) {
                        *slot = value;
                    }
                }
                // Managed memory as the client provides it (whatever the server's GPU does):
                // supported, with no concurrent host access while device work is outstanding.
                for (id, value) in MANAGED_ATTRIBUTES {
                    if let Some(slot) = v.get_mut(id) {
                        *slot = value;
                    }
                }
                if shares_managed_memory(&conn, d) {
                    if let Some(slot) = v.get_mut(CONCURRENT_MANAGED_ACCESS) {
                        *slot = 1;
                    }
                }
                v
            })
            .collect();
        let shared_managed = accepted
            .devices
            .iter()
            .map(|d| shares_managed_memory(&conn, d))
            .collect();
        let primary = accepted
            .devices
            .iter()
            .map(|_| PrimaryContext {
                handle: handles::mint(Kind::Context),
                ..Default::default()
            })
            .collect();
        let lanes = Arc::new(Lanes::new());
        Self {
            lanes: lanes.clone(),
            session_id: std::sync::atomic::AtomicU64::new(accepted.session_id),
            devices: accepted.devices,
            hello,
            attributes,
            inner: Mutex::new(Inner {
                conn,
                allocations: BTreeMap::new(),
                host: BTreeMap::new(),
                aliases: Default::default(),
                contexts: HashMap::new(),
                primary,
                modules: HashMap::new(),
                functions: HashMap::new(),
                libraries: HashMap::new(),
                kernels: HashMap::new(),
                streams: HashMap::new(),
                events: HashMap::new(),
                pools: HashMap::new(),
                current_pools: HashMap::new(),
                managed_on_device: false,
                managed_count: 0,
                shared_managed,
                shared_count: 0,
                ipc_exports: Default::default(),
                ipc_opened: HashMap::new(),
                physical: HashMap::new(),
                physical_retains: HashMap::new(),
                mappings: HashMap::new(),
                arrays: HashMap::new(),
                textures: HashMap::new(),
                graphs: Default::default(),
                placements: 0,
                lanes,
                limits: HashMap::new(),
                occupancy: HashMap::new(),
            }),
        }
    }

    /// The server's id of this session.
    pub fn session_id(&self) -> u64 {
        self.session_id.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn set_session_id(&self, id: u64) {
        self.session_id
            .store(id, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts the thread that sends quiet calls left waiting for more than `interval` (an
    /// application that launches work and then only polls host memory still gets it run).
    /// Called once the session exists, never while the library is being loaded.
    pub fn start_flusher(self: &std::sync::Arc<Self>, interval: std::time::Duration) {
        let weak = std::sync::Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("gpufuse-flush".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                let Some(s) = weak.upgrade() else { return };
                let guard = match s.inner.try_lock() {
                    Ok(g) => Some(g),
                    Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) => None,
                };
                if let Some(mut g) = guard {
                    g.drain_lanes();
                    if g.conn.has_queued() {
                        let _ = g.conn.flush();
                    }
                }
            });
    }

    /// Locks the session state. A panic while it was held does not poison it for good.
    ///
    /// Every lane's queued launches move into the connection first ([`crate::lanes`]), so
    /// whatever the caller sends next goes out after everything any thread queued before.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.drain_lanes();
        g
    }

    /// The session's lanes (diagnostics and tests).
    pub fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    pub fn device(&self, ordinal: i32) -> Option<&DeviceInfo> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
    }

    /// A cached device attribute.
    pub fn attribute(&self, device: i32, attr: i32) -> Option<i32> {
        let d = self.attributes.get(usize::try_from(device).ok()?)?;
        d.get(usize::try_from(attr).ok()?).copied()
    }

    /// Device `device`'s compute capability as one number (9.0 is 90), from its attributes
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` (75) and `_MINOR` (76).
    pub fn compute_capability(&self, device: i32) -> Option<u32> {
        let (major, minor) = (self.attribute(device, 75)?, self.attribute(device, 76)?);
        u32::try_from(major * 10 + minor).ok()
    }
}

thread_local! {
    /// The calling thread's context stack; the last entry is current.
    static CONTEXT_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The current context of threads whose stack is gone: a driver call from a thread-local
/// destructor at thread exit (an allocator's cache freeing memory) runs after the stack's
/// own destructor, and must neither panic nor lose the context its library just made
/// current. Shared by every exiting thread, which at worst see each other's context.
static EXITING_CONTEXT: AtomicU64 = AtomicU64::new(0);

/// The calling thread's current context (0 if none).
pub fn current_context() -> u64 {
    CONTEXT_STACK
        .try_with(|s| s.borrow().last().copied().unwrap_or(0))
        .unwrap_or_else(|_| EXITING_CONTEXT.load(Ordering::Acquire))
}

/// Replaces the current context (`cuCtxSetCurrent`); 0 pops it.
pub fn set_current_context(ctx: u64) {
    let set = CONTEXT_STACK.try_with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if ctx != 0 {
            s.push(ctx);
        }
    });
    if set.is_err() {
        EXITING_CONTEXT.store(ctx, Ordering::Release);
    }
}

pub fn push_context(ctx: u64) {
    if CONTEXT_STACK
        .try_with(|s| s.borrow_mut().push(ctx))
        .is_err()
    {
        EXITING_CONTEXT.store(ctx, Ordering::Release);
    }
}

pub fn pop_context() -> Option<u64> {
    CONTEXT_STACK
        .try_with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|_| Some(EXITING_CONTEXT.swap(0, Ordering::AcqRel)).filter(|&c| c != 0))
}

/// Removes `ctx` from the calling thread's stack (when it is destroyed).
pub fn forget_context(ctx: u64) {
    let _ = CONTEXT_STACK.try_with(|s| s.borrow_mut().retain(|&c| c != ctx));
    let _ = EXITING_CONTEXT.compare_exchange(ctx, 0, Ordering::AcqRel, Ordering::Acquire);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_stack_push_pop_and_set() {
        assert_eq!(current_context(), 0);
        push_context(5);
        push_context(6);
        assert_eq!(current_context(), 6);
        set_current_context(7);
        assert_eq!(current_context(), 7);
        assert_eq!(pop_context(), Some(7));
        assert_eq!(current_context(), 5);
        forget_context(5);
        assert_eq!(current_context(), 0);
    }
}
