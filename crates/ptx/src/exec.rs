//! One instruction for a group of lanes: control flow and barriers for the group as a whole,
//! warp-wide instructions in `collective.rs`, and the rest lane by lane over operand arrays
//! (`lanes.rs`) with the scalar semantics of `alu.rs` and memory of `space.rs`: no allocation,
//! no lookup by name.

use std::sync::atomic::{fence, Ordering};

use crate::alu::{self, mask, sext, B32, PRED, U32};
use crate::code::{Code, Ins};
use crate::collective;
use crate::inst::{Op, Space, Ty, Type};
use crate::lanes::{guard, map1, map2, map3, put, try_map2, val_into};
use crate::round;
use crate::space::{
    addrs, aligned, atomic, load_lanes, store, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW,
    WINDOW_MASK,
};
use crate::warp::{self, Bits, Env, Group, Lanes, Warp};
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
                // Divergence: the lanes meet again at the branch's post-dominator.
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
            });
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
            if ins.m.bar_red && run != 0 {
                // `bar.red.op d, a{, b}, {!}c`: the predicate is the last source.
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
            aligned(ins, &a, run)?;
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
            aligned(ins, &a, run)?;
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
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Fma
        | Op::Mad
        | Op::Sqrt
        | Op::Rcp
        | Op::Cvt
            if ins.m.rnd.is_some()
                && !(ins.op == Op::Cvt
                    && (ins.m.pk_dst.is_some() || (ty.is_float() && ty.size == 2))) =>
        {
            // Directed rounding (`.rz`, `.rm`, `.rp`), off the fast paths.
            let n = match ins.op {
                Op::Sqrt | Op::Rcp | Op::Cvt => 1,
                Op::Fma | Op::Mad => 3,
                _ => 2,
            };
            let x = v!(w, env, 0, if ins.op == Op::Cvt { ins.ty2 } else { ty });
            let y = if n > 1 { v!(w, env, 1, ty) } else { [0; 32] };
            let z = if n > 2 { v!(w, env, 2, ty) } else { [0; 32] };
            let mut r = [0u64; 32];
            for l in Bits(run) {
                r[l] = round::directed(ins, x[l], y[l], z[l]);
            }
            put(w, g, d0, &r, run);
        }
        Op::Cvt if ins.m.pk_dst.is_some() || ins.m.pk_src.is_some() => {
            let Some(dst) = ins.m.pk_dst else {
                return Err(unsupported());
            };
            let src = ins.m.pk_src;
            let a = v!(w, env, 0, ins.ty2);
            let b = if src.is_none() && dst != crate::half::Packed::Tf32 {
                v!(w, env, 1, ins.ty2)
            } else {
                [0; 32]
            };
            let (mode, sf, relu) = (ins.m.rnd.unwrap_or('n'), ins.m.satfinite, ins.m.relu);
            let r = map2(&a, &b, run, |a, b| {
                crate::half::cvt_packed(dst, src, ins.ty2, a, b, mode, sf, relu)
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
            let r = if let Some(e) = ins.m.x2 {
                map3(&x, &y, &z, run, |a, b, c| {
                    let lo = alu::fma_of(ins, e, a & 0xffff, b & 0xffff, c & 0xffff);
                    let hi =
                        alu::fma_of(ins, e, a >> 16 & 0xffff, b >> 16 & 0xffff, c >> 16 & 0xffff);
                    (hi & 0xffff) << 16 | (lo & 0xffff)
                })
            } else if ty.kind == Ty::F && ty.size == 4 && !ins.m.sat && !ins.m.relu {
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
        Op::Abs | Op::Neg if ins.m.x2.is_some() || (ty.is_float() && ty.size == 2) => {
            // f16/bf16 (and pairs): the sign bit(s), NaN payloads kept.
            let x = v!(w, env, 0, ty);
            let sign = if ins.m.x2.is_some() {
                0x8000_8000
            } else {
                0x8000
            };
            let abs = ins.op == Op::Abs;
            let r = map1(&x, run, |x| if abs { x & !sign } else { x ^ sign });
            put(w, g, d0, &r, run);
        }
        Op::Tanh | Op::Ex2 if ins.m.x2.is_some() => {
            let x = v!(w, env, 0, ty);
            let e = ins.m.x2.unwrap_or(ty);
            let one = crate::code::Ins {
                ty: e,
                ..ins.clone()
            };
            let mut r = [0u64; 32];
            for l in Bits(run) {
                let lo = alu::unary_float(&one, x[l] & 0xffff).ok_or_else(unsupported)?;
                let hi = alu::unary_float(&one, x[l] >> 16 & 0xffff).ok_or_else(unsupported)?;
                r[l] = (hi & 0xffff) << 16 | (lo & 0xffff);
            }
            put(w, g, d0, &r, run);
        }
        Op::Abs | Op::Neg if !ty.is_float() => {
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
        Op::Setp | Op::Set if ins.m.x2.is_some() => {
            // Packed pairs: `setp.cmp.f16x2 p|q, a, b` (p for the low element), or
            // `set.cmp.{u32,f16x2}.f16x2 d, a, b` (each half all ones, or 1.0 of the element).
            let e = ins.m.x2.unwrap_or(ty);
            let (x, y) = (v!(w, env, 0, B32), v!(w, env, 1, B32));
            let c = if ins.m.bool_op != crate::inst::BoolOp::None {
                v!(w, env, 2, PRED)
            } else {
                [0; 32]
            };
            let (cmp, bop) = (ins.m.cmp, ins.m.bool_op);
            let combine = |r: bool, c: u64| match bop {
                crate::inst::BoolOp::None => r,
                crate::inst::BoolOp::And => r && c != 0,
                crate::inst::BoolOp::Or => r || c != 0,
                crate::inst::BoolOp::Xor => r ^ (c != 0),
            };
            let mut lo = [0u64; 32];
            let mut hi = [0u64; 32];
            for l in Bits(run) {
                let (a, b) = alu::cmp_pair(cmp, e, x[l], y[l]);
                lo[l] = combine(a, c[l]) as u64;
                hi[l] = combine(b, c[l]) as u64;
            }
            if ins.op == Op::Setp {
                put(w, g, ins.d[0], &lo, run);
                if ins.dvec && ins.nd > 1 {
                    put(w, g, ins.d[1], &hi, run);
                }
            } else {
                let one = if ty.kind == Ty::B {
                    alu::from_f(1.0, e)
                } else {
                    0xffff
                };
                let r = map2(&lo, &hi, run, |a, b| (b * one) << 16 | (a * one));
                put(w, g, d0, &r, run);
            }
        }
        Op::Setp | Op::Set => {
            // `set.cmp.dtype.stype`: the comparison is of the source type.
            let cty = if ins.op == Op::Set { ins.ty2 } else { ty };
            let (x, y) = (v!(w, env, 0, cty), v!(w, env, 1, cty));
            let cmp = ins.m.cmp;
            let mut r = map2(&x, &y, run, |a, b| alu::cmp(cmp, a, b, cty) as u64);
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
                let one = if ty.is_float() {
                    alu::from_f(1.0, ty)
                } else {
                    mask(ty.size)
                };
                put(
                    w,
                    g,
                    d0,
                    &map1(&r, run, |r| if r != 0 { one } else { 0 }),
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
        Op::Mbarrier => {
            use crate::inst::MbarOp;
            let m = ins.m.mbar;
            let b64 = crate::inst::Type {
                kind: crate::inst::Ty::B,
                size: 8,
            };
            if m == MbarOp::None {
                return Err(unsupported());
            }
            if m == MbarOp::PendingCount {
                let st = v!(w, env, 0, b64);
                put(w, g, d0, &map1(&st, run, |s| s & 0xffff_ffff), run);
                return Ok(Flow::Next);
            }
            let mut a = [0u64; 32];
            addrs(w, env, g, ins, &mut a)?;
            if let Some(l) = Bits(run).find(|&l| a[l] % 8 != 0) {
                return Err(ExecError::MisalignedAddress(a[l]));
            }
            let x = if ins.ns > 0 {
                v!(w, env, 0, b64)
            } else {
                [1; 32]
            };
            let mut r = [0u64; 32];
            for l in Bits(run) {
                let xl = x[l];
                r[l] = match m {
                    MbarOp::Init => {
                        let n = xl & 0x7fff_ffff;
                        crate::space::atomic(w, env, l, a[l], 8, |_| n | n << 32)?
                    }
                    MbarOp::Inval => crate::space::atomic(w, env, l, a[l], 8, |_| 0)?,
                    MbarOp::Arrive | MbarOp::ArriveDrop => {
                        let drop = m == MbarOp::ArriveDrop;
                        let count = if ins.ns > 0 { xl & 0xffff_ffff } else { 1 };
                        // The state token: the barrier before this arrival (its phase).
                        crate::space::atomic(w, env, l, a[l], 8, |o| mbar_arrive(o, count, drop))?
                    }
                    _ => {
                        let now = crate::space::atomic(w, env, l, a[l], 8, |o| o)?;
                        let phase = if ins.m.parity { xl & 1 } else { xl >> 63 };
                        (now >> 63 != phase) as u64
                    }
                };
            }
            if m.has_dst() {
                put(w, g, d0, &r, run);
            }
        }
        Op::Atom | Op::Red => {
            let mut a = [0u64; 32];
            addrs(w, env, g, ins, &mut a)?;
            aligned(ins, &a, run)?;
            let (op, n) = (ins.m.atom_op, ty.size as u64);
            if alu::atom(op, ty, 0, 0, 0).is_none() {
                return Err(unsupported());
            }
            let x2 = ins.m.x2;
            let rmw = move |o: u64, x: u64, y: u64| match x2 {
                // `atom.add.noftz.f16x2`: each half.
                Some(e) => {
                    let lo = alu::atom(op, e, o & 0xffff, x & 0xffff, 0).unwrap_or(o);
                    let hi = alu::atom(op, e, o >> 16 & 0xffff, x >> 16 & 0xffff, 0).unwrap_or(o);
                    (hi & 0xffff) << 16 | (lo & 0xffff)
                }
                None => alu::atom(op, ty, o, x, y).unwrap_or(o),
            };
            // `atom.v2.f32.add {d0, d1}, [a], {b0, b1}`: one atomic per element.
            let elems = if ins.m.vec > 1 { ins.m.vec as usize } else { 1 };
            if elems > 1 && (op == crate::inst::AtomOp::Cas || ins.ns as usize != elems) {
                return Err(unsupported());
            }
            for k in 0..elems {
                let x = v!(w, env, k, ty);
                let y = if op == crate::inst::AtomOp::Cas {
                    v!(w, env, 1, ty)
                } else {
                    [0; 32]
                };
                let mut old = [0u64; 32];
                for l in Bits(run) {
                    let (xl, yl) = (x[l], y[l]);
                    let at = a[l].wrapping_add(k as u64 * n);
                    old[l] = atomic(w, env, l, at, n, |o| rmw(o, xl, yl))?;
                }
                if ins.op == Op::Atom {
                    put(w, g, ins.d[k], &old, run);
                }
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
            let mode = ins.m.prmt;
            let r = map3(&x, &y, &s, run, |a, b, c| alu::prmt_mode(mode, a, b, c));
            put(w, g, d0, &r, run);
        }
        Op::Bfind => {
            let x = v!(w, env, 0, ty);
            let sa = ins.m.shiftamt;
            put(w, g, d0, &map1(&x, run, |x| alu::bfind(ty, sa, x)), run);
        }
        Op::Fns => {
            let (m, b, o) = (v!(w, env, 0, U32), v!(w, env, 1, U32), v!(w, env, 2, U32));
            put(w, g, d0, &map3(&m, &b, &o, run, alu::fns), run);
        }
        Op::Dp2a => {
            let (x, y, z) = (v!(w, env, 0, ty), v!(w, env, 1, ins.ty2), v!(w, env, 2, ty));
            let r = map3(&x, &y, &z, run, |x, y, z| alu::dp2a(ins, x, y, z));
            put(w, g, d0, &r, run);
        }
        Op::Szext => {
            let (x, b) = (v!(w, env, 0, ty), v!(w, env, 1, U32));
            let wrap = ins.m.shf_wrap;
            put(
                w,
                g,
                d0,
                &map2(&x, &b, run, |x, b| alu::szext(ty, wrap, x, b)),
                run,
            );
        }
        Op::Bmsk => {
            let (a, b) = (v!(w, env, 0, U32), v!(w, env, 1, U32));
            let wrap = ins.m.shf_wrap;
            put(
                w,
                g,
                d0,
                &map2(&a, &b, run, |a, b| alu::bmsk(wrap, a, b)),
                run,
            );
        }
        Op::Vabsdiff => {
            // d = each element's |a - b| (or their sum plus c with `.add`); `ty` is the
            // sources' type (its kind says whether the elements are signed).
            let (x, y, z) = (v!(w, env, 0, U32), v!(w, env, 1, U32), v!(w, env, 2, U32));
            let (n, add, signed) = (ins.m.simd as u32, ins.m.simd_add, ty.kind == Ty::S);
            let bits = 32 / n.max(1);
            let r = map3(&x, &y, &z, run, |a, b, c| {
                let m = (1u64 << bits) - 1;
                let (mut d, mut sum) = (0u64, c & 0xffff_ffff);
                for i in 0..n {
                    let (p, q) = ((a >> (i * bits)) & m, (b >> (i * bits)) & m);
                    let diff = if signed {
                        (sext(p, (bits / 8) as u8) - sext(q, (bits / 8) as u8)).unsigned_abs()
                    } else {
                        p.abs_diff(q)
                    };
                    d |= (diff & m) << (i * bits);
                    sum = sum.wrapping_add(diff);
                }
                if add {
                    sum & 0xffff_ffff
                } else {
                    d
                }
            });
            put(w, g, d0, &r, run);
        }
        Op::Alloca => {
            // alloca.u64 ptr, size{, align}: a block on the lane's alloca stack.
            let size = v!(w, env, 0, ty);
            let align = if ins.ns > 1 {
                v!(w, env, 1, U32)
            } else {
                [8; 32]
            };
            let mut r = [0u64; 32];
            for l in Bits(run) {
                let a = align[l].clamp(1, 1 << 12).next_power_of_two();
                let stack = &mut w.alloca[l];
                let start = (stack.len() as u64).div_ceil(a) * a;
                let end = start.checked_add(size[l]).filter(|&e| e <= warp::MAX_LOCAL);
                let Some(end) = end else {
                    return Err(ExecError::StackOverflow);
                };
                stack.resize(end as usize, 0);
                r[l] = crate::space::ALLOCA_WINDOW + start;
            }
            put(w, g, d0, &r, run);
        }
        Op::Stacksave => {
            let mut r = [0u64; 32];
            for l in Bits(run) {
                r[l] = crate::space::ALLOCA_WINDOW + w.alloca[l].len() as u64;
            }
            put(w, g, d0, &r, run);
        }
        Op::Stackrestore => {
            let x = v!(w, env, 0, ty);
            for l in Bits(run) {
                let sp = x[l].wrapping_sub(crate::space::ALLOCA_WINDOW);
                if sp > w.alloca[l].len() as u64 {
                    return Err(ExecError::IllegalAddress(x[l]));
                }
                w.alloca[l].truncate(sp as usize);
            }
        }
        Op::Slct => {
            let (x, y) = (v!(w, env, 0, ty), v!(w, env, 1, ty));
            let c = v!(w, env, 2, ins.ty2);
            let cty = ins.ty2;
            let r = map3(&x, &y, &c, run, |x, y, c| {
                let take_a = if cty.is_float() {
                    // -0 counts as >= 0; NaN does not.
                    alu::fv(c, cty) >= 0.0
                } else {
                    sext(c, cty.size) >= 0
                };
                if take_a {
                    x
                } else {
                    y
                }
            });
            put(w, g, d0, &r, run);
        }
        Op::Createpolicy => {
            // An opaque policy: the VM has no cache for it to steer.
            put(w, g, d0, &[0; 32], run);
        }
        Op::CpAsync => crate::copy::cp_async(w, env, g, ins, run)?,
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
            let mode = ins.m.testp;
            let r = map1(&x, run, |x| alu::testp(mode, ty, x) as u64);
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

/// An `mbarrier` word after `count` arrivals (`drop`: they also leave the barrier, lowering
/// the expected count of later phases): when no arrival is pending, the phase completes: the
/// phase bit flips and the pending count starts again at the expected count.
fn mbar_arrive(o: u64, count: u64, drop: bool) -> u64 {
    let mut expected = o >> 32 & 0x7fff_ffff;
    let mut pending = o & 0xffff_ffff;
    let mut phase = o >> 63;
    if drop {
        expected = expected.saturating_sub(count);
    }
    pending = pending.saturating_sub(count);
    if pending == 0 {
        phase ^= 1;
        pending = expected;
    }
    phase << 63 | expected << 32 | pending
}
