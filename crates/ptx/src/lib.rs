//! PTX for gpufuse's emulated GPU: a parser and an interpreter.
//!
//! [`Module::parse`] reads the PTX that nvcc, NVRTC and CuPy emit (entries, device functions,
//! module variables, parameter layouts; `lex.rs`, `parse.rs`), decodes each statement by the
//! tables of opcodes and modifiers of `decode/` into an instruction (`inst.rs`, the vocabulary
//! the parser and the interpreter share), and compiles every instruction once into a compact
//! form whose operands are register indices, immediates, special registers or resolved
//! variables (`code.rs`); an opcode the interpreter does not implement fails only the kernels
//! that reach it, at launch, naming it.
//!
//! The parser cannot skip text (`lex.rs`: comments, strings, line numbers): every directive of
//! the PTX ISA 9.x is understood, ignored on purpose where it means nothing for execution
//! (`.file` and `.loc`, which end at their line, `.section .debug_*`, `@@DWARF`, `.pragma`,
//! occupancy hints), or an error naming its line and text (`tests/directives.rs`). Among the
//! rest: `.target`'s `map_f64_to_f32` is taken for a module without `.f64` instructions and
//! refused, naming one, otherwise; `.maxntid`/`.reqntid` are checked at launch; `.alias` is
//! resolved; `.attribute(.managed)` is kept; `WARP_SZ` is the constant 32;
//! `%reserved_smem_offset_*` name a 1 KiB reserved region after each block's shared memory
//! ([`RESERVED_SHARED`]); a memory operand whose base is a 32-bit register is computed in 32
//! bits (`code::Ins::addr32`: CUTLASS's `[%r+49280]` with `%r` "negative"). The kernel tests
//! run on plain, `-lineinfo` and `-G` nvcc builds of the same source.
//!
//! [`Module::launch`] runs a kernel over its grid with CUDA's semantics for the implemented
//! instructions:
//! - a warp's 32 lanes execute each instruction together: registers are stored per warp as
//!   structure-of-arrays, each instruction runs in a tight loop over the active lanes (a 32-bit
//!   mask), with no allocation per instruction (`warp.rs`; `exec/mod.rs`: control flow and
//!   barriers; lane-by-lane families in `exec/{memory,arith,bits}.rs` over `lanes.rs`;
//!   warp-wide instructions in `collective.rs`; scalar semantics in `alu.rs`); the common forms
//!   (integer and float arithmetic, comparisons, `selp`, moves, conversions, loads, stores,
//!   shared atomics) are resolved at load time to their exact operation, width and operand
//!   shapes and run with one dispatch per instruction, computed straight into the destination
//!   register (`exec/spec/`: `select.rs` picks a form at load time, `mod.rs` runs it;
//!   `tests/spec_forms.rs` runs kernels with and without them and compares), and
//!   single-element loads and stores whose lanes are all in range take `exec/fast.rs`;
//! - min-PC scheduling keeps lanes in lockstep and reconverges divergent paths, so shuffles,
//!   votes, `redux`, `match` and `activemask` see their partners; lanes of a divergent branch
//!   wait at its immediate post-dominator for the rest (`reconverge.rs`), so warp-synchronous
//!   code stays in lockstep whatever the block layout; `bar.sync` waits for the block's live
//!   threads (`warp.rs`), and `bar.warp.sync` is a warp-level fence that never counts toward
//!   it;
//! - calls to device functions (`call`, `call.uni`) with `.param` arguments and return values:
//!   the callee gets its own registers and a local-memory frame on the thread's stack, so
//!   recursion works, and pointers into a caller's local arrays stay valid; calls nested deeper
//!   than 256 fail the launch with [`ExecError::StackOverflow`]; a call of `__assertfail` (a
//!   failed device-side `assert()`) ends it with [`ExecError::Assert`] and the message;
//! - indirect calls (`call (rets), %rd, (args), prototype;`): function `i` of a module (its
//!   `i`-th `.entry`/`.func` definition, in text order) has the pseudo address
//!   [`function_address`]`(i)` = [`FUNCTION_WINDOW`] `+ 8 * i`, which `mov`/`cvta` of its name
//!   and module-variable initializers naming it (`.u64 t[] = {f, g}`) give; the lanes of a
//!   warp calling each distinct address enter that function together; an address that is no
//!   device function is [`ExecError::IllegalAddress`] (`space.rs`);
//! - shared, local, param, const and global state spaces, generic addressing, atomics, fences,
//!   [`ExecError::IllegalAddress`] for any access outside device memory and
//!   [`ExecError::MisalignedAddress`] for one not a multiple of its size;
//! - float rounding modifiers: `.rn` (the default) and exact `.rz`, `.rm`, `.rp` on f32/f64
//!   arithmetic and conversions (`round.rs`) and on conversions to f16/bf16/fp8/tf32
//!   (`half.rs`, which also does their packed pairs, each rounded once); a directed mode on f16
//!   arithmetic fails as unsupported;
//! - `cp.async` and its waits (`copy.rs`), `ldmatrix` and `mma.sync` over a warp's gathered
//!   fragments (`tensor.rs`), `wmma.load`, `wmma.store` and `wmma.mma` for f16, bf16, tf32, f64
//!   and s8/u8 as whole-matrix loops (`wmma.rs`), device `printf` (`printf.rs`: formatted
//!   records go to [`DeviceMemory::print`]; the emulated device sends them back with the next
//!   reply and the client prints them through the C library's `stdout`), device
//!   `malloc`/`free` from the heap [`DeviceMemory::heap`] gives (`heap.rs`: the emulated device
//!   reserves a heap per session at the first launch that needs it, 8 MiB as CUDA's default,
//!   outside the session's ledger, or the size `cudaDeviceSetLimit(cudaLimitMallocHeapSize)`
//!   asked before that launch, whose part beyond 8 MiB is charged to the session when asked
//!   (`SetLimit`, protocol 14); `cudaLimitPrintfFifoSize` sizes a launch's printf buffer the
//!   same way); docs/ptx-instructions.md lists every PTX instruction and what runs;
//! - the blocks of a launch run in parallel on the host's cores (`launch.rs`): as many threads
//!   as [`std::thread::available_parallelism`] (or `GPUFUSE_EMU_THREADS`), each taking the next
//!   block. Device memory is therefore shared: [`DeviceMemory`] hands out regions of
//!   `AtomicU64` words, every global access is atomic at the word level (no data race in Rust's
//!   sense, whatever the kernel does), and atomic instructions are exact across threads
//!   (`memory.rs`). What a launch needs of its kernel (the reachable functions, heap use, the
//!   kernel by name) is found once, at module load, and each host thread keeps its last
//!   block's warps and shared memory, zeroed again only after a launch wrote it, so a stream of
//!   small launches allocates and clears nothing (docs/protocol.md, "The worker's pace"). A
//!   cooperative launch's blocks are all resident at once, taking turns (`launch.rs`,
//!   `coresident`; its grid workspace at `%envreg1:%envreg2`; how a grid that can never
//!   progress is detected: ARCHITECTURE.md, "Cooperative launches").
//!
//! - device-side launches (CUDA Dynamic Parallelism, CDP2; `devrt.rs`): the device runtime's
//!   functions (`cudaGetParameterBufferV2`, `cudaLaunchDeviceV2`, device streams, events,
//!   `cudaMalloc`/`cudaFree`/`cudaMemcpyAsync`, `cudaGetLastError`, ...) are VM builtins,
//!   which the linker needs no definition for; a launch of a kernel that reaches them runs the
//!   tree of grids it makes (each grid's blocks, then its enqueued launches and copies in
//!   launch order, each run to completion with its own work, depth first, then its tail
//!   launches, after all their parent's other work) and ends when the whole tree has: one
//!   launch for the host, whose device time is the whole tree's; parameter buffers come from
//!   the device heap; nesting and pending-launch limits as CUDA's defaults, failed launches in
//!   the calling thread's `cudaGetLastError`;
//! - texture and surface objects (`tex`, `tld4`, `txq`, `suld.b`, `sust.b`, `suq`;
//!   `tex.rs`): the device describes each live handle ([`DeviceMemory::texture`]) and the VM
//!   samples its memory by the CUDA programming guide's texture fetching rules (linear
//!   filtering with 9-bit weights).
//!
//! Not yet: variable addresses in initializers (`generic(var)`), `sust.p`, `sured`,
//! sub-byte `wmma` (`.s4`/`.u4`/`.b1`), `wgmma`/`tcgen05`, TMA (`cp.async.bulk`, `mbarrier`'s
//! transaction counts).
//! `mbarrier` itself runs: a `.b64` word of pending count, expected count and phase, updated
//! atomically (`exec/memory.rs`).
//! [`Module::link`] joins several translation units' PTX into one module (`link.rs`), as the
//! driver's JIT linker does for `cuLink*` and for programs built with `nvcc -rdc=true`:
//! `.extern` functions and variables resolved across units, `.weak` and `.common`, each unit's
//! internal names renamed apart, duplicate and unresolved symbols errors naming them.
//!
//! `cargo run -p gpufuse-ptx --example ptx_check -- FILE.ptx` lists what a module lacks;
//! `cargo run --release -p gpufuse-ptx --example vm_bench` measures lane-instructions per
//! second; `--example sample_bench -- matrixMul.ptx` times the CUDA samples' matrixMul kernel.

#![forbid(unsafe_code)]

mod alu;
mod code;
mod collective;
mod copy;
mod decode;
mod devrt;
mod exec;
mod graph;
mod half;
mod heap;
mod inst;
mod lanes;
mod launch;
mod lex;
mod link;
mod memory;
mod parse;
mod printf;
mod reconverge;
mod round;
mod space;
mod tensor;
mod tex;
mod warp;
mod wmma;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use heap::{Heap, DEFAULT_HEAP};
pub use inst::Space;
pub use parse::{Param, Var};
pub use space::{function_address, function_index, FUNCTION_WINDOW};
pub use tex::{AddressMode, Sampler, Shape, TexFormat, Texture};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PtxError {
    #[error("invalid PTX: {0}")]
    Syntax(String),
    #[error("PTX instruction `{opcode}` is not supported by the emulated GPU")]
    Unsupported { opcode: String },
    /// Units that cannot be linked: symbols defined twice, declared and never defined.
    #[error("PTX link error: {0}")]
    Link(String),
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ExecError {
    #[error("illegal address {0:#x}")]
    IllegalAddress(u64),
    /// A load, store or atomic at an address that is not a multiple of its access size.
    #[error("misaligned address {0:#x}")]
    MisalignedAddress(u64),
    #[error("kernel executed a trap")]
    Trap,
    /// A device-side `assert()` failed (a call of `__assertfail`): its message.
    #[error("{0}")]
    Assert(String),
    #[error("call stack overflow")]
    StackOverflow,
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("invalid launch: {0}")]
    InvalidLaunch(String),
    #[error("no kernel named {0}")]
    NoKernel(String),
    /// A texture or surface instruction named an object the device does not know, or used one
    /// in a way it cannot be (a surface access out of range with `.trap`).
    #[error("{0}")]
    Texture(String),
    /// A cooperative grid in which every unfinished block waits for memory no block will write.
    #[error("{0}")]
    Deadlock(String),
    /// The launch was stopped before it finished: its cancel flag
    /// ([`DeviceMemory::cancel`]) was set (the session's client is gone).
    #[error("the launch was stopped: its session is ending")]
    Cancelled,
}

/// Shared memory reserved for NVIDIA's system software in every block (1 KiB, as on sm_80 and
/// later GPUs: `CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK`). The VM puts it after
/// the kernel's static and dynamic shared memory, so no kernel variable overlaps it:
/// `%reserved_smem_offset_begin` is its first byte's shared-space offset, `_end` the offset
/// past it, `_cap` its size (1024); `_0` is its start and `_1` its middle (512 bytes each;
/// cooperative groups keeps the barriers and scratch of `tiled_partition` of more than 32
/// threads at `_1`, and may use up to 288 bytes there).
pub const RESERVED_SHARED: u64 = 1024;

/// Device memory as the interpreter sees it: allocations as regions of words that the host
/// threads running a launch's blocks share. An address in no region is
/// [`ExecError::IllegalAddress`].
pub trait DeviceMemory: Sync {
    /// The region holding `addr`, if any.
    fn region(&self, addr: u64) -> Option<Region<'_>>;

    /// The text of one device-side `printf` call (`vprintf`), formatted. Calls of one launch
    /// come in the order the threads made them; the device keeps them for the application.
    /// By default the text is dropped.
    fn print(&self, _text: &[u8]) {}

    /// The session's device heap for `malloc`/`free` in kernels, if the device keeps one.
    fn heap(&self) -> Option<&Heap> {
        None
    }

    /// The texture or surface object a handle names, if it is live (`tex.rs`).
    fn texture(&self, _handle: u64) -> Option<Texture> {
        None
    }

    /// A flag that stops the launch once set: every block looks at it before each turn of
    /// its warps (a few thousand instruction issues per warp apart, so a kernel that loops
    /// for ever stops too), and the launch fails with [`ExecError::Cancelled`]. The worker
    /// sets it when the session's client is gone.
    fn cancel(&self) -> Option<&AtomicBool> {
        None
    }
}

/// One allocation of device memory. Byte `k` of it is bits `8 * (k % 8)..` of `words[k / 8]`
/// (little-endian); `start` is a multiple of 8.
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    /// The device address of the first byte.
    pub start: u64,
    /// The length in bytes (at most `8 * words.len()`).
    pub len: u64,
    pub words: &'a [AtomicU64],
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// What a launch cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct LaunchStats {
    /// Wall-clock time from the first block to the last.
    pub elapsed: Duration,
    pub lane_instructions: u64,
    /// Host threads that ran its blocks.
    pub threads: usize,
}

/// A kernel's interface.
#[derive(Debug, Clone)]
pub struct KernelInfo {
    pub name: String,
    pub params: Vec<Param>,
    pub param_bytes: u32,
    pub static_shared_bytes: u32,
    pub max_threads: Option<u32>,
    /// `.reqntid`: the block shape every launch must have.
    pub req_threads: Option<[u32; 3]>,
}

/// A parsed, compiled PTX module.
pub struct Module {
    version: (u32, u32),
    target: u32,
    program: code::Program,
    kernels: Vec<KernelInfo>,
    globals: Vec<Var>,
    /// Module-scope `.shared` variables (each block gets its own copy).
    shared: Vec<Var>,
    /// Per function: for a kernel, the functions its launches can reach (itself first:
    /// `launch::reachable`), found once at load instead of at every launch; empty otherwise.
    reach: Vec<Vec<usize>>,
    /// Per function: whether a kernel, or what it reaches, calls device `malloc` or `free`
    /// or the device runtime (whose parameter buffers come from the heap).
    heap: Vec<bool>,
    /// Per function: whether a kernel, or what it reaches, calls the device runtime
    /// (`devrt.rs`): its launches run as a tree of grids.
    devrt: Vec<bool>,
    /// Per function: a kernel's parameter bytes (`None` for a device function), for launches
    /// from device code.
    entry_params: Vec<Option<devrt::Entry>>,
    /// Kernel name -> (its function index, its index in `kernels`): a launch finds its kernel
    /// without comparing names along a list (a library's module has thousands).
    entries: std::collections::HashMap<String, (usize, usize)>,
}

/// The module-scope `.shared` variables kernel `k` uses, in bytes: those named by its
/// instructions or by the device functions it reaches (calls, or functions whose address it
/// takes), as ptxas allocates them per kernel. A module of many kernels (NCCL's) declares more
/// shared memory in all than any one kernel has: counting every variable for every kernel made
/// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES` larger than the GPU's.
fn module_shared_used(p: &parse::Parsed, k: &parse::Function) -> u64 {
    fn names(ops: &[inst::Operand], out: &mut Vec<String>) {
        for o in ops {
            match o {
                inst::Operand::Sym(n)
                | inst::Operand::Addr {
                    base: inst::Base::Sym(n),
                    ..
                } => out.push(n.clone()),
                inst::Operand::Vector(v) => names(v, out),
                _ => {}
            }
        }
    }
    let shared: std::collections::HashMap<&str, u64> = p
        .globals
        .iter()
        .filter(|g| g.space == "shared")
        .map(|g| (g.name.as_str(), round_up(g.size, g.align)))
        .collect();
    if shared.is_empty() {
        return 0;
    }
    let funcs: std::collections::HashMap<&str, &parse::Function> =
        p.functions.iter().map(|f| (f.name.as_str(), f)).collect();
    let mut seen_funcs = std::collections::HashSet::from([k.name.as_str()]);
    let mut used = std::collections::HashSet::new();
    let mut todo = vec![k];
    while let Some(f) = todo.pop() {
        let mut syms = Vec::new();
        for i in &f.insts {
            names(&i.args, &mut syms);
        }
        for n in syms {
            if let Some((&name, _)) = shared.get_key_value(n.as_str()) {
                used.insert(name);
            } else if let Some(&g) = funcs.get(n.as_str()) {
                if seen_funcs.insert(g.name.as_str()) {
                    todo.push(g);
                }
            }
        }
    }
    used.iter().map(|n| shared[n]).sum()
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a.max(1)) * a.max(1)
}

/// Host threads a launch uses by default: `GPUFUSE_EMU_THREADS`, else every core.
pub fn default_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("GPUFUSE_EMU_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

impl Module {
    pub fn parse(src: &str) -> Result<Module, PtxError> {
        Module::from_parsed(parse::parse(src)?)
    }

    /// This module with every instruction on the interpreter's general path: none of the
    /// forms specialized at load time (`exec/spec/`). For tests that compare the two.
    #[doc(hidden)]
    pub fn without_fast_forms(mut self) -> Module {
        for f in &mut self.program.funcs {
            for ins in &mut f.insts {
                ins.fast = exec::spec::Fast::None;
            }
        }
        self
    }

    /// Links several translation units' PTX into one module (`link.rs`), as nvlink and the
    /// driver's JIT linker do: each unit's `.extern` functions and variables resolve to another
    /// unit's definitions, `.weak` definitions give way, `.common` variables merge, and each
    /// unit's internal names stay its own. A symbol defined twice or declared and defined by no
    /// unit is [`PtxError::Link`] naming it. Units are `(name, text)`; the name is for messages.
    pub fn link(units: &[(&str, &str)]) -> Result<Module, PtxError> {
        let mut parsed = Vec::with_capacity(units.len());
        for (name, src) in units {
            let unit = parse::parse_unit(src).map_err(|e| match e {
                PtxError::Syntax(m) => PtxError::Syntax(format!("{name}: {m}")),
                e => e,
            })?;
            parsed.push((name.to_string(), unit));
        }
        Module::from_parsed(parse::finish(link::link(parsed)?)?)
    }

    fn from_parsed(p: parse::Parsed) -> Result<Module, PtxError> {
        let kernels: Vec<KernelInfo> = p
            .functions
            .iter()
            .filter(|f| f.is_entry)
            .map(|f| KernelInfo {
                name: f.name.clone(),
                params: f.params.clone(),
                param_bytes: f.param_bytes,
                static_shared_bytes: (f
                    .locals
                    .iter()
                    .filter(|v| v.space == "shared" && v.size > 0)
                    .map(|v| round_up(v.size, v.align))
                    .sum::<u64>()
                    + module_shared_used(&p, f)) as u32,
                max_threads: f.max_threads,
                req_threads: f.req_threads,
            })
            .collect();
        let (shared, globals): (Vec<Var>, Vec<Var>) =
            p.globals.into_iter().partition(|g| g.space == "shared");
        let program = code::compile(&p.functions, &shared);
        let reach: Vec<Vec<usize>> = (0..program.funcs.len())
            .map(|k| match program.funcs[k].is_entry {
                true => launch::reachable(&program, k),
                false => Vec::new(),
            })
            .collect();
        let heap = reach
            .iter()
            .map(|funcs| funcs.iter().any(|&f| calls_heap(&program.funcs[f])))
            .collect();
        let devrt = reach
            .iter()
            .map(|funcs| funcs.iter().any(|&f| calls_devrt(&program.funcs[f])))
            .collect();
        let entry_params = p
            .functions
            .iter()
            .map(|f| {
                f.is_entry.then_some(devrt::Entry {
                    param_bytes: f.param_bytes,
                    max_threads: f.max_threads,
                    req_threads: f.req_threads,
                })
            })
            .collect();
        // The first kernel and the first entry function of each name, as a search would find.
        let kernel_of: std::collections::HashMap<&str, usize> = kernels
            .iter()
            .enumerate()
            .rev()
            .map(|(i, k)| (k.name.as_str(), i))
            .collect();
        let mut entries: std::collections::HashMap<String, (usize, usize)> =
            std::collections::HashMap::new();
        for (f, code) in program.funcs.iter().enumerate() {
            if let Some(&k) = kernel_of.get(code.name.as_str()).filter(|_| code.is_entry) {
                entries.entry(code.name.clone()).or_insert((f, k));
            }
        }
        Ok(Module {
            version: p.version,
            target: p.target,
            program,
            kernels,
            globals,
            shared,
            reach,
            heap,
            devrt,
            entry_params,
            entries,
        })
    }

    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    pub fn target_sm(&self) -> u32 {
        self.target
    }

    /// Functions that hold an instruction the VM does not implement, with the first such.
    pub fn unsupported(&self) -> impl Iterator<Item = (&str, &str)> {
        self.program
            .funcs
            .iter()
            .filter_map(|f| Some((f.name.as_str(), f.unsupported.as_deref()?)))
    }

    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        let &(_, k) = self.entries.get(name)?;
        self.kernels.get(k)
    }

    /// Whether a function of the module calls device `malloc` or `free` (the device then
    /// provides a heap, [`DeviceMemory::heap`]).
    pub fn uses_heap(&self) -> bool {
        self.program.funcs.iter().any(calls_heap)
    }

    /// Whether `kernel`, or a function it can reach through calls (an indirect call may reach
    /// any of the module's), calls device `malloc` or `free`: a launch of it needs the heap.
    /// A name the module lacks answers like [`Module::uses_heap`].
    pub fn kernel_uses_heap(&self, kernel: &str) -> bool {
        match self.entries.get(kernel) {
            Some(&(f, _)) => self.heap[f],
            None => self.uses_heap(),
        }
    }

    /// Module-scope `.global` and `.const` variables (the device allocates them).
    pub fn globals(&self) -> &[Var] {
        &self.globals
    }

    /// Runs `kernel` over its grid on [`default_threads`] host threads. `symbols` gives the
    /// device address of each module variable.
    pub fn launch(
        &self,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        mem: &dyn DeviceMemory,
        symbols: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<LaunchStats, ExecError> {
        self.launch_on(kernel, cfg, params, mem, symbols, default_threads())
    }

    /// [`Module::launch`] on at most `threads` host threads.
    pub fn launch_on(
        &self,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        mem: &dyn DeviceMemory,
        symbols: &dyn Fn(&str) -> Option<u64>,
        threads: usize,
    ) -> Result<LaunchStats, ExecError> {
        self.launch_with(kernel, cfg, params, mem, symbols, threads, None)
    }

    /// [`Module::launch_on`], cooperative when `cooperative` gives the grid workspace: the
    /// device address of 8 zeroed (or left by an earlier cooperative launch) bytes where
    /// `this_grid().sync()` counts arrivals (`%envreg1:%envreg2`). Every block of a
    /// cooperative launch is resident at once (`launch.rs`); the caller checks that the grid
    /// fits the device.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_with(
        &self,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        mem: &dyn DeviceMemory,
        symbols: &dyn Fn(&str) -> Option<u64>,
        threads: usize,
        cooperative: Option<u64>,
    ) -> Result<LaunchStats, ExecError> {
        let &(k, info) = self
            .entries
            .get(kernel)
            .ok_or_else(|| ExecError::NoKernel(kernel.to_string()))?;
        let info = &self.kernels[info];
        if let Some(op) = &self.program.funcs[k].unsupported {
            return Err(ExecError::Unsupported(format!(
                "PTX instruction `{op}` in {kernel} is not supported by the emulated GPU"
            )));
        }
        let threads_per_block: u64 = cfg.block.iter().map(|&d| d as u64).product();
        if threads_per_block == 0 || threads_per_block > 1024 || cfg.grid.contains(&0) {
            return Err(ExecError::InvalidLaunch(format!(
                "grid {:?} block {:?}",
                cfg.grid, cfg.block
            )));
        }
        if info
            .max_threads
            .is_some_and(|n| threads_per_block > n as u64)
        {
            return Err(ExecError::InvalidLaunch(format!(
                "{threads_per_block} threads per block, the kernel allows {} (.maxntid)",
                info.max_threads.unwrap_or_default()
            )));
        }
        if info.req_threads.is_some_and(|r| r != cfg.block) {
            return Err(ExecError::InvalidLaunch(format!(
                "block {:?}, the kernel requires {:?} (.reqntid)",
                cfg.block,
                info.req_threads.unwrap_or_default()
            )));
        }
        if (params.len() as u32) < info.param_bytes {
            return Err(ExecError::InvalidLaunch(format!(
                "{} parameter bytes, the kernel takes {}",
                params.len(),
                info.param_bytes
            )));
        }
        let grid = |devrt| {
            launch::run(
                &self.program,
                &self.shared,
                k,
                &self.reach[k],
                cfg,
                params,
                mem,
                symbols,
                threads,
                cooperative,
                devrt,
            )
        };
        if !self.devrt[k] {
            return grid(None);
        }
        // A kernel that launches kernels: the tree of grids it makes, run to its end.
        let start = std::time::Instant::now();
        let tree = devrt::Tree::new(&self.entry_params);
        let root = devrt::Grid::new(0);
        let run = || -> Result<LaunchStats, ExecError> {
            let mut stats = grid(Some((&tree, &root)))?;
            self.run_children(&tree, &root, mem, symbols, threads, &mut stats)?;
            Ok(stats)
        };
        let result = run();
        tree.finish(mem);
        let mut stats = result?;
        stats.elapsed = start.elapsed();
        Ok(stats)
    }

    /// Runs the work `grid` enqueued (`devrt.rs`), each grid with its own work after it,
    /// depth first; adds their costs to `stats`.
    fn run_children(
        &self,
        tree: &devrt::Tree,
        grid: &devrt::Grid,
        mem: &dyn DeviceMemory,
        symbols: &dyn Fn(&str) -> Option<u64>,
        threads: usize,
        stats: &mut LaunchStats,
    ) -> Result<(), ExecError> {
        for work in grid.take() {
            let devrt::Work::Grid { func, cfg, params } = work else {
                devrt::run_copy(mem, &work)?;
                continue;
            };
            // The launch call checked its shape (`devrt::launch`).
            tree.started();
            let child = devrt::Grid::new(grid.depth + 1);
            let s = launch::run(
                &self.program,
                &self.shared,
                func,
                &self.reach[func],
                &cfg,
                &params,
                mem,
                symbols,
                threads,
                None,
                Some((tree, &child)),
            )?;
            stats.lane_instructions += s.lane_instructions;
            stats.threads = stats.threads.max(s.threads);
            self.run_children(tree, &child, mem, symbols, threads, stats)?;
        }
        Ok(())
    }
}

/// Device memory of one region at a base address: for tests and benchmarks.
pub struct VecMemory {
    base: u64,
    len: u64,
    words: Vec<AtomicU64>,
    printed: std::sync::Mutex<Vec<u8>>,
    heap: Option<Heap>,
    textures: Vec<(u64, Texture)>,
    cancel: Option<Arc<AtomicBool>>,
}

impl VecMemory {
    /// `len` zeroed bytes at `base` (a multiple of 8).
    pub fn new(base: u64, len: usize) -> VecMemory {
        VecMemory {
            base,
            len: len as u64,
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
            printed: std::sync::Mutex::new(Vec::new()),
            heap: None,
            textures: Vec::new(),
            cancel: None,
        }
    }

    /// Launches on this memory stop once `flag` is set ([`DeviceMemory::cancel`]).
    pub fn with_cancel(mut self, flag: Arc<AtomicBool>) -> VecMemory {
        self.cancel = Some(flag);
        self
    }

    /// Makes `handle` name the texture or surface object `t`.
    pub fn set_texture(&mut self, handle: u64, t: Texture) {
        self.textures.retain(|(h, _)| *h != handle);
        self.textures.push((handle, t));
    }

    /// Forgets `handle` (a destroyed object).
    pub fn remove_texture(&mut self, handle: u64) {
        self.textures.retain(|(h, _)| *h != handle);
    }

    /// The last `bytes` of the memory become a device heap for `malloc`/`free` in kernels.
    pub fn with_heap(mut self, bytes: u64) -> VecMemory {
        let bytes = bytes.min(self.len);
        self.heap = Some(Heap::new(self.base + self.len - bytes, bytes));
        self
    }

    /// What device-side `printf` printed so far, taken.
    pub fn take_printed(&self) -> Vec<u8> {
        std::mem::take(&mut *self.printed.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes at `[off, off + len)`; zeros past the end.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        (off..off + len)
            .map(|k| match self.words.get(k / 8) {
                Some(w) if (k as u64) < self.len => {
                    (w.load(std::sync::atomic::Ordering::Relaxed) >> (8 * (k % 8))) as u8
                }
                _ => 0,
            })
            .collect()
    }

    /// Writes `data` at `off`; bytes past the end are dropped.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        for (k, &b) in (off..).zip(data) {
            if (k as u64) >= self.len {
                break;
            }
            if let Some(w) = self.words.get_mut(k / 8) {
                let sh = 8 * (k % 8);
                *w.get_mut() = (*w.get_mut() & !(0xff << sh)) | (b as u64) << sh;
            }
        }
    }
}

impl DeviceMemory for VecMemory {
    fn region(&self, addr: u64) -> Option<Region<'_>> {
        (addr >= self.base && addr - self.base < self.len && self.base.is_multiple_of(8)).then_some(
            Region {
                start: self.base,
                len: self.len,
                words: &self.words,
            },
        )
    }

    fn print(&self, text: &[u8]) {
        let mut p = self.printed.lock().unwrap_or_else(|p| p.into_inner());
        p.extend_from_slice(text);
    }

    fn heap(&self) -> Option<&Heap> {
        self.heap.as_ref()
    }

    fn texture(&self, handle: u64) -> Option<Texture> {
        self.textures
            .iter()
            .find(|(h, _)| *h == handle)
            .map(|(_, t)| *t)
    }

    fn cancel(&self) -> Option<&AtomicBool> {
        self.cancel.as_deref()
    }
}

/// Whether `f` itself calls device `malloc` or `free`, or the device runtime (whose
/// parameter buffers, `cudaMalloc` and error strings come from the heap).
fn calls_heap(f: &code::Code) -> bool {
    use code::{FREE_CALLEE, MALLOC_CALLEE};
    calls_devrt(f)
        || f.calls
            .iter()
            .any(|c| matches!(c.callee, MALLOC_CALLEE | FREE_CALLEE))
}

/// Whether `f` itself calls the device runtime (`devrt.rs`).
fn calls_devrt(f: &code::Code) -> bool {
    f.calls
        .iter()
        .any(|c| devrt::from_callee(c.callee).is_some())
}
