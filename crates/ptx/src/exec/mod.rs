//! One instruction for a group of lanes: control flow and barriers for the group as a whole
//! (here), warp-wide instructions in `collective.rs`, tensor, texture and surface instructions
//! in their own modules, and the rest lane by lane over operand arrays (`lanes.rs`) with the
//! scalar semantics of `alu.rs` and memory of `space.rs`, by family: [`memory`] (data
//! movement, atomics), [`arith`] (arithmetic, conversions, comparisons) and [`bits`]. No
//! allocation, no lookup by name. Single-element loads and stores whose lanes are all in range
//! take [`fast`]'s paths; the common integer operations choose their operation once per
//! instruction, not per lane (`arith.rs`). Before all of that, an instruction with a form
//! specialized at load time ([`spec`]) runs that form, unless a lane fails one of its memory
//! checks.

/// An operand's value in every lane: the `k`-th source of `ins`, as type `t`.
macro_rules! v {
    ($w:expr, $env:expr, $g:expr, $ins:expr, $k:expr, $t:expr) => {{
        let mut o = [0u64; 32];
        crate::lanes::val_into($w, $env, $g, $ins.src($k), $t.size, &mut o)?;
        o
    }};
}

/// `lanes!(x, w, env, g, ins, k, t)`: binds `x` to [`v!`]'s value, read straight into `x`
/// (no 256-byte copy out of a temporary, which the optimizer does not always remove).
macro_rules! lanes {
    ($x:ident, $w:expr, $env:expr, $g:expr, $ins:expr, $k:expr, $t:expr) => {
        let mut $x = [0u64; 32];
        crate::lanes::val_into($w, $env, $g, $ins.src($k), $t.size, &mut $x)?;
        let $x = $x;
    };
}

mod arith;
mod bits;
mod fast;
mod memory;
pub(crate) mod spec;

use std::sync::atomic::{fence, Ordering};

use crate::code::{Code, Ins};
use crate::collective;
use crate::inst::Op;
use crate::lanes::{guard, val_into};
use crate::warp::{self, Bits, Env, Group, Warp};
use crate::ExecError;

/// Where the group goes after an instruction.
pub enum Flow {
    /// Every lane of the group to the next instruction.
    Next,
    /// Every lane of the group to this instruction.
    Goto(u32),
    /// The instruction placed each lane itself.
    Sched,
}

/// Executes `ins` (at `g.pc` of `code`) for the group `g`.
pub fn exec(
    w: &mut Warp,
    env: &mut Env,
    code: &Code,
    ins: &Ins,
    g: &Group,
) -> Result<Flow, ExecError> {
    let run = guard(w, g, ins);
    // A form specialized at load time (`spec/`): no control flow, nothing warp-wide.
    if ins.fast != spec::Fast::None && (run == 0 || spec::exec(w, env, ins, g, run)) {
        return Ok(Flow::Next);
    }
    let unsupported = || {
        ExecError::Unsupported(
            code.texts
                .get(g.pc as usize)
                .map_or_else(String::new, |t| t.to_string()),
        )
    };
    // Control flow, barriers and warp-wide instructions: the group as a whole.
    match ins.op {
        Op::Bra => return Ok(branch(w, code, ins, g, run)),
        Op::Call => {
            warp::call(w, env, code, ins.target, g, run)?;
            return Ok(Flow::Sched);
        }
        Op::Ret if g.depth > 0 => {
            w.goto(g.mask & !run, g.pc + 1);
            warp::ret(w, env, g, run)?;
            return Ok(Flow::Sched);
        }
        Op::Ret | Op::Exit => {
            w.live &= !run;
            w.calling &= !run;
            for l in Bits(run) {
                w.stacks[l].clear();
            }
            return Ok(Flow::Next);
        }
        Op::Trap | Op::Brkpt if run != 0 => return Err(ExecError::Trap),
        Op::Bar => {
            if ins.m.bar_red && run != 0 {
                bar_red(w, env, ins, g, run, &unsupported)?;
            }
            w.bar |= run;
            return Ok(Flow::Next);
        }
        Op::Membar | Op::Fence => {
            if !env.l.exclusive && run != 0 {
                fence(Ordering::SeqCst);
            }
            return Ok(Flow::Next);
        }
        Op::Trap | Op::Brkpt | Op::Nanosleep | Op::Prefetch | Op::Griddep | Op::CpAsyncWait => {
            return Ok(Flow::Next)
        }
        Op::Mma => {
            if run != 0 {
                crate::tensor::mma(w, env, code, g, ins, run)?;
            }
            return Ok(Flow::Next);
        }
        Op::Wmma => {
            if run != 0 {
                crate::wmma::exec(w, env, code, g, ins, run)?;
            }
            return Ok(Flow::Next);
        }
        Op::Ldmatrix => {
            if run != 0 {
                crate::tensor::ldmatrix(w, env, g, ins, run)?;
            }
            return Ok(Flow::Next);
        }
        Op::Tex | Op::Tld4 => {
            if run != 0 {
                crate::tex::tex(w, env, g, ins, run, ins.op == Op::Tld4)?;
            }
            return Ok(Flow::Next);
        }
        Op::Txq | Op::Suq => {
            if run != 0 {
                crate::tex::query(w, env, g, ins, run)?;
            }
            return Ok(Flow::Next);
        }
        Op::Suld | Op::Sust => {
            if run != 0 {
                crate::tex::surface(w, env, code, g, ins, run, ins.op == Op::Sust)?;
            }
            return Ok(Flow::Next);
        }
        Op::Activemask | Op::Vote | Op::Redux | Op::Match | Op::Shfl | Op::Elect => {
            collective::exec(w, env, g, ins, run, &unsupported)?;
            return Ok(Flow::Next);
        }
        _ => {}
    }
    if run == 0 {
        return Ok(Flow::Next);
    }
    lane_by_lane(w, env, ins, g, run, &unsupported)?;
    Ok(Flow::Next)
}

/// A branch of the lanes `run` of `g`: the whole group to the target, or none of it, or a
/// divergence: the lanes meet again at the branch's post-dominator.
#[inline(always)]
fn branch(w: &mut Warp, code: &Code, ins: &Ins, g: &Group, run: u32) -> Flow {
    if run == g.mask {
        Flow::Goto(ins.target)
    } else if run == 0 {
        Flow::Next
    } else {
        let join = code.joins.get(g.pc as usize).copied();
        if let Some(pc) = join.filter(|&p| p != crate::reconverge::NONE) {
            w.joins.push(warp::Join {
                pc,
                func: g.func as u32,
                depth: g.depth,
                mask: g.mask,
            });
        }
        w.goto(run, ins.target);
        w.goto(g.mask & !run, g.pc + 1);
        Flow::Sched
    }
}

/// `bar.red.op d, a{, b}, {!}c` (`__syncthreads_count/and/or`): the lanes' predicates (the
/// last source) into the block's reduction, and the warp among those waiting for its result.
fn bar_red(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let last = (ins.ns as usize).checked_sub(1).ok_or_else(unsupported)?;
    let mut c = [0u64; 32];
    val_into(w, env, g, ins.src(last), 1, &mut c)?;
    let red = &mut env.bar_red;
    for l in Bits(run) {
        let p = c[l] & 1 != 0;
        red.count += p as u32;
        red.all &= p;
        red.any |= p;
    }
    red.waiting
        .push((w.index, ins.d[0], g.depth, run, ins.m.atom_op));
    Ok(())
}

/// The instructions run lane by lane, by family: data movement ([`memory`]), bits ([`bits`]),
/// arithmetic ([`arith`]).
#[inline(always)]
fn lane_by_lane(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    match ins.op {
        Op::Mov
        | Op::Ld
        | Op::Ldu
        | Op::St
        | Op::Cvta
        | Op::Isspacep
        | Op::Mbarrier
        | Op::Atom
        | Op::Red
        | Op::Alloca
        | Op::Stacksave
        | Op::Stackrestore
        | Op::Createpolicy
        | Op::CpAsync => memory::exec(w, env, ins, g, run, unsupported),
        Op::Popc
        | Op::Clz
        | Op::Brev
        | Op::Bfe
        | Op::Bfi
        | Op::Prmt
        | Op::Bfind
        | Op::Fns
        | Op::Dp2a
        | Op::Szext
        | Op::Bmsk
        | Op::Vabsdiff
        | Op::Shf
        | Op::Lop3
        | Op::Sad
        | Op::Dp4a => bits::exec(w, env, ins, g, run, unsupported),
        _ => arith::exec(w, env, ins, g, run, unsupported),
    }
}
