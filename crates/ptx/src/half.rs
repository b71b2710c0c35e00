//! Small float formats: f16, bf16, tf32 and the 8-bit e4m3/e5m2, their exact conversions
//! from f64 under every rounding mode (one rounding, so `cvt.rn.f16.f64` is not rounded twice
//! through f32) with `.satfinite` and `.relu`, and the packed forms of `cvt`
//! (`cvt.rn.f16x2.f32 d, a, b`, `cvt.rn.satfinite.e4m3x2.f32 d, a, b`,
//! `cvt.rn.f16x2.e4m3x2 d, a`, ...).

/// A float format: exponent and mantissa bits, and how it saturates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub exp: u32,
    pub man: u32,
    /// IEEE-like: the largest exponent encodes infinities and NaNs. Otherwise (e4m3) there
    /// is no infinity and only the all-ones pattern is NaN.
    pub ieee: bool,
}

pub const F16: Format = Format {
    exp: 5,
    man: 10,
    ieee: true,
};
pub const BF16: Format = Format {
    exp: 8,
    man: 7,
    ieee: true,
};
pub const E4M3: Format = Format {
    exp: 4,
    man: 3,
    ieee: false,
};
pub const E5M2: Format = Format {
    exp: 5,
    man: 2,
    ieee: true,
};
/// tf32: f32's exponent with 10 mantissa bits, kept in the top 19 bits of a 32-bit register.
pub const TF32: Format = Format {
    exp: 8,
    man: 10,
    ieee: true,
};

/// The element formats of packed `cvt` operands (`f16x2`, `bf16x2`, `e4m3x2`, `e5m2x2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    F16x2,
    Bf16x2,
    E4m3x2,
    E5m2x2,
    /// tf32 (not packed): one value in the top 19 bits of a 32-bit register.
    Tf32,
}

impl Packed {
    pub fn parse(m: &str) -> Option<Packed> {
        Some(match m {
            "f16x2" => Packed::F16x2,
            "bf16x2" => Packed::Bf16x2,
            "e4m3x2" => Packed::E4m3x2,
            "e5m2x2" => Packed::E5m2x2,
            "tf32" => Packed::Tf32,
            _ => return None,
        })
    }

    pub fn format(self) -> Format {
        match self {
            Packed::F16x2 => F16,
            Packed::Bf16x2 => BF16,
            Packed::E4m3x2 => E4M3,
            Packed::E5m2x2 => E5M2,
            Packed::Tf32 => TF32,
        }
    }

    /// Bits of one element.
    pub fn bits(self) -> u32 {
        let f = self.format();
        1 + f.exp + f.man
    }
}

impl Format {
    fn bias(self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }

    fn width(self) -> u32 {
        1 + self.exp + self.man
    }

    /// The canonical NaN of the format (what `cvt` produces for a NaN).
    pub fn nan(self) -> u64 {
        if self.ieee {
            // All ones but the sign: 0x7fff for f16 and bf16, 0x7f for e5m2.
            (1u64 << (self.width() - 1)) - 1
        } else {
            0x7f
        }
    }

    /// The largest finite value's bits (positive).
    fn max_finite(self) -> u64 {
        if self.ieee {
            (((1u64 << self.exp) - 2) << self.man) | ((1 << self.man) - 1)
        } else {
            // e4m3: exponent all ones with mantissa 110 (448).
            (((1u64 << self.exp) - 1) << self.man) | ((1 << self.man) - 2)
        }
    }

    fn inf(self) -> u64 {
        ((1u64 << self.exp) - 1) << self.man
    }

    /// The value of bits `v` of this format.
    pub fn decode(self, v: u64) -> f64 {
        let w = self.width();
        let v = v & ((1u64 << w) - 1);
        let sign = if v >> (w - 1) & 1 != 0 { -1.0 } else { 1.0 };
        let e = ((v >> self.man) & ((1 << self.exp) - 1)) as i32;
        let m = (v & ((1 << self.man) - 1)) as f64;
        let top = (1 << self.exp) - 1;
        if self.ieee && e == top {
            return if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if !self.ieee && e == top && m as u64 == (1 << self.man) - 1 {
            return f64::NAN;
        }
        let scale = |k: i32| 2f64.powi(k);
        if e == 0 {
            sign * m * scale(1 - self.bias() - self.man as i32)
        } else {
            sign * (m + (1u64 << self.man) as f64) * scale(e - self.bias() - self.man as i32)
        }
    }

    /// `x` rounded once to this format in `mode` ('n' nearest even, 'a' nearest away from
    /// zero, 'z', 'm', 'p'); `satfinite` clamps to the largest finite value instead of
    /// infinity (NaN stays NaN).
    pub fn encode(self, x: f64, mode: char, satfinite: bool) -> u64 {
        let w = self.width();
        let sign_bit = 1u64 << (w - 1);
        if x.is_nan() {
            return self.nan();
        }
        let neg = x.is_sign_negative();
        let s = if neg { sign_bit } else { 0 };
        let a = x.abs();
        let overflow = |s: u64| -> u64 {
            // Past the largest finite value: infinity, unless the mode rounds toward zero
            // on this side, or the format has none (e4m3 gives NaN), or it saturates.
            let toward_zero = match mode {
                'z' => true,
                'm' => !neg,
                'p' => neg,
                _ => false,
            };
            if satfinite || (toward_zero && self.ieee) {
                s | self.max_finite()
            } else if self.ieee {
                s | self.inf()
            } else {
                s | self.nan()
            }
        };
        if a.is_infinite() {
            // An infinity stays one (whatever the rounding), unless saturated.
            return if satfinite {
                s | self.max_finite()
            } else if self.ieee {
                s | self.inf()
            } else {
                s | self.nan()
            };
        }
        if a == 0.0 {
            return s;
        }
        let emin = 1 - self.bias();
        // The exponent of `a` (exact: from the f64 bits, normalizing subnormals).
        let e = {
            let bits = a.to_bits();
            let be = ((bits >> 52) & 0x7ff) as i32;
            if be == 0 {
                -1074 + (63 - bits.leading_zeros()) as i32
            } else {
                be - 1023
            }
        };
        let q = e.max(emin) - self.man as i32;
        // a / 2^q < 2^(man+1): its integer part and fraction are exact in f64.
        let scaled = a * 2f64.powi(-q);
        let n = scaled.floor();
        let frac = scaled - n;
        let mut n = n as u64;
        let up = match mode {
            'n' => frac > 0.5 || (frac == 0.5 && n & 1 == 1),
            'a' => frac >= 0.5,
            'z' => false,
            'm' => neg && frac > 0.0,
            'p' => !neg && frac > 0.0,
            _ => frac > 0.5 || (frac == 0.5 && n & 1 == 1),
        };
        n += up as u64;
        let mut q = q;
        if n >> (self.man + 1) != 0 {
            n >>= 1;
            q += 1;
        }
        if n == 0 {
            return s;
        }
        let bits = if n < (1 << self.man) {
            n
        } else {
            let ef = (q + self.man as i32 + self.bias()) as u64;
            (ef << self.man) | (n - (1 << self.man))
        };
        if bits > self.max_finite() {
            return overflow(s);
        }
        s | bits
    }
}

/// `.relu` of a converted value: negative values (and -0) become +0, NaN the canonical NaN.
pub fn relu(f: Format, bits: u64) -> u64 {
    let w = f.width();
    let v = f.decode(bits);
    if v.is_nan() {
        f.nan()
    } else if bits >> (w - 1) & 1 != 0 {
        0
    } else {
        bits
    }
}

/// A scalar f32/f64/f16/bf16 value's f64, by the `cvt` source type.
pub fn scalar(v: u64, t: crate::inst::Type) -> f64 {
    crate::alu::fv(v, t)
}

/// Packed `cvt`: `d` in packed format `dst` from `a`/`b`. With a scalar source (`ty2`),
/// `a` goes to the upper element and `b` to the lower; with a packed source, each element of
/// `a` is converted in place.
#[allow(clippy::too_many_arguments)]
pub fn cvt_packed(
    dst: Packed,
    src: Option<Packed>,
    ty2: crate::inst::Type,
    a: u64,
    b: u64,
    mode: char,
    satfinite: bool,
    relu_: bool,
) -> u64 {
    let f = dst.format();
    if dst == Packed::Tf32 {
        // `cvt.{rna,rn,rz}{.satfinite}.tf32.f32`: the f32 with 10 mantissa bits.
        let r = f.encode(scalar(a, ty2), mode, satfinite);
        return r << 13;
    }
    let conv = |x: f64| {
        let r = f.encode(x, mode, satfinite);
        if relu_ {
            relu(f, r)
        } else {
            r
        }
    };
    let dbits = dst.bits();
    let (hi, lo) = match src {
        None => (scalar(a, ty2), scalar(b, ty2)),
        Some(s) => {
            let sb = s.bits();
            let m = (1u64 << sb) - 1;
            (s.format().decode((a >> sb) & m), s.format().decode(a & m))
        }
    };
    (conv(hi) << dbits) | conv(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_matches_the_host_conversion_for_every_value() {
        for h in 0..=u16::MAX {
            let x = F16.decode(h as u64);
            if x.is_nan() {
                continue;
            }
            assert_eq!(F16.encode(x, 'n', false), h as u64, "{h:#x}");
            assert_eq!(F16.encode(x, 'z', false), h as u64, "{h:#x}");
        }
    }

    #[test]
    fn bf16_is_f32_rounded() {
        let mut s = 0x9e37_79b9u32;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            if x.is_nan() {
                continue;
            }
            // Round to nearest even on the top 16 bits.
            let b = s as u64;
            let r = (b + 0x7fff + ((b >> 16) & 1)) >> 16;
            assert_eq!(BF16.encode(x as f64, 'n', false), r, "{x}");
            assert_eq!(BF16.encode(x as f64, 'z', false), b >> 16, "{x}");
        }
    }

    #[test]
    fn fp8_limits() {
        assert_eq!(E4M3.decode(0x7e), 448.0);
        assert!(E4M3.decode(0x7f).is_nan());
        assert_eq!(E4M3.encode(1000.0, 'n', true), 0x7e);
        assert_eq!(E4M3.encode(1000.0, 'n', false), 0x7f);
        assert_eq!(E4M3.encode(-1000.0, 'n', true), 0xfe);
        assert_eq!(E5M2.decode(0x7b), 57344.0);
        assert_eq!(E5M2.encode(1e6, 'n', true), 0x7b);
        assert_eq!(E5M2.encode(1e6, 'n', false), 0x7c);
        assert_eq!(E4M3.encode(2f64.powi(-9), 'n', false), 1);
        assert_eq!(E4M3.encode(1.0, 'n', false), 0x38);
        for b in 0..0x7eu64 {
            assert_eq!(E4M3.encode(E4M3.decode(b), 'n', false), b);
        }
    }
}
