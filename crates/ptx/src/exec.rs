//! One instruction for a group of lanes. Operands are read for all 32 lanes at once into
//! arrays, the operation runs in a loop over the lanes that pass the guard predicate, and the
//! result is written back under that mask: no allocation, no lookup by name.

use std::sync::atomic::{fence, Ordering};

use crate::alu::{self, mask, sext, PRED, U32};
use crate::code::{Code, Dst, Ins, Src};
use crate::inst::{Op, ShflMode, Space, Sreg, Ty, Type, VoteMode};
use crate::memory;
use crate::warp::{self, Bits, Env, Group, Lanes, Warp};
use crate::ExecError;

/// Generic-address windows of the state spaces that are not device memory.
pub const SHARED_WINDOW: u64 = 0x7F00_0000_0000_0000;
pub const LOCAL_WINDOW: u64 = 0x7E00_0000_0000_0000;
pub const PARAM_WINDOW: u64 = 0x7D00_0000_0000_0000;
const WINDOW_MASK: u64 = 0xFF00_0000_0000_0000;

/// Where the group goes after an instruction.
pub enum Flow {
    /// Every lane of the group to the next instruction.
    Next,
    /// Every lane of the group to this instruction.
    Goto(u32),
    /// The instruction placed each lane itself.
    Sched,
}

#[inline(always)]
fn map1(a: &Lanes, run: u32, f: impl Fn(u64) -> u64) -> Lanes {
    let mut o = [0u64; 32];
    if run == u32::MAX {
        for l in 0..32 {
            o[l] = f(a[l]);
        }
    } else {
        for l in Bits(run) {
            o[l] = f(a[l]);
        }
    }
    o
}

#[inline(always)]
fn map2(a: &Lanes, b: &Lanes, run: u32, f: impl Fn(u64, u64) -> u64) -> Lanes {
    let mut o = [0u64; 32];
    if run == u32::MAX {
        for l in 0..32 {
            o[l] = f(a[l], b[l]);
        }
    } else {
        for l in Bits(run) {
            o[l] = f(a[l], b[l]);
        }
    }
    o
}

#[inline(always)]
fn map3(a: &Lanes, b: &Lanes, c: &Lanes, run: u32, f: impl Fn(u64, u64, u64) -> u64) -> Lanes {
    let mut o = [0u64; 32];
    if run == u32::MAX {
        for l in 0..32 {
            o[l] = f(a[l], b[l], c[l]);
        }
    } else {
        for l in Bits(run) {
            o[l] = f(a[l], b[l], c[l]);
        }
    }
    o
}

#[inline(always)]
fn try_map2(a: &Lanes, b: &Lanes, run: u32, f: impl Fn(u64, u64) -> Option<u64>) -> Option<Lanes> {
    let mut o = [0u64; 32];
    for l in Bits(run) {
        o[l] = f(a[l], b[l])?;
    }
    Some(o)
}

fn special(w: &Warp, env: &Env, s: Sreg, l: usize) -> u64 {
    let c = &env.l.cfg;
    let lane = l as u32;
    match s {
        Sreg::Tid(d) => w.tid[l][d as usize % 3] as u64,
        Sreg::Ntid(d) => c.block[d as usize % 3] as u64,
        Sreg::Ctaid(d) => env.ctaid[d as usize % 3] as u64,
        Sreg::Nctaid(d) => c.grid[d as usize % 3] as u64,
        Sreg::Laneid => lane as u64,
        Sreg::Warpid => w.index as u64,
        Sreg::Nwarpid => 64,
        Sreg::Smid => 0,
        Sreg::Nsmid => 108,
        Sreg::Clock | Sreg::Clock64 | Sreg::Globaltimer => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        Sreg::LanemaskEq => 1 << lane,
        Sreg::LanemaskLt => (1u64 << lane) - 1,
        Sreg::LanemaskLe => (1u64 << (lane + 1)) - 1,
        Sreg::LanemaskGt => !((1u64 << (lane + 1)) - 1) & 0xffff_ffff,
        Sreg::LanemaskGe => !((1u64 << lane) - 1) & 0xffff_ffff,
        Sreg::DynSmem => c.dynamic_shared_bytes as u64,
    }
}

fn bad_operand() -> ExecError {
    ExecError::Unsupported("an operand that has no value".into())
}

/// An operand's value in every lane, read as `size` bytes.
pub fn val(w: &Warp, env: &Env, g: &Group, s: Src, size: u8) -> Result<Lanes, ExecError> {
    let mut out = [0u64; 32];
    val_into(w, env, g, s, size, &mut out)?;
    Ok(out)
}

/// [`val`] into `out`.
#[inline(always)]
fn val_into(
    w: &Warp,
    env: &Env,
    g: &Group,
    s: Src,
    size: u8,
    out: &mut Lanes,
) -> Result<(), ExecError> {
    let m = mask(size);
    *out = match s {
        Src::Reg(r) => {
            let row = &w.levels[g.depth][r as usize];
            for (o, &x) in out.iter_mut().zip(row) {
                *o = x & m;
            }
            return Ok(());
        }
        Src::NotReg(r) => {
            let row = &w.levels[g.depth][r as usize];
            for (o, &x) in out.iter_mut().zip(row) {
                *o = (x == 0) as u64;
            }
            return Ok(());
        }
        Src::Imm(v) => [v & m; 32],
        Src::Sreg(s @ (Sreg::Clock | Sreg::Clock64 | Sreg::Globaltimer)) => {
            [special(w, env, s, 0) & m; 32]
        }
        Src::Sreg(s) => std::array::from_fn(|l| special(w, env, s, l) & m),
        Src::Sym(id) => {
            let v = env
                .l
                .syms
                .get(id as usize)
                .copied()
                .flatten()
                .ok_or_else(|| {
                    let name = match env.l.prog.symbols.get(id as usize) {
                        Some(crate::code::SymKind::Global(n)) => n.as_str(),
                        _ => "?",
                    };
                    ExecError::Unsupported(format!("unknown symbol {name}"))
                })?;
            [v; 32]
        }
        Src::Local(off) => [g.base.wrapping_add(off); 32],
        Src::FrameParam(off) => [LOCAL_WINDOW + g.base.wrapping_add(off); 32],
        Src::KernelParam(off) => [PARAM_WINDOW + off; 32],
        Src::Bad => return Err(bad_operand()),
    };
    Ok(())
}

/// Writes `v` to a destination register in `run`'s lanes.
#[inline(always)]
fn put(w: &mut Warp, g: &Group, d: Dst, v: &Lanes, run: u32) {
    if let Dst::Reg(r) = d {
        let row = &mut w.levels[g.depth][r as usize];
        if run == u32::MAX {
            *row = *v;
        } else {
            for l in Bits(run) {
                row[l] = v[l];
            }
        }
    }
}

/// The lanes of the group whose guard predicate holds.
#[inline(always)]
fn guard(w: &Warp, g: &Group, ins: &Ins) -> u32 {
    match ins.guard {
        None => g.mask,
        Some((r, neg)) => {
            let row = &w.levels[g.depth][r as usize];
            let mut m = 0u32;
            for (l, &x) in row.iter().enumerate() {
                m |= (((x != 0) != neg) as u32) << l;
            }
            m & g.mask
        }
    }
}

/// The address of the `[...]` operand in every lane: shared, local and parameter-space
/// addresses become generic addresses in their window.
#[inline(always)]
fn addrs(w: &Warp, env: &Env, g: &Group, ins: &Ins, out: &mut Lanes) -> Result<(), ExecError> {
    let (base, off) = ins.addr.ok_or_else(bad_operand)?;
    val_into(w, env, g, base, 8, out)?;
    let win = match ins.space {
        Space::Shared => SHARED_WINDOW,
        Space::Local => LOCAL_WINDOW,
        Space::Param => PARAM_WINDOW,
        _ => 0,
    };
    for a in out.iter_mut() {
        *a = a.wrapping_add(off as u64);
        if win != 0 && *a & WINDOW_MASK == 0 {
            *a += win;
        }
    }
    Ok(())
}

/// The device memory region holding `[a, a + n)`, from the cache or the device.
#[inline(always)]
fn region<'a>(env: &mut Env<'a>, a: u64, n: u64) -> Result<crate::Region<'a>, ExecError> {
    if let Some(r) = env.region {
        if memory::contains(&r, a, n) {
            return Ok(r);
        }
    }
    let r = env.l.mem.region(a).ok_or(ExecError::IllegalAddress(a))?;
    env.region = Some(r);
    Ok(r)
}

/// Loads element `k` of `N` bytes at each lane's address.
#[inline(always)]
fn load_lanes<const N: u64>(
    w: &Warp,
    env: &mut Env,
    a: &Lanes,
    k: usize,
    run: u32,
    out: &mut Lanes,
) -> Result<(), ExecError> {
    for l in Bits(run) {
        out[l] = load(w, env, l, a[l].wrapping_add(k as u64 * N), N)?;
    }
    Ok(())
}

/// Loads `n` bytes at generic or window address `a` for lane `l`.
#[inline(always)]
fn load(w: &Warp, env: &mut Env, l: usize, a: u64, n: u64) -> Result<u64, ExecError> {
    let v = match a & WINDOW_MASK {
        SHARED_WINDOW => memory::read_bytes(&env.shared, a - SHARED_WINDOW, n),
        LOCAL_WINDOW => memory::read_bytes(&w.local[l], a - LOCAL_WINDOW, n),
        PARAM_WINDOW => memory::read_bytes(env.l.params, a - PARAM_WINDOW, n),
        _ => memory::load(&region(env, a, n)?, a, n),
    };
    v.ok_or(ExecError::IllegalAddress(a))
}

#[inline(always)]
fn store(w: &mut Warp, env: &mut Env, l: usize, a: u64, n: u64, v: u64) -> Result<(), ExecError> {
    let ok = match a & WINDOW_MASK {
        SHARED_WINDOW => memory::write_bytes(&mut env.shared, a - SHARED_WINDOW, n, v),
        LOCAL_WINDOW => memory::write_bytes(&mut w.local[l], a - LOCAL_WINDOW, n, v),
        PARAM_WINDOW => None,
        _ => {
            let exclusive = env.l.exclusive;
            memory::store(&region(env, a, n)?, a, n, v, exclusive)
        }
    };
    ok.ok_or(ExecError::IllegalAddress(a))
}

/// An atomic read-modify-write for lane `l`; returns the old value.
fn atomic(
    w: &mut Warp,
    env: &mut Env,
    l: usize,
    a: u64,
    n: u64,
    f: impl Fn(u64) -> u64,
) -> Result<u64, ExecError> {
    let illegal = ExecError::IllegalAddress(a);
    let plain = |buf: &mut [u8], off: u64| -> Option<u64> {
        let old = memory::read_bytes(buf, off, n)?;
        memory::write_bytes(buf, off, n, f(old))?;
        Some(old)
    };
    match a & WINDOW_MASK {
        SHARED_WINDOW => plain(&mut env.shared, a - SHARED_WINDOW),
        LOCAL_WINDOW => plain(&mut w.local[l], a - LOCAL_WINDOW),
        PARAM_WINDOW => None,
        _ => memory::rmw(&region(env, a, n)?, a, n, &f),
    }
    .ok_or(illegal)
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
    let unsupported = || {
        ExecError::Unsupported(
            code.texts
                .get(g.pc as usize)
                .map_or_else(String::new, |t| t.to_string()),
        )
    };
    let ty = ins.ty;
    // Control flow, barriers and warp-wide instructions: the group as a whole.
    match ins.op {
        Op::Bra => {
            return Ok(if run == g.mask {
                Flow::Goto(ins.target)
            } else if run == 0 {
                Flow::Next
            } else {
                w.goto(run, ins.target);
                w.goto(g.mask & !run, g.pc + 1);
                Flow::Sched
            })
        }
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
            w.bar |= run;
            return Ok(Flow::Next);
        }
        Op::Membar | Op::Fence => {
            if !env.l.exclusive && run != 0 {
                fence(Ordering::SeqCst);
            }
            return Ok(Flow::Next);
        }
        Op::Trap | Op::Brkpt | Op::Nanosleep | Op::Prefetch => return Ok(Flow::Next),
        Op::Activemask => {
            put(w, g, ins.d[0], &[run as u64; 32], run);
            return Ok(Flow::Next);
        }
        Op::Vote => {
            // vote.sync.mode.pred d, {!}a, membermask
            let v = val(w, env, g, ins.src(0), PRED.size)?;
            let mut ballot = 0u32;
            for l in Bits(run) {
                ballot |= ((v[l] != 0) as u32) << l;
            }
            let all = ballot == run;
            let r = match ins.m.vote_mode {
                VoteMode::All => all as u64,
                VoteMode::Any => (ballot != 0) as u64,
                VoteMode::Uni => (all || ballot == 0) as u64,
                VoteMode::Ballot => ballot as u64,
            };
            put(w, g, ins.d[0], &[r; 32], run);
            return Ok(Flow::Next);
        }
        Op::Redux => {
            // redux.sync.op.type d, a, membermask: every lane gets the whole reduction.
            let v = val(w, env, g, ins.src(0), ty.size)?;
            let mut acc: Option<u64> = None;
            for l in Bits(run) {
                let x = v[l] & 0xffff_ffff;
                acc = Some(match acc {
                    None => x,
                    Some(y) => alu::redux(ins.m.atom_op, ty, y, x).ok_or_else(unsupported)?,
                });
            }
            put(w, g, ins.d[0], &[acc.unwrap_or(0); 32], run);
            return Ok(Flow::Next);
        }
        Op::Match => {
            let v = val(w, env, g, ins.src(0), ty.size)?;
            let (mut out, mut pred) = ([0u64; 32], [0u64; 32]);
            for l in Bits(run) {
                let mut m = 0u32;
                for o in Bits(run) {
                    m |= ((v[o] == v[l]) as u32) << o;
                }
                let all = m == run;
                out[l] = match ins.m.vote_mode {
                    VoteMode::All if !all => 0,
                    _ => m as u64,
                };
                pred[l] = all as u64;
            }
            put(w, g, ins.d[0], &out, run);
            if ins.dvec && ins.nd > 1 {
                put(w, g, ins.d[1], &pred, run);
            }
            return Ok(Flow::Next);
        }
        Op::Shfl => {
            // shfl.sync.mode.b32 d[|p], a, b, c, membermask
            let src = val(w, env, g, ins.src(0), 4)?;
            let b = val(w, env, g, ins.src(1), 4)?;
            let c = val(w, env, g, ins.src(2), 4)?;
            let (mut out, mut ok_out) = ([0u64; 32], [0u64; 32]);
            for l in Bits(run) {
                let lane = l as i64;
                let bval = b[l] as i64;
                let c = c[l] as i64;
                let seg_mask = (c >> 8) & 0x1f;
                let min_lane = lane & seg_mask;
                let max_lane = min_lane | ((c & 0x1f) & !seg_mask);
                let j = match ins.m.shfl_mode {
                    ShflMode::Up => lane - bval,
                    ShflMode::Down => lane + bval,
                    ShflMode::Bfly => lane ^ bval,
                    ShflMode::Idx => min_lane | (bval & !seg_mask),
                };
                let ok = match ins.m.shfl_mode {
                    ShflMode::Up => j >= min_lane,
                    _ => j <= max_lane,
                };
                let j = if ok && (0..32).contains(&j) && run & (1 << j) != 0 {
                    j
                } else {
                    lane
                };
                out[l] = src[j as usize];
                ok_out[l] = ok as u64;
            }
            put(w, g, ins.d[0], &out, run);
            if ins.dvec && ins.nd > 1 {
                put(w, g, ins.d[1], &ok_out, run);
            }
            return Ok(Flow::Next);
        }
        _ => {}
    }
    if run == 0 {
        return Ok(Flow::Next);
    }
    // An operand's value in every lane (the k-th source, as type t).
    macro_rules! v {
        ($w:expr, $env:expr, $k:expr, $t:expr) => {{
            let mut o = [0u64; 32];
            val_into($w, $env, g, ins.src($k), $t.size, &mut o)?;
            o
        }};
    }
    let d0 = ins.d[0];
    match ins.op {
        Op::Mov if ins.dvec => {
            // Unpack: mov.b64 {lo, hi}, %rd
            let x = v!(w, env, 0, ty);
            let n = ins.nd as u32;
            let bits = (ty.size as u32 * 8) / n.max(1);
            let m = low_bits(bits);
            for k in 0..ins.nd as usize {
                let sh = bits * k as u32;
                let part = map1(&x, run, |x| x.checked_shr(sh).unwrap_or(0) & m);
                put(w, g, ins.d[k], &part, run);
            }
        }
        Op::Mov if ins.svec => {
            // Pack: mov.b64 %rd, {lo, hi}
            let n = ins.ns as u32;
            let bits = (ty.size as u32 * 8) / n.max(1);
            let part_ty = Type {
                kind: Ty::B,
                size: (bits / 8) as u8,
            };
            let m = low_bits(bits);
            let mut x = [0u64; 32];
            for k in 0..ins.ns as usize {
                let p = v!(w, env, k, part_ty);
                let sh = bits * k as u32;
                for l in Bits(run) {
                    x[l] |= (p[l] & m).checked_shl(sh).unwrap_or(0);
                }
            }
            put(w, g, d0, &x, run);
        }
        Op::Mov => {
            let x = v!(w, env, 0, ty);
            put(w, g, d0, &x, run);
        }
        Op::Ld | Op::Ldu => {
            let mut a = [0u64; 32];
            addrs(w, env, g, ins, &mut a)?;
            for k in 0..ins.nd as usize {
                let mut out = [0u64; 32];
                match ty.size {
                    4 => load_lanes::<4>(w, env, &a, k, run, &mut out)?,
                    8 => load_lanes::<8>(w, env, &a, k, run, &mut out)?,
                    2 => load_lanes::<2>(w, env, &a, k, run, &mut out)?,
                    _ => load_lanes::<1>(w, env, &a, k, run, &mut out)?,
                }
                if ty.kind == Ty::S {
                    out = map1(&out, run, |x| sext(x, ty.size) as u64);
                }
                put(w, g, ins.d[k], &out, run);
            }
        }
        Op::St => {
            let mut a = [0u64; 32];
            addrs(w, env, g, ins, &mut a)?;
            let n = ty.size as u64;
            for k in 0..ins.ns as usize {
                let x = v!(w, env, k, ty);
                for l in Bits(run) {
                    store(w, env, l, a[l].wrapping_add(k as u64 * n), n, x[l])?;
                }
            }
        }
        Op::Cvta => {
            let x = v!(w, env, 0, ty);
            let win = match ins.m.space2 {
                Some(Space::Shared) => SHARED_WINDOW,
                Some(Space::Local) => LOCAL_WINDOW,
                Some(Space::Param) => PARAM_WINDOW,
                _ => 0,
            };
            let to = ins.m.to;
            let r = map1(&x, run, |x| {
                if to {
                    if win != 0 && x & WINDOW_MASK == win {
                        x - win
                    } else {
                        x
                    }
                } else if x & WINDOW_MASK == 0 {
                    x + win
                } else {
                    x
                }
            });
            put(w, g, d0, &r, run);
        }
        Op::Isspacep => {
            let x = v!(
                w,
                env,
                0,
                Type {
                    kind: Ty::U,
                    size: 8
                }
            );
            let space = ins.m.space2;
            let r = map1(&x, run, |x| {
                (match space {
                    Some(Space::Shared) => x & WINDOW_MASK == SHARED_WINDOW,
                    Some(Space::Local) => x & WINDOW_MASK == LOCAL_WINDOW,
                    Some(Space::Global) => x & WINDOW_MASK == 0,
                    _ => false,
                }) as u64
            });
            put(w, g, d0, &r, run);
        }
        Op::Cvt => {
            let x = v!(w, env, 0, ins.ty2);
            let r = map1(&x, run, |x| alu::cvt(ins, x));
            put(w, g, d0, &r, run);
        }
        Op::Add | Op::Sub | Op::Addc | Op::Subc
            if ins.m.cc || matches!(ins.op, Op::Addc | Op::Subc) =>
        {
            let (x, y) = (v!(w, env, 0, ty), v!(w, env, 1, ty));
            let mut r = [0u64; 32];
            for l in Bits(run) {
                let mut c = w.carry & (1 << l) != 0;
                r[l] = alu::carry_arith(ins, x[l], y[l], &mut c);
                w.carry = (w.carry & !(1 << l)) | ((c as u32) << l);
            }
            put(w, g, d0, &r, run);
        }
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Rem
        | Op::Min
        | Op::Max
        | Op::And
        | Op::Or
        | Op::Xor
        | Op::Shl
        | Op::Shr
        | Op::Copysign
        | Op::Mul24 => {
            let sty = if matches!(ins.op, Op::Shl | Op::Shr) {
                U32
            } else {
                ty
            };
            let (x, y) = (v!(w, env, 0, ty), v!(w, env, 1, sty));
            let r = if ty.kind == Ty::Pred {
                match ins.op {
                    Op::And => map2(&x, &y, run, |a, b| a & b),
                    Op::Or => map2(&x, &y, run, |a, b| a | b),
                    Op::Xor => map2(&x, &y, run, |a, b| a ^ b),
                    _ => return Err(unsupported()),
                }
            } else {
                binary(ins, &x, &y, run).ok_or_else(unsupported)?
            };
            put(w, g, d0, &r, run);
        }
        Op::Mad | Op::Fma | Op::Madc | Op::Mad24 => {
            let zty = if ins.m.wide {
                Type {
                    size: ty.size.saturating_mul(2),
                    ..ty
                }
            } else {
                ty
            };
            let (x, y, z) = (v!(w, env, 0, ty), v!(w, env, 1, ty), v!(w, env, 2, zty));
            let r = if ty.kind == Ty::F && ty.size == 4 && !ins.m.sat {
                map3(&x, &y, &z, run, |a, b, c| {
                    alu::fma_f32(alu::f32v(a), alu::f32v(b), alu::f32v(c)).to_bits() as u64
                })
            } else {
                let mut r = [0u64; 32];
                for l in Bits(run) {
                    let mut c = w.carry & (1 << l) != 0;
                    r[l] = alu::mad(ins, x[l], y[l], z[l], &mut c);
                    w.carry = (w.carry & !(1 << l)) | ((c as u32) << l);
                }
                r
            };
            put(w, g, d0, &r, run);
        }
        Op::Abs | Op::Neg if ty.kind != Ty::F => {
            let x = v!(w, env, 0, ty);
            let (abs, size) = (ins.op == Op::Abs, ty.size);
            let r = map1(&x, run, |x| {
                let x = sext(x, size);
                (if abs {
                    x.wrapping_abs()
                } else {
                    x.wrapping_neg()
                }) as u64
                    & mask(size)
            });
            put(w, g, d0, &r, run);
        }
        Op::Abs
        | Op::Neg
        | Op::Rcp
        | Op::Sqrt
        | Op::Rsqrt
        | Op::Sin
        | Op::Cos
        | Op::Ex2
        | Op::Lg2
        | Op::Tanh => {
            let x = v!(w, env, 0, ty);
            let mut r = [0u64; 32];
            for l in Bits(run) {
                r[l] = alu::unary_float(ins, x[l]).ok_or_else(unsupported)?;
            }
            put(w, g, d0, &r, run);
        }
        Op::Not => {
            let x = v!(w, env, 0, ty);
            let (pred, m) = (ty.kind == Ty::Pred, mask(ty.size));
            let r = map1(&x, run, |x| if pred { (x == 0) as u64 } else { !x & m });
            put(w, g, d0, &r, run);
        }
        Op::Cnot => {
            let x = v!(w, env, 0, ty);
            put(w, g, d0, &map1(&x, run, |x| (x == 0) as u64), run);
        }
        Op::Setp | Op::Set => {
            let (x, y) = (v!(w, env, 0, ty), v!(w, env, 1, ty));
            let cmp = ins.m.cmp;
            let mut r = map2(&x, &y, run, |a, b| alu::cmp(cmp, a, b, ty) as u64);
            if ins.m.bool_op != crate::inst::BoolOp::None {
                let c = v!(w, env, 2, PRED);
                let op = ins.m.bool_op;
                r = map2(&r, &c, run, |r, c| {
                    let (r, c) = (r != 0, c != 0);
                    (match op {
                        crate::inst::BoolOp::And => r && c,
                        crate::inst::BoolOp::Or => r || c,
                        _ => r ^ c,
                    }) as u64
                });
            }
            if ins.dvec {
                put(w, g, ins.d[0], &r, run);
                if ins.nd > 1 {
                    put(w, g, ins.d[1], &map1(&r, run, |r| (r == 0) as u64), run);
                }
            } else if ins.op == Op::Set {
                put(
                    w,
                    g,
                    d0,
                    &map1(&r, run, |r| if r != 0 { u32::MAX as u64 } else { 0 }),
                    run,
                );
            } else {
                put(w, g, d0, &r, run);
            }
        }
        Op::Selp => {
            let c = v!(w, env, 2, PRED);
            let (x, y) = (v!(w, env, 0, ty), v!(w, env, 1, ty));
            let r = map3(&c, &x, &y, run, |c, x, y| if c != 0 { x } else { y });
            put(w, g, d0, &r, run);
        }
        Op::Atom | Op::Red => {
            let mut a = [0u64; 32];
            addrs(w, env, g, ins, &mut a)?;
            let (op, n) = (ins.m.atom_op, ty.size as u64);
            if alu::atom(op, ty, 0, 0, 0).is_none() {
                return Err(unsupported());
            }
            let x = v!(w, env, 0, ty);
            let y = if op == crate::inst::AtomOp::Cas {
                v!(w, env, 1, ty)
            } else {
                [0; 32]
            };
            let mut old = [0u64; 32];
            for l in Bits(run) {
                let (xl, yl) = (x[l], y[l]);
                old[l] = atomic(w, env, l, a[l], n, |o| {
                    alu::atom(op, ty, o, xl, yl).unwrap_or(o)
                })?;
            }
            if ins.op == Op::Atom {
                put(w, g, d0, &old, run);
            }
        }
        Op::Popc => {
            let x = v!(w, env, 0, ty);
            put(w, g, d0, &map1(&x, run, |x| x.count_ones() as u64), run);
        }
        Op::Clz => {
            let x = v!(w, env, 0, ty);
            let unused = 64 - ty.size as u32 * 8;
            let r = map1(&x, run, |x| (x.leading_zeros() - unused) as u64);
            put(w, g, d0, &r, run);
        }
        Op::Brev => {
            let x = v!(w, env, 0, ty);
            let sh = 64 - ty.size as u32 * 8;
            put(w, g, d0, &map1(&x, run, |x| x.reverse_bits() >> sh), run);
        }
        Op::Bfe => {
            let x = v!(w, env, 0, ty);
            let (pos, len) = (v!(w, env, 1, U32), v!(w, env, 2, U32));
            let r = map3(&x, &pos, &len, run, |x, p, n| {
                alu::bfe(ty, x, p & 0xff, n & 0xff)
            });
            put(w, g, d0, &r, run);
        }
        Op::Bfi => {
            let (x, y) = (v!(w, env, 0, ty), v!(w, env, 1, ty));
            let (pos, len) = (v!(w, env, 2, U32), v!(w, env, 3, U32));
            let mut r = [0u64; 32];
            for l in Bits(run) {
                r[l] = alu::bfi(ty, x[l], y[l], pos[l] & 0xff, len[l] & 0xff);
            }
            put(w, g, d0, &r, run);
        }
        Op::Prmt => {
            let (x, y, s) = (v!(w, env, 0, ty), v!(w, env, 1, ty), v!(w, env, 2, ty));
            put(w, g, d0, &map3(&x, &y, &s, run, alu::prmt), run);
        }
        Op::Shf => {
            let (lo, hi, sh) = (v!(w, env, 0, ty), v!(w, env, 1, ty), v!(w, env, 2, ty));
            let (wrap, left) = (ins.m.shf_wrap, ins.m.shf_left);
            let r = map3(&lo, &hi, &sh, run, |lo, hi, sh| {
                let sh = if wrap { sh & 31 } else { sh.min(32) };
                let x = (hi << 32) | (lo & 0xffff_ffff);
                (if left { (x << sh) >> 32 } else { x >> sh }) & 0xffff_ffff
            });
            put(w, g, d0, &r, run);
        }
        Op::Lop3 => {
            let (x, y, z) = (v!(w, env, 0, ty), v!(w, env, 1, ty), v!(w, env, 2, ty));
            let lut = v!(w, env, 3, ty);
            let mut r = [0u64; 32];
            for l in Bits(run) {
                r[l] = alu::lop3(x[l], y[l], z[l], lut[l]);
            }
            put(w, g, d0, &r, run);
        }
        Op::Testp => {
            let x = v!(w, env, 0, ty);
            let r = map1(&x, run, |x| alu::fv(x, ty).is_finite() as u64);
            put(w, g, d0, &r, run);
        }
        Op::Sad => {
            let (x, y, z) = (v!(w, env, 0, ty), v!(w, env, 1, ty), v!(w, env, 2, ty));
            let r = map3(&x, &y, &z, run, |x, y, z| {
                let d = if ty.kind == Ty::S {
                    sext(x, ty.size)
                        .wrapping_sub(sext(y, ty.size))
                        .unsigned_abs()
                } else {
                    x.abs_diff(y)
                };
                d.wrapping_add(z) & mask(ty.size)
            });
            put(w, g, d0, &r, run);
        }
        Op::Dp4a => {
            let (x, y, z) = (v!(w, env, 0, ty), v!(w, env, 1, ins.ty2), v!(w, env, 2, ty));
            put(
                w,
                g,
                d0,
                &map3(&x, &y, &z, run, |x, y, z| alu::dp4a(ins, x, y, z)),
                run,
            );
        }
        _ => return Err(unsupported()),
    }
    Ok(Flow::Next)
}

/// Two-operand arithmetic; the common integer and f32 forms run specialized loops.
#[inline(always)]
fn binary(ins: &Ins, x: &Lanes, y: &Lanes, run: u32) -> Option<Lanes> {
    let ty = ins.ty;
    let m = mask(ty.size);
    if ins.m.x2.is_none() && !ins.m.sat {
        let int = matches!(ty.kind, Ty::U | Ty::S | Ty::B);
        match ins.op {
            Op::Add if int => return Some(map2(x, y, run, |a, b| a.wrapping_add(b) & m)),
            Op::Sub if int => return Some(map2(x, y, run, |a, b| a.wrapping_sub(b) & m)),
            Op::Mul if int && !ins.m.wide && !ins.m.hi => {
                return Some(map2(x, y, run, |a, b| a.wrapping_mul(b) & m))
            }
            Op::And if int => return Some(map2(x, y, run, |a, b| a & b)),
            Op::Or if int => return Some(map2(x, y, run, |a, b| a | b)),
            Op::Xor if int => return Some(map2(x, y, run, |a, b| a ^ b)),
            Op::Add if ty == alu_f32() => {
                return Some(map2(x, y, run, |a, b| f32op(a, b, |p, q| p + q)))
            }
            Op::Sub if ty == alu_f32() => {
                return Some(map2(x, y, run, |a, b| f32op(a, b, |p, q| p - q)))
            }
            Op::Mul if ty == alu_f32() => {
                return Some(map2(x, y, run, |a, b| f32op(a, b, |p, q| p * q)))
            }
            _ => {}
        }
    }
    try_map2(x, y, run, |a, b| alu::arith(ins, a, b))
}

fn alu_f32() -> Type {
    Type {
        kind: Ty::F,
        size: 4,
    }
}

#[inline(always)]
fn f32op(a: u64, b: u64, f: impl Fn(f32, f32) -> f32) -> u64 {
    f(alu::f32v(a), alu::f32v(b)).to_bits() as u64
}

/// The low `bits` bits.
fn low_bits(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}
