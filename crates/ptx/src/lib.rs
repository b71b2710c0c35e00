//! PTX for gpufuse's emulated GPU: a parser and an interpreter.
//!
//! [`Module::parse`] reads the PTX that nvcc, NVRTC and CuPy emit (entries, device functions'
//! declarations, module variables, parameter layouts) and decodes every instruction once; an
//! opcode the interpreter does not implement fails the load with an error naming it.
//! [`Module::launch`] runs a kernel over its grid with CUDA's semantics for the implemented
//! instructions: per-thread registers, warps of 32 in lockstep under min-PC scheduling (so
//! shuffles and votes see their partners), `bar.sync` across a block, shared, local, param,
//! const and global state spaces, atomics, and an illegal-address error for any access outside
//! device memory. Blocks run one after another on the calling thread in this version.
//!
//! Not yet: calls to device functions (`call`), textures, tensor-core instructions. A module
//! holding them still loads (libraries ship thousands of kernels in one module); launching a
//! kernel that holds one fails with an error naming the instruction, so nothing runs wrongly.
//! `cargo run -p gpufuse-ptx --example ptx_check -- FILE.ptx` lists them for a module.

#![forbid(unsafe_code)]

mod exec;
mod inst;
mod parse;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use inst::Space;
pub use parse::{Param, Var};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PtxError {
    #[error("invalid PTX: {0}")]
    Syntax(String),
    #[error("PTX instruction `{opcode}` is not supported by the emulated GPU")]
    Unsupported { opcode: String },
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ExecError {
    #[error("illegal address {0:#x}")]
    IllegalAddress(u64),
    #[error("kernel executed a trap")]
    Trap,
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("invalid launch: {0}")]
    InvalidLaunch(String),
    #[error("no kernel named {0}")]
    NoKernel(String),
}

/// Device memory as the interpreter sees it. An access outside device memory is
/// [`ExecError::IllegalAddress`].
pub trait DeviceMemory {
    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ExecError>;
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ExecError>;
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
    pub elapsed: Duration,
    pub lane_instructions: u64,
}

/// A kernel's interface.
#[derive(Debug, Clone)]
pub struct KernelInfo {
    pub name: String,
    pub params: Vec<Param>,
    pub param_bytes: u32,
    pub static_shared_bytes: u32,
    pub max_threads: Option<u32>,
}

/// A parsed, decoded PTX module.
pub struct Module {
    version: (u32, u32),
    target: u32,
    functions: Vec<parse::Function>,
    kernels: Vec<KernelInfo>,
    globals: Vec<Var>,
    /// Module-scope `.shared` variables (each block gets its own copy).
    shared: Vec<Var>,
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a.max(1)) * a.max(1)
}

impl Module {
    pub fn parse(src: &str) -> Result<Module, PtxError> {
        let p = parse::parse(src)?;
        let module_shared: u64 = p
            .globals
            .iter()
            .filter(|g| g.space == "shared")
            .map(|g| round_up(g.size, g.align))
            .sum();
        let kernels = p
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
                    + module_shared) as u32,
                max_threads: f.max_threads,
            })
            .collect();
        let (shared, globals): (Vec<Var>, Vec<Var>) =
            p.globals.into_iter().partition(|g| g.space == "shared");
        Ok(Module {
            version: p.version,
            target: p.target,
            functions: p.functions,
            kernels,
            globals,
            shared,
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
        self.functions
            .iter()
            .filter_map(|f| Some((f.name.as_str(), f.unsupported.as_deref()?)))
    }

    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// Module-scope `.global` and `.const` variables (the device allocates them).
    pub fn globals(&self) -> &[Var] {
        &self.globals
    }

    /// Runs `kernel` over its grid. `symbols` gives the device address of each module variable.
    pub fn launch(
        &self,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        mem: &mut dyn DeviceMemory,
        symbols: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<LaunchStats, ExecError> {
        let f = self
            .functions
            .iter()
            .find(|f| f.is_entry && f.name == kernel)
            .ok_or_else(|| ExecError::NoKernel(kernel.to_string()))?;
        if let Some(op) = &f.unsupported {
            return Err(ExecError::Unsupported(format!(
                "PTX instruction `{op}` in {kernel} is not supported by the emulated GPU"
            )));
        }
        let threads: u64 = cfg.block.iter().map(|&d| d as u64).product();
        if threads == 0 || threads > 1024 || cfg.grid.contains(&0) {
            return Err(ExecError::InvalidLaunch(format!(
                "grid {:?} block {:?}",
                cfg.grid, cfg.block
            )));
        }
        if (params.len() as u32) < f.param_bytes {
            return Err(ExecError::InvalidLaunch(format!(
                "{} parameter bytes, the kernel takes {}",
                params.len(),
                f.param_bytes
            )));
        }
        // Lay out shared and local variables: static shared first, dynamic (`.extern`) after.
        let mut layout: HashMap<String, (Space, u64)> = HashMap::new();
        let (mut shared, mut local) = (0u64, 0u64);
        let module_shared = self.functions.is_empty();
        let _ = module_shared;
        let mut dynamic = Vec::new();
        for v in f.locals.iter().chain(self.shared_globals()) {
            match v.space.as_str() {
                "shared" if v.size == 0 => dynamic.push(v),
                "shared" => {
                    shared = round_up(shared, v.align);
                    layout.insert(v.name.clone(), (Space::Shared, shared));
                    shared += v.size;
                }
                "local" | "param" => {
                    local = round_up(local, v.align);
                    layout.insert(v.name.clone(), (Space::Local, local));
                    local += v.size;
                }
                _ => {}
            }
        }
        shared = round_up(shared, 16);
        for v in dynamic {
            layout.insert(v.name.clone(), (Space::Shared, shared));
        }
        let shared_total = shared as usize + cfg.dynamic_shared_bytes as usize;
        let syms = exec::Symbols {
            global: symbols,
            local: &layout,
        };
        let start = Instant::now();
        let mut lane_instructions = 0;
        for z in 0..cfg.grid[2] {
            for y in 0..cfg.grid[1] {
                for x in 0..cfg.grid[0] {
                    lane_instructions += exec::run_block(
                        f,
                        cfg,
                        [x, y, z],
                        params,
                        shared_total,
                        local as usize,
                        &syms,
                        mem,
                    )?;
                }
            }
        }
        Ok(LaunchStats {
            elapsed: start.elapsed(),
            lane_instructions,
        })
    }

    fn shared_globals(&self) -> impl Iterator<Item = &Var> {
        self.shared.iter()
    }
}

/// Device memory backed by one vector at a base address: for tests.
pub struct VecMemory {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl DeviceMemory for VecMemory {
    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ExecError> {
        let off = addr
            .checked_sub(self.base)
            .ok_or(ExecError::IllegalAddress(addr))? as usize;
        let src = self
            .bytes
            .get(off..off + out.len())
            .ok_or(ExecError::IllegalAddress(addr))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ExecError> {
        let off = addr
            .checked_sub(self.base)
            .ok_or(ExecError::IllegalAddress(addr))? as usize;
        let dst = self
            .bytes
            .get_mut(off..off + data.len())
            .ok_or(ExecError::IllegalAddress(addr))?;
        dst.copy_from_slice(data);
        Ok(())
    }
}
