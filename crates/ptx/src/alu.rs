//! Scalar semantics of the arithmetic instructions: one lane's value in, one out. Values are
//! register bits (`u64`); a type says how many of them count and how to read them. `None` means
//! the instruction has no meaning for its types (the launch fails naming it).

use crate::code::Ins;
use crate::inst::{AtomOp, Cmp, Op, Ty, Type};

pub const B32: Type = Type {
    kind: Ty::B,
    size: 4,
};
pub const U32: Type = Type {
    kind: Ty::U,
    size: 4,
};
pub const PRED: Type = Type {
    kind: Ty::Pred,
    size: 1,
};

/// The bits of a value of `size` bytes.
#[inline(always)]
pub fn mask(size: u8) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size as u32 * 8)) - 1
    }
}

#[inline(always)]
pub fn sext(v: u64, size: u8) -> i64 {
    let bits = size as u32 * 8;
    if bits >= 64 {
        v as i64
    } else {
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }
}

#[inline(always)]
pub fn f32v(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

/// `fma.rn.f32`, exactly rounded. The product of two f32 is exact in f64, so the f64 sum is
/// rounded once; rounding that to f32 is exact unless it lies exactly halfway between two f32
/// (or in the subnormal range), where the libm `fmaf` decides. This avoids a call per lane.
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    let r = a as f64 * b as f64 + c as f64;
    let bits = r.to_bits();
    let exp = (bits >> 52) & 0x7ff;
    if (bits & 0x1fff_ffff != 0x1000_0000 && exp >= 0x3ff - 126) || r == 0.0 {
        r as f32
    } else {
        fma_exact(a, b, c)
    }
}

/// [`fma_f32`] of 32 lanes of f32 bits (the low 32 bits of each word), in passes the compiler
/// vectorizes: the f64 result of every lane, the check of every lane, and only where a lane
/// needs it (rarely) the exact `fmaf`. Each lane's bits equal `fma_f32`'s.
#[inline(always)]
pub fn fma_f32_lanes(x: &[u64; 32], y: &[u64; 32], z: &[u64; 32], out: &mut [u64; 32]) {
    let mut r = [0f64; 32];
    for l in 0..32 {
        r[l] = f32v(x[l]) as f64 * f32v(y[l]) as f64 + f32v(z[l]) as f64;
    }
    let mut exact = false;
    for l in 0..32 {
        let bits = r[l].to_bits();
        let exp = (bits >> 52) & 0x7ff;
        let ok = (bits & 0x1fff_ffff != 0x1000_0000 && exp >= 0x3ff - 126) || r[l] == 0.0;
        exact |= !ok;
        out[l] = (r[l] as f32).to_bits() as u64;
    }
    if exact {
        for l in 0..32 {
            out[l] = fma_f32(f32v(x[l]), f32v(y[l]), f32v(z[l])).to_bits() as u64;
        }
    }
}

/// The libm `fmaf`, out of line so that it is not computed speculatively on the fast path.
#[cold]
#[inline(never)]
fn fma_exact(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// A float of type `t` (f16, f32, f64) as an f64.
#[inline(always)]
pub fn fv(v: u64, t: Type) -> f64 {
    if t.kind == Ty::Bf {
        f32::from_bits((v as u32 & 0xffff) << 16) as f64
    } else if t.size == 4 {
        f32v(v) as f64
    } else if t.size == 2 {
        half_to_f32(v as u16) as f64
    } else {
        f64::from_bits(v)
    }
}

/// An f64 as the bits of a float of type `t`.
#[inline(always)]
pub fn from_f(x: f64, t: Type) -> u64 {
    if t.size == 4 {
        (x as f32).to_bits() as u64
    } else if t.kind == Ty::Bf {
        crate::half::BF16.encode(x, 'n', false)
    } else if t.size == 2 {
        crate::half::F16.encode(x, 'n', false)
    } else {
        x.to_bits()
    }
}

pub fn half_to_f32(h: u16) -> f32 {
    let s = ((h >> 15) & 1) as u32;
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as u32;
    let bits = if e == 0 {
        if m == 0 {
            s << 31
        } else {
            let f = m as f32 / 1024.0 * 2f32.powi(-14);
            return if s == 1 { -f } else { f };
        }
    } else if e == 31 {
        (s << 31) | 0x7f80_0000 | (m << 13)
    } else {
        (s << 31) | (((e - 15 + 127) as u32) << 23) | (m << 13)
    };
    f32::from_bits(bits)
}

/// `setp`/`set` comparisons.
#[inline]
pub fn cmp(op: Cmp, a: u64, b: u64, ty: Type) -> bool {
    match ty.kind {
        Ty::F | Ty::Bf => {
            let (x, y) = (fv(a, ty), fv(b, ty));
            let unordered = x.is_nan() || y.is_nan();
            match op {
                Cmp::Eq => x == y,
                Cmp::Ne => !unordered && x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
                Cmp::Equ => unordered || x == y,
                Cmp::Neu => unordered || x != y,
                Cmp::Ltu => unordered || x < y,
                Cmp::Leu => unordered || x <= y,
                Cmp::Gtu => unordered || x > y,
                Cmp::Geu => unordered || x >= y,
                Cmp::Num => !unordered,
                Cmp::Nan => unordered,
                _ => false,
            }
        }
        Ty::S => {
            let (x, y) = (sext(a, ty.size), sext(b, ty.size));
            match op {
                Cmp::Eq => x == y,
                Cmp::Ne => x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
                _ => false,
            }
        }
        _ => match op {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt | Cmp::Lo => a < b,
            Cmp::Le | Cmp::Ls => a <= b,
            Cmp::Gt | Cmp::Hi => a > b,
            Cmp::Ge | Cmp::Hs => a >= b,
            _ => false,
        },
    }
}

/// Integer or float arithmetic of two operands (of each half, for packed pairs).
#[inline]
pub fn arith(i: &Ins, a: u64, b: u64) -> Option<u64> {
    match i.m.x2 {
        Some(e) => {
            let lo = arith_of(i, e, a & 0xffff, b & 0xffff)?;
            let hi = arith_of(i, e, (a >> 16) & 0xffff, (b >> 16) & 0xffff)?;
            Some((hi & 0xffff) << 16 | (lo & 0xffff))
        }
        None => arith_of(i, i.ty, a, b),
    }
}

#[inline]
fn arith_of(i: &Ins, t: Type, a: u64, b: u64) -> Option<u64> {
    let m = mask(t.size);
    if t.is_float() {
        let (x, y) = (fv(a, t), fv(b, t));
        if matches!(i.op, Op::Min | Op::Max) {
            return Some(min_max(i, t, a, b));
        }
        let r = match i.op {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
            Op::Div => x / y,
            Op::Copysign => y.copysign(x),
            _ => return None,
        };
        let r = if t.size == 4 && t.kind == Ty::F {
            (r as f32) as f64
        } else {
            r
        };
        return Some(finish(i, t, r));
    }
    let signed = t.kind == Ty::S;
    let bits = t.size as u32 * 8;
    Some(match i.op {
        Op::Add | Op::Sub if i.m.sat && signed => {
            let (x, y) = (sext(a, t.size) as i128, sext(b, t.size) as i128);
            let r = if i.op == Op::Add { x + y } else { x - y };
            let lim = 1i128 << (bits - 1);
            r.clamp(-lim, lim - 1) as u64 & m
        }
        Op::Min | Op::Max if i.m.relu => {
            let (x, y) = (sext(a, t.size), sext(b, t.size));
            let r = if i.op == Op::Min { x.min(y) } else { x.max(y) };
            r.max(0) as u64 & m
        }
        Op::Mul24 => {
            let (x, y) = if signed {
                (
                    sext(a & 0xff_ffff, 3) as i128,
                    sext(b & 0xff_ffff, 3) as i128,
                )
            } else {
                ((a & 0xff_ffff) as i128, (b & 0xff_ffff) as i128)
            };
            let p = x * y;
            (if i.m.hi { p >> 16 } else { p }) as u64 & m
        }
        Op::Add => a.wrapping_add(b) & m,
        Op::Sub => a.wrapping_sub(b) & m,
        Op::Mul if i.m.wide => {
            if signed {
                (sext(a, t.size).wrapping_mul(sext(b, t.size))) as u64
            } else {
                a.wrapping_mul(b)
            }
        }
        Op::Mul if i.m.hi => {
            if signed {
                ((sext(a, t.size) as i128 * sext(b, t.size) as i128) >> bits) as u64 & m
            } else {
                ((a as u128 * b as u128) >> bits) as u64 & m
            }
        }
        Op::Mul => a.wrapping_mul(b) & m,
        Op::Div => {
            if b == 0 {
                m
            } else if signed {
                sext(a, t.size).wrapping_div(sext(b, t.size)) as u64 & m
            } else {
                a / b
            }
        }
        Op::Rem => {
            if b == 0 {
                a
            } else if signed {
                sext(a, t.size).wrapping_rem(sext(b, t.size)) as u64 & m
            } else {
                a % b
            }
        }
        Op::Min => {
            if signed {
                sext(a, t.size).min(sext(b, t.size)) as u64 & m
            } else {
                a.min(b)
            }
        }
        Op::Max => {
            if signed {
                sext(a, t.size).max(sext(b, t.size)) as u64 & m
            } else {
                a.max(b)
            }
        }
        Op::And => a & b,
        Op::Or => a | b,
        Op::Xor => a ^ b,
        Op::Shl => {
            if b >= bits as u64 {
                0
            } else {
                (a << b) & m
            }
        }
        Op::Shr => {
            let sh = b.min(bits as u64 - 1 + signed as u64);
            if signed {
                (sext(a, t.size) >> sh.min(63)) as u64 & m
            } else if b >= bits as u64 {
                0
            } else {
                a >> sh
            }
        }
        _ => return None,
    })
}

/// A float result of type `t` with `.sat` (clamped to [0, 1], NaN to 0) or `.relu`
/// (negative to +0, NaN canonical) applied.
fn finish(i: &Ins, t: Type, r: f64) -> u64 {
    if i.m.sat {
        return from_f(if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) }, t);
    }
    if i.m.relu {
        if r.is_nan() {
            return canonical_nan(t);
        }
        return from_f(if r <= 0.0 { 0.0 } else { r }, t);
    }
    from_f(r, t)
}

/// The canonical NaN of a float type (what PTX's `.NaN` forms return).
pub fn canonical_nan(t: Type) -> u64 {
    match (t.kind, t.size) {
        (_, 2) => 0x7fff,
        (_, 4) => 0x7fff_ffff,
        _ => 0x7fff_ffff_ffff_ffff,
    }
}

/// `min`/`max` of floats, with `.NaN` (any NaN gives the canonical NaN), `.xorsign.abs` and
/// `.relu`; otherwise a NaN operand yields the other, and -0 is below +0.
pub fn min_max(i: &Ins, t: Type, a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (fv(a, t), fv(b, t));
    // `.xorsign`: the result's sign is the XOR of the operands' sign bits (NaNs' too).
    let sign = x.is_sign_negative() != y.is_sign_negative();
    if x.is_nan() || y.is_nan() {
        if i.m.nan || (x.is_nan() && y.is_nan()) {
            return canonical_nan(t);
        }
        let (r, v) = if x.is_nan() { (b, y) } else { (a, x) };
        if i.m.xorsign {
            let m = if sign { -v.abs() } else { v.abs() };
            return from_f(m, t);
        }
        return if i.m.relu && v <= 0.0 { 0 } else { r };
    }
    if i.m.xorsign {
        x = x.abs();
        y = y.abs();
    }
    let max = i.op == Op::Max;
    let r = if x == y && x == 0.0 {
        // Zeros: -0 is below +0.
        let neg = if max {
            x.is_sign_negative() && y.is_sign_negative()
        } else {
            x.is_sign_negative() || y.is_sign_negative()
        };
        if neg {
            -0.0
        } else {
            0.0
        }
    } else if (x > y) == max {
        x
    } else {
        y
    };
    let r = if i.m.xorsign && sign { -r } else { r };
    let r = if i.m.relu && r <= 0.0 { 0.0 } else { r };
    from_f(r, t)
}

/// `cvt`: between integer and float types, with rounding modifiers and saturation.
pub fn cvt(i: &Ins, v: u64) -> u64 {
    let (dst, src) = (i.ty, i.ty2);
    if dst.is_float() && dst.size == 2 && !(src.is_float() && src.size == 2) {
        // To f16/bf16: rounded once, whatever the source.
        let x = if src.is_float() {
            fv(v, src)
        } else if src.kind == Ty::S {
            sext(v, src.size) as f64
        } else {
            (v & mask(src.size)) as f64
        };
        let f = if dst.kind == Ty::Bf {
            crate::half::BF16
        } else {
            crate::half::F16
        };
        let r = f.encode(x, i.m.rnd.unwrap_or('n'), i.m.satfinite);
        let r = if i.m.relu { crate::half::relu(f, r) } else { r };
        return if i.m.sat {
            finish(i, dst, f.decode(r))
        } else {
            r
        };
    }
    match (dst.is_float(), src.is_float()) {
        (true, true) => {
            let x = fv(v, src);
            let x = match i.m.rnd_int {
                Some('n') => x.round_ties_even(),
                Some('z') => x.trunc(),
                Some('m') => x.floor(),
                Some('p') => x.ceil(),
                _ => x,
            };
            finish(i, dst, x)
        }
        (true, false) => {
            // Straight to the destination type: via f64, a 64-bit integer would be rounded twice.
            let x = if src.kind == Ty::S {
                sext(v, src.size) as i128
            } else {
                (v & mask(src.size)) as i128
            };
            if dst.size == 4 {
                (x as f32).to_bits() as u64
            } else {
                from_f(x as f64, dst)
            }
        }
        (false, true) => {
            let x = fv(v, src);
            let x = match i.m.rnd_int {
                Some('n') => x.round_ties_even(),
                Some('m') => x.floor(),
                Some('p') => x.ceil(),
                _ => x.trunc(),
            };
            if x.is_nan() {
                return 0;
            }
            let r = if dst.kind == Ty::S {
                let bits = dst.size as u32 * 8;
                let (lo, hi) = (
                    -(2f64.powi(bits as i32 - 1)),
                    2f64.powi(bits as i32 - 1) - 1.0,
                );
                x.clamp(lo, hi) as i64 as u64
            } else {
                let hi = 2f64.powi(dst.size as i32 * 8) - 1.0;
                x.clamp(0.0, hi) as u64
            };
            r & mask(dst.size)
        }
        (false, false) => {
            let x = if src.kind == Ty::S {
                sext(v, src.size) as u64
            } else {
                v & mask(src.size)
            };
            if i.m.sat && dst.size < 8 {
                let bits = dst.size as u32 * 8;
                let xs = if src.kind == Ty::S {
                    x as i64 as i128
                } else {
                    x as i128
                };
                let (lo, hi): (i128, i128) = if dst.kind == Ty::S {
                    (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
                } else {
                    (0, (1 << bits) - 1)
                };
                return (xs.clamp(lo, hi) as u64) & mask(dst.size);
            }
            let r = x & mask(dst.size);
            if dst.kind == Ty::S {
                sext(r, dst.size) as u64 & mask(dst.size.max(4))
            } else {
                r
            }
        }
    }
}

/// Float functions of one operand.
pub fn unary_float(i: &Ins, a: u64) -> Option<u64> {
    let t = i.ty;
    let x = fv(a, t);
    let r = match i.op {
        Op::Rcp => 1.0 / x,
        Op::Sqrt => x.sqrt(),
        Op::Rsqrt => 1.0 / x.sqrt(),
        Op::Sin => x.sin(),
        Op::Cos => x.cos(),
        Op::Ex2 => x.exp2(),
        Op::Lg2 => x.log2(),
        Op::Tanh => x.tanh(),
        Op::Abs => x.abs(),
        Op::Neg => -x,
        _ => return None,
    };
    Some(from_f(r, t))
}

/// `mad`, `fma`, `madc`, `mad24` of one lane; `carry` is the lane's carry flag.
pub fn mad(i: &Ins, x: u64, y: u64, z: u64, carry: &mut bool) -> u64 {
    let ty = i.ty;
    if ty.is_float() {
        return fma_of(i, ty, x, y, z);
    }
    if i.op == Op::Mad24 {
        let signed = ty.kind == Ty::S;
        let (a, b) = if signed {
            (
                sext(x & 0xff_ffff, 3) as i128,
                sext(y & 0xff_ffff, 3) as i128,
            )
        } else {
            ((x & 0xff_ffff) as i128, (y & 0xff_ffff) as i128)
        };
        let p = a * b;
        let p = if i.m.hi { p >> 16 } else { p };
        let r = if i.m.sat && signed {
            (p as i32 as i64 + sext(z, 4)).clamp(i32::MIN as i64, i32::MAX as i64) as u64
        } else {
            (p as u64).wrapping_add(z)
        };
        return r & mask(ty.size);
    }
    let bits = ty.size as u32 * 8;
    let prod: u128 = if ty.kind == Ty::S {
        (sext(x, ty.size) as i128 * sext(y, ty.size) as i128) as u128
    } else {
        x as u128 * y as u128
    };
    let (p, wm) = if i.m.wide {
        (prod as u64, mask(ty.size * 2))
    } else if i.m.hi {
        ((prod >> bits) as u64 & mask(ty.size), mask(ty.size))
    } else {
        (prod as u64 & mask(ty.size), mask(ty.size))
    };
    let cin = if i.op == Op::Madc { *carry as u64 } else { 0 };
    let s = p as u128 + z as u128 + cin as u128;
    let obits = if i.m.wide { bits * 2 } else { bits };
    if i.m.cc {
        *carry = (s >> obits) as u64 & 1 != 0;
    }
    s as u64 & wm
}

/// `fma`/`mad` of one float element of type `t`, with `.sat` and `.relu`.
pub fn fma_of(i: &Ins, t: Type, x: u64, y: u64, z: u64) -> u64 {
    let r = if t.size == 4 {
        fma_f32(f32v(x), f32v(y), f32v(z)) as f64
    } else {
        fv(x, t).mul_add(fv(y, t), fv(z, t))
    };
    finish(i, t, r)
}

/// `add.cc`, `sub.cc`, `addc`, `subc` of one lane.
pub fn carry_arith(i: &Ins, x: u64, y: u64, carry: &mut bool) -> u64 {
    let ty = i.ty;
    let bits = ty.size as u32 * 8;
    let cin = match i.op {
        Op::Addc | Op::Subc => *carry as u128,
        _ => 0,
    };
    let (r, c) = if matches!(i.op, Op::Add | Op::Addc) {
        let s = x as u128 + y as u128 + cin;
        (s as u64 & mask(ty.size), (s >> bits) as u64 & 1 != 0)
    } else {
        let s = (x as u128).wrapping_sub(y as u128 + cin);
        (s as u64 & mask(ty.size), (x as u128) < y as u128 + cin)
    };
    if i.m.cc || matches!(i.op, Op::Add | Op::Sub) {
        *carry = c;
    }
    r
}

/// The new value of an atomic read-modify-write; `y` is the second operand of `cas`.
pub fn atom(op: AtomOp, ty: Type, old: u64, x: u64, y: u64) -> Option<u64> {
    Some(match op {
        AtomOp::Add if ty.is_float() => from_f(fv(old, ty) + fv(x, ty), ty),
        AtomOp::Add => old.wrapping_add(x) & mask(ty.size),
        AtomOp::Min if ty.is_float() => from_f(fv(old, ty).min(fv(x, ty)), ty),
        AtomOp::Max if ty.is_float() => from_f(fv(old, ty).max(fv(x, ty)), ty),
        AtomOp::Min if ty.kind == Ty::S => {
            sext(old, ty.size).min(sext(x, ty.size)) as u64 & mask(ty.size)
        }
        AtomOp::Max if ty.kind == Ty::S => {
            sext(old, ty.size).max(sext(x, ty.size)) as u64 & mask(ty.size)
        }
        AtomOp::Min => old.min(x),
        AtomOp::Max => old.max(x),
        AtomOp::Exch => x,
        AtomOp::Cas => {
            if old == x {
                y
            } else {
                old
            }
        }
        AtomOp::And => old & x,
        AtomOp::Or => old | x,
        AtomOp::Xor => old ^ x,
        AtomOp::Inc => {
            if old >= x {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old == 0 || old > x {
                x
            } else {
                old - 1
            }
        }
        AtomOp::None => return None,
    })
}

/// One step of a `redux.sync` reduction on 32-bit values.
pub fn redux(op: AtomOp, t: Type, a: u64, b: u64) -> Option<u64> {
    let (sa, sb) = (a as u32 as i32, b as u32 as i32);
    let signed = t.kind == Ty::S;
    Some(match op {
        AtomOp::Add => (a as u32).wrapping_add(b as u32) as u64,
        AtomOp::Min if signed => sa.min(sb) as u32 as u64,
        AtomOp::Max if signed => sa.max(sb) as u32 as u64,
        AtomOp::Min => a.min(b),
        AtomOp::Max => a.max(b),
        AtomOp::And => a & b,
        AtomOp::Or => a | b,
        AtomOp::Xor => a ^ b,
        _ => return None,
    })
}

/// `bfe`: the bit field of `len` bits at `pos` (each 0..255), sign-extended from its top
/// bit for signed types; bits past the operand's msb read as that sign.
pub fn bfe(ty: Type, x: u64, pos: u64, len: u64) -> u64 {
    let bits = ty.size as u64 * 8;
    let msb = bits - 1;
    if len == 0 {
        return 0;
    }
    let sbit = if ty.kind == Ty::S {
        (x >> (pos + len - 1).min(msb)) & 1
    } else {
        0
    };
    // Bits that come from the operand: positions pos..pos+len that lie within it.
    let take = if pos > msb { 0 } else { len.min(bits - pos) };
    let field = if take == 0 {
        0
    } else {
        (x >> pos)
            & if take >= 64 {
                u64::MAX
            } else {
                (1 << take) - 1
            }
    };
    if sbit == 1 && take < 64 {
        (field | (u64::MAX << take)) & mask(ty.size)
    } else {
        field
    }
}

/// `bfi`: `x`'s low bits inserted into `y` at `pos`.
pub fn bfi(ty: Type, x: u64, y: u64, pos: u64, len: u64) -> u64 {
    let bits = ty.size as u64 * 8;
    if len == 0 || pos >= bits {
        return y;
    }
    let m = (if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    }) << pos;
    ((y & !m) | ((x << pos) & m)) & mask(ty.size)
}

/// `prmt` (the default mode): bytes of `{y, x}` picked by the selector's nibbles.
pub fn prmt(x: u64, y: u64, sel: u64) -> u64 {
    let bytes = ((y & 0xffff_ffff) << 32) | (x & 0xffff_ffff);
    let mut r = 0u64;
    for k in 0..4 {
        let s = (sel >> (k * 4)) & 0xf;
        let byte = (bytes >> ((s & 7) * 8)) & 0xff;
        let byte = if s & 8 != 0 {
            if byte & 0x80 != 0 {
                0xff
            } else {
                0
            }
        } else {
            byte
        };
        r |= byte << (k * 8);
    }
    r
}

/// `lop3`: any function of three inputs, by its truth table.
pub fn lop3(x: u64, y: u64, z: u64, lut: u64) -> u64 {
    let mut r = 0u64;
    for bit in 0..32 {
        let idx = (((x >> bit) & 1) << 2) | (((y >> bit) & 1) << 1) | ((z >> bit) & 1);
        r |= ((lut >> idx) & 1) << bit;
    }
    r
}

/// `dp4a`: four byte products added to `z`.
pub fn dp4a(i: &Ins, x: u64, y: u64, z: u64) -> u64 {
    let mut s = z as i64;
    for k in 0..4 {
        let xa = (x >> (k * 8)) & 0xff;
        let ya = (y >> (k * 8)) & 0xff;
        let xa = if i.ty.kind == Ty::S {
            xa as i8 as i64
        } else {
            xa as i64
        };
        let ya = if i.ty2.kind == Ty::S {
            ya as i8 as i64
        } else {
            ya as i64
        };
        s = s.wrapping_add(xa * ya);
    }
    s as u64 & 0xffff_ffff
}

/// `bfind{.shiftamt}`: the position of the most significant bit that differs from the sign
/// (the most significant 1 of unsigned values); `0xffffffff` when there is none. `.shiftamt`
/// gives the left shift that brings it to the top instead.
pub fn bfind(ty: Type, shiftamt: bool, x: u64) -> u64 {
    let bits = ty.size as u32 * 8;
    let x = x & mask(ty.size);
    let x = if ty.kind == Ty::S && (x >> (bits - 1)) & 1 == 1 {
        !x & mask(ty.size)
    } else {
        x
    };
    if x == 0 {
        return 0xffff_ffff;
    }
    let pos = 63 - x.leading_zeros();
    (if shiftamt { bits - 1 - pos } else { pos }) as u64
}

/// `fns.b32 d, mask, base, offset`: the position of the `offset`-th set bit of `mask`
/// counting from `base` (upward for a positive offset, downward for a negative one; offset 0
/// means `base` itself when it is set); `0xffffffff` when there is none.
pub fn fns(mask_: u64, base: u64, offset: u64) -> u64 {
    let m = mask_ as u32;
    let base = base as u32;
    let off = offset as u32 as i32;
    if base > 31 {
        return 0xffff_ffff;
    }
    if off == 0 {
        return if m >> base & 1 == 1 {
            base as u64
        } else {
            0xffff_ffff
        };
    }
    let mut left = off.unsigned_abs();
    if off > 0 {
        for p in base..32 {
            if m >> p & 1 == 1 {
                left -= 1;
                if left == 0 {
                    return p as u64;
                }
            }
        }
    } else {
        for p in (0..=base).rev() {
            if m >> p & 1 == 1 {
                left -= 1;
                if left == 0 {
                    return p as u64;
                }
            }
        }
    }
    0xffff_ffff
}

/// `dp2a.{lo,hi}`: the two 16-bit halves of `x` times two bytes of `y` (its low or high
/// pair), added to `z`.
pub fn dp2a(i: &Ins, x: u64, y: u64, z: u64) -> u64 {
    let mut s = z as u32 as i64;
    if i.ty.kind == Ty::S {
        s = z as u32 as i32 as i64;
    }
    let first = if i.m.hi { 2 } else { 0 };
    for k in 0..2 {
        let xa = (x >> (k * 16)) & 0xffff;
        let ya = (y >> ((first + k) * 8)) & 0xff;
        let xa = if i.ty.kind == Ty::S {
            xa as u16 as i16 as i64
        } else {
            xa as i64
        };
        let ya = if i.ty2.kind == Ty::S {
            ya as u8 as i8 as i64
        } else {
            ya as i64
        };
        s = s.wrapping_add(xa * ya);
    }
    s as u64 & 0xffff_ffff
}

/// `szext.{wrap,clamp}.{u32,s32} d, a, b`: the low `b` bits of `a`, sign- or zero-extended.
pub fn szext(ty: Type, wrap: bool, a: u64, b: u64) -> u64 {
    let n = if wrap { b & 31 } else { b.min(32) } as u32;
    if n >= 32 {
        return a & 0xffff_ffff;
    }
    if n == 0 {
        return 0;
    }
    let low = a & ((1u64 << n) - 1);
    if ty.kind == Ty::S && (low >> (n - 1)) & 1 == 1 {
        (low | (u64::MAX << n)) & 0xffff_ffff
    } else {
        low
    }
}

/// `bmsk.{wrap,clamp}.b32 d, a, b`: `b` ones starting at bit `a`.
pub fn bmsk(wrap: bool, a: u64, b: u64) -> u64 {
    let (a, b) = if wrap {
        (a & 31, b & 31)
    } else {
        (a.min(32), b.min(32))
    };
    let ones = if b >= 64 { u64::MAX } else { (1u64 << b) - 1 };
    (ones << a) & 0xffff_ffff
}

/// `prmt.b32.<mode>`: the fixed permutations of `{b, a}` (bytes 0..3 from `a`, 4..7 from
/// `b`) by the two low bits of the selector (`ecl`/`ecr`/`rc8`/`rc16`/`f4e`/`b4e`).
pub fn prmt_mode(mode: crate::inst::PrmtMode, a: u64, b: u64, c: u64) -> u64 {
    use crate::inst::PrmtMode as M;
    let bytes = ((b & 0xffff_ffff) << 32) | (a & 0xffff_ffff);
    let s = (c & 3) as usize;
    let sel: [u64; 4] = match mode {
        M::Generic => return prmt(a, b, c),
        M::F4e => [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]][s],
        M::B4e => [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]][s],
        M::Rc8 => [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]][s],
        M::Ecl => [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]][s],
        M::Ecr => [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]][s],
        M::Rc16 => [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]][s],
    };
    let mut r = 0u64;
    for (k, &b) in sel.iter().enumerate() {
        r |= ((bytes >> (b * 8)) & 0xff) << (k * 8);
    }
    r
}

/// `testp.<mode>` of a float.
pub fn testp(mode: crate::inst::TestpMode, t: Type, v: u64) -> bool {
    use crate::inst::TestpMode as M;
    let x = fv(v, t);
    match mode {
        M::Finite => x.is_finite(),
        M::Infinite => x.is_infinite(),
        M::Number => !x.is_nan(),
        M::NotANumber => x.is_nan(),
        // f32 subnormals are normal f64s: classify in the operand's own format.
        M::Normal | M::Subnormal => {
            let (e, m) = match t.size {
                4 => ((v >> 23) & 0xff, v & 0x7f_ffff),
                2 if t.kind == Ty::Bf => ((v >> 7) & 0xff, v & 0x7f),
                2 => ((v >> 10) & 0x1f, v & 0x3ff),
                _ => ((v >> 52) & 0x7ff, v & 0xf_ffff_ffff_ffff),
            };
            let top = match t.size {
                4 => 0xff,
                2 if t.kind == Ty::Bf => 0xff,
                2 => 0x1f,
                _ => 0x7ff,
            };
            if mode == M::Normal {
                e != 0 && e != top
            } else {
                e == 0 && m != 0
            }
        }
    }
}

/// Float `set`/`setp` of packed pairs: the comparison of each element.
pub fn cmp_pair(op: Cmp, e: Type, a: u64, b: u64) -> (bool, bool) {
    (
        cmp(op, a & 0xffff, b & 0xffff, e),
        cmp(op, (a >> 16) & 0xffff, (b >> 16) & 0xffff, e),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 32-lane form gives each lane's `fma_f32` bits, NaN payloads included, with and
    /// without a lane that needs the exact path, and with garbage above the low 32 bits.
    #[test]
    fn fma_f32_lanes_match_fma_f32() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let special = [
            0u64,
            0x8000_0000,
            0x7fc0_0001,
            0x7f80_0000,
            0x0000_0001,
            0x3f80_0000,
        ];
        for round in 0..20_000 {
            let mut v: [[u64; 32]; 3] = [[0; 32]; 3];
            for row in &mut v {
                for w in row.iter_mut() {
                    let r = next();
                    *w = if r % 7 == 0 {
                        special[(r >> 8) as usize % special.len()] | (r << 40)
                    } else {
                        r
                    };
                }
            }
            if round % 3 == 0 {
                // A halfway case in one lane.
                let a = (1.0f32 + f32::EPSILON).to_bits() as u64;
                let l = round % 32;
                (v[0][l], v[1][l], v[2][l]) = (a, a, (-1.0f32).to_bits() as u64);
            }
            let mut out = [0u64; 32];
            fma_f32_lanes(&v[0], &v[1], &v[2], &mut out);
            for l in 0..32 {
                let want = fma_f32(f32v(v[0][l]), f32v(v[1][l]), f32v(v[2][l])).to_bits();
                assert_eq!(
                    out[l],
                    want as u64,
                    "lane {l} of {:x?}",
                    (v[0][l], v[1][l], v[2][l])
                );
            }
        }
    }

    #[test]
    fn fma_f32_is_exactly_rounded() {
        let mut x = 0x1234_5678u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            f32::from_bits(x)
        };
        for _ in 0..200_000 {
            let (a, b, c) = (next(), next(), next());
            let (want, got) = (a.mul_add(b, c), fma_f32(a, b, c));
            assert!(want.to_bits() == got.to_bits() || want.is_nan() && got.is_nan());
        }
        // Halfway cases and tiny results take the exact path.
        let a = 1.0 + f32::EPSILON;
        assert_eq!(fma_f32(a, a, -1.0), a.mul_add(a, -1.0));
        assert_eq!(fma_f32(1e-30, 1e-10, 0.0), 1e-30f32.mul_add(1e-10, 0.0));
        assert_eq!(
            fma_f32(
                1.0 + 2.0f32.powi(-12),
                1.0 + 2.0f32.powi(-12),
                2.0f32.powi(-48)
            ),
            (1.0 + 2.0f32.powi(-12)).mul_add(1.0 + 2.0f32.powi(-12), 2.0f32.powi(-48))
        );
    }
}
