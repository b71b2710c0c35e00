//! Warps and blocks. A warp keeps its 32 lanes' registers as structure-of-arrays
//! (`levels[call depth][register][lane]`), program counters, call stacks and local memory.
//! Scheduling is min-PC: the lanes whose position is lowest run the next instruction together,
//! so converged code runs in lockstep (shuffles and votes see their partners) and divergent
//! paths reconverge. A lane inside a call is positioned by its call sites and then its PC,
//! compared in that order, so lanes in a callee run before their caller moves on. When a
//! branch splits a group, the lanes that reach its immediate post-dominator first wait there
//! (`Warp::joins`, `reconverge.rs`) until the rest arrive, exit, or wait at a block barrier:
//! a side placed out of line (at a higher PC) cannot be overtaken by the other side's next
//! loop round. While the running group is every runnable lane of the warp, no meeting is
//! pending and the instruction did not branch apart, the next instruction runs for the same
//! group without a scan; so does it while the group's next PC is below every other runnable
//! lane's, no lane is inside a call and the group does not reach a meeting point (`pick`
//! would choose the same group). `bar.sync` parks lanes until every live thread of the block arrives.

use std::cmp::Ordering;

use crate::code::{Code, Program, Src};
use crate::exec::{self, Flow};
use crate::lanes;
use crate::memory;
use crate::space::LOCAL_WINDOW;
use crate::{DeviceMemory, ExecError, LaunchConfig, Region};

/// Calls nested deeper than this fail the launch (a GPU's stack overflows too).
pub const MAX_DEPTH: usize = 256;
/// Local memory one thread may use, all frames together (CUDA's limit per thread).
pub const MAX_LOCAL: u64 = 512 << 10;

/// The lanes of a mask, lowest first.
#[derive(Clone, Copy)]
pub struct Bits(pub u32);

impl Iterator for Bits {
    type Item = usize;
    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let l = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(l)
    }
}

/// A call in progress: the callee, where it was called from, and its frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    pub func: u32,
    /// The caller's PC of the `call`.
    pub site: u32,
    /// The local-memory address of the callee's frame.
    pub base: u64,
}

/// The lanes that run one instruction together, and where they are.
#[derive(Debug, Clone, Copy)]
pub struct Group {
    pub pc: u32,
    pub mask: u32,
    pub func: usize,
    pub depth: usize,
    /// The local-memory address of the running frame.
    pub base: u64,
}

pub type Lanes = [u64; 32];

pub struct Warp {
    pub index: u32,
    /// Lanes that exist (the last warp of a block may be partial).
    pub exists: u32,
    /// Lanes that have not exited.
    pub live: u32,
    /// Lanes waiting at a barrier.
    pub bar: u32,
    /// Carry flags (`add.cc`).
    pub carry: u32,
    /// Lanes inside a call.
    pub calling: u32,
    pub pc: [u32; 32],
    pub tid: [[u32; 3]; 32],
    /// Registers by call depth: `levels[depth][register][lane]`.
    pub levels: Vec<Vec<Lanes>>,
    /// Per lane, inline: a launch of one small block allocates only its register file.
    pub stacks: [Vec<Frame>; 32],
    pub local: [Vec<u8>; 32],
    /// Each lane's `alloca` stack (`ALLOCA_WINDOW` addresses), grown upward; its length is
    /// the stack pointer `stacksave` reads and `stackrestore` sets.
    pub alloca: [Vec<u8>; 32],
    /// Divergent branches whose lanes have not all met again yet, innermost last.
    pub joins: Vec<Join>,
    /// Each lane's last device runtime error (`cudaGetLastError` in device code, `devrt.rs`).
    pub devrt_error: [u32; 32],
    /// The block shape `tid` and `exists` were computed for ([`Warp::place`]): a spare warp
    /// placed again in the same shape keeps them.
    placed: Option<(u32, u32, [u32; 3])>,
}

/// The lanes `mask` of a branch that diverged in function `func` at call depth `depth` meet
/// again at instruction `pc`: a lane that gets there waits for the others (`reconverge.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Join {
    pub pc: u32,
    pub func: u32,
    pub depth: usize,
    pub mask: u32,
}

impl Warp {
    fn new(index: u32, threads: u32, block: [u32; 3]) -> Warp {
        let mut w = Warp {
            index,
            exists: 0,
            live: 0,
            bar: 0,
            carry: 0,
            calling: 0,
            pc: [0; 32],
            tid: [[0; 3]; 32],
            levels: vec![Vec::new()],
            stacks: std::array::from_fn(|_| Vec::new()),
            local: std::array::from_fn(|_| Vec::new()),
            alloca: std::array::from_fn(|_| Vec::new()),
            joins: Vec::new(),
            devrt_error: [0; 32],
            placed: None,
        };
        w.place(index, threads, block);
        w
    }

    /// Makes this warp warp `index` of a block of `threads` threads shaped `block`.
    fn place(&mut self, index: u32, threads: u32, block: [u32; 3]) {
        if self.placed == Some((index, threads, block)) {
            // The same lanes as last time (a stream of launches of one shape).
            self.live = self.exists;
            return;
        }
        self.placed = Some((index, threads, block));
        let first = index * 32;
        let n = threads.saturating_sub(first).min(32);
        self.index = index;
        self.exists = if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
        self.live = self.exists;
        let [bx, by] = [block[0].max(1), block[1].max(1)];
        // The first lane's coordinates, then counting up with carries (no division per lane).
        let mut t = [first % bx, (first / bx) % by, first / (bx * by)];
        for slot in self.tid.iter_mut() {
            *slot = t;
            t[0] += 1;
            if t[0] == bx {
                t[0] = 0;
                t[1] += 1;
                if t[1] == by {
                    t[1] = 0;
                    t[2] += 1;
                }
            }
        }
    }

    fn reset(&mut self, kernel: &Code) {
        self.live = self.exists;
        self.bar = 0;
        self.carry = 0;
        self.calling = 0;
        self.pc = [0; 32];
        self.devrt_error = [0; 32];
        for a in &mut self.alloca {
            a.clear();
        }
        self.joins.clear();
        let regs = &mut self.levels[0];
        regs.clear();
        regs.resize(kernel.nregs, [0; 32]);
        for s in &mut self.stacks {
            s.clear();
        }
        let frame = kernel.frame as usize;
        if frame == 0 {
            // Nothing to zero: not even an empty `memset` per lane, which costs a launch of
            // an empty kernel more than the rest of this reset.
            return;
        }
        for l in Bits(self.exists) {
            let local = &mut self.local[l];
            if local.len() < frame {
                local.resize(frame, 0);
            }
            local[..frame].fill(0);
        }
    }

    /// Lanes that can run now.
    #[inline(always)]
    pub fn runnable(&self) -> u32 {
        self.live & !self.bar
    }

    /// A lane's position: its call sites, outermost first, each with the function called
    /// there (lanes of an indirect call may be in different callees), then its PC.
    fn position(&self, l: usize) -> impl Iterator<Item = u32> + '_ {
        self.stacks[l]
            .iter()
            .flat_map(|f| [f.site, f.func])
            .chain(std::iter::once(self.pc[l]))
    }

    /// Whether lane `l` stands at `j`'s meeting point.
    fn at_join(&self, l: usize, j: &Join, kernel: usize) -> bool {
        self.pc[l] == j.pc
            && self.stacks[l].len() == j.depth
            && self.stacks[l].last().map_or(kernel as u32, |f| f.func) == j.func
    }

    /// Lanes waiting at a meeting point for others of their branch. Meetings every lane has
    /// reached (or left by exiting), or whose other lanes wait at a block barrier, are over and
    /// removed.
    fn held(&mut self, kernel: usize) -> u32 {
        let mut held = 0u32;
        let mut k = self.joins.len();
        while k > 0 {
            k -= 1;
            let j = self.joins[k];
            let lanes = j.mask & self.live;
            let mut there = 0u32;
            for l in Bits(lanes) {
                if self.at_join(l, &j, kernel) {
                    there |= 1 << l;
                }
            }
            // Over when every lane is there, or when the others all wait at a block barrier
            // (a barrier on one path, `ret` on the other: the lanes part for good, as on a GPU).
            if there == lanes || (lanes & !there & !self.bar) == 0 {
                self.joins.remove(k);
            } else {
                held |= there;
            }
        }
        held
    }

    /// The lanes at the lowest position, if any can run.
    fn pick(&mut self, kernel: usize) -> Option<Group> {
        let held = if self.joins.is_empty() {
            0
        } else {
            self.held(kernel)
        };
        let run = self.runnable() & !held;
        if run == 0 {
            return None;
        }
        if self.calling & run == 0 {
            let (mut best, mut mask) = (u32::MAX, 0u32);
            for l in Bits(run) {
                let p = self.pc[l];
                if p < best {
                    best = p;
                    mask = 1 << l;
                } else if p == best {
                    mask |= 1 << l;
                }
            }
            return Some(Group {
                pc: best,
                mask,
                func: kernel,
                depth: 0,
                base: 0,
            });
        }
        let mut lanes = Bits(run);
        let mut best = lanes.next()?;
        let mut mask = 1u32 << best;
        for l in lanes {
            match self.position(l).cmp(self.position(best)) {
                Ordering::Less => {
                    best = l;
                    mask = 1 << l;
                }
                Ordering::Equal => mask |= 1 << l,
                Ordering::Greater => {}
            }
        }
        let top = self.stacks[best].last();
        Some(Group {
            pc: self.pc[best],
            mask,
            func: top.map_or(kernel, |f| f.func as usize),
            depth: self.stacks[best].len(),
            base: top.map_or(0, |f| f.base),
        })
    }

    /// Sets the PC of `mask`'s lanes.
    #[inline(always)]
    pub fn goto(&mut self, mask: u32, pc: u32) {
        for l in Bits(mask) {
            self.pc[l] = pc;
        }
    }
}

/// What every block of a launch shares.
pub struct Launch<'a> {
    pub prog: &'a Program,
    pub kernel: usize,
    pub cfg: LaunchConfig,
    pub params: &'a [u8],
    /// Each module symbol's value, for the symbols the reachable code names.
    pub syms: Vec<Option<u64>>,
    pub mem: &'a dyn DeviceMemory,
    pub shared_bytes: usize,
    /// One host thread runs the whole launch.
    pub exclusive: bool,
    /// A cooperative launch's grid workspace (`%envreg1:%envreg2`), 0 for any other launch.
    pub workspace: u64,
    /// A cooperative launch's count of quanta that wrote device memory (`launch.rs`).
    pub epoch: Option<&'a std::sync::atomic::AtomicU64>,
    /// Set: the launch stops at its blocks' next step ([`crate::DeviceMemory::cancel`]).
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// The launch tree this grid belongs to and the work it enqueues (`devrt.rs`), for a
    /// kernel that reaches the device runtime.
    pub devrt: Option<(&'a crate::devrt::Tree<'a>, &'a crate::devrt::Grid)>,
}

/// A block's own state, apart from its warps.
pub struct Env<'a> {
    pub l: &'a Launch<'a>,
    pub shared: Vec<u8>,
    pub ctaid: [u32; 3],
    /// The device memory region of the last global access.
    pub region: Option<Region<'a>>,
    /// The regions of the last few global accesses of the specialized forms, latest first
    /// (`exec/spec/`): a loop over several arrays finds each one's region here.
    pub recent: [Option<Region<'a>>; 4],
    /// The reduction of the `bar.red` threads waiting at the block barrier.
    pub bar_red: BarRed,
    /// Device memory was written since the block's last step began.
    pub wrote: bool,
    /// Shared memory was written since it was last zeroed (`space.rs` sets it at every shared
    /// store and atomic): the next block starts by zeroing it only then.
    pub shared_dirty: bool,
}

impl Env<'_> {
    /// Notes a write to device memory; a cooperative launch's epoch moves at the first write
    /// of a step, before the write is seen (`launch.rs` relies on that order).
    #[inline(always)]
    pub fn wrote(&mut self) {
        if !self.wrote {
            self.wrote = true;
            if let Some(e) = self.l.epoch {
                e.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
}

/// What a block's step left: the block finished, or has more to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Done,
    Pending,
}

/// What `bar.red` (`__syncthreads_count/and/or`) gathers until the barrier releases: the
/// predicate's count, and, or over the arriving threads, and where each waiting group wants
/// the result (warp index, destination, call depth, lanes, reduction).
pub struct BarRed {
    pub count: u32,
    pub all: bool,
    pub any: bool,
    pub waiting: Vec<(u32, crate::code::Dst, usize, u32, crate::inst::AtomOp)>,
}

impl Default for BarRed {
    fn default() -> Self {
        BarRed {
            count: 0,
            all: true,
            any: false,
            waiting: Vec::new(),
        }
    }
}

thread_local! {
    /// The warps of this host thread's last block, kept with their register files so that a
    /// stream of small launches allocates nothing per launch.
    static SPARE: std::cell::RefCell<Vec<Warp>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The shared memory of this host thread's last block, kept for the same reason, and
    /// whether it is all zeros (no block wrote it since it was zeroed): a stream of launches
    /// that never touch shared memory zeroes nothing.
    static SPARE_SHARED: std::cell::RefCell<(Vec<u8>, bool)> =
        const { std::cell::RefCell::new((Vec::new(), true)) };
}

/// `len` zeroed bytes of shared memory, in this thread's spare buffer where there is one.
fn spare_shared(len: usize) -> Vec<u8> {
    let (mut shared, zeroed) = SPARE_SHARED
        .try_with(|s| std::mem::take(&mut *s.borrow_mut()))
        .unwrap_or_default();
    if !zeroed {
        shared.clear();
    }
    shared.truncate(len);
    shared.resize(len, 0);
    shared
}

/// Warps for a block of `threads` threads, from this thread's spares where there are some.
fn spare_warps(threads: u32, block: [u32; 3]) -> Vec<Warp> {
    let n = threads.div_ceil(32) as usize;
    let mut warps = SPARE.with(|s| std::mem::take(&mut *s.borrow_mut()));
    warps.truncate(n);
    for (i, w) in warps.iter_mut().enumerate() {
        w.place(i as u32, threads, block);
    }
    for i in warps.len()..n {
        warps.push(Warp::new(i as u32, threads, block));
    }
    warps
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        let warps = std::mem::take(&mut self.warps);
        // A block holds at most 32 warps (1024 threads): the spares stay bounded.
        let _ = SPARE.try_with(|s| *s.borrow_mut() = warps);
        // As is its shared memory (at most `MAX_SHARED` and the reserved region).
        let shared = std::mem::take(&mut self.env.shared);
        let zeroed = !self.env.shared_dirty;
        let _ = SPARE_SHARED.try_with(|s| *s.borrow_mut() = (shared, zeroed));
    }
}

/// A block runner, reused for every block one host thread runs.
pub struct Block<'a> {
    pub env: Env<'a>,
    warps: Vec<Warp>,
}

impl<'a> Block<'a> {
    pub fn new(l: &'a Launch<'a>) -> Block<'a> {
        let threads: u32 = l.cfg.block.iter().product();
        Block {
            env: Env {
                l,
                shared: spare_shared(l.shared_bytes),
                ctaid: [0; 3],
                region: None,
                recent: [None; 4],
                bar_red: BarRed::default(),
                wrote: false,
                shared_dirty: false,
            },
            warps: spare_warps(threads, l.cfg.block),
        }
    }

    /// Runs one block to completion; returns the lane-instructions it executed.
    pub fn run(&mut self, ctaid: [u32; 3]) -> Result<u64, ExecError> {
        self.start(ctaid);
        let mut count = 0;
        loop {
            let (step, c) = self.step(QUANTUM)?;
            count += c;
            if step == Step::Done {
                return Ok(count);
            }
        }
    }

    /// Places the block at `ctaid`, every thread at the kernel's first instruction.
    pub fn start(&mut self, ctaid: [u32; 3]) {
        let l = self.env.l;
        let kernel = &l.prog.funcs[l.kernel];
        self.env.ctaid = ctaid;
        if std::mem::take(&mut self.env.shared_dirty) {
            self.env.shared.fill(0);
        }
        self.env.bar_red = BarRed::default();
        for w in &mut self.warps {
            w.reset(kernel);
        }
    }

    /// Runs each warp for at most `budget` instruction issues (a warp stops earlier at a
    /// barrier or its end), then releases the block barrier if every thread waits there.
    /// Warps that wait for each other through memory thus all make progress. Returns whether
    /// the block finished and the lane-instructions it executed.
    pub fn step(&mut self, budget: u64) -> Result<(Step, u64), ExecError> {
        // One relaxed load per turn of the block's warps: free beside the turn itself.
        if self
            .env
            .l
            .cancel
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        {
            return Err(ExecError::Cancelled);
        }
        self.env.wrote = false;
        let mut progressed = false;
        let mut count = 0;
        for w in &mut self.warps {
            let (p, c) = run_warp(w, &mut self.env, budget)?;
            progressed |= p;
            count += c;
        }
        if self.warps.iter().all(|w| w.live == 0) {
            return Ok((Step::Done, count));
        }
        if self.warps.iter().all(|w| w.runnable() == 0) {
            let red = std::mem::take(&mut self.env.bar_red);
            for (warp, d, depth, lanes, op) in red.waiting {
                let v = match op {
                    crate::inst::AtomOp::And => red.all as u64,
                    crate::inst::AtomOp::Or => red.any as u64,
                    _ => u64::from(red.count),
                };
                if let Some(w) = self.warps.get_mut(warp as usize) {
                    if let crate::code::Dst::Reg(r) = d {
                        for l in Bits(lanes) {
                            w.levels[depth][r as usize][l] = v;
                        }
                    }
                }
            }
            for w in &mut self.warps {
                w.bar = 0;
            }
            return Ok((Step::Pending, count));
        }
        if !progressed {
            return Err(ExecError::Unsupported(
                "deadlock: threads wait at different barriers".into(),
            ));
        }
        Ok((Step::Pending, count))
    }

    /// A fingerprint of everything the block's future depends on besides device memory:
    /// each warp's lanes, program counters, registers, frames and local memory, the block's
    /// shared memory and barrier state. Equal fingerprints with device memory unchanged mean
    /// the block runs in a cycle.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::default();
        h.bytes(&self.env.shared);
        h.word(self.env.bar_red.count as u64);
        h.word(self.env.bar_red.waiting.len() as u64);
        for w in &self.warps {
            h.word(w.live as u64 | (w.bar as u64) << 32);
            h.word(w.calling as u64 | (w.carry as u64) << 32);
            for &pc in &w.pc {
                h.word(pc as u64);
            }
            h.word(w.joins.len() as u64);
            for j in &w.joins {
                h.word(j.pc as u64 | (j.mask as u64) << 32);
            }
            for level in &w.levels {
                for reg in level {
                    for &v in reg {
                        h.word(v);
                    }
                }
            }
            for l in Bits(w.live) {
                h.word(w.stacks[l].len() as u64);
                h.bytes(&w.local[l]);
                h.bytes(&w.alloca[l]);
            }
        }
        h.0
    }
}

/// Instruction issues a warp runs before the next warp of its block gets a turn.
pub const QUANTUM: u64 = 4096;

/// A fast 64-bit hash (multiply-xor over words): fingerprints are compared, never trusted
/// across processes.
#[derive(Default)]
struct Fnv(u64);

impl Fnv {
    #[inline(always)]
    fn word(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x100_0000_01b3).rotate_left(29);
    }

    fn bytes(&mut self, b: &[u8]) {
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        for &x in chunks.remainder() {
            self.word(x as u64);
        }
        self.word(b.len() as u64);
    }
}

/// Runs a warp until every lane has exited or waits at a barrier, or `budget` instruction
/// issues have run.
fn run_warp(w: &mut Warp, env: &mut Env, budget: u64) -> Result<(bool, u64), ExecError> {
    let prog = env.l.prog;
    let kernel = env.l.kernel;
    let (mut progressed, mut count) = (false, 0u64);
    let mut next: Option<Group> = None;
    // The lowest PC of the runnable lanes outside the running group (`u32::MAX`: none).
    let mut fence = u32::MAX;
    let mut issued = 0u64;
    loop {
        if issued == budget {
            // The group the fast path held keeps its place for the next turn.
            if let Some(g) = next.take() {
                w.goto(g.mask, g.pc);
            }
            break;
        }
        issued += 1;
        let g = match next.take() {
            Some(g) => g,
            None => match w.pick(kernel) {
                Some(g) => {
                    fence = Bits(w.runnable() & !g.mask)
                        .map(|l| w.pc[l])
                        .min()
                        .unwrap_or(u32::MAX);
                    g
                }
                None => break,
            },
        };
        progressed = true;
        let code = &prog.funcs[g.func];
        let Some(ins) = code.insts.get(g.pc as usize) else {
            // Past the last instruction: the thread ends, or the function returns.
            if g.depth == 0 {
                w.live &= !g.mask;
            } else {
                ret(w, env, &g, g.mask)?;
            }
            continue;
        };
        count += g.mask.count_ones() as u64;
        let to = match exec::exec(w, env, code, ins, &g)? {
            Flow::Next => g.pc + 1,
            Flow::Goto(t) => t,
            Flow::Sched => continue,
        };
        if g.mask == w.runnable() && w.joins.is_empty() {
            next = Some(Group { pc: to, ..g });
            fence = u32::MAX;
        } else if to < fence
            && w.calling == 0
            && g.mask & !w.runnable() == 0
            && !w.joins.iter().any(|j| j.pc == to)
        {
            // A divergent group whose lanes are all ahead of the others (which do not move
            // while it runs), outside calls, not arriving at a meeting point: `pick` would
            // choose exactly this group again (and drop no meeting: each still has a lane of
            // this group, running, or the same lanes as at the last pick).
            next = Some(Group { pc: to, ..g });
        } else {
            w.goto(g.mask, to);
        }
    }
    Ok((progressed, count))
}

/// `call`: `run`'s lanes enter the callee with a new frame; the others move on.
pub fn call(
    w: &mut Warp,
    env: &mut Env,
    code: &Code,
    site: u32,
    g: &Group,
    run: u32,
) -> Result<(), ExecError> {
    w.goto(g.mask & !run, g.pc + 1);
    if run == 0 {
        return Ok(());
    }
    let prog = env.l.prog;
    let cs = code
        .calls
        .get(site as usize)
        .ok_or_else(|| ExecError::Unsupported(format!("call site {site}")))?;
    if cs.callee == crate::code::ASSERT_CALLEE {
        let lane = Bits(run).next().unwrap_or(0);
        return Err(ExecError::Assert(assert_message(w, env, g, cs, lane)));
    }
    if cs.callee == crate::code::SET_CONDITIONAL_CALLEE {
        return crate::graph::set_conditional(w, env, g, cs, run);
    }
    if let Some(f) = crate::devrt::from_callee(cs.callee) {
        return crate::devrt::call(w, env, g, cs, run, f);
    }
    if cs.callee == crate::code::VPRINTF_CALLEE {
        return crate::printf::vprintf(w, env, g, cs, run);
    }
    if matches!(
        cs.callee,
        crate::code::MALLOC_CALLEE | crate::code::FREE_CALLEE
    ) {
        let malloc = cs.callee == crate::code::MALLOC_CALLEE;
        return crate::heap::call(w, env, g, cs, run, malloc);
    }
    let Some(reg) = cs.pointer else {
        return enter(w, env, code, cs, cs.callee, g, run);
    };
    // An indirect call: the lanes calling each distinct address enter that function together.
    let ptr = lanes::val(w, env, g, Src::Reg(reg), 8)?;
    let mut left = run;
    while left != 0 {
        let first = left.trailing_zeros() as usize;
        let addr = ptr[first];
        let mut lanes = 0u32;
        for l in Bits(left) {
            if ptr[l] == addr {
                lanes |= 1 << l;
            }
        }
        left &= !lanes;
        let callee = crate::space::function_index(addr)
            .filter(|&i| i < prog.funcs.len() && !prog.funcs[i].is_entry)
            .ok_or(ExecError::IllegalAddress(addr))?;
        let f = &prog.funcs[callee];
        if f.params.len() != cs.args.len() || f.returns.len() != cs.rets.len() {
            return Err(ExecError::Unsupported(format!(
                "an indirect call of {} that does not match it: {}",
                f.name,
                code.texts.get(g.pc as usize).map_or("", |t| t)
            )));
        }
        enter(w, env, code, cs, callee as u32, g, lanes)?;
    }
    Ok(())
}

/// `run`'s lanes enter function `func` from call site `cs` with a new frame.
fn enter(
    w: &mut Warp,
    env: &mut Env,
    code: &Code,
    cs: &crate::code::CallSite,
    func: u32,
    g: &Group,
    run: u32,
) -> Result<(), ExecError> {
    let prog = env.l.prog;
    let callee = &prog.funcs[func as usize];
    if g.depth + 1 > MAX_DEPTH {
        return Err(ExecError::StackOverflow);
    }
    let base = g.base + code.frame;
    let end = base + callee.frame;
    if end > MAX_LOCAL {
        return Err(ExecError::StackOverflow);
    }
    let depth = g.depth + 1;
    if w.levels.len() <= depth {
        w.levels.resize_with(depth + 1, Vec::new);
    }
    if w.levels[depth].len() < callee.nregs {
        w.levels[depth].resize(callee.nregs, [0; 32]);
    }
    // Argument values that are registers or immediates, for all lanes at once.
    let mut values: Vec<Option<Lanes>> = Vec::with_capacity(cs.args.len());
    for (a, &(_, size)) in cs.args.iter().zip(&callee.params) {
        values.push(match a {
            Src::FrameParam(_) => None,
            &a => Some(lanes::val(w, env, g, a, size.min(8) as u8)?),
        });
    }
    for l in Bits(run) {
        let local = &mut w.local[l];
        if (local.len() as u64) < end {
            local.resize(end as usize, 0);
        }
        for ((a, v), &(off, size)) in cs.args.iter().zip(&values).zip(&callee.params) {
            let dst = base + off;
            match (a, v) {
                (Src::FrameParam(src), _) => {
                    let src = g.base + src;
                    let (s, d, n) = (src as usize, dst as usize, size as usize);
                    if src + size > end {
                        return Err(ExecError::IllegalAddress(LOCAL_WINDOW + src));
                    }
                    local.copy_within(s..s + n, d);
                }
                (_, Some(v)) => {
                    if size > 8 {
                        return Err(ExecError::Unsupported(format!(
                            "a register argument of {size} bytes to {}",
                            callee.name
                        )));
                    }
                    memory::write_bytes(local, dst, size, v[l])
                        .ok_or(ExecError::IllegalAddress(LOCAL_WINDOW + dst))?;
                }
                _ => {}
            }
        }
        w.stacks[l].push(Frame {
            func,
            site: g.pc,
            base,
        });
        w.pc[l] = 0;
    }
    w.calling |= run;
    Ok(())
}

/// `ret` from a device function: `lanes` copy their return values to the caller and go back.
pub fn ret(w: &mut Warp, env: &mut Env, g: &Group, lanes: u32) -> Result<(), ExecError> {
    let prog = env.l.prog;
    let kernel = env.l.kernel;
    let callee = &prog.funcs[g.func];
    let Some(caller_depth) = g.depth.checked_sub(1) else {
        return Err(ExecError::Unsupported(
            "return from a kernel's frame".into(),
        ));
    };
    for l in Bits(lanes) {
        let Some(frame) = w.stacks[l].pop() else {
            w.live &= !(1 << l);
            continue;
        };
        let (caller, caller_base) = match w.stacks[l].last() {
            Some(f) => (f.func as usize, f.base),
            None => {
                w.calling &= !(1 << l);
                (kernel, 0)
            }
        };
        let caller = &prog.funcs[caller];
        let site = caller
            .insts
            .get(frame.site as usize)
            .and_then(|i| caller.calls.get(i.target as usize))
            .ok_or_else(|| ExecError::Unsupported("return to a lost call site".into()))?;
        for (r, &(off, size)) in site.rets.iter().zip(&callee.returns) {
            let src = frame.base + off;
            let local = &mut w.local[l];
            match *r {
                Src::FrameParam(o) => {
                    let dst = caller_base + o;
                    let (s, d, n) = (src as usize, dst as usize, size as usize);
                    if src + size > local.len() as u64 || dst + size > frame.base {
                        return Err(ExecError::IllegalAddress(LOCAL_WINDOW + dst));
                    }
                    local.copy_within(s..s + n, d);
                }
                Src::Reg(reg) => {
                    let v = memory::read_bytes(local, src, size.min(8))
                        .ok_or(ExecError::IllegalAddress(LOCAL_WINDOW + src))?;
                    if let Some(row) = w.levels[caller_depth].get_mut(reg as usize) {
                        row[l] = v;
                    }
                }
                _ => {
                    return Err(ExecError::Unsupported(format!(
                        "a return value of {} that is not a variable",
                        callee.name
                    )))
                }
            }
        }
        w.pc[l] = frame.site + 1;
    }
    Ok(())
}

/// The message of a failed device-side `assert()`, from the arguments of
/// `__assertfail(message, file, line, function, char_size)` as lane `l` passed them; the
/// generic "device-side assert triggered" when they cannot be read.
fn assert_message(
    w: &Warp,
    env: &mut Env,
    g: &Group,
    cs: &crate::code::CallSite,
    l: usize,
) -> String {
    let mut arg = |k: usize, n: u64| -> Option<u64> {
        match *cs.args.get(k)? {
            Src::FrameParam(off) => {
                crate::space::load(w, env, l, LOCAL_WINDOW + g.base + off, n).ok()
            }
            a => lanes::val(w, env, g, a, n as u8).ok().map(|v| v[l]),
        }
    };
    let (msg, file, line, func) = (arg(0, 8), arg(1, 8), arg(2, 4), arg(3, 8));
    let mut string = |p: u64| -> Option<String> {
        let mut bytes = Vec::new();
        for i in 0..1024 {
            match crate::space::load(w, env, l, p.wrapping_add(i), 1).ok()? as u8 {
                0 => break,
                b => bytes.push(b),
            }
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    };
    let Some(msg) = msg.and_then(&mut string) else {
        return "device-side assert triggered".to_string();
    };
    let file = file.and_then(&mut string).unwrap_or_default();
    let func = func.and_then(&mut string).unwrap_or_default();
    format!(
        "{file}:{}: {func}: Assertion `{msg}` failed.",
        line.unwrap_or(0) as u32
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thread coordinates counted with carries equal the division formula, for every warp of
    /// odd-shaped blocks, including a placed-again spare.
    #[test]
    fn placed_warps_have_the_threads_coordinates() {
        let mut spare = Warp::new(0, 32, [32, 1, 1]);
        for block in [[5u32, 3, 4], [7, 1, 1], [1, 9, 5], [32, 2, 2], [33, 3, 1]] {
            let threads: u32 = block.iter().product();
            for index in 0..threads.div_ceil(32) {
                spare.place(index, threads, block);
                for l in Bits(spare.exists) {
                    let i = index * 32 + l as u32;
                    let want = [
                        i % block[0],
                        (i / block[0]) % block[1],
                        i / (block[0] * block[1]),
                    ];
                    assert_eq!(spare.tid[l], want, "block {block:?} thread {i}");
                }
            }
        }
    }
}
