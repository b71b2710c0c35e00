//! Directed rounding (`.rz`, `.rm`, `.rp`) of f32 and f64 arithmetic and conversions, exact
//! and without touching the host's floating-point mode. Each operation is computed rounded to
//! nearest, `r`, together with the sign of `exact - r` (error-free transformations for sums, an
//! exact integer comparison of the product `q * y` with `x` for quotients, of `s * s` with `x`
//! for square roots, a wide integer sum for fused multiply-adds); `r` is then moved one step in
//! the requested direction when the exact result lies on that side. An f32 result is computed
//! in f64 first: `s = RN64(exact)` and the sign of `exact - s` decide the f32 result too, since
//! no f32 lies strictly between `exact` and `s`.
//!
//! `.rn` (and no modifier) never comes here: those keep the fast paths of `alu.rs`/`exec/`.

use std::cmp::Ordering;

use crate::alu::{fv, mask, sext};
use crate::code::Ins;
use crate::inst::{Op, Ty};

/// The next f64 toward +inf (`f64::next_up`, which the crate's minimum Rust lacks).
fn up64(x: f64) -> f64 {
    if x.is_nan() || x == f64::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f64::from_bits(1);
    }
    let b = x.to_bits();
    f64::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}

fn down64(x: f64) -> f64 {
    -up64(-x)
}

fn up32(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f32::from_bits(1);
    }
    let b = x.to_bits();
    f32::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}

fn down32(x: f32) -> f32 {
    -up32(-x)
}

/// What to do with a result `r` whose exact value compares to it as `e`: step up, down, or
/// keep it.
#[inline]
fn step(r_pos: bool, r_neg: bool, e: Ordering, mode: char) -> Ordering {
    match (mode, e) {
        (_, Ordering::Equal) => Ordering::Equal,
        ('p', Ordering::Greater) => Ordering::Greater,
        ('m', Ordering::Less) => Ordering::Less,
        ('z', Ordering::Less) if r_pos => Ordering::Less,
        ('z', Ordering::Greater) if r_neg => Ordering::Greater,
        _ => Ordering::Equal,
    }
}

/// `r` (an f64 rounded to nearest) rounded in `mode` instead, `e` being `exact.cmp(r)`.
pub fn dir64(r: f64, e: Ordering, mode: char) -> f64 {
    match step(r > 0.0, r < 0.0, e, mode) {
        Ordering::Greater => up64(r),
        Ordering::Less => down64(r),
        Ordering::Equal => r,
    }
}

/// The f32 in `mode` of an exact value `s + t`, where `s = RN64(exact)` and `e` is
/// `exact.cmp(s)`.
pub fn dir32(s: f64, e: Ordering, mode: char) -> f32 {
    let c = s as f32;
    if s.is_nan() {
        return c;
    }
    // When `s` is not an f32, `exact` lies on `s`'s side of `c` (no f32 is nearer to it).
    let e = if c as f64 != s {
        s.partial_cmp(&(c as f64)).unwrap_or(Ordering::Equal)
    } else {
        e
    };
    match step(c > 0.0, c < 0.0, e, mode) {
        Ordering::Greater => up32(c),
        Ordering::Less => down32(c),
        Ordering::Equal => c,
    }
}

/// A finite value `(-1)^neg * m * 2^e`, exactly.
#[derive(Clone, Copy, Debug)]
struct Exact {
    neg: bool,
    m: u128,
    e: i32,
}

impl Exact {
    fn of(x: f64) -> Exact {
        let b = x.to_bits();
        let exp = ((b >> 52) & 0x7ff) as i32;
        let frac = b & ((1u64 << 52) - 1);
        let (m, e) = if exp == 0 {
            (frac, -1074)
        } else {
            (frac | 1 << 52, exp - 1075)
        };
        Exact {
            neg: x.is_sign_negative(),
            m: m as u128,
            e,
        }
    }

    /// The product of two values of at most 64-bit mantissas (f64s).
    fn mul(self, o: Exact) -> Exact {
        Exact {
            neg: self.neg ^ o.neg,
            m: self.m * o.m,
            e: self.e + o.e,
        }
    }

    fn sign(self) -> i8 {
        if self.m == 0 {
            0
        } else if self.neg {
            -1
        } else {
            1
        }
    }

    fn cmp(self, o: Exact) -> Ordering {
        let (sa, sb) = (self.sign(), o.sign());
        if sa != sb || sa == 0 {
            return sa.cmp(&sb);
        }
        // Both nonzero, same sign: normalize to a top bit at 127 and compare.
        let (la, lb) = (self.m.leading_zeros() as i32, o.m.leading_zeros() as i32);
        let mag = (self.e - la)
            .cmp(&(o.e - lb))
            .then((self.m << la).cmp(&(o.m << lb)));
        if sa < 0 {
            mag.reverse()
        } else {
            mag
        }
    }
}

/// The sign of a sum of exact values, computed in a two's-complement integer wide enough for
/// any three terms built from f64s and one product of two f64s.
fn sum_sign(terms: &[Exact]) -> Ordering {
    const LIMBS: usize = 72;
    let emin = terms
        .iter()
        .filter(|t| t.m != 0)
        .map(|t| t.e)
        .min()
        .unwrap_or(0);
    let mut acc = [0u64; LIMBS];
    for t in terms.iter().filter(|t| t.m != 0) {
        let shift = (t.e - emin) as usize;
        let (word, bit) = (shift / 64, (shift % 64) as u32);
        let parts = [t.m as u64, (t.m >> 64) as u64, 0];
        let mut v = [0u64; 3];
        for k in 0..3 {
            v[k] = parts[k] << bit;
            if bit > 0 && k > 0 {
                v[k] |= parts[k - 1] >> (64 - bit);
            }
        }
        let mut carry = false;
        for (k, limb) in acc.iter_mut().enumerate().skip(word) {
            let x = v.get(k - word).copied().unwrap_or(0);
            if t.neg {
                let (d1, b1) = limb.overflowing_sub(x);
                let (d2, b2) = d1.overflowing_sub(carry as u64);
                *limb = d2;
                carry = b1 || b2;
            } else {
                let (s1, c1) = limb.overflowing_add(x);
                let (s2, c2) = s1.overflowing_add(carry as u64);
                *limb = s2;
                carry = c1 || c2;
            }
            if !carry && k >= word + 2 {
                break;
            }
        }
    }
    if acc[LIMBS - 1] >> 63 != 0 {
        Ordering::Less
    } else if acc.iter().any(|&w| w != 0) {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// For a result `r` that is infinite or NaN: an infinity from finite operands overflowed (the
/// exact value is finite, nearer zero); anything else is exact.
fn special(r: f64, finite_inputs: bool) -> Ordering {
    if r.is_infinite() && finite_inputs {
        if r > 0.0 {
            Ordering::Less
        } else {
            Ordering::Greater
        }
    } else {
        Ordering::Equal
    }
}

/// `x + y` rounded to nearest and how the exact sum compares to it (TwoSum).
fn sum(x: f64, y: f64) -> (f64, Ordering) {
    let r = x + y;
    if !r.is_finite() {
        return (r, special(r, x.is_finite() && y.is_finite()));
    }
    let yy = r - x;
    let xx = r - yy;
    let err = (x - xx) + (y - yy);
    (r, err.partial_cmp(&0.0).unwrap_or(Ordering::Equal))
}

fn product(x: f64, y: f64) -> (f64, Ordering) {
    let r = x * y;
    if !r.is_finite() || !x.is_finite() || !y.is_finite() {
        return (r, special(r, x.is_finite() && y.is_finite()));
    }
    (r, Exact::of(x).mul(Exact::of(y)).cmp(Exact::of(r)))
}

fn quotient(x: f64, y: f64) -> (f64, Ordering) {
    let q = x / y;
    if !q.is_finite() || !x.is_finite() || !y.is_finite() || y == 0.0 {
        return (q, special(q, x.is_finite() && y.is_finite() && y != 0.0));
    }
    // x / y > q exactly when x > q * y (for y > 0).
    let e = Exact::of(x).cmp(Exact::of(q).mul(Exact::of(y)));
    (q, if y < 0.0 { e.reverse() } else { e })
}

fn root(x: f64) -> (f64, Ordering) {
    let s = x.sqrt();
    if !s.is_finite() || x <= 0.0 {
        return (s, Ordering::Equal);
    }
    (s, Exact::of(x).cmp(Exact::of(s).mul(Exact::of(s))))
}

fn fused(x: f64, y: f64, z: f64) -> (f64, Ordering) {
    let r = x.mul_add(y, z);
    if !r.is_finite() || !x.is_finite() || !y.is_finite() || !z.is_finite() {
        let finite = x.is_finite() && y.is_finite() && z.is_finite();
        return (r, special(r, finite));
    }
    let mut neg_r = Exact::of(r);
    neg_r.neg = !neg_r.neg;
    let p = Exact::of(x).mul(Exact::of(y));
    (r, sum_sign(&[p, Exact::of(z), neg_r]))
}

/// A float instruction with a directed rounding modifier (`ins.m.rnd` is `'z'`, `'m'` or `'p'`;
/// the decoder admits it only on f32/f64 `add`, `sub`, `mul`, `fma`/`mad`, `div`, `sqrt`,
/// `rcp`, and on `cvt` to f32/f64).
pub fn directed(ins: &Ins, a: u64, b: u64, c: u64) -> u64 {
    let mode = ins.m.rnd.unwrap_or('n');
    if ins.op == Op::Cvt {
        return cvt(ins, a, mode);
    }
    let t = ins.ty;
    let (x, y, z) = (fv(a, t), fv(b, t), fv(c, t));
    let (r, e) = match ins.op {
        Op::Add => sum(x, y),
        Op::Sub => sum(x, -y),
        Op::Mul => product(x, y),
        Op::Div => quotient(x, y),
        Op::Rcp => quotient(1.0, x),
        Op::Sqrt => root(x),
        Op::Fma | Op::Mad => fused(x, y, z),
        _ => (f64::NAN, Ordering::Equal),
    };
    let mut out = if t.size == 4 {
        dir32(r, e, mode) as f64
    } else {
        dir64(r, e, mode)
    };
    // An exact zero sum of opposite-signed (or cancelling) terms is -0 rounding down.
    if mode == 'm' && out == 0.0 && e == Ordering::Equal {
        let plus_zero = |v: f64| v == 0.0 && v.is_sign_positive();
        let both_plus = match ins.op {
            Op::Add => plus_zero(x) && plus_zero(y),
            Op::Sub => plus_zero(x) && plus_zero(-y),
            Op::Fma | Op::Mad => plus_zero(x * y) && plus_zero(z),
            _ => true,
        };
        if !both_plus {
            out = -0.0;
        }
    }
    if ins.m.sat {
        out = out.clamp(0.0, 1.0);
    }
    if t.size == 4 {
        (out as f32).to_bits() as u64
    } else {
        out.to_bits()
    }
}

/// `cvt.rz/rm/rp` to f32 or f64 from a float or an integer.
fn cvt(ins: &Ins, v: u64, mode: char) -> u64 {
    let (dst, src) = (ins.ty, ins.ty2);
    let (s, e) = if src.kind == Ty::F {
        // Widening is exact; f64 -> f32 is the only rounding case.
        (fv(v, src), Ordering::Equal)
    } else {
        let n: i128 = if src.kind == Ty::S {
            sext(v, src.size) as i128
        } else {
            (v & mask(src.size)) as i128
        };
        let s = n as f64;
        (s, n.cmp(&(s as i128)))
    };
    let out = if dst.size == 4 {
        dir32(s, e, mode) as f64
    } else {
        dir64(s, e, mode)
    };
    let out = if ins.m.sat { out.clamp(0.0, 1.0) } else { out };
    if dst.size == 4 {
        (out as f32).to_bits() as u64
    } else {
        out.to_bits()
    }
}

/// Whether a directed rounding modifier is implemented for this instruction: f32/f64
/// arithmetic of one value (not packed pairs, not f16), and conversions to f32/f64.
pub fn supported(op: Op, ty: crate::inst::Type, ty2: crate::inst::Type, packed: bool) -> bool {
    let float = |t: crate::inst::Type| t.kind == Ty::F && (t.size == 4 || t.size == 8);
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::Fma | Op::Mad | Op::Div | Op::Sqrt | Op::Rcp => {
            float(ty) && !packed
        }
        Op::Cvt => float(ty) && matches!(ty2.kind, Ty::F | Ty::S | Ty::U | Ty::B),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type BinOp = fn(f64, f64) -> (f64, Ordering);

    fn rnd32(op: BinOp, x: f32, y: f32, mode: char) -> f32 {
        let (r, e) = op(x as f64, y as f64);
        dir32(r, e, mode)
    }

    fn rnd64(op: BinOp, x: f64, y: f64, mode: char) -> f64 {
        let (r, e) = op(x, y);
        dir64(r, e, mode)
    }

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// f32 products and near sums are exact in f64: the directed results bracket them.
    #[test]
    fn f32_results_bracket_the_exact_value() {
        let mut next = rng(0x9e37_79b9_7f4a_7c15);
        for k in 0..200_000 {
            let x = f32::from_bits(next() as u32);
            let mut y = f32::from_bits(next() as u32);
            if !x.is_finite() || !y.is_finite() {
                continue;
            }
            let op: BinOp = if k % 2 == 0 {
                product
            } else {
                // Exponents within 20 of each other: the f64 sum is exact.
                y = f32::from_bits((y.to_bits() & 0x807f_ffff) | (x.to_bits() & 0x7f80_0000));
                y *= 2f32.powi((next() % 20) as i32 - 10);
                sum
            };
            let exact = op(x as f64, y as f64).0;
            if !exact.is_finite() || exact.abs() > f32::MAX as f64 {
                continue;
            }
            let (dn, upv, z) = (
                rnd32(op, x, y, 'm'),
                rnd32(op, x, y, 'p'),
                rnd32(op, x, y, 'z'),
            );
            assert!(dn as f64 <= exact && exact <= upv as f64, "{x} {y}");
            if dn as f64 == exact {
                assert_eq!(dn.to_bits(), upv.to_bits(), "{x} {y}");
            } else {
                assert!(
                    up32(dn) as f64 > exact && (down32(upv) as f64) < exact,
                    "{x} {y}"
                );
            }
            assert_eq!(z, if exact > 0.0 { dn } else { upv }, "{x} {y}");
        }
    }

    /// f64 results: rm <= rn <= rp, one ulp apart unless exact, rz on the side of zero.
    #[test]
    fn f64_results_are_consistent() {
        let mut next = rng(0x0123_4567_89ab_cdef);
        let ops: [BinOp; 4] = [sum, product, quotient, |x, _| root(x)];
        for k in 0..400_000 {
            let x = f64::from_bits(next());
            let y = f64::from_bits(next());
            let op = ops[k % 4];
            let (rn, e) = op(x, y);
            if !rn.is_finite() {
                continue;
            }
            let (dn, upv, z) = (
                rnd64(op, x, y, 'm'),
                rnd64(op, x, y, 'p'),
                rnd64(op, x, y, 'z'),
            );
            assert!(dn <= rn && rn <= upv, "{k} {x:e} {y:e}");
            if e == Ordering::Equal {
                assert!(dn == rn && upv == rn);
            } else {
                assert_eq!(up64(dn), upv, "{k} {x:e} {y:e}");
            }
            assert_eq!(
                z,
                if rn > 0.0 || (rn == 0.0 && e == Ordering::Greater) {
                    dn
                } else {
                    upv
                }
            );
        }
    }

    #[test]
    fn known_values() {
        let one = 1.0f64;
        let tiny = 2f64.powi(-60);
        assert_eq!(dir64(sum(one, tiny).0, sum(one, tiny).1, 'm'), 1.0);
        assert_eq!(dir64(sum(one, tiny).0, sum(one, tiny).1, 'p'), up64(1.0));
        assert_eq!(dir64(sum(-one, -tiny).0, sum(-one, -tiny).1, 'z'), -1.0);
        assert_eq!(
            dir64(sum(-one, -tiny).0, sum(-one, -tiny).1, 'm'),
            down64(-1.0)
        );
        let (r, e) = fused(1.0, 1.0, tiny);
        assert_eq!((dir64(r, e, 'z'), dir64(r, e, 'p')), (1.0, up64(1.0)));
        let (r, e) = fused(1.0, 1.0, -tiny);
        assert_eq!((dir64(r, e, 'z'), dir64(r, e, 'p')), (down64(1.0), 1.0));
        // Overflow: toward zero never reaches infinity.
        let (r, e) = product(1e300, 1e300);
        assert_eq!(dir64(r, e, 'z'), f64::MAX);
        assert_eq!(dir64(r, e, 'm'), f64::MAX);
        assert_eq!(dir64(r, e, 'p'), f64::INFINITY);
        let (r, e) = product(-1e300, 1e300);
        assert_eq!(dir64(r, e, 'p'), -f64::MAX);
        assert_eq!(dir64(r, e, 'm'), f64::NEG_INFINITY);
        // Underflow: the smallest subnormal on the far side.
        let (r, e) = product(1e-300, 1e-300);
        assert_eq!(dir64(r, e, 'p'), f64::from_bits(1));
        assert_eq!(dir64(r, e, 'z'), 0.0);
        let (r, e) = product(-1e-300, 1e-300);
        assert_eq!(dir64(r, e, 'm'), -f64::from_bits(1));
        assert!(dir64(r, e, 'z') == 0.0 && dir64(r, e, 'z').is_sign_negative());
        // fma whose terms span the whole exponent range.
        let (r, e) = fused(f64::MIN_POSITIVE, 1e-300, 1e300);
        assert_eq!((dir64(r, e, 'm'), dir64(r, e, 'p')), (1e300, up64(1e300)));
        let (r, e) = fused(f64::MIN_POSITIVE, -1e-300, 1e300);
        assert_eq!((dir64(r, e, 'm'), dir64(r, e, 'p')), (down64(1e300), 1e300));
        // 3 * RN(1/3) - 1 is exactly -2^-54.
        assert_eq!(
            fused(3.0, 1.0 / 3.0, -1.0),
            (-(2f64.powi(-54)), Ordering::Equal)
        );
        // Infinite and NaN operands are exact.
        assert_eq!(sum(f64::INFINITY, 1.0).1, Ordering::Equal);
        assert!(dir32(f64::NAN, Ordering::Equal, 'z').is_nan());
    }
}
