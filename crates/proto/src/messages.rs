//! Message bodies. Every handle is an id minted by the client (see the crate docs); device
//! pointers are device virtual addresses chosen by the server.

use serde::{Deserialize, Serialize};

use crate::ids::{
    ContextHandle, DevicePtr, EventHandle, FunctionHandle, ModuleHandle, PhysicalHandle, SessionId,
    StreamHandle, TexHandle,
};

/// A CUDA driver status code: the one `CUresult` type, generated from NVIDIA's `cuda.h` into
/// `gpufuse-cuda-types` with every value it defines (`gpufuse_cuda_types::short`).
pub use gpufuse_cuda_types::CUresult as Status;

/// Which kind of session a hello opens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionKind {
    /// A CUDA application: the connection is handed to a worker process.
    Cuda,
    /// A one-shot status query answered by the node itself.
    Status,
    /// A one-shot admission check (`gpufuse run`, before it starts the program): the node
    /// answers `Admissible` or `Refused` exactly as it would a `Cuda` hello with the same token
    /// and resources, and keeps nothing.
    Check,
    /// A one-shot request to end session `session` (`gpufuse kill`): the node kills its worker
    /// and answers `Ended` once everything the session held is released.
    End { session: SessionId },
    /// A node's agent opens its link to the controller (`gpufuse node --controller`); a
    /// node answers it with a refusal.
    NodeAgent,
    /// A one-shot request to move session `session` to the node's device `device`
    /// (`gpufuse migrate`): the node answers `Migrated` once the session runs there, or
    /// `Refused` with the session untouched.
    Migrate { session: SessionId, device: u32 },
    /// A one-shot request to end every session opened with a token of the Kubernetes claim
    /// the hello's own token names, sent by the DRA plugin when the kubelet unprepares the
    /// claim: the node answers `ClaimEnded` once they are released.
    EndClaim,
    /// A worker moving its session here from another node (`docs/migration.md`): the node
    /// admits it on device `device` as it would a `Cuda` hello with the same token and
    /// resources, and starts a worker for it at the session's address window `window_base`;
    /// the connection then carries the session's state ([`MoveMessage`] frames). `session`
    /// is the session's id on the node it leaves (for the logs); `bytes` what it holds there
    /// (the device must have that much room, whatever its slice).
    MoveIn {
        session: SessionId,
        device: u32,
        window_base: u64,
        bytes: u64,
    },
    /// A client whose session moved here ([`Moved`]): the connection is handed to the worker
    /// that holds the session, which answers the hello. `key` is the one-time key the move
    /// gave the client.
    Resume { key: u64 },
    /// A one-shot request to move session `session` to device `device` of another node
    /// (`gpufuse migrate --to NODE:DEVICE`). At a node, `node` is the target node's address
    /// and `token` the token to present there; at a controller, `node` is the target node's
    /// name and the controller grants the place itself.
    MigrateTo {
        session: SessionId,
        node: String,
        device: u32,
        token: String,
    },
    /// A one-shot request to a controller (`gpufuse node drain NODE`): cordon node `node`
    /// and move every session off it, each to the best device of its model elsewhere; the
    /// controller answers `Drained` once every move has ended. A node refuses it.
    Drain { node: String },
    /// A one-shot request to a controller (`gpufuse node cordon|uncordon NODE`): place
    /// nothing new on node `node` (`cordoned`), or place there again; its sessions keep
    /// running. Answered `Cordoned`.
    Cordon { node: String, cordoned: bool },
}

/// Quality-of-service level of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Qos {
    Low,
    #[default]
    Medium,
    High,
    Critical,
}

impl Qos {
    /// Scheduling rank: a higher rank goes first.
    pub fn rank(self) -> u8 {
        match self {
            Qos::Low => 0,
            Qos::Medium => 1,
            Qos::High => 2,
            Qos::Critical => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Qos::Low => "low",
            Qos::Medium => "medium",
            Qos::High => "high",
            Qos::Critical => "critical",
        }
    }
}

impl std::str::FromStr for Qos {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "low" => Qos::Low,
            "medium" => Qos::Medium,
            "high" => Qos::High,
            "critical" => Qos::Critical,
            _ => {
                return Err(format!(
                    "bad QoS {s:?}: expected low, medium, high or critical"
                ))
            }
        })
    }
}

/// How a node enforces compute shares (`gpufuse serve --compute-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ComputePolicy {
    /// A session never runs more than its share, even when the device would otherwise idle.
    Hard,
    /// Shares divide a busy device; a session may use capacity nobody else wants.
    #[default]
    Elastic,
}

impl ComputePolicy {
    pub fn name(self) -> &'static str {
        match self {
            ComputePolicy::Hard => "hard",
            ComputePolicy::Elastic => "elastic",
        }
    }
}

impl std::str::FromStr for ComputePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hard" => Ok(ComputePolicy::Hard),
            "elastic" => Ok(ComputePolicy::Elastic),
            _ => Err(format!(
                "bad compute policy {s:?}: expected hard or elastic"
            )),
        }
    }
}

/// What a session asks for. Fields left `None` take the server's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRequest {
    pub vram_bytes: Option<u64>,
    pub compute_percent: Option<u32>,
    pub tflops: Option<u32>,
    pub qos: Qos,
}

/// A device UUID in NVIDIA's text form, as `nvidia-smi -L` prints it:
/// `GPU-00112233-4455-6677-8899-aabbccddeeff`.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The client's first frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientHello {
    pub protocol_version: u16,
    pub kind: SessionKind,
    pub token: String,
    pub pid: u32,
    pub program: String,
    pub resources: ResourceRequest,
}

/// Whether a device is emulated or a real GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    Emulated,
    Cuda,
}

/// Everything the client caches about one device: immutable for the session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub kind: DeviceKind,
    pub uuid: [u8; 16],
    /// Memory the session may use: its slice, not the physical size.
    pub total_mem: u64,
    /// `(CUdevice_attribute, value)` for every attribute the device answers.
    pub attributes: Vec<(i32, i32)>,
}

/// The server's answer to a hello.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerHello {
    Accepted {
        session_id: SessionId,
        devices: Vec<DeviceInfo>,
    },
    Refused {
        reason: String,
    },
    Status(NodeStatus),
    /// A `Check` hello would be admitted now, on device `device`.
    Admissible {
        device: u32,
    },
    /// An `End` hello's session is gone and its memory released.
    Ended {
        session: SessionId,
    },
    /// From a controller: this session is served by the node at `address`; say hello there
    /// again with `grant` as the token (`crate::pool`).
    Redirect {
        address: String,
        grant: String,
    },
    /// From a controller: the pool's view (a `Status` hello).
    PoolStatus(crate::PoolStatus),
    /// From a controller to a node's agent: its registration may follow. `grant_key` verifies
    /// the grants clients bring; reports are due every `heartbeat_ms`.
    PoolAgent {
        grant_key: Vec<u8>,
        heartbeat_ms: u32,
    },
    /// A `Migrate` hello's session runs on `device` now; it was stopped for `stop_us` of the
    /// move's `total_us` (microseconds).
    Migrated {
        session: SessionId,
        device: u32,
        stop_us: u64,
        total_us: u64,
    },
    /// A `Migrate` hello's session runs on `device` now, moved with pre-copy: the move took
    /// `total_us` (microseconds), `figures` say how long the session stopped and what was
    /// copied while it ran and during the stop.
    MigratedWith {
        session: SessionId,
        device: u32,
        total_us: u64,
        figures: MoveFigures,
    },
    /// The answer to `EndClaim`: how many sessions of the claim were ended.
    ClaimEnded {
        sessions: u32,
    },
    /// A `MigrateTo` hello's session runs on node `node` now, as that node's session
    /// `new_session` on its device `device`; `figures` as for [`ServerHello::MigratedWith`].
    MovedToNode {
        session: SessionId,
        node: String,
        new_session: SessionId,
        device: u32,
        total_us: u64,
        figures: MoveFigures,
    },
    /// A `Drain` hello's node is cordoned; `moved` sessions run elsewhere now, `stuck` ones
    /// are still there, each with the reason.
    Drained {
        node: String,
        moved: Vec<DrainedSession>,
        stuck: Vec<StuckSession>,
    },
    /// A `Cordon` hello's node is cordoned (or not) now.
    Cordoned {
        node: String,
        cordoned: bool,
    },
}

/// A session a drain (or a defragmentation round) moved: where it runs now and what the
/// move cost it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainedSession {
    /// The pool's id.
    pub session: SessionId,
    pub node: String,
    pub device: u32,
    pub total_us: u64,
    pub figures: MoveFigures,
}

/// A session a drain could not move, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckSession {
    pub session: SessionId,
    pub reason: String,
}

/// What a move with pre-copy did (`docs/migration.md`): the session's memory was copied while
/// it ran, in `rounds` (the first copies everything, each next one what device work could
/// have written since), then the session stopped for `stop_us` microseconds, in which the
/// `stop_bytes` still dirty were copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveFigures {
    pub stop_us: u64,
    pub rounds: u32,
    /// The session's device memory.
    pub bytes: u64,
    /// Bytes copied while the session ran (every round together).
    pub precopied_bytes: u64,
    /// Bytes copied during the stop.
    pub stop_bytes: u64,
}

/// A worker's answer to [`NodeCommand::MigrateWithFigures`] (a frame of kind
/// [`crate::FrameKind::ControlReply`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveOutcome {
    Moved(MoveFigures),
    /// The session stays where it was, untouched, for `reason`.
    Refused {
        reason: String,
    },
    /// Moved to another node ([`NodeCommand::MigrateOut`]), where it is session `session`.
    MovedAway {
        session: SessionId,
        figures: MoveFigures,
    },
}

/// What a worker moving its session to another node sends the worker there (frames of kind
/// [`crate::FrameKind::Move`]), in this order: a layout, chunks of contents, the books; once
/// the receiver holds the session, the quiet requests the client sent the old worker since
/// (forwarded in order), and the end of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveMessage {
    /// A part of a layout (a device state image, encoded with its magic and version, without
    /// the contents of its allocations), `total` bytes in all: once the parts add up to it,
    /// the receiver starts over from that layout, rebuilt zeroed on a fresh device. In parts
    /// because a layout holds the session's module images, which may exceed a frame.
    Layout {
        total: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Contents of device memory at `addr`: `data`, or when it is empty the frame's tail.
    Chunk {
        addr: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The session's books (the sending worker's tables, encoded by the worker), after the
    /// last chunk: the receiver takes the session over and answers with a [`MoveAck`].
    Commit(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The move is off; the receiver frees what it built and ends.
    Abort { reason: String },
    /// After the receiver took the session over: a quiet request frame (header and body)
    /// the client sent the old worker, which runs here, in order.
    Forward(#[serde(with = "serde_bytes")] Vec<u8>),
    /// No more forwarded requests: the client has been told where its session went and
    /// resumes it here.
    Forwarded,
    /// After the receiver took the session over: the client is still quiet, nothing to
    /// forward yet. Sent every 10 s, so the receiver tells a lost old worker (silence) from a
    /// quiet client.
    Waiting,
}

/// The receiving worker's answer to [`MoveMessage::Commit`] (a frame of kind
/// [`crate::FrameKind::MoveReply`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveAck {
    /// It holds the session now; its client resumes with a `Resume { key }` hello.
    Ready { key: u64 },
    /// It cannot take the session (nothing of the session changed where it was).
    Refused { reason: String },
}

/// The body of a [`crate::FrameKind::Moved`] frame: where the session runs now, and the key
/// that resumes it there (a `Resume { key }` hello).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub address: String,
    pub key: u64,
}

/// A node's state as `gpufuse status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub compute_policy: ComputePolicy,
    pub devices: Vec<DeviceStatus>,
    pub sessions: Vec<SessionStatus>,
    pub notes: Vec<String>,
    /// Sessions waiting for capacity (`gpufuse serve`'s own controller), and why.
    pub pending: Vec<crate::PoolPendingView>,
    pub image_cache: ImageCacheStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub index: u32,
    pub name: String,
    pub kind: DeviceKind,
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// The same UUID `cuDeviceGetUuid` reports.
    pub uuid: [u8; 16],
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// PCI domain, bus, device (attributes 50, 33, 34).
    pub pci: (u32, u32, u32),
    /// Percent of the last second the device spent running kernels.
    pub utilization_percent: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub id: SessionId,
    pub pid: u32,
    pub program: String,
    /// The subject of the session's token (its tenant), when the node checks tokens.
    pub subject: Option<String>,
    pub worker_pid: u32,
    pub device: u32,
    pub used_bytes: u64,
    /// The session's VRAM limit (its slice), if it has one.
    pub limit_bytes: Option<u64>,
    /// Percent of the last second the session's kernels ran.
    pub utilization_percent: u32,
    pub qos: Qos,
    /// The session's compute share in percent, if it asked for one.
    pub compute_percent: Option<u32>,
    /// Device time the session's kernels ran, measured, since it started.
    pub device_time_us: u64,
    /// Queueing delay of the session's kernels at the device's launch queue (recent launches).
    pub queue_p50_us: u64,
    pub queue_p99_us: u64,
    /// The session holds the device now (its kernels are running).
    pub on_device: bool,
    /// Of `used_bytes`, what is away from device memory: in host memory and on disk
    /// (oversubscription, scale to zero); the rest is resident.
    pub swapped_host_bytes: u64,
    pub swapped_disk_bytes: u64,
}

/// Module images a node's workers were sent or found in the node's image cache (counts and
/// bytes); a worker reports each change ([`ControlRequest::Images`]), the node adds them up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageCounts {
    /// Images whose bytes a client sent.
    pub received: u64,
    pub received_bytes: u64,
    /// Images a client named by hash only, found in the node's cache.
    pub hits: u64,
    pub hit_bytes: u64,
    /// Cache entries whose bytes did not match their hash: dropped, and the client was asked
    /// for the image.
    pub corrupt: u64,
}

/// The node's image cache (`gpufuse serve --image-cache`): its place, its size and what it
/// saved since the node started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageCacheStatus {
    /// The cache's directory; `None` when the node keeps no images on disk.
    pub dir: Option<String>,
    pub limit_bytes: u64,
    pub entries: u64,
    pub bytes: u64,
    pub counts: ImageCounts,
}

/// One parameter of a kernel: where its bytes go in the packed parameter buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamSlot {
    pub offset: u32,
    pub size: u32,
}

/// A kernel's parameter layout and static attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionInfo {
    pub params: Vec<ParamSlot>,
    /// `(CUfunction_attribute, value)`.
    pub attributes: Vec<(i32, i32)>,
}

/// A 3-D extent (grid or block).
pub type Dim3 = [u32; 3];

/// A kernel launch. `params` is packed at device-side offsets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch<'a> {
    pub function: FunctionHandle,
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem: u32,
    pub stream: StreamHandle,
    #[serde(borrow, with = "serde_bytes")]
    pub params: &'a [u8],
    /// `CUlaunchAttribute`s of `cuLaunchKernelEx`: id and the raw 64-byte value, with any
    /// embedded handle already translated to its id.
    pub attributes: Vec<(u32, [u64; 8])>,
}

/// A rectangular copy between two device regions, or one side packed (host data travels packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rect {
    pub ptr: DevicePtr,
    pub pitch: u64,
}

/// Requests from client to worker. Each has an explicit opcode ([`Request::opcode`]): new
/// requests are appended at the end of the enum, never inserted.
///
/// Quiet requests (sent with [`crate::FLAG_QUIET`]) are marked; the rest are synchronous.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request<'a> {
    /// Sync. Measures the transport.
    Ping,
    /// Quiet. Creates context `ctx` on `device` (primary or not).
    CtxCreate {
        ctx: ContextHandle,
        device: u32,
        flags: u32,
    },
    /// Quiet.
    CtxDestroy { ctx: ContextHandle },
    /// Sync. Waits for all work of the context's device.
    CtxSynchronize { ctx: ContextHandle },
    /// Sync. Frees everything the session holds on `device` and resets its error state.
    DeviceReset { device: u32 },
    /// Sync -> [`Reply::Ptr`].
    MemAlloc { device: u32, size: u64 },
    /// Sync -> [`Reply::Pitch`].
    MemAllocPitch {
        device: u32,
        width: u64,
        height: u64,
        elem_size: u32,
    },
    /// Quiet. Stream-ordered or not, the worker frees when earlier work is done.
    MemFree { ptr: DevicePtr },
    /// Sync -> [`Reply::MemInfo`].
    MemGetInfo { device: u32 },
    /// Quiet.
    MemcpyHtoD {
        dst: DevicePtr,
        stream: StreamHandle,
        #[serde(borrow, with = "serde_bytes")]
        data: &'a [u8],
    },
    /// Sync -> [`Reply::Data`].
    MemcpyDtoH {
        src: DevicePtr,
        size: u64,
        stream: StreamHandle,
    },
    /// Quiet. The data is staged and returned with the reply to the next synchronous request,
    /// tagged with `tag`.
    MemcpyDtoHAsync {
        src: DevicePtr,
        size: u64,
        stream: StreamHandle,
        tag: u64,
    },
    /// Quiet.
    MemcpyDtoD {
        dst: DevicePtr,
        src: DevicePtr,
        size: u64,
        stream: StreamHandle,
    },
    /// Quiet. 2-D copy between device regions.
    Memcpy2DDtoD {
        dst: Rect,
        src: Rect,
        width: u64,
        height: u64,
        stream: StreamHandle,
    },
    /// Quiet. Host rows arrive packed (`width * height` bytes).
    Memcpy2DHtoD {
        dst: Rect,
        width: u64,
        height: u64,
        stream: StreamHandle,
        #[serde(borrow, with = "serde_bytes")]
        data: &'a [u8],
    },
    /// Sync -> [`Reply::Data`] with the rows packed.
    Memcpy2DDtoH {
        src: Rect,
        width: u64,
        height: u64,
        stream: StreamHandle,
    },
    /// Quiet. Sets `count` elements of `elem_size` (1, 2 or 4) bytes to `value`.
    Memset {
        dst: DevicePtr,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: StreamHandle,
    },
    /// Quiet.
    Memset2D {
        dst: Rect,
        value: u32,
        elem_size: u8,
        width: u64,
        height: u64,
        stream: StreamHandle,
    },
    /// Quiet.
    StreamCreate {
        stream: StreamHandle,
        flags: u32,
        priority: i32,
    },
    /// Quiet.
    StreamDestroy { stream: StreamHandle },
    /// Sync.
    StreamSynchronize { stream: StreamHandle },
    /// Sync -> status only (`CUDA_SUCCESS` or `CUDA_ERROR_NOT_READY`).
    StreamQuery { stream: StreamHandle },
    /// Quiet.
    StreamWaitEvent {
        stream: StreamHandle,
        event: EventHandle,
    },
    /// Quiet.
    EventCreate { event: EventHandle, flags: u32 },
    /// Quiet.
    EventDestroy { event: EventHandle },
    /// Quiet.
    EventRecord {
        event: EventHandle,
        stream: StreamHandle,
    },
    /// Sync -> status only.
    EventQuery { event: EventHandle },
    /// Sync.
    EventSynchronize { event: EventHandle },
    /// Sync -> [`Reply::Elapsed`].
    EventElapsedTime {
        start: EventHandle,
        end: EventHandle,
    },
    /// Sync. `image` is sent only when the worker answered [`Reply::NeedImage`] for this hash.
    ModuleLoad {
        module: ModuleHandle,
        device: u32,
        hash: [u8; 32],
        #[serde(borrow, with = "serde_bytes")]
        image: Option<&'a [u8]>,
    },
    /// Quiet.
    ModuleUnload { module: ModuleHandle },
    /// Sync -> [`Reply::Function`].
    ModuleGetFunction {
        module: ModuleHandle,
        name: &'a str,
        function: FunctionHandle,
    },
    /// Sync -> [`Reply::Global`].
    ModuleGetGlobal { module: ModuleHandle, name: &'a str },
    /// Quiet.
    LaunchKernel(Launch<'a>),
    /// Sync -> [`Reply::Launches`]: every launch the worker received, for component tests and
    /// diagnostics (the last `max` of them).
    DebugLaunchLog { max: u32 },
    /// Sync. Virtual memory management: physical memory `handle` of `size` bytes on `device`
    /// (charged to the session's slice), not yet mapped anywhere.
    MemCreate {
        handle: PhysicalHandle,
        device: u32,
        size: u64,
    },
    /// Quiet. Releases physical memory (at once if unmapped, else at its unmapping).
    MemRelease { handle: PhysicalHandle },
    /// Sync -> [`Reply::Ptr`]. Reserves `size` bytes of device address space.
    MemAddressReserve { size: u64, align: u64 },
    /// Quiet. Frees a reservation (its mappings must be gone).
    MemAddressFree { ptr: DevicePtr, size: u64 },
    /// Sync. Maps all of physical memory `handle` at `ptr`, inside a reservation.
    MemMap {
        ptr: DevicePtr,
        size: u64,
        handle: PhysicalHandle,
    },
    /// Quiet. Unmaps what is mapped in `[ptr, ptr+size)`; the physical memory keeps its data.
    MemUnmap { ptr: DevicePtr, size: u64 },
    /// Quiet. Part of a module image too large for one frame, in order from offset 0; a
    /// [`Request::ModuleLoad`] without the image follows once all `total` bytes are sent.
    ModuleImagePart {
        hash: [u8; 32],
        total: u64,
        offset: u64,
        #[serde(borrow, with = "serde_bytes")]
        data: &'a [u8],
    },
    /// Sync. Texture or surface object `handle` (minted by the client, the value kernels get)
    /// reads the memory `desc` describes; the worker checks that it lies in one allocation.
    TexObjectCreate {
        handle: TexHandle,
        desc: TexObjectDesc,
    },
    /// Quiet. Kernels launched after it that use `handle` fail.
    TexObjectDestroy { handle: TexHandle },
    /// Sync. Moves the session to the shared-memory transport: the frame arrives over the
    /// unix socket with the mapping and its doorbells attached (`SCM_RIGHTS`), rings of the
    /// sizes given; after a reply with status 0 both sides use the rings
    /// (`gpufuse_transport::shm`). Any other status: the socket carries on. A sixth
    /// descriptor, if sent, is the client's host arena (`gpufuse_transport::arena`), which
    /// [`Request::MemcpyHtoDHost`] and [`Request::MemcpyDtoHHost`] then name offsets in.
    ShmAttach { request_ring: u64, reply_ring: u64 },
    /// Quiet. Copies `size` bytes of the session's host arena from `offset` (page-locked memory
    /// of a client on the shared-memory transport, which the worker maps: see
    /// `gpufuse_transport::arena`) to `dst` on `stream`, so no data crosses. An arena range
    /// outside the arena, or a session without one, is `CUDA_ERROR_INVALID_VALUE`.
    MemcpyHtoDHost {
        dst: DevicePtr,
        stream: StreamHandle,
        offset: u64,
        size: u64,
    },
    /// Quiet. Copies `size` bytes at `src` into the session's host arena at `offset` (the
    /// reverse of [`Request::MemcpyHtoDHost`]): the bytes are in place once the reply to a
    /// later synchronous request comes.
    MemcpyDtoHHost {
        src: DevicePtr,
        stream: StreamHandle,
        offset: u64,
        size: u64,
    },
    /// Sync -> [`Reply::Ptr`]. Managed memory the client and the device use at the same time
    /// (a session on the shared-memory transport): `size` bytes whose memory is the client's
    /// host arena at `offset` (`gpufuse_transport::arena`), which the client maps at the
    /// returned address too, so host and device atomics touch the same words. Charged to the
    /// session like [`Request::MemAlloc`], freed with [`Request::MemFree`]. An arena range
    /// outside the arena, or a session without one, is `CUDA_ERROR_INVALID_VALUE`; a device
    /// that keeps its memory elsewhere (a real GPU) answers `CUDA_ERROR_NOT_SUPPORTED`.
    MemAllocShared { device: u32, size: u64, offset: u64 },
    /// Sync. The client maps its host arena (page-locked memory, `gpufuse_transport::arena`)
    /// at `base` in its own address space: the device makes the whole arena addressable at the
    /// same addresses, so kernels dereference `cuMemHostAlloc` pointers as they do under
    /// unified addressing on a GPU. Host memory: not charged to the session. Sent after each
    /// [`Request::ShmAttach`] that brought an arena. `CUDA_ERROR_NOT_SUPPORTED` when the
    /// device keeps its memory elsewhere (a real GPU) or the range would overlap the
    /// session's device addresses; `CUDA_ERROR_INVALID_VALUE` for a session without an arena.
    MapHostArena { base: u64 },
    /// Sync. `cuCtxSetLimit` of a limit the device
    /// applies: `CU_LIMIT_PRINTF_FIFO_SIZE` (1, the device-side `printf` output one launch may
    /// produce) and `CU_LIMIT_MALLOC_HEAP_SIZE` (2, the heap of device `malloc`, charged to the
    /// session beyond CUDA's 8 MiB default). `CUDA_ERROR_INVALID_VALUE` for the heap once a
    /// kernel that uses it has run (as NVIDIA's driver answers) and for any other limit;
    /// `CUDA_ERROR_NOT_SUPPORTED` where the device keeps no such limit (the client then keeps
    /// the value itself); `CUDA_ERROR_OUT_OF_MEMORY` for a heap the session's slice cannot hold.
    SetLimit { device: u32, limit: u32, value: u64 },
    /// Sync -> [`ReplyBody::Data`], the 64 bytes of a `CUipcMemHandle`. CUDA IPC
    /// (`cuIpcGetMemHandle`): the allocation whose base is `ptr` becomes memory other sessions
    /// of this host may open (the worker moves it into a memfd, contents and address kept; it
    /// is then never evicted, and the session cannot be moved while it lives). Asking again
    /// gives the same handle. `CUDA_ERROR_INVALID_VALUE` for a pointer that is not an
    /// allocation's base; `CUDA_ERROR_NOT_SUPPORTED` where the device keeps its memory
    /// elsewhere (a real GPU).
    IpcGetMemHandle { ptr: DevicePtr },
    /// Sync -> [`ReplyBody::Opened`]. `cuIpcOpenMemHandle`: maps the memory another session
    /// exported (`handle`, 64 bytes, from [`Request::IpcGetMemHandle`]) into this session's
    /// address space. Not charged to this session (its exporter's slice holds it).
    /// `CUDA_ERROR_INVALID_VALUE` for a handle that names no live export of this host;
    /// `CUDA_ERROR_INVALID_CONTEXT` for this session's own export (as NVIDIA's driver refuses
    /// a process its own handles).
    IpcOpenMemHandle {
        device: u32,
        #[serde(borrow, with = "serde_bytes")]
        handle: &'a [u8],
    },
    /// Sync. `cuIpcCloseMemHandle`: unmaps memory [`Request::IpcOpenMemHandle`] mapped at
    /// `ptr`. `CUDA_ERROR_INVALID_VALUE` for any other pointer.
    IpcCloseMemHandle { ptr: DevicePtr },
    /// Sync -> [`ReplyBody::Data`], a 64-byte handle as [`Request::IpcGetMemHandle`]'s.
    /// `cuMemExportToShareableHandle` (POSIX file descriptor): physical memory `handle` moves
    /// into a memfd of the worker (contents kept, mapped or not), which the client opens to
    /// hand the application a descriptor. `CUDA_ERROR_INVALID_VALUE` for an unknown handle;
    /// `CUDA_ERROR_NOT_SUPPORTED` where the device keeps its memory elsewhere.
    IpcExportPhysical { handle: PhysicalHandle },
    /// Sync. `cuMemImportFromShareableHandle`: the memfd `shared` names (a handle whose pid
    /// and descriptor are the client's own descriptor of it) becomes physical memory `handle`
    /// of this session, not charged to it. `CUDA_ERROR_INVALID_VALUE` for a handle that names
    /// no such memfd or a `handle` already in use.
    IpcImportPhysical {
        handle: PhysicalHandle,
        #[serde(borrow, with = "serde_bytes")]
        shared: &'a [u8],
    },
    /// Sync -> [`ReplyBody::Count`]. `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`:
    /// blocks of `block` threads with `dyn_smem` bytes of dynamic shared memory that one
    /// multiprocessor holds at once, as the device serving the session decides (a real GPU's
    /// driver answers on the cuda backend). `max_dyn_smem` is the function's
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` as the application set it (more
    /// dynamic shared memory than that fits no block; `u32::MAX` when the client knows none).
    /// `CUDA_ERROR_INVALID_HANDLE` for an unknown function.
    Occupancy {
        function: FunctionHandle,
        block: u32,
        dyn_smem: u64,
        max_dyn_smem: u32,
        flags: u32,
    },
    /// Sync -> [`ReplyBody::Count`]. `cuCtxGetLimit` of a limit the application has not set:
    /// the device's own value. `CUDA_ERROR_INVALID_VALUE` for a limit the device's driver
    /// does not know.
    GetLimit { device: u32, limit: u32 },
    /// Quiet (protocol 17). An executable graph of device work only, kept by the worker as
    /// `graph` (the client's executable handle; defined again: replaced): a real GPU makes it
    /// one driver graph, launched with one driver call. A node naming an unknown function is
    /// `CUDA_ERROR_INVALID_HANDLE`, kept as any quiet failure; the graph is then not defined.
    GraphDefine { graph: u64, nodes: Vec<GraphNode> },
    /// Quiet (protocol 17). Runs a defined graph's nodes in order on `stream`.
    /// `CUDA_ERROR_INVALID_HANDLE` for a graph not defined.
    GraphLaunch { graph: u64, stream: StreamHandle },
    /// Quiet (protocol 17). Forgets a defined graph (work it launched still runs).
    GraphDestroy { graph: u64 },
}

/// One node of a graph the worker keeps ([`Request::GraphDefine`]): device work only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GraphNode {
    /// A kernel launch: `params` packed as for [`Request::LaunchKernel`]; `cooperative`:
    /// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`.
    Launch {
        function: FunctionHandle,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        #[serde(with = "serde_bytes")]
        params: Vec<u8>,
        cooperative: bool,
    },
    /// A device-to-device copy.
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        size: u64,
    },
    /// A memset of `count` elements of `elem_size` (1, 2 or 4) bytes.
    Memset {
        dst: DevicePtr,
        value: u32,
        elem_size: u8,
        count: u64,
    },
}

/// Texture and surface objects (`cuTexObjectCreate`, `cuSurfObjectCreate`): the memory, its
/// element format and shape, and for textures the sampler. Values are the driver API's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TexObjectDesc {
    /// Device address of element (0, 0, 0).
    pub ptr: DevicePtr,
    /// `CUarray_format`.
    pub format: i32,
    /// 1, 2 or 4.
    pub channels: u32,
    pub shape: TexShape,
    /// Elements per row, rows, and slices or layers (1 where a shape has none).
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    /// Bytes from one row to the next (slices are `pitch * height` apart).
    pub pitch: u64,
    /// `None` for a surface object.
    pub sampler: Option<TexSampler>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TexShape {
    /// Linear memory (`CU_RESOURCE_TYPE_LINEAR`, `tex1Dfetch`).
    Linear,
    D1,
    /// A 2-D array or pitched memory (`CU_RESOURCE_TYPE_PITCH2D`).
    D2,
    D3,
    /// Layered 1-D and 2-D arrays (`CUDA_ARRAY3D_LAYERED`).
    Layered1,
    Layered2,
}

/// `CUDA_TEXTURE_DESC` as far as the emulated GPU honours it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TexSampler {
    /// `CUaddress_mode` per dimension.
    pub address: [u32; 3],
    /// `CUfilter_mode`.
    pub filter: u32,
    /// `CU_TRSF_READ_AS_INTEGER` (1), `CU_TRSF_NORMALIZED_COORDINATES` (2).
    pub flags: u32,
    pub border: [f32; 4],
}

impl<'a> Request<'a> {
    /// Puts bulk data that arrived as the frame's tail into the request's bulk field, which
    /// must have been sent empty. False for a request without one.
    pub fn attach_tail(&mut self, tail: &'a [u8]) -> bool {
        match self {
            Request::MemcpyHtoD { data, .. }
            | Request::Memcpy2DHtoD { data, .. }
            | Request::ModuleImagePart { data, .. }
                if data.is_empty() =>
            {
                *data = tail;
                true
            }
            Request::ModuleLoad { image, .. } if image.is_some_and(|i| i.is_empty()) => {
                *image = Some(tail);
                true
            }
            _ => false,
        }
    }

    /// The request's opcode: the number that identifies it on the wire (postcard writes it as
    /// the message's first varint). Explicit and append-only: a new request takes the next
    /// number at the end of the enum, and a number is never reused or moved; the golden-bytes
    /// test (`tests/golden.rs`) fails on any reordering.
    pub fn opcode(&self) -> u32 {
        match self {
            Request::Ping => 0,
            Request::CtxCreate { .. } => 1,
            Request::CtxDestroy { .. } => 2,
            Request::CtxSynchronize { .. } => 3,
            Request::DeviceReset { .. } => 4,
            Request::MemAlloc { .. } => 5,
            Request::MemAllocPitch { .. } => 6,
            Request::MemFree { .. } => 7,
            Request::MemGetInfo { .. } => 8,
            Request::MemcpyHtoD { .. } => 9,
            Request::MemcpyDtoH { .. } => 10,
            Request::MemcpyDtoHAsync { .. } => 11,
            Request::MemcpyDtoD { .. } => 12,
            Request::Memcpy2DDtoD { .. } => 13,
            Request::Memcpy2DHtoD { .. } => 14,
            Request::Memcpy2DDtoH { .. } => 15,
            Request::Memset { .. } => 16,
            Request::Memset2D { .. } => 17,
            Request::StreamCreate { .. } => 18,
            Request::StreamDestroy { .. } => 19,
            Request::StreamSynchronize { .. } => 20,
            Request::StreamQuery { .. } => 21,
            Request::StreamWaitEvent { .. } => 22,
            Request::EventCreate { .. } => 23,
            Request::EventDestroy { .. } => 24,
            Request::EventRecord { .. } => 25,
            Request::EventQuery { .. } => 26,
            Request::EventSynchronize { .. } => 27,
            Request::EventElapsedTime { .. } => 28,
            Request::ModuleLoad { .. } => 29,
            Request::ModuleUnload { .. } => 30,
            Request::ModuleGetFunction { .. } => 31,
            Request::ModuleGetGlobal { .. } => 32,
            Request::LaunchKernel(_) => 33,
            Request::DebugLaunchLog { .. } => 34,
            Request::MemCreate { .. } => 35,
            Request::MemRelease { .. } => 36,
            Request::MemAddressReserve { .. } => 37,
            Request::MemAddressFree { .. } => 38,
            Request::MemMap { .. } => 39,
            Request::MemUnmap { .. } => 40,
            Request::ModuleImagePart { .. } => 41,
            Request::TexObjectCreate { .. } => 42,
            Request::TexObjectDestroy { .. } => 43,
            Request::ShmAttach { .. } => 44,
            Request::MemcpyHtoDHost { .. } => 45,
            Request::MemcpyDtoHHost { .. } => 46,
            Request::MemAllocShared { .. } => 47,
            Request::MapHostArena { .. } => 48,
            Request::SetLimit { .. } => 49,
            Request::IpcGetMemHandle { .. } => 50,
            Request::IpcOpenMemHandle { .. } => 51,
            Request::IpcCloseMemHandle { .. } => 52,
            Request::IpcExportPhysical { .. } => 53,
            Request::IpcImportPhysical { .. } => 54,
            Request::Occupancy { .. } => 55,
            Request::GetLimit { .. } => 56,
            Request::GraphDefine { .. } => 57,
            Request::GraphLaunch { .. } => 58,
            Request::GraphDestroy { .. } => 59,
        }
    }

    /// Whether the client sends this request without waiting for a reply.
    pub fn is_quiet(&self) -> bool {
        matches!(
            self,
            Request::CtxCreate { .. }
                | Request::CtxDestroy { .. }
                | Request::MemFree { .. }
                | Request::MemRelease { .. }
                | Request::MemAddressFree { .. }
                | Request::MemUnmap { .. }
                | Request::ModuleImagePart { .. }
                | Request::MemcpyHtoD { .. }
                | Request::MemcpyHtoDHost { .. }
                | Request::MemcpyDtoHHost { .. }
                | Request::MemcpyDtoHAsync { .. }
                | Request::MemcpyDtoD { .. }
                | Request::Memcpy2DDtoD { .. }
                | Request::Memcpy2DHtoD { .. }
                | Request::Memset { .. }
                | Request::Memset2D { .. }
                | Request::StreamCreate { .. }
                | Request::StreamDestroy { .. }
                | Request::StreamWaitEvent { .. }
                | Request::EventCreate { .. }
                | Request::EventDestroy { .. }
                | Request::EventRecord { .. }
                | Request::ModuleUnload { .. }
                | Request::LaunchKernel(_)
                | Request::TexObjectDestroy { .. }
                | Request::GraphDefine { .. }
                | Request::GraphLaunch { .. }
                | Request::GraphDestroy { .. }
        )
    }
}

/// Device-to-host data of a quiet copy, delivered with a later synchronous reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedCopy {
    pub tag: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A launch as the worker received it (diagnostics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    pub function_name: String,
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem: u32,
    pub stream: StreamHandle,
    #[serde(with = "serde_bytes")]
    pub params: Vec<u8>,
}

/// The payload of a reply. Bulk `Data` may travel as the frame's tail
/// ([`crate::encode_frame_head`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReplyBody {
    None,
    Ptr(DevicePtr),
    Pitch {
        ptr: DevicePtr,
        pitch: u64,
    },
    MemInfo {
        free: u64,
        total: u64,
    },
    #[serde(with = "serde_bytes")]
    Data(Vec<u8>),
    Elapsed(f32),
    NeedImage,
    Function(FunctionInfo),
    Global {
        ptr: DevicePtr,
        size: u64,
    },
    Launches(Vec<LaunchRecord>),
    /// Memory another session exported, mapped at `ptr` ([`Request::IpcOpenMemHandle`]).
    Opened {
        ptr: DevicePtr,
        size: u64,
    },
    /// A number the device answered ([`Request::Occupancy`], [`Request::GetLimit`]).
    Count(u64),
}

/// The answer to a synchronous request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The request's own status.
    pub status: Status,
    /// The first failure of a quiet request since the last reply, if any (CUDA's asynchronous
    /// error). The client returns it from the synchronizing call that sees it.
    pub deferred_error: Option<Status>,
    /// Device-to-host data of earlier quiet copies.
    pub staged: Vec<StagedCopy>,
    /// Device-side `printf` output of the launches since the last reply, in order: the
    /// client prints it to the application's stdout before returning.
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    pub body: ReplyBody,
}

impl Reply {
    pub fn ok(body: ReplyBody) -> Self {
        Self {
            status: gpufuse_cuda_types::CUDA_SUCCESS,
            body,
            deferred_error: None,
            staged: Vec::new(),
            output: Vec::new(),
        }
    }

    pub fn err(status: Status) -> Self {
        Self {
            status,
            body: ReplyBody::None,
            deferred_error: None,
            staged: Vec::new(),
            output: Vec::new(),
        }
    }
}

/// A worker's request to its node over the control socket (frames of kind
/// [`crate::FrameKind::Control`]): the device's memory ledger and its launch queue live in the
/// node, because several sessions share one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// Reserve bytes on the device; `ok` if granted.
    Reserve { bytes: u64 },
    /// Return bytes.
    Release { bytes: u64 },
    /// How many bytes the device has in use across all sessions (`value`).
    DeviceUsed,
    /// Wait for the device (the launch queue); `value` is the lease's quantum in microseconds:
    /// launches may go on without asking again until they have used it.
    Acquire,
    /// End the lease, reporting the device time its launches took: what the session's compute
    /// share is charged. Not answered (the worker does not wait): it may end a lease the
    /// worker took from the node's offer (`gpufuse_transport::lease_offer`).
    Done { micros: u64 },
    /// `Done`, then `Acquire`, as one request: the session has more launches waiting, so it
    /// never looks idle between two leases.
    Renew { micros: u64 },
    /// How much of the session's memory is away from the device now: in host memory and on
    /// disk (a report after it changed; the ledger's releases and reserves are separate).
    Swapped { host: u64, disk: u64 },
    /// `Reserve`, from a session that holds no device memory now (it moved its own out): the
    /// node waits for other sessions to make room as long as they can (oversubscription),
    /// instead of refusing at once.
    ReserveWaiting { bytes: u64 },
    /// Module images the worker was sent or found in the node's image cache since its last
    /// report (a report after each change; answered `ok`).
    Images(ImageCounts),
}

/// The node's command to a worker, on the worker's command socket (frames of kind
/// [`crate::FrameKind::Control`], answered by a [`ControlAnswer`] of kind
/// [`crate::FrameKind::ControlReply`]). A worker reads commands only between requests, so a
/// session running a kernel answers when the kernel ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeCommand {
    /// Move at least `bytes` of the session's device memory out (to disk if `to_disk`, else
    /// to host memory), releasing them from the ledger; `value` is the bytes released.
    Evict { bytes: u64, to_disk: bool },
    /// Move the session to the node's device `device` (its address window unchanged): capture,
    /// rebuild on the target, switch. `ok` false with nothing changed if it cannot move;
    /// `value` is the stop time in microseconds.
    Migrate { device: u32 },
    /// [`NodeCommand::Migrate`], answered by a [`MoveOutcome`] instead of a
    /// [`ControlAnswer`]: the move's figures, or why the session cannot move.
    MigrateWithFigures { device: u32 },
    /// Move the session to device `device` of the node at `address`: a `MoveIn` hello there
    /// with `token`, the session's `resources`, `pid` and `program`; pre-copy over that
    /// connection while the session runs; the stop at the client's next synchronous request,
    /// which is answered with a [`Moved`] frame. Answered by a [`MoveOutcome`].
    MigrateOut {
        address: String,
        token: String,
        device: u32,
        resources: ResourceRequest,
        pid: u32,
        program: String,
    },
    /// The client of an incoming session (a `Resume` hello) is here: its connection's
    /// descriptor comes with this frame (`SCM_RIGHTS`); `tcp` says whether it is a TCP
    /// socket. Answered by a [`ControlAnswer`].
    Adopt { tcp: bool },
}

/// The node's answer to a [`ControlRequest`] (frames of kind
/// [`crate::FrameKind::ControlReply`], with the request's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlAnswer {
    pub ok: bool,
    pub value: u64,
}
