//! Arithmetic, lane by lane: integer and floating-point operations (directed rounding off the
//! fast paths), conversions (packed ones too), multiply-add and carries, unary functions,
//! comparisons (`setp`, `set`), `selp`, `slct`, `testp`.

use crate::alu::{self, mask, sext, B32, PRED, U32};
use crate::code::Ins;
use crate::inst::{Cmp, Op, Ty, Type};
use crate::lanes::{map1, map2, map3, put, put_map2, put_map3, try_map2};
use crate::round;
use crate::warp::{Bits, Env, Group, Lanes, Warp};
use crate::ExecError;

/// Runs `ins` (an instruction of this family) for the lanes `run` of group `g`.
pub(super) fn exec(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    match ins.op {
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
            directed(w, env, ins, g, run)
        }
        Op::Cvt if ins.m.pk_dst.is_some() || ins.m.pk_src.is_some() => {
            cvt_packed(w, env, ins, g, run, unsupported)
        }
        Op::Cvt => cvt(w, env, ins, g, run),
        Op::Add | Op::Sub | Op::Addc | Op::Subc
            if ins.m.cc || matches!(ins.op, Op::Addc | Op::Subc) =>
        {
            carry(w, env, ins, g, run)
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
        | Op::Mul24 => binary_op(w, env, ins, g, run, unsupported),
        Op::Mad | Op::Fma | Op::Madc | Op::Mad24 => mad(w, env, ins, g, run),
        Op::Abs | Op::Neg if ins.m.x2.is_some() || (ty.is_float() && ty.size == 2) => {
            sign_half(w, env, ins, g, run)
        }
        Op::Tanh | Op::Ex2 if ins.m.x2.is_some() => unary_pair(w, env, ins, g, run, unsupported),
        Op::Abs | Op::Neg if !ty.is_float() => abs_neg_int(w, env, ins, g, run),
        Op::Abs
        | Op::Neg
        | Op::Rcp
        | Op::Sqrt
        | Op::Rsqrt
        | Op::Sin
        | Op::Cos
        | Op::Ex2
        | Op::Lg2
        | Op::Tanh => unary(w, env, ins, g, run, unsupported),
        Op::Not => not(w, env, ins, g, run),
        Op::Cnot => cnot(w, env, ins, g, run),
        Op::Setp | Op::Set if ins.m.x2.is_some() => setp_pair(w, env, ins, g, run),
        Op::Setp | Op::Set => setp(w, env, ins, g, run),
        Op::Selp => selp(w, env, ins, g, run),
        Op::Slct => slct(w, env, ins, g, run),
        Op::Testp => testp(w, env, ins, g, run),
        _ => Err(unsupported()),
    }
}

/// Directed rounding (`.rz`, `.rm`, `.rp`) of arithmetic and conversions, off the fast
/// paths.
fn directed(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    let n = match ins.op {
        Op::Sqrt | Op::Rcp | Op::Cvt => 1,
        Op::Fma | Op::Mad => 3,
        _ => 2,
    };
    lanes!(
        x,
        w,
        env,
        g,
        ins,
        0,
        if ins.op == Op::Cvt { ins.ty2 } else { ty }
    );
    let y = if n > 1 {
        v!(w, env, g, ins, 1, ty)
    } else {
        [0; 32]
    };
    let z = if n > 2 {
        v!(w, env, g, ins, 2, ty)
    } else {
        [0; 32]
    };
    let mut r = [0u64; 32];
    for l in Bits(run) {
        r[l] = round::directed(ins, x[l], y[l], z[l]);
    }
    put(w, g, d0, &r, run);
    Ok(())
}

/// `cvt` to or from a packed format (`f16x2`, `bf16x2`, `e4m3x2`, `e5m2x2`, `tf32`).
fn cvt_packed(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let d0 = ins.d[0];
    let Some(dst) = ins.m.pk_dst else {
        return Err(unsupported());
    };
    let src = ins.m.pk_src;
    lanes!(a, w, env, g, ins, 0, ins.ty2);
    let b = if src.is_none() && dst != crate::half::Packed::Tf32 {
        v!(w, env, g, ins, 1, ins.ty2)
    } else {
        [0; 32]
    };
    let (mode, sf, relu) = (ins.m.rnd.unwrap_or('n'), ins.m.satfinite, ins.m.relu);
    let r = map2(&a, &b, run, |a, b| {
        crate::half::cvt_packed(dst, src, ins.ty2, a, b, mode, sf, relu)
    });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `cvt` of one value.
fn cvt(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ins.ty2);
    let r = map1(&x, run, |x| alu::cvt(ins, x));
    put(w, g, d0, &r, run);
    Ok(())
}

/// `add.cc`, `sub.cc`, `addc`, `subc`: the carry flag in and out.
fn carry(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, ty);
    let mut r = [0u64; 32];
    for l in Bits(run) {
        let mut c = w.carry & (1 << l) != 0;
        r[l] = alu::carry_arith(ins, x[l], y[l], &mut c);
        w.carry = (w.carry & !(1 << l)) | ((c as u32) << l);
    }
    put(w, g, d0, &r, run);
    Ok(())
}

/// Two-operand arithmetic and logic: the common forms through [`binary`], the others lane
/// by lane.
fn binary_op(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    let sty = if matches!(ins.op, Op::Shl | Op::Shr) {
        U32
    } else {
        ty
    };
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, sty);
    if ty.kind == Ty::Pred {
        match ins.op {
            // An immediate operand may be any integer (nvcc writes `xor.pred %p, %q,
            // -1;` for a negation): nonzero is true.
            Op::And => put_map2(w, g, d0, &x, &y, run, |a, b| (a != 0 && b != 0) as u64),
            Op::Or => put_map2(w, g, d0, &x, &y, run, |a, b| (a != 0 || b != 0) as u64),
            Op::Xor => put_map2(w, g, d0, &x, &y, run, |a, b| ((a != 0) ^ (b != 0)) as u64),
            _ => return Err(unsupported()),
        }
    } else if !binary(w, g, ins, &x, &y, run) {
        let r = try_map2(&x, &y, run, |a, b| alu::arith(ins, a, b)).ok_or_else(unsupported)?;
        put(w, g, d0, &r, run);
    }
    Ok(())
}

/// `mad`, `fma`, `madc`, `mad24`.
fn mad(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    let zty = if ins.m.wide {
        Type {
            size: ty.size.saturating_mul(2),
            ..ty
        }
    } else {
        ty
    };
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, ty);
    lanes!(z, w, env, g, ins, 2, zty);
    let xyz = (&x, &y, &z);
    let int = matches!(ty.kind, Ty::U | Ty::S | Ty::B);
    let (m, size) = (mask(ty.size), ty.size);
    if let Some(e) = ins.m.x2 {
        put_map3(w, g, d0, xyz, run, |a, b, c| {
            let lo = alu::fma_of(ins, e, a & 0xffff, b & 0xffff, c & 0xffff);
            let hi = alu::fma_of(ins, e, a >> 16 & 0xffff, b >> 16 & 0xffff, c >> 16 & 0xffff);
            (hi & 0xffff) << 16 | (lo & 0xffff)
        });
    } else if ty.kind == Ty::F && ty.size == 4 && !ins.m.sat && !ins.m.relu {
        put_map3(w, g, d0, xyz, run, |a, b, c| {
            alu::fma_f32(alu::f32v(a), alu::f32v(b), alu::f32v(c)).to_bits() as u64
        });
    } else if ins.op == Op::Mad
        && int
        && !ins.m.cc
        && !ins.m.hi
        && !ins.m.sat
        && (!ins.m.wide || size < 8)
    {
        // Integer multiply-add, low half or wide: no carry, no per-lane dispatch.
        if !ins.m.wide {
            put_map3(w, g, d0, xyz, run, |a, b, c| {
                a.wrapping_mul(b).wrapping_add(c) & m
            });
        } else if ty.kind == Ty::S {
            put_map3(w, g, d0, xyz, run, |a, b, c| {
                (sext(a, size).wrapping_mul(sext(b, size)) as u64).wrapping_add(c)
            });
        } else {
            put_map3(w, g, d0, xyz, run, |a, b, c| {
                a.wrapping_mul(b).wrapping_add(c)
            });
        }
    } else {
        let mut r = [0u64; 32];
        for l in Bits(run) {
            let mut c = w.carry & (1 << l) != 0;
            r[l] = alu::mad(ins, x[l], y[l], z[l], &mut c);
            if ins.m.cc || ins.op == Op::Madc {
                w.carry = (w.carry & !(1 << l)) | ((c as u32) << l);
            }
        }
        put(w, g, d0, &r, run);
    }
    Ok(())
}

/// `abs`, `neg` of f16/bf16 (and pairs): the sign bit(s), NaN payloads kept.
fn sign_half(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    let sign = if ins.m.x2.is_some() {
        0x8000_8000
    } else {
        0x8000
    };
    let abs = ins.op == Op::Abs;
    let r = map1(&x, run, |x| if abs { x & !sign } else { x ^ sign });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `tanh`, `ex2` of packed pairs: each half on its own.
fn unary_pair(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
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
    Ok(())
}

/// Integer `abs` and `neg`.
fn abs_neg_int(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
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
    Ok(())
}

/// Float functions of one operand (`abs`, `neg`, `rcp`, `sqrt`, `rsqrt`, `sin`, `cos`, `ex2`,
/// `lg2`, `tanh`).
fn unary(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    let mut r = [0u64; 32];
    for l in Bits(run) {
        r[l] = alu::unary_float(ins, x[l]).ok_or_else(unsupported)?;
    }
    put(w, g, d0, &r, run);
    Ok(())
}

/// `not` of a predicate or an integer.
fn not(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    let (pred, m) = (ty.kind == Ty::Pred, mask(ty.size));
    let r = map1(&x, run, |x| if pred { (x == 0) as u64 } else { !x & m });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `cnot`: 1 for zero, else 0.
fn cnot(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    put(w, g, d0, &map1(&x, run, |x| (x == 0) as u64), run);
    Ok(())
}

/// `setp`, `set` of packed pairs.
fn setp_pair(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    // Packed pairs: `setp.cmp.f16x2 p|q, a, b` (p for the low element), or
    // `set.cmp.{u32,f16x2}.f16x2 d, a, b` (each half all ones, or 1.0 of the element).
    let e = ins.m.x2.unwrap_or(ty);
    lanes!(x, w, env, g, ins, 0, B32);
    lanes!(y, w, env, g, ins, 1, B32);
    let c = if ins.m.bool_op != crate::inst::BoolOp::None {
        v!(w, env, g, ins, 2, PRED)
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
    Ok(())
}

/// `setp`, `set` of one value each.
fn setp(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    // `set.cmp.dtype.stype`: the comparison is of the source type.
    let cty = if ins.op == Op::Set { ins.ty2 } else { ty };
    lanes!(x, w, env, g, ins, 0, cty);
    lanes!(y, w, env, g, ins, 1, cty);
    let cmp = ins.m.cmp;
    let mut r = match int_cmp(cmp, cty, &x, &y, run) {
        Some(r) => r,
        None => map2(&x, &y, run, |a, b| alu::cmp(cmp, a, b, cty) as u64),
    };
    if ins.m.bool_op != crate::inst::BoolOp::None {
        lanes!(c, w, env, g, ins, 2, PRED);
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
    Ok(())
}

/// `selp d, a, b, c`: `c ? a : b`.
fn selp(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(c, w, env, g, ins, 2, PRED);
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, ty);
    let r = map3(&c, &x, &y, run, |c, x, y| if c != 0 { x } else { y });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `slct d, a, b, c`: `c >= 0 ? a : b`.
fn slct(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, ty);
    lanes!(c, w, env, g, ins, 2, ins.ty2);
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
    Ok(())
}

/// `testp`.
fn testp(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    let mode = ins.m.testp;
    let r = map1(&x, run, |x| alu::testp(mode, ty, x) as u64);
    put(w, g, d0, &r, run);
    Ok(())
}
/// Two-operand arithmetic in the common integer and f32 forms, each a loop of its own written
/// straight into the destination; `false` leaves the instruction to the per-lane path.
#[inline(always)]
fn binary(w: &mut Warp, g: &Group, ins: &Ins, x: &Lanes, y: &Lanes, run: u32) -> bool {
    let ty = ins.ty;
    if ins.m.x2.is_some() || ins.m.sat {
        return false;
    }
    let (m, size, bits) = (mask(ty.size), ty.size, ty.size as u64 * 8);
    let int = matches!(ty.kind, Ty::U | Ty::S | Ty::B);
    let (signed, f32) = (ty.kind == Ty::S, ty == alu_f32());
    macro_rules! each {
        ($f:expr) => {
            put_map2(w, g, ins.d[0], x, y, run, $f)
        };
    }
    match ins.op {
        Op::Add if int => each!(|a, b| a.wrapping_add(b) & m),
        Op::Sub if int => each!(|a, b| a.wrapping_sub(b) & m),
        Op::Mul if int && !ins.m.wide && !ins.m.hi => each!(|a, b| a.wrapping_mul(b) & m),
        Op::Mul if int && ins.m.wide && signed => {
            each!(|a, b| sext(a, size).wrapping_mul(sext(b, size)) as u64)
        }
        Op::Mul if int && ins.m.wide => each!(|a, b| a.wrapping_mul(b)),
        Op::Shl if int => each!(|a, b| if b >= bits { 0 } else { (a << b) & m }),
        Op::Shr if int && signed => {
            each!(|a, b| (sext(a, size) >> b.min(bits).min(63)) as u64 & m)
        }
        Op::Shr if int => each!(|a, b| if b >= bits { 0 } else { a >> b }),
        Op::Min if int && !ins.m.relu && signed => {
            each!(|a, b| sext(a, size).min(sext(b, size)) as u64 & m)
        }
        Op::Max if int && !ins.m.relu && signed => {
            each!(|a, b| sext(a, size).max(sext(b, size)) as u64 & m)
        }
        Op::Min if int && !ins.m.relu => each!(|a, b| a.min(b)),
        Op::Max if int && !ins.m.relu => each!(|a, b| a.max(b)),
        Op::And if int => each!(|a, b| a & b),
        Op::Or if int => each!(|a, b| a | b),
        Op::Xor if int => each!(|a, b| a ^ b),
        Op::Add if f32 => each!(|a, b| f32op(a, b, |p, q| p + q)),
        Op::Sub if f32 => each!(|a, b| f32op(a, b, |p, q| p - q)),
        Op::Mul if f32 => each!(|a, b| f32op(a, b, |p, q| p * q)),
        _ => return false,
    }
    true
}

/// An integer comparison with the choice of comparison made once, not per lane; `None` for
/// the others (floats, or a comparison the type does not have), which `alu::cmp` does.
#[inline(always)]
fn int_cmp(cmp: Cmp, ty: Type, x: &Lanes, y: &Lanes, run: u32) -> Option<Lanes> {
    macro_rules! by {
        ($cmp:expr, $conv:expr) => {{
            let c = $conv;
            Some(match $cmp {
                Cmp::Eq => map2(x, y, run, |a, b| (c(a) == c(b)) as u64),
                Cmp::Ne => map2(x, y, run, |a, b| (c(a) != c(b)) as u64),
                Cmp::Lt => map2(x, y, run, |a, b| (c(a) < c(b)) as u64),
                Cmp::Le => map2(x, y, run, |a, b| (c(a) <= c(b)) as u64),
                Cmp::Gt => map2(x, y, run, |a, b| (c(a) > c(b)) as u64),
                Cmp::Ge => map2(x, y, run, |a, b| (c(a) >= c(b)) as u64),
                _ => return None,
            })
        }};
    }
    match ty.kind {
        Ty::S => {
            let size = ty.size;
            by!(cmp, |v: u64| sext(v, size))
        }
        Ty::U | Ty::B => {
            let cmp = match cmp {
                Cmp::Lo => Cmp::Lt,
                Cmp::Ls => Cmp::Le,
                Cmp::Hi => Cmp::Gt,
                Cmp::Hs => Cmp::Ge,
                c => c,
            };
            by!(cmp, |v: u64| v)
        }
        _ => None,
    }
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
