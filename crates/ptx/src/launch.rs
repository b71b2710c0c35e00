//! A launch: the code it reaches, its shared-memory layout, its symbols, and its blocks run on
//! host threads. Blocks are independent (as on a GPU), so each thread takes the next block
//! index from a shared counter and runs it with its own block runner; the first failure stops
//! the others at their next block and fails the launch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::code::{Program, SymKind};
use crate::parse::Var;
use crate::warp::{Block, Launch, Step, MAX_LOCAL};
use crate::{DeviceMemory, ExecError, LaunchConfig, LaunchStats};

/// Shared memory a block may have (far above any GPU's; the device checks its own limit).
const MAX_SHARED: u64 = 16 << 20;

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a.max(1)) * a.max(1)
}

/// The functions a kernel can reach through calls, the kernel first. An indirect call (through
/// a function address) may reach every device function of the module.
pub(crate) fn reachable(prog: &Program, kernel: usize) -> Vec<usize> {
    use crate::code::{
        ASSERT_CALLEE, FREE_CALLEE, INDIRECT_CALLEE, MALLOC_CALLEE, SET_CONDITIONAL_CALLEE,
        VPRINTF_CALLEE,
    };
    let mut seen = vec![false; prog.funcs.len()];
    let mut out = vec![kernel];
    seen[kernel] = true;
    let mut i = 0;
    while let Some(&f) = out.get(i) {
        for c in prog.funcs[f].calls.iter().map(|c| c.callee) {
            // `__assertfail` has no body to reach.
            let callees = match c {
                ASSERT_CALLEE
                | VPRINTF_CALLEE
                | MALLOC_CALLEE
                | FREE_CALLEE
                | SET_CONDITIONAL_CALLEE => 0..0,
                INDIRECT_CALLEE => 0..prog.funcs.len(),
                // The device runtime's functions have no body either (`devrt.rs`).
                c if c >= crate::devrt::CALLEE_BASE => 0..0,
                c => c as usize..c as usize + 1,
            };
            for c in callees {
                if !seen[c] && !prog.funcs[c].is_entry {
                    seen[c] = true;
                    out.push(c);
                }
            }
        }
        i += 1;
    }
    out
}

/// Runs a launch of `kernel`; `funcs` is what it reaches ([`reachable`], the kernel first),
/// found once when the module was loaded.
#[allow(clippy::too_many_arguments)]
pub fn run(
    prog: &Program,
    module_shared: &[Var],
    kernel: usize,
    funcs: &[usize],
    cfg: &LaunchConfig,
    params: &[u8],
    mem: &dyn DeviceMemory,
    symbols: &dyn Fn(&str) -> Option<u64>,
    threads: usize,
    cooperative: Option<u64>,
    devrt: Option<(&crate::devrt::Tree, &crate::devrt::Grid)>,
) -> Result<LaunchStats, ExecError> {
    check_code(prog, kernel, funcs)?;
    let (offsets, shared_bytes) = shared_layout(prog, module_shared, kernel, funcs, cfg)?;
    let syms = symbol_addresses(prog, funcs, &offsets, symbols);
    let blocks: u64 = cfg.grid.iter().map(|&d| d as u64).product();
    let workers = threads.clamp(1, blocks.clamp(1, 1024) as usize);
    let epoch = AtomicU64::new(0);
    let launch = Launch {
        prog,
        kernel,
        cfg: *cfg,
        params,
        syms,
        mem,
        shared_bytes,
        exclusive: workers == 1,
        workspace: cooperative.unwrap_or(0),
        epoch: cooperative.map(|_| &epoch),
        cancel: mem.cancel(),
        devrt,
    };
    let ctaid = |i: u64| {
        let (gx, gy) = (cfg.grid[0] as u64, cfg.grid[1] as u64);
        [
            (i % gx) as u32,
            ((i / gx) % gy) as u32,
            (i / (gx * gy)) as u32,
        ]
    };
    let start = Instant::now();
    if cooperative.is_some() {
        return coresident(&launch, blocks, workers, &ctaid, start);
    }
    if workers == 1 {
        let mut block = Block::new(&launch);
        let mut lane_instructions = 0;
        for i in 0..blocks {
            lane_instructions += block.run(ctaid(i))?;
        }
        return Ok(LaunchStats {
            elapsed: start.elapsed(),
            lane_instructions,
            threads: 1,
        });
    }
    parallel(&launch, blocks, workers, &ctaid, start)
}

/// Whether the launch can run the code it reaches: no instruction the VM does not run, no
/// frame larger than a thread's local memory.
fn check_code(prog: &Program, kernel: usize, funcs: &[usize]) -> Result<(), ExecError> {
    let name = &prog.funcs[kernel].name;
    for &f in funcs {
        let code = &prog.funcs[f];
        if let Some(op) = &code.unsupported {
            let via = if f == kernel {
                String::new()
            } else {
                format!(" (called function {})", code.name)
            };
            return Err(ExecError::Unsupported(format!(
                "PTX instruction `{op}` in {name}{via} is not supported by the emulated GPU"
            )));
        }
        if code.frame > MAX_LOCAL {
            return Err(ExecError::InvalidLaunch(format!(
                "{} needs {} bytes of local memory per thread",
                code.name, code.frame
            )));
        }
    }
    Ok(())
}

/// A block's shared memory: each variable's offset (the kernel's static variables, the
/// module's, those of the functions it calls; dynamic (`.extern`) variables after them), and
/// the bytes of it all, the reserved region (`%reserved_smem_offset_*`) included.
fn shared_layout(
    prog: &Program,
    module_shared: &[Var],
    kernel: usize,
    funcs: &[usize],
    cfg: &LaunchConfig,
) -> Result<(HashMap<u32, u64>, usize), ExecError> {
    let mut offsets: HashMap<u32, u64> = HashMap::new();
    let mut shared = 0u64;
    let mut dynamic = Vec::new();
    let kernel_vars = prog.funcs[kernel].shared.iter().map(|(id, v)| (*id, v));
    let module_vars = prog
        .symbols
        .iter()
        .enumerate()
        .filter_map(|(id, k)| match k {
            SymKind::ModuleShared(i) => Some((id as u32, module_shared.get(*i)?)),
            _ => None,
        });
    let callee_vars = funcs[1..]
        .iter()
        .flat_map(|&f| prog.funcs[f].shared.iter().map(|(id, v)| (*id, v)));
    for (id, v) in kernel_vars.chain(module_vars).chain(callee_vars) {
        if v.size == 0 {
            dynamic.push(id);
        } else if let std::collections::hash_map::Entry::Vacant(e) = offsets.entry(id) {
            shared = round_up(shared, v.align);
            e.insert(shared);
            shared += v.size;
        }
    }
    shared = round_up(shared, 16);
    for id in dynamic {
        offsets.insert(id, shared);
    }
    let shared_bytes = shared + cfg.dynamic_shared_bytes as u64;
    if shared_bytes > MAX_SHARED {
        return Err(ExecError::InvalidLaunch(format!(
            "{shared_bytes} bytes of shared memory per block"
        )));
    }
    // The reserved region after the kernel's own shared memory (`%reserved_smem_offset_*`).
    let shared_bytes = (round_up(shared_bytes, 16) + crate::RESERVED_SHARED) as usize;
    Ok((offsets, shared_bytes))
}

/// The address (or shared-memory offset) of each symbol the reached code names.
fn symbol_addresses(
    prog: &Program,
    funcs: &[usize],
    offsets: &HashMap<u32, u64>,
    symbols: &dyn Fn(&str) -> Option<u64>,
) -> Vec<Option<u64>> {
    let mut syms = vec![None; prog.symbols.len()];
    for &f in funcs {
        for &id in &prog.funcs[f].symbols {
            let slot = &mut syms[id as usize];
            if slot.is_some() {
                continue;
            }
            *slot = match &prog.symbols[id as usize] {
                SymKind::Global(name) => symbols(name),
                SymKind::ModuleShared(_) | SymKind::BodyShared => offsets.get(&id).copied(),
            };
        }
    }
    syms
}

/// The blocks run on `workers` host threads, each taking the next block index; the first
/// failure (of the lowest block, among those run) stops the others at their next block.
fn parallel(
    launch: &Launch,
    blocks: u64,
    workers: usize,
    ctaid: &(impl Fn(u64) -> [u32; 3] + Sync),
    start: Instant,
) -> Result<LaunchStats, ExecError> {
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let failure: Mutex<Option<(u64, ExecError)>> = Mutex::new(None);
    let work = || {
        let mut block = Block::new(launch);
        let mut count = 0;
        while !stop.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= blocks {
                break;
            }
            match block.run(ctaid(i)) {
                Ok(c) => count += c,
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    let mut f = failure.lock().unwrap_or_else(|p| p.into_inner());
                    if f.as_ref().is_none_or(|(j, _)| i < *j) {
                        *f = Some((i, e));
                    }
                }
            }
        }
        total.fetch_add(count, Ordering::Relaxed);
    };
    let mut started = 1;
    std::thread::scope(|s| {
        for _ in 1..workers {
            if std::thread::Builder::new()
                .name("gpufuse-block".into())
                .spawn_scoped(s, work)
                .is_ok()
            {
                started += 1;
            }
        }
        work();
    });
    if let Some((_, e)) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(LaunchStats {
        elapsed: start.elapsed(),
        lane_instructions: total.into_inner(),
        threads: started,
    })
}

/// Instruction issues per warp in one turn of a co-resident block.
const COOP_QUANTUM: u64 = 256;
/// Fingerprints a block remembers while device memory stays unchanged.
const CYCLE_MEMORY: usize = 4096;

/// A cooperative launch: every block is resident at once, as the CUDA driver guarantees, so
/// blocks may wait for each other through memory (`this_grid().sync()`, flags, locks). Each
/// host thread owns the blocks `i ≡ thread (mod workers)` and runs them in turns of
/// [`COOP_QUANTUM`] issues per warp, round robin, so a block that spins lets the others run.
///
/// A grid in which no block can make progress fails instead of hanging: `launch.epoch` moves
/// before the first device-memory write of any block's turn. While it stays put, a block whose
/// state fingerprint (`Block::fingerprint`) after a turn repeats one it had since the epoch
/// began is in a cycle: it reads the same memory and so does the same thing forever. When every
/// host thread has seen all its unfinished blocks in a cycle within one epoch, and the epoch
/// still has not moved, nothing will ever write memory again, so no block can leave its
/// cycle: the launch fails (`ExecError::Deadlock`). A block that reads a clock never repeats
/// and is never called stuck.
fn coresident(
    launch: &Launch,
    blocks: u64,
    workers: usize,
    ctaid: &(dyn Fn(u64) -> [u32; 3] + Sync),
    start: Instant,
) -> Result<LaunchStats, ExecError> {
    let epoch = launch
        .epoch
        .ok_or_else(|| ExecError::InvalidLaunch("no epoch".into()))?;
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let failure: Mutex<Option<(u64, ExecError)>> = Mutex::new(None);
    // Per host thread: the epoch + 1 in which all its blocks were seen cycling (0: not), or
    // u64::MAX once its blocks have all finished.
    let stuck: Vec<AtomicU64> = (0..workers).map(|_| AtomicU64::new(0)).collect();
    let fail = |i: u64, e: ExecError| {
        stop.store(true, Ordering::Relaxed);
        let mut f = failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.as_ref().is_none_or(|(j, _)| i < *j) {
            *f = Some((i, e));
        }
    };
    let work = |me: usize| {
        struct Resident<'a> {
            index: u64,
            block: Block<'a>,
            seen: std::collections::HashSet<u64>,
            since: u64,
            cycling: bool,
        }
        let mut mine: Vec<Resident> = (me as u64..blocks)
            .step_by(workers)
            .map(|index| {
                let mut block = Block::new(launch);
                block.start(ctaid(index));
                Resident {
                    index,
                    block,
                    seen: Default::default(),
                    since: u64::MAX,
                    cycling: false,
                }
            })
            .collect();
        let mut count = 0;
        while !mine.is_empty() && !stop.load(Ordering::Relaxed) {
            let round = epoch.load(Ordering::SeqCst);
            let mut k = 0;
            while k < mine.len() {
                let r = &mut mine[k];
                match r.block.step(COOP_QUANTUM) {
                    Ok((Step::Done, c)) => {
                        count += c;
                        mine.swap_remove(k);
                        // A finished block changes what the others may wait for.
                        epoch.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    Ok((Step::Pending, c)) => {
                        count += c;
                        let now = epoch.load(Ordering::SeqCst);
                        if r.block.env.wrote || now != r.since || r.seen.len() >= CYCLE_MEMORY {
                            r.seen.clear();
                            r.since = now;
                            r.cycling = false;
                        }
                        if !r.block.env.wrote {
                            r.cycling |= !r.seen.insert(r.block.fingerprint());
                        }
                    }
                    Err(e) => {
                        fail(r.index, e);
                        return;
                    }
                }
                k += 1;
            }
            if mine.is_empty() {
                break;
            }
            let now = epoch.load(Ordering::SeqCst);
            if now == round && mine.iter().all(|r| r.cycling && r.since == now) {
                stuck[me].store(now + 1, Ordering::SeqCst);
                let all = stuck.iter().all(|s| {
                    let s = s.load(Ordering::SeqCst);
                    s == now + 1 || s == u64::MAX
                });
                if all && epoch.load(Ordering::SeqCst) == now {
                    let first = mine.iter().map(|r| r.index).min().unwrap_or(0);
                    fail(
                        first,
                        ExecError::Deadlock(format!(
                            "no block of the cooperative grid of {blocks} can make progress: \
                             every unfinished block waits in a loop that reads memory no \
                             block will write"
                        )),
                    );
                    return;
                }
            } else {
                stuck[me].store(0, Ordering::SeqCst);
            }
        }
        stuck[me].store(u64::MAX, Ordering::SeqCst);
        total.fetch_add(count, Ordering::Relaxed);
    };
    let mut started = 1;
    std::thread::scope(|s| {
        for me in 1..workers {
            if std::thread::Builder::new()
                .name("gpufuse-block".into())
                .spawn_scoped(s, move || work(me))
                .is_ok()
            {
                started += 1;
            } else {
                fail(
                    0,
                    ExecError::InvalidLaunch("cannot start a host thread for the grid".into()),
                );
            }
        }
        work(0);
    });
    if let Some((_, e)) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(LaunchStats {
        elapsed: start.elapsed(),
        lane_instructions: total.into_inner(),
        threads: started,
    })
}
