//! The simulated machine: devices, contexts, streams, events, modules, graphs, and the
//! handles the API hands out for them.

use std::cell::Cell;
use std::collections::{BinaryHeap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;
use std::thread::ThreadId;

use gpufuse_cuda_types::{short as E, CUresult};

use crate::config::Config;
use crate::memory::Memory;
use crate::timeline::{Pending, Work};
use crate::SimStats;

/// What a handle names. Handles are `kind << 48 | id`, never 0, so one kind of handle passed
/// where another is expected is `CUDA_ERROR_INVALID_HANDLE`, as is a destroyed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Ctx = 1,
    Module,
    Function,
    Stream,
    Event,
    Graph,
    Exec,
}

const ID_BITS: u32 = 48;

pub(crate) fn handle(kind: Kind, id: u64) -> *mut c_void {
    std::ptr::without_provenance_mut((((kind as u64) << ID_BITS) | id) as usize)
}

/// The id in `h` if it is a handle of `kind` (whether it is live is the caller's question).
pub(crate) fn id_of(kind: Kind, h: *mut c_void) -> Option<u64> {
    let v = h as usize as u64;
    let id = v & ((1 << ID_BITS) - 1);
    (v >> ID_BITS == kind as u64 && id != 0).then_some(id)
}

thread_local! {
    /// The calling thread's current context (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

pub(crate) fn set_current(ctx: u64) {
    CURRENT.with(|c| c.set(ctx));
}

fn current() -> u64 {
    CURRENT.with(Cell::get)
}

/// The engines of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Compute,
    HtoD,
    DtoH,
}

/// When one engine is busy: the ops given to it, as `[start, end)` intervals in time order
/// (those that ended before the last placement are dropped).
#[derive(Default)]
pub(crate) struct EngineTime {
    busy: Vec<(u64, u64)>,
}

impl EngineTime {
    /// Gives the engine an op of `duration` ready at `ready`: the earliest time from then on
    /// that it is free for that long. An op that becomes ready early runs in a gap before
    /// work enqueued earlier that waits for something, as an engine runs what is ready.
    pub fn place(&mut self, ready: u64, duration: u64, now: u64) -> u64 {
        // What ended before now concerns no op to come: each is ready at its call's entry or
        // later, and this call's entry is no later than `ready`.
        let horizon = ready.min(now);
        let old = self.busy.partition_point(|&(_, end)| end <= horizon);
        self.busy.drain(..old);
        let mut start = ready;
        let mut at = self.busy.partition_point(|&(_, end)| end <= ready);
        while let Some(&(s, e)) = self.busy.get(at) {
            if start + duration <= s {
                break;
            }
            start = start.max(e);
            at += 1;
        }
        if duration > 0 {
            self.busy.insert(at, (start, start + duration));
        }
        start
    }
}

pub(crate) struct Device {
    pub compute: EngineTime,
    pub htod: EngineTime,
    pub dtoh: EngineTime,
    /// The primary context, once retained.
    pub primary: Option<u64>,
}

impl Device {
    pub fn engine(&mut self, e: Engine) -> &mut EngineTime {
        match e {
            Engine::Compute => &mut self.compute,
            Engine::HtoD => &mut self.htod,
            Engine::DtoH => &mut self.dtoh,
        }
    }
}

pub(crate) struct Context {
    pub device: usize,
    /// The legacy NULL stream's last op end.
    pub null_end: u64,
    /// The end of the last op of any stream of this context.
    pub all_end: u64,
    /// The last op end of blocking streams destroyed with work outstanding (the legacy
    /// stream still waits for it).
    pub retired_blocking_end: u64,
    /// An asynchronous error (an op's memory was unmapped when it completed), returned once by
    /// the next synchronize or query call.
    pub fault: Option<CUresult>,
}

/// A stream capture in progress.
pub(crate) struct Capture {
    pub id: u64,
    /// `CUstreamCaptureMode`: 0 global, 1 thread-local, 2 relaxed.
    pub mode: i32,
    pub thread: ThreadId,
    pub nodes: Vec<Work>,
    /// A prohibited call broke the capture: `cuStreamEndCapture` fails.
    pub invalidated: bool,
}

pub(crate) struct Stream {
    pub ctx: u64,
    pub nonblocking: bool,
    pub last_end: u64,
    pub capture: Option<Capture>,
}

/// A stream as a call names it: the context's legacy NULL stream, or a created one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SRef {
    Null(u64),
    Id(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EvState {
    /// Never recorded.
    Never,
    /// Completes (completed) at this time.
    At(u64),
    /// Recorded into capture `id`: a graph node, not a point on the timeline.
    Captured(u64),
}

pub(crate) struct Event {
    pub flags: u32,
    pub state: EvState,
}

pub(crate) const EVENT_DISABLE_TIMING: u32 = 0x2;

pub(crate) struct Global {
    pub addr: u64,
    pub size: u64,
}

/// Memory a module's variables live in: a reservation with one mapping.
pub(crate) struct ModuleMem {
    pub va: u64,
    pub size: u64,
    pub phys: u64,
}

pub(crate) struct Module {
    pub functions: HashMap<String, u64>,
    pub globals: HashMap<String, Global>,
    pub mem: Option<ModuleMem>,
}

/// What a kernel does when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelKind {
    /// Nothing (it only takes time).
    Plain,
    /// `sim_add_u32(u64 ptr, u32 n, u32 value)`.
    AddU32,
}

pub(crate) struct Function {
    /// (offset, size) of each parameter.
    pub params: Vec<(usize, usize)>,
    pub kind: KernelKind,
    pub duration_ns: u64,
    pub max_threads: u32,
    pub static_shared: u64,
    pub ptx_version: i32,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub max_dynamic_shared: u64,
    /// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`.
    pub carveout: i32,
    /// Cluster attributes 10..=15 (must-be-set, width, height, depth, non-portable, policy).
    pub cluster: [i32; 6],
}

impl Function {
    /// The packed parameter buffer's size.
    pub fn params_size(&self) -> usize {
        self.params.iter().map(|&(o, s)| o + s).max().unwrap_or(0)
    }
}

pub(crate) struct Exec {
    pub nodes: Arc<Vec<Work>>,
    /// The end of its last launch: launches of one executable graph do not overlap.
    pub last_end: u64,
}

pub(crate) struct Sim {
    pub initialized: bool,
    pub cfg: Config,
    pub devices: Vec<Device>,
    pub contexts: HashMap<u64, Context>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, Module>,
    pub functions: HashMap<u64, Function>,
    pub graphs: HashMap<u64, Arc<Vec<Work>>>,
    pub execs: HashMap<u64, Exec>,
    pub mem: Memory,
    /// Ops on the timeline not yet applied, soonest first.
    pub pending: BinaryHeap<Pending>,
    pub seq: u64,
    /// The time the current call entered the library, when the effects of everything that
    /// completed by then were applied: queries answer as of this instant.
    pub clock: u64,
    next_id: u64,
    pub stats: SimStats,
}

impl Sim {
    pub fn new() -> Self {
        Sim {
            initialized: false,
            cfg: Config::default(),
            devices: Vec::new(),
            contexts: HashMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            mem: Memory::new(0),
            pending: BinaryHeap::new(),
            seq: 0,
            clock: 0,
            next_id: 1,
            stats: SimStats::default(),
        }
    }

    /// `cuInit`: reads the environment the first time.
    pub fn init(&mut self, flags: u32) -> Result<(), CUresult> {
        if flags != 0 {
            return Err(E::INVALID_VALUE);
        }
        if self.initialized {
            return Ok(());
        }
        let cfg = Config::from_env().map_err(|msg| {
            eprintln!("gpufuse-cuda-sim: {msg}");
            E::INVALID_VALUE
        })?;
        if cfg.devices == 0 {
            return Err(E::NO_DEVICE);
        }
        self.devices = (0..cfg.devices)
            .map(|_| Device {
                compute: EngineTime::default(),
                htod: EngineTime::default(),
                dtoh: EngineTime::default(),
                primary: None,
            })
            .collect();
        self.mem = Memory::new(cfg.devices);
        self.cfg = cfg;
        self.initialized = true;
        Ok(())
    }

    /// A fresh id for any kind of object.
    pub fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A device ordinal (`CUDA_ERROR_INVALID_DEVICE` if there is no such device).
    pub fn device(&self, d: i32) -> Result<usize, CUresult> {
        usize::try_from(d)
            .ok()
            .filter(|&d| d < self.devices.len())
            .ok_or(E::INVALID_DEVICE)
    }

    /// The calling thread's current context (`CUDA_ERROR_INVALID_CONTEXT` without one).
    pub fn current(&self) -> Result<u64, CUresult> {
        let c = current();
        if c != 0 && self.contexts.contains_key(&c) {
            Ok(c)
        } else {
            Err(E::INVALID_CONTEXT)
        }
    }

    /// The stream a call names: NULL, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` are the
    /// current context's legacy stream.
    pub fn stream(&self, h: *mut c_void) -> Result<SRef, CUresult> {
        match h as usize {
            0..=2 => Ok(SRef::Null(self.current()?)),
            _ => id_of(Kind::Stream, h)
                .filter(|id| self.streams.contains_key(id))
                .map(SRef::Id)
                .ok_or(E::INVALID_HANDLE),
        }
    }

    pub fn event_id(&self, h: *mut c_void) -> Result<u64, CUresult> {
        id_of(Kind::Event, h)
            .filter(|id| self.events.contains_key(id))
            .ok_or(E::INVALID_HANDLE)
    }

    pub fn function_id(&self, h: *mut c_void) -> Result<u64, CUresult> {
        id_of(Kind::Function, h)
            .filter(|id| self.functions.contains_key(id))
            .ok_or(E::INVALID_HANDLE)
    }

    pub fn module_id(&self, h: *mut c_void) -> Result<u64, CUresult> {
        id_of(Kind::Module, h)
            .filter(|id| self.modules.contains_key(id))
            .ok_or(E::INVALID_HANDLE)
    }

    pub fn ctx_of(&self, s: SRef) -> u64 {
        match s {
            SRef::Null(c) => c,
            SRef::Id(id) => self.streams[&id].ctx,
        }
    }

    /// Takes context `c`'s pending asynchronous error.
    pub fn take_fault(&mut self, c: u64) -> Option<CUresult> {
        self.contexts.get_mut(&c).and_then(|c| c.fault.take())
    }
}

#[cfg(test)]
mod tests {
    use super::EngineTime;

    #[test]
    fn engines_fill_gaps_in_order_of_readiness() {
        let mut e = EngineTime::default();
        assert_eq!(e.place(100, 50, 0), 100);
        assert_eq!(e.place(100, 10, 0), 150, "busy until 150");
        // Enqueued later, ready earlier than work waiting for an event: runs first.
        assert_eq!(e.place(1000, 100, 0), 1000);
        assert_eq!(e.place(200, 100, 0), 200);
        assert_eq!(e.place(250, 800, 0), 1100, "no gap of 800 before 1100");
        assert_eq!(e.place(300, 600, 0), 300);
        assert_eq!(e.place(950, 0, 0), 950);
        assert_eq!(e.place(1050, 0, 0), 1100, "a point inside busy time waits");
        assert_eq!(e.place(5000, 1, 0), 5000);
    }
}
