//! The device runtime (CUDA Dynamic Parallelism, CDP2 as in CUDA 12 and 13): kernels that
//! launch kernels. nvcc compiles `child<<<g, b, s, stream>>>(args)` in device code to
//! `cudaGetParameterBufferV2(child, g, b, s)` (the address of a buffer the caller fills with
//! the child's parameters, laid out as the child's `.param` list), then
//! `cudaLaunchDeviceV2(buffer, stream)`; with CUDA 12 and later the PTX names them
//! `__cudaCDP2GetParameterBufferV2` and so on. NVIDIA's libcudadevrt, which defines them,
//! ships SASS and (CUDA 13) PTX for sm_121 only, and its code drives a GPU's launch hardware,
//! so the VM provides the device runtime itself: the calls are builtins (`code.rs` gives them
//! callees of their own, the linker needs no definition for them), and libcudadevrt's unit is
//! left out of an image's units (`gpufuse_fatbin::select_units`).
//!
//! Scheduling. A launch from the host is a tree of grids: [`Module::launch`](crate::Module)
//! runs the root grid's blocks, then the grids and copies each grid enqueued, in the order
//! they were enqueued, each one to completion (its blocks, then its own enqueued work,
//! recursively), then the grid's tail launches (`cudaStreamTailLaunch`) the same way. The host
//! sees one launch that ends when the whole tree has. This meets CDP2's rules: a grid is
//! complete only once all its children are; a child may start any time after its launch;
//! launches into one stream run in the order they were made (all work of a grid runs in
//! launch order); a tail launch runs after its parent grid and all the parent's other work,
//! descendants included; fire-and-forget launches (`cudaStreamFireAndForget`) may run any
//! time. Since CDP2 has no device-side synchronization with children, no program may wait in
//! a kernel for a child it launched (it would hang on a GPU as well). Events
//! (`cudaEventRecord`, `cudaStreamWaitEvent`) and streams are accepted; with work run in
//! launch order every dependency they express is already met.
//!
//! Parameter buffers come from the device heap ([`crate::DeviceMemory::heap`]), 64-byte
//! aligned; `cudaLaunchDeviceV2` copies the parameters out of the buffer and frees it (a
//! buffer never launched is freed when the tree ends). Limits: launches nest at most
//! [`MAX_DEPTH`] deep (a launch from a grid at that depth is
//! `cudaErrorLaunchMaxDepthExceeded`), and at most [`MAX_PENDING`] launches may wait to run
//! (`cudaErrorLaunchPendingCountExceeded`), CUDA's defaults. A failed call sets the calling
//! thread's last error (`cudaGetLastError`, `cudaPeekAtLastError`). A fault in any grid of the
//! tree fails the host's launch with that fault.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::code::{CallSite, Src};
use crate::space::{function_index, load, store, LOCAL_WINDOW};
use crate::warp::{Bits, Env, Group, Warp};
use crate::{DeviceMemory, ExecError, Heap, LaunchConfig};

/// Launches nest at most this deep (CUDA's hardware limit, and `cudaLimitDevRuntimeSyncDepth`'s
/// maximum): the host's grid is depth 0.
pub const MAX_DEPTH: u32 = 24;
/// Launches that may wait to run at once (`cudaLimitDevRuntimePendingLaunchCount`'s default).
pub const MAX_PENDING: usize = 2048;
/// The tail-launch stream of device code (`cudaStreamTailLaunch`); every other stream,
/// `cudaStreamFireAndForget` (4) included, runs its work in launch order.
pub const STREAM_TAIL_LAUNCH: u64 = 3;
/// Alignment of a parameter buffer.
const BUFFER_ALIGN: u64 = 64;

/// CUDA runtime error codes the device runtime returns.
pub const SUCCESS: u32 = 0;
pub const INVALID_VALUE: u32 = 1;
pub const MEMORY_ALLOCATION: u32 = 2;
pub const INVALID_CONFIGURATION: u32 = 9;
pub const LAUNCH_MAX_DEPTH_EXCEEDED: u32 = 65;
pub const LAUNCH_PENDING_COUNT_EXCEEDED: u32 = 69;
pub const INVALID_DEVICE_FUNCTION: u32 = 98;

/// The device runtime functions the VM provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Func {
    GetParameterBufferV2,
    LaunchDeviceV2,
    GetParameterBuffer,
    LaunchDevice,
    StreamCreateWithFlags,
    StreamDestroy,
    GetLastError,
    PeekAtLastError,
    GetErrorString,
    GetErrorName,
    GetDevice,
    Malloc,
    Free,
    MemcpyAsync,
    MemsetAsync,
    EventCreateWithFlags,
    EventRecord,
    EventRecordWithFlags,
    EventDestroy,
    StreamWaitEvent,
}

const FUNCS: [(&str, Func, usize); 20] = [
    ("GetParameterBufferV2", Func::GetParameterBufferV2, 4),
    ("LaunchDeviceV2", Func::LaunchDeviceV2, 2),
    ("GetParameterBuffer", Func::GetParameterBuffer, 2),
    ("LaunchDevice", Func::LaunchDevice, 6),
    ("StreamCreateWithFlags", Func::StreamCreateWithFlags, 2),
    ("StreamDestroy", Func::StreamDestroy, 1),
    ("GetLastError", Func::GetLastError, 0),
    ("PeekAtLastError", Func::PeekAtLastError, 0),
    ("GetErrorString", Func::GetErrorString, 1),
    ("GetErrorName", Func::GetErrorName, 1),
    ("GetDevice", Func::GetDevice, 1),
    ("Malloc", Func::Malloc, 2),
    ("Free", Func::Free, 1),
    ("MemcpyAsync", Func::MemcpyAsync, 5),
    ("MemsetAsync", Func::MemsetAsync, 4),
    ("EventCreateWithFlags", Func::EventCreateWithFlags, 2),
    ("EventRecord", Func::EventRecord, 2),
    ("EventRecordWithFlags", Func::EventRecordWithFlags, 3),
    ("EventDestroy", Func::EventDestroy, 1),
    ("StreamWaitEvent", Func::StreamWaitEvent, 3),
];

/// [`CallSite::callee`] of device runtime function `f`: `CALLEE_BASE + f as u32`.
pub const CALLEE_BASE: u32 = u32::MAX - 64;

/// The part of a device runtime function's name after its prefix (`__cudaCDP2` as CUDA 12
/// and later name them, `cuda` as before), if `name` is one.
fn runtime_name(name: &str) -> Option<&str> {
    name.strip_prefix("__cudaCDP2")
        .or_else(|| name.strip_prefix("cuda"))
}

/// Whether an `.extern` function of this name is the device runtime's, which the linker
/// leaves to the VM (those the VM lacks fail the kernels that call them, naming them).
pub fn is_runtime(name: &str) -> bool {
    name.starts_with("__cudaCDP2")
        || runtime_name(name).is_some_and(|n| FUNCS.iter().any(|(f, ..)| *f == n))
        || matches!(
            name,
            "cudaDeviceGetAttribute"
                | "cudaFuncGetAttributes"
                | "cudaOccupancyMaxActiveBlocksPerMultiprocessor"
                | "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"
                | "cudaCGGetIntrinsicHandle"
                | "cudaCGSynchronize"
                | "cudaCGSynchronizeGrid"
                | "cudaCGGetSize"
                | "cudaCGGetRank"
                | "cudaDeviceSynchronize"
                | "cudaStreamCreate"
        )
}

/// The device runtime function `name` names and how many arguments it takes.
pub fn lookup(name: &str) -> Option<(Func, usize)> {
    let n = runtime_name(name)?;
    FUNCS
        .iter()
        .find(|(f, ..)| *f == n)
        .map(|&(_, f, args)| (f, args))
}

/// The function a callee names, if it is a device runtime call.
pub fn from_callee(callee: u32) -> Option<Func> {
    let i = callee.checked_sub(CALLEE_BASE)? as usize;
    FUNCS.get(i).map(|&(_, f, _)| f)
}

/// A launch or a copy a grid enqueued.
#[derive(Debug)]
pub enum Work {
    Grid {
        func: usize,
        cfg: LaunchConfig,
        params: Vec<u8>,
    },
    Copy {
        dst: u64,
        src: u64,
        len: u64,
    },
    Set {
        dst: u64,
        value: u8,
        len: u64,
    },
}

/// A parameter buffer handed out and not yet launched.
struct Buffer {
    /// The heap block holding it.
    block: u64,
    /// The kernel and configuration `cudaGetParameterBufferV2` named (none for
    /// `cudaGetParameterBuffer`, whose `cudaLaunchDevice` names them).
    launch: Option<(usize, LaunchConfig)>,
    size: u64,
}

/// What a launch from device code needs to know of a kernel.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub param_bytes: u32,
    /// `.maxntid`, `.reqntid`: the block shapes it allows.
    pub max_threads: Option<u32>,
    pub req_threads: Option<[u32; 3]>,
}

/// The state of one host launch's tree of grids.
pub struct Tree<'a> {
    /// Per function of the module: a kernel's interface, `None` for a device function.
    pub entry_params: &'a [Option<Entry>],
    buffers: Mutex<HashMap<u64, Buffer>>,
    pending: AtomicUsize,
    handles: AtomicU64,
    /// Error strings handed out (`cudaGetErrorString`): heap blocks, freed with the tree.
    strings: Mutex<HashMap<(u32, bool), u64>>,
}

impl<'a> Tree<'a> {
    pub fn new(entry_params: &'a [Option<Entry>]) -> Tree<'a> {
        Tree {
            entry_params,
            buffers: Mutex::new(HashMap::new()),
            pending: AtomicUsize::new(0),
            handles: AtomicU64::new(0x100),
            strings: Mutex::new(HashMap::new()),
        }
    }

    /// A launch waiting to run has started.
    pub fn started(&self) {
        let _ = self
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Frees what the tree still holds on the heap (buffers never launched, error strings).
    pub fn finish(&self, mem: &dyn DeviceMemory) {
        let Some(heap) = mem.heap() else { return };
        for (_, b) in std::mem::take(&mut *lock(&self.buffers)) {
            heap.free(b.block);
        }
        for (_, s) in std::mem::take(&mut *lock(&self.strings)) {
            heap.free(s);
        }
    }
}

/// The work one grid enqueued.
pub struct Grid {
    /// The host's grid is 0, its children 1, ...
    pub depth: u32,
    work: Mutex<Vec<Work>>,
    tail: Mutex<Vec<Work>>,
}

impl Grid {
    pub fn new(depth: u32) -> Grid {
        Grid {
            depth,
            work: Mutex::new(Vec::new()),
            tail: Mutex::new(Vec::new()),
        }
    }

    /// What the grid enqueued, in the order it runs: its launches and copies in launch order,
    /// then its tail launches.
    pub fn take(&self) -> Vec<Work> {
        let mut w = std::mem::take(&mut *lock(&self.work));
        w.append(&mut lock(&self.tail));
        w
    }

    fn push(&self, stream: u64, w: Work) {
        let q = if stream == STREAM_TAIL_LAUNCH {
            &self.tail
        } else {
            &self.work
        };
        lock(q).push(w);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads `len` bytes of device memory at `addr`.
pub fn read(mem: &dyn DeviceMemory, addr: u64, len: u64) -> Result<Vec<u8>, ExecError> {
    let mut out = Vec::with_capacity(len as usize);
    let mut region = None;
    for a in addr..addr.saturating_add(len) {
        let r = match region {
            Some(r) if crate::memory::contains(&r, a, 1) => r,
            _ => mem.region(a).ok_or(ExecError::IllegalAddress(a))?,
        };
        region = Some(r);
        out.push(crate::memory::load(&r, a, 1).ok_or(ExecError::IllegalAddress(a))? as u8);
    }
    Ok(out)
}

/// Writes `bytes` at `addr` (byte `k` of `bytes(k)`).
fn write(
    mem: &dyn DeviceMemory,
    addr: u64,
    len: u64,
    bytes: impl Fn(u64) -> u8,
) -> Result<(), ExecError> {
    let mut region = None;
    for k in 0..len {
        let a = addr.wrapping_add(k);
        let r = match region {
            Some(r) if crate::memory::contains(&r, a, 1) => r,
            _ => mem.region(a).ok_or(ExecError::IllegalAddress(a))?,
        };
        region = Some(r);
        crate::memory::store(&r, a, 1, u64::from(bytes(k)), false)
            .ok_or(ExecError::IllegalAddress(a))?;
    }
    Ok(())
}

/// Runs an enqueued copy or memset (a grid is run by the caller).
pub fn run_copy(mem: &dyn DeviceMemory, w: &Work) -> Result<(), ExecError> {
    match *w {
        Work::Copy { dst, src, len } => {
            let data = read(mem, src, len)?;
            write(mem, dst, len, |k| data[k as usize])
        }
        Work::Set { dst, value, len } => write(mem, dst, len, |_| value),
        Work::Grid { .. } => Ok(()),
    }
}

/// The message of a CUDA runtime error code, as `cudaGetErrorString` gives it.
fn error_text(code: u32, name: bool) -> &'static str {
    let (n, s) = match code {
        SUCCESS => ("cudaSuccess", "no error"),
        INVALID_VALUE => ("cudaErrorInvalidValue", "invalid argument"),
        MEMORY_ALLOCATION => ("cudaErrorMemoryAllocation", "out of memory"),
        INVALID_CONFIGURATION => (
            "cudaErrorInvalidConfiguration",
            "invalid configuration argument",
        ),
        LAUNCH_MAX_DEPTH_EXCEEDED => (
            "cudaErrorLaunchMaxDepthExceeded",
            "launch would exceed maximum depth of nested launches",
        ),
        LAUNCH_PENDING_COUNT_EXCEEDED => (
            "cudaErrorLaunchPendingCountExceeded",
            "launch failed because launch would exceed cudaLimitDevRuntimePendingLaunchCount",
        ),
        INVALID_DEVICE_FUNCTION => ("cudaErrorInvalidDeviceFunction", "invalid device function"),
        _ => ("cudaErrorUnknown", "unrecognized error code"),
    };
    if name {
        n
    } else {
        s
    }
}

/// Argument `k`'s `size` bytes at byte `off` of it, for lane `l`.
#[allow(clippy::too_many_arguments)]
fn arg(
    w: &Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    k: usize,
    l: usize,
    off: u64,
    size: u8,
) -> Result<u64, ExecError> {
    let a = *cs.args.get(k).ok_or_else(|| {
        ExecError::Unsupported("device runtime call without its arguments".into())
    })?;
    match a {
        Src::FrameParam(p) => load(w, env, l, LOCAL_WINDOW + g.base + p + off, u64::from(size)),
        a if off == 0 => Ok(crate::lanes::val(w, env, g, a, size)?[l]),
        _ => Err(ExecError::Unsupported(
            "a device runtime call's aggregate argument not in parameter space".into(),
        )),
    }
}

fn dim3(
    w: &Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    k: usize,
    l: usize,
) -> Result<[u32; 3], ExecError> {
    let mut d = [0; 3];
    for (i, v) in d.iter_mut().enumerate() {
        *v = arg(w, env, g, cs, k, l, 4 * i as u64, 4)? as u32;
    }
    Ok(d)
}

/// Sets lane `l`'s return value.
fn ret(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    l: usize,
    size: u64,
    v: u64,
) -> Result<(), ExecError> {
    match cs.rets.first() {
        Some(&Src::FrameParam(off)) => store(w, env, l, LOCAL_WINDOW + g.base + off, size, v),
        Some(&Src::Reg(r)) => {
            if let Some(row) = w.levels[g.depth].get_mut(r as usize) {
                row[l] = v;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Whether a launch configuration is one a GPU takes.
fn valid_config(cfg: &LaunchConfig) -> bool {
    let threads: u64 = cfg.block.iter().map(|&d| u64::from(d)).product();
    (1..=1024).contains(&threads)
        && cfg.block[2] <= 64
        && cfg.grid.iter().all(|&d| d > 0)
        && cfg.grid[0] < (1 << 31)
        && cfg.grid[1] <= 65535
        && cfg.grid[2] <= 65535
}

/// The device runtime call `f` made by `run`'s lanes, lowest first.
pub fn call(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    run: u32,
    f: Func,
) -> Result<(), ExecError> {
    let Some((tree, grid)) = env.l.devrt else {
        return Err(ExecError::Unsupported(
            "device runtime call outside a launch tree".into(),
        ));
    };
    let rt = Runtime {
        tree,
        grid,
        mem: env.l.mem,
    };
    for l in Bits(run) {
        let (value, size, err) = lane_call(w, env, g, cs, l, f, &rt)?;
        if err != SUCCESS {
            w.devrt_error[l] = err;
        }
        ret(w, env, g, cs, l, size, value)?;
    }
    w.goto(run, g.pc + 1);
    Ok(())
}

/// What a device runtime call works with: the launch tree, the calling grid, device memory.
struct Runtime<'r, 't> {
    tree: &'r Tree<'t>,
    grid: &'r Grid,
    mem: &'r dyn DeviceMemory,
}

impl Runtime<'_, '_> {
    fn heap(&self) -> Result<&Heap, ExecError> {
        self.mem.heap().ok_or_else(|| {
            ExecError::Unsupported("the device runtime without a device heap".into())
        })
    }
}

/// Lane `l`'s call of `f`: its return value, the value's size, and the error to record.
fn lane_call(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    l: usize,
    f: Func,
    rt: &Runtime,
) -> Result<(u64, u64, u32), ExecError> {
    Ok(match f {
        Func::GetParameterBufferV2 | Func::GetParameterBuffer => {
            parameter_buffer(w, env, g, cs, l, f, rt)?
        }
        Func::LaunchDeviceV2 | Func::LaunchDevice => {
            let (buf, stream, named) = if f == Func::LaunchDeviceV2 {
                (
                    arg(w, env, g, cs, 0, l, 0, 8)?,
                    arg(w, env, g, cs, 1, l, 0, 8)?,
                    None,
                )
            } else {
                let func = arg(w, env, g, cs, 0, l, 0, 8)?;
                let cfg = LaunchConfig {
                    grid: dim3(w, env, g, cs, 2, l)?,
                    block: dim3(w, env, g, cs, 3, l)?,
                    dynamic_shared_bytes: arg(w, env, g, cs, 4, l, 0, 4)? as u32,
                };
                (
                    arg(w, env, g, cs, 1, l, 0, 8)?,
                    arg(w, env, g, cs, 5, l, 0, 8)?,
                    Some((func, cfg)),
                )
            };
            let err = launch(rt.tree, rt.grid, rt.mem, buf, stream, named)?;
            (u64::from(err), 4, err)
        }
        Func::StreamCreateWithFlags | Func::EventCreateWithFlags => {
            let p = arg(w, env, g, cs, 0, l, 0, 8)?;
            let flags = arg(w, env, g, cs, 1, l, 0, 4)?;
            // Device streams must be non-blocking (`cudaStreamNonBlocking`, 1); device
            // events take `cudaEventDisableTiming` (2).
            let ok = match f {
                Func::StreamCreateWithFlags => flags == 1,
                _ => flags & !2 == 0,
            };
            if ok && p != 0 {
                let h = rt.tree.handles.fetch_add(8, Ordering::Relaxed);
                store(w, env, l, p, 8, h)?;
                (0, 4, SUCCESS)
            } else {
                (u64::from(INVALID_VALUE), 4, INVALID_VALUE)
            }
        }
        Func::StreamDestroy
        | Func::EventDestroy
        | Func::EventRecord
        | Func::EventRecordWithFlags
        | Func::StreamWaitEvent => (0, 4, SUCCESS),
        Func::GetLastError => {
            let e = std::mem::take(&mut w.devrt_error[l]);
            (u64::from(e), 4, SUCCESS)
        }
        Func::PeekAtLastError => (u64::from(w.devrt_error[l]), 4, SUCCESS),
        Func::GetErrorString | Func::GetErrorName => {
            let code = arg(w, env, g, cs, 0, l, 0, 4)? as u32;
            (error_string(rt, code, f == Func::GetErrorName)?, 8, SUCCESS)
        }
        Func::GetDevice => {
            let p = arg(w, env, g, cs, 0, l, 0, 8)?;
            store(w, env, l, p, 4, 0)?;
            (0, 4, SUCCESS)
        }
        Func::Malloc => {
            let p = arg(w, env, g, cs, 0, l, 0, 8)?;
            let bytes = arg(w, env, g, cs, 1, l, 0, 8)?;
            match rt.heap()?.alloc(bytes) {
                Some(a) => {
                    store(w, env, l, p, 8, a)?;
                    (0, 4, SUCCESS)
                }
                None => (u64::from(MEMORY_ALLOCATION), 4, MEMORY_ALLOCATION),
            }
        }
        Func::Free => {
            let p = arg(w, env, g, cs, 0, l, 0, 8)?;
            if p == 0 || rt.heap()?.free(p) {
                (0, 4, SUCCESS)
            } else {
                (u64::from(INVALID_VALUE), 4, INVALID_VALUE)
            }
        }
        Func::MemcpyAsync | Func::MemsetAsync => memcpy_memset(w, env, g, cs, l, f, rt.grid)?,
    })
}

/// `cudaGetParameterBufferV2(func, grid, block, shared)` or `cudaGetParameterBuffer(align,
/// size)`: a buffer from the heap for a child launch's parameters (what the V2 form's launch
/// will be is kept with it); a null pointer and the error for a bad function or alignment.
fn parameter_buffer(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    l: usize,
    f: Func,
    rt: &Runtime,
) -> Result<(u64, u64, u32), ExecError> {
    let (launch, bytes) = if f == Func::GetParameterBufferV2 {
        let func = arg(w, env, g, cs, 0, l, 0, 8)?;
        let grid_dim = dim3(w, env, g, cs, 1, l)?;
        let block_dim = dim3(w, env, g, cs, 2, l)?;
        let shared = arg(w, env, g, cs, 3, l, 0, 4)? as u32;
        match function_index(func)
            .and_then(|i| Some((i, rt.tree.entry_params.get(i).copied()??.param_bytes)))
        {
            Some((i, bytes)) => (
                Some((
                    i,
                    LaunchConfig {
                        grid: grid_dim,
                        block: block_dim,
                        dynamic_shared_bytes: shared,
                    },
                )),
                u64::from(bytes),
            ),
            None => return Ok((0, 8, INVALID_DEVICE_FUNCTION)),
        }
    } else {
        let align = arg(w, env, g, cs, 0, l, 0, 8)?;
        let bytes = arg(w, env, g, cs, 1, l, 0, 8)?;
        if align > BUFFER_ALIGN || !align.is_power_of_two() && align != 0 {
            return Ok((0, 8, INVALID_VALUE));
        }
        (None, bytes)
    };
    Ok(match rt.heap()?.alloc(bytes.max(1) + BUFFER_ALIGN) {
        Some(block) => {
            let addr = block.div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
            lock(&rt.tree.buffers).insert(
                addr,
                Buffer {
                    block,
                    launch,
                    size: bytes,
                },
            );
            (addr, 8, SUCCESS)
        }
        None => (0, 8, MEMORY_ALLOCATION),
    })
}

/// `cudaGetErrorString`/`cudaGetErrorName` of `code`: the text's address, written to the heap
/// once per launch tree.
fn error_string(rt: &Runtime, code: u32, name: bool) -> Result<u64, ExecError> {
    let key = (code, name);
    let known = lock(&rt.tree.strings).get(&key).copied();
    Ok(match known {
        Some(p) => p,
        None => {
            let text = error_text(code, name).as_bytes();
            let p = rt.heap()?.alloc(text.len() as u64 + 1).ok_or_else(|| {
                ExecError::Unsupported("no device heap left for cudaGetErrorString".into())
            })?;
            write(rt.mem, p, text.len() as u64 + 1, |k| {
                text.get(k as usize).copied().unwrap_or(0)
            })?;
            lock(&rt.tree.strings).insert(key, p);
            p
        }
    })
}

/// `cudaMemcpyAsync(dst, src, len, kind, stream)` or `cudaMemsetAsync(dst, value, len,
/// stream)`: work enqueued on the stream of the calling grid.
fn memcpy_memset(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    l: usize,
    f: Func,
    grid: &Grid,
) -> Result<(u64, u64, u32), ExecError> {
    let dst = arg(w, env, g, cs, 0, l, 0, 8)?;
    let work = if f == Func::MemcpyAsync {
        let src = arg(w, env, g, cs, 1, l, 0, 8)?;
        let len = arg(w, env, g, cs, 2, l, 0, 8)?;
        // Device code copies device to device (3) or by address (default, 4).
        let kind = arg(w, env, g, cs, 3, l, 0, 4)?;
        (kind == 3 || kind == 4).then_some(Work::Copy { dst, src, len })
    } else {
        let value = arg(w, env, g, cs, 1, l, 0, 4)? as u8;
        let len = arg(w, env, g, cs, 2, l, 0, 8)?;
        Some(Work::Set { dst, value, len })
    };
    let stream = arg(w, env, g, cs, cs.args.len() - 1, l, 0, 8)?;
    Ok(match work {
        Some(work) => {
            grid.push(stream, work);
            (0, 4, SUCCESS)
        }
        None => (u64::from(INVALID_VALUE), 4, INVALID_VALUE),
    })
}

/// `cudaLaunchDeviceV2(buf, stream)` (or `cudaLaunchDevice`, which names the kernel and its
/// configuration itself): the child's parameters are copied out of the buffer, which goes
/// back to the heap, and the child is enqueued in its parent grid. Returns the call's status.
fn launch(
    tree: &Tree,
    grid: &Grid,
    mem: &dyn DeviceMemory,
    buf: u64,
    stream: u64,
    named: Option<(u64, LaunchConfig)>,
) -> Result<u32, ExecError> {
    let Some(b) = lock(&tree.buffers).remove(&buf) else {
        return Ok(INVALID_VALUE);
    };
    let free = |b: &Buffer| {
        if let Some(h) = mem.heap() {
            h.free(b.block);
        }
    };
    let target = match (b.launch, named) {
        (Some(t), _) => Some(t),
        (None, Some((func, cfg))) => function_index(func)
            .filter(|&i| matches!(tree.entry_params.get(i), Some(Some(_))))
            .map(|i| (i, cfg)),
        (None, None) => None,
    };
    let Some((func, cfg)) = target else {
        free(&b);
        return Ok(INVALID_DEVICE_FUNCTION);
    };
    let entry = tree.entry_params[func];
    let want = entry.map_or(0, |e| u64::from(e.param_bytes));
    let params = read(mem, buf, want.min(b.size));
    free(&b);
    let mut params = params?;
    params.resize(want as usize, 0);
    let threads: u64 = cfg.block.iter().map(|&d| u64::from(d)).product();
    if !valid_config(&cfg)
        || entry.is_some_and(|e| {
            e.max_threads.is_some_and(|n| threads > u64::from(n))
                || e.req_threads.is_some_and(|r| r != cfg.block)
        })
    {
        return Ok(INVALID_CONFIGURATION);
    }
    if grid.depth + 1 > MAX_DEPTH {
        return Ok(LAUNCH_MAX_DEPTH_EXCEEDED);
    }
    if tree
        .pending
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < MAX_PENDING).then_some(n + 1)
        })
        .is_err()
    {
        return Ok(LAUNCH_PENDING_COUNT_EXCEEDED);
    }
    grid.push(stream, Work::Grid { func, cfg, params });
    Ok(SUCCESS)
}
