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

/// The libm `fmaf`, out of line so that it is not computed speculatively on the fast path.
#[cold]
#[inline(never)]
fn fma_exact(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// A float of type `t` (f16, f32, f64) as an f64.
#[inline(always)]
pub fn fv(v: u64, t: Type) -> f64 {
    if t.size == 4 {
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
    } else if t.size == 2 {
        f32_to_half(x as f32) as u64
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

pub fn f32_to_half(f: f32) -> u16 {
    let b = f.to_bits();
    let s = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let m = b & 0x7f_ffff;
    if ((b >> 23) & 0xff) == 0xff {
        return s | 0x7c00 | if m != 0 { 0x200 } else { 0 };
    }
    if e >= 31 {
        return s | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return s;
        }
        let m = (m | 0x80_0000) >> (1 - e);
        return s | ((m + 0x1000) >> 13) as u16;
    }
    let r = s as u32 | ((e as u32) << 10) | (m >> 13);
    // round to nearest even
    let rem = m & 0x1fff;
    (if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r + 1
    } else {
        r
    }) as u16
}

/// `setp`/`set` comparisons.
#[inline]
pub fn cmp(op: Cmp, a: u64, b: u64, ty: Type) -> bool {
    match ty.kind {
        Ty::F => {
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
    if t.kind == Ty::F {
        let (x, y) = (fv(a, t), fv(b, t));
        let r = match i.op {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
            Op::Div => x / y,
            Op::Min => x.min(y),
            Op::Max => x.max(y),
            Op::Copysign => y.copysign(x),
            _ => return None,
        };
        let r = if t.size == 4 { (r as f32) as f64 } else { r };
        let r = if i.m.sat { r.clamp(0.0, 1.0) } else { r };
        return Some(from_f(r, t));
    }
    let signed = t.kind == Ty::S;
    let bits = t.size as u32 * 8;
    Some(match i.op {
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
        Op::Mul | Op::Mul24 => a.wrapping_mul(b) & m,
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

/// `cvt`: between integer and float types, with rounding modifiers and saturation.
pub fn cvt(i: &Ins, v: u64) -> u64 {
    let (dst, src) = (i.ty, i.ty2);
    match (dst.kind == Ty::F, src.kind == Ty::F) {
        (true, true) => {
            let x = fv(v, src);
            let x = match i.m.rnd_int {
                Some('n') => x.round_ties_even(),
                Some('z') => x.trunc(),
                Some('m') => x.floor(),
                Some('p') => x.ceil(),
                _ => x,
            };
            let x = if i.m.sat { x.clamp(0.0, 1.0) } else { x };
            from_f(x, dst)
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
    if ty.kind == Ty::F {
        let r = if ty.size == 4 {
            fma_f32(f32v(x), f32v(y), f32v(z)) as f64
        } else {
            fv(x, ty).mul_add(fv(y, ty), fv(z, ty))
        };
        let r = if i.m.sat { r.clamp(0.0, 1.0) } else { r };
        return from_f(r, ty);
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
        AtomOp::Add if ty.kind == Ty::F => from_f(fv(old, ty) + fv(x, ty), ty),
        AtomOp::Add => old.wrapping_add(x) & mask(ty.size),
        AtomOp::Min if ty.kind == Ty::F => from_f(fv(old, ty).min(fv(x, ty)), ty),
        AtomOp::Max if ty.kind == Ty::F => from_f(fv(old, ty).max(fv(x, ty)), ty),
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

/// `bfe`: a bit field, sign-extended for signed types.
pub fn bfe(ty: Type, x: u64, pos: u64, len: u64) -> u64 {
    let bits = ty.size as u64 * 8;
    if len == 0 {
        return 0;
    }
    let field =
        if pos >= bits { 0 } else { x >> pos } & if len >= 64 { u64::MAX } else { (1 << len) - 1 };
    if ty.kind == Ty::S {
        let sign_pos = (pos + len - 1).min(bits - 1);
        let sign = (x >> sign_pos) & 1;
        let l = len.min(bits);
        if sign == 1 && l < 64 {
            (field | (u64::MAX << l)) & mask(ty.size)
        } else {
            field
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
