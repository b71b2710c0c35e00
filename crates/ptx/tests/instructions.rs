//! The instructions nvcc 13.5 emits for CUDA's documented device intrinsics
//! (tests/fixtures/intrinsics.cu, compiled for sm_100), run by the interpreter and checked
//! output by output against references computed here on the CPU from the PTX ISA's
//! definitions (and the `half` crate for f16/bf16 rounding). One row of
//! docs/ptx-instructions.md per check, roughly: each output names the intrinsic it checks.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};
use half::{bf16, f16};

const BASE: u64 = 0x2000_0000_0000;
const MB: usize = 1 << 20;

fn module() -> Module {
    Module::parse(include_str!("fixtures/intrinsics.ptx")).unwrap()
}

/// Runs `kernel` over one thread per input triple (blocks of 64) and returns each thread's
/// `nout` output words.
fn run(kernel: &str, nout: usize, a: &[u32], b: &[u32], c: &[u32]) -> Vec<Vec<u32>> {
    let n = a.len();
    assert!(n.is_multiple_of(64) && b.len() == n && c.len() == n);
    let m = module();
    let mut mem = VecMemory::new(BASE, 4 * MB);
    for (k, v) in [a, b, c].iter().enumerate() {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(k * MB, &bytes);
    }
    let params: Vec<u8> = (0..4u64)
        .flat_map(|k| (BASE + k * MB as u64).to_le_bytes())
        .collect();
    m.launch(
        kernel,
        &LaunchConfig {
            grid: [(n / 64) as u32, 1, 1],
            block: [64, 1, 1],
            dynamic_shared_bytes: 0,
        },
        &params,
        &mem,
        &|_| None,
    )
    .unwrap_or_else(|e| panic!("{kernel}: {e}"));
    let out = mem.read(3 * MB, 4 * n * nout);
    out.chunks(4 * nout)
        .map(|t| {
            t.chunks(4)
                .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                .collect()
        })
        .collect()
}

/// xorshift words mixed with the values that find edge cases.
fn words(n: usize, seed: u32, specials: &[u32]) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            if i % 3 == 0 {
                specials[(s as usize / 3) % specials.len()]
            } else {
                s
            }
        })
        .collect()
}

const INT_SPECIALS: &[u32] = &[
    0,
    1,
    2,
    31,
    32,
    33,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0xffff_fffe,
    0x0000_ffff,
    0x00ff_ff00,
    0x1234_5678,
    0x8765_4321,
];

/// Compares each output of each thread with the reference `want(thread, index)`; `same`
/// decides equality (bit equality, or NaN-aware).
fn check(
    name: &str,
    got: &[Vec<u32>],
    names: &[&str],
    want: impl Fn(usize, usize) -> Option<u32>,
    same: impl Fn(usize, u32, u32) -> bool,
) {
    let mut failures = Vec::new();
    for (t, row) in got.iter().enumerate() {
        for (k, &g) in row.iter().enumerate() {
            if let Some(w) = want(t, k) {
                if !same(k, g, w) && failures.len() < 20 {
                    failures.push(format!(
                        "{name} thread {t} output {k} ({}): got {g:#x}, want {w:#x}",
                        names.get(k).unwrap_or(&"?")
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---- integer references, from the PTX ISA's definitions --------------------------------

fn prmt(a: u32, b: u32, c: u32, mode: &str) -> u32 {
    let bytes = ((b as u64) << 32) | a as u64;
    let byte = |i: u64| ((bytes >> (8 * i)) & 0xff) as u32;
    let s = c & 3;
    let pick: [u64; 4] = match mode {
        "" => {
            let mut r = 0;
            for k in 0..4 {
                let sel = (c >> (4 * k)) & 0xf;
                let mut v = byte((sel & 7) as u64);
                if sel & 8 != 0 {
                    v = if v & 0x80 != 0 { 0xff } else { 0 };
                }
                r |= v << (8 * k);
            }
            return r;
        }
        // d.b3 d.b2 d.b1 d.b0 per selector, from the ISA's table (listed b0 first here).
        "f4e" => [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]][s as usize],
        "b4e" => [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]][s as usize],
        "rc8" => [s as u64; 4],
        "ecl" => [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]][s as usize],
        "ecr" => [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]][s as usize],
        "rc16" => [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]][s as usize],
        _ => unreachable!(),
    };
    pick.iter()
        .enumerate()
        .map(|(k, &i)| byte(i) << (8 * k))
        .sum()
}

fn bfe(a: u64, b: u32, c: u32, bits: u32, signed: bool) -> u64 {
    let msb = bits - 1;
    let (pos, len) = (b & 0xff, c & 0xff);
    let bit = |i: u32| (a >> i) & 1;
    let sbit = if !signed || len == 0 {
        0
    } else {
        bit((pos + len - 1).min(msb))
    };
    let mut d = 0u64;
    for i in 0..=msb {
        let v = if i < len && pos + i <= msb {
            bit(pos + i)
        } else {
            sbit
        };
        d |= v << i;
    }
    d
}

fn bfind(a: u64, bits: u32, signed: bool, shiftamt: bool) -> u32 {
    let msb = bits - 1;
    let mut a = a;
    if signed && (a >> msb) & 1 == 1 {
        a = !a;
    }
    let mut d = u32::MAX;
    for i in (0..=msb).rev() {
        if (a >> i) & 1 == 1 {
            d = i;
            break;
        }
    }
    if shiftamt && d != u32::MAX {
        d = msb - d;
    }
    d
}

fn fns(mask: u32, base: u32, offset: i32) -> u32 {
    if offset == 0 {
        return if (mask >> base) & 1 == 1 {
            base
        } else {
            u32::MAX
        };
    }
    let mut pos = base as i32;
    let mut count = offset.unsigned_abs() - 1;
    let inc = if offset > 0 { 1 } else { -1 };
    while (0..32).contains(&pos) {
        if (mask >> pos) & 1 == 1 {
            if count == 0 {
                return pos as u32;
            }
            count -= 1;
        }
        pos += inc;
    }
    u32::MAX
}

fn szext(a: u32, b: u32, clamp: bool, signed: bool) -> u32 {
    let b1 = b & 0x1f;
    let too_large = b >= 32 && clamp;
    let mask = if too_large { 0 } else { !0u32 << b1 };
    let sign = if b1 == 0 || too_large || !signed {
        false
    } else {
        (a >> ((b1 - 1) & 0x1f)) & 1 == 1
    };
    (a & !mask) | if sign { mask } else { 0 }
}

fn bmsk(a: u32, b: u32, clamp: bool) -> u32 {
    let a1 = a & 0x1f;
    let mut mask0 = !0u32 << a1;
    let b1 = b & 0x1f;
    let sum = a1 + b1;
    let mut mask1 = if sum >= 32 { 0 } else { !0u32 << sum };
    let (mut pos_over, mut width_over) = (false, false);
    if clamp {
        if a >= 32 {
            pos_over = true;
            mask0 = 0;
        }
        width_over = b >= 32;
    }
    if sum >= 32 || pos_over || width_over {
        mask1 = 0;
    } else if b1 == 0 {
        mask1 = !0;
    }
    mask0 & !mask1
}

fn sext24(x: u32) -> i64 {
    ((x << 8) as i32 >> 8) as i64
}

fn dp(a: u32, b: u32, c: u32, sa: bool, sb: bool, two: Option<bool>) -> u32 {
    let byte = |v: u32, i: u32, s: bool| {
        let x = (v >> (8 * i)) & 0xff;
        if s {
            x as u8 as i8 as i64
        } else {
            x as i64
        }
    };
    let mut acc = if sa { c as i32 as i64 } else { c as i64 };
    match two {
        None => {
            for i in 0..4 {
                acc += byte(a, i, sa) * byte(b, i, sb);
            }
        }
        Some(hi) => {
            for i in 0..2 {
                let h = (a >> (16 * i)) & 0xffff;
                let h = if sa { h as u16 as i16 as i64 } else { h as i64 };
                acc += h * byte(b, i + if hi { 2 } else { 0 }, sb);
            }
        }
    }
    acc as u32
}

#[test]
fn int32_intrinsics_and_bit_instructions() {
    let n = 1024;
    let a = words(n, 0x1234_5677, INT_SPECIALS);
    let b = words(n, 0x0bad_cafe, INT_SPECIALS);
    let c = words(n, 0x5eed_0001, INT_SPECIALS);
    let got = run("int32_ops", 48, &a, &b, &c);
    let names = [
        "__ffs",
        "__clz",
        "__popc",
        "__brev",
        "__byte_perm",
        "__funnelshift_l",
        "__funnelshift_r",
        "__funnelshift_lc",
        "__funnelshift_rc",
        "__mulhi",
        "__umulhi",
        "__mul24",
        "__umul24",
        "__sad",
        "__usad",
        "__hadd",
        "__rhadd",
        "__uhadd",
        "__urhadd",
        "__dp4a(s)",
        "__dp4a(u)",
        "__dp2a_lo(s)",
        "__dp2a_hi(u)",
        "__fns",
        "bfind.u32",
        "bfind.s32",
        "bfind.shiftamt.u32",
        "bfind.shiftamt.s32",
        "bfe.u32",
        "bfe.s32",
        "bfi.b32",
        "prmt",
        "prmt.f4e",
        "prmt.b4e",
        "prmt.rc8",
        "prmt.ecl",
        "prmt.ecr",
        "prmt.rc16",
        "szext.wrap.s32",
        "szext.clamp.u32",
        "bmsk.wrap",
        "bmsk.clamp",
        "lop3 0x96",
        "__vimax_s32_relu",
        "add.sat.s32",
        "sub.sat.s32",
        "mul24.hi.u32",
        "mad24.lo.s32",
    ];
    check(
        "int32_ops",
        &got,
        &names,
        |t, k| {
            let (a, b, c) = (a[t], b[t], c[t]);
            let (sa, sb) = (a as i32 as i64, b as i32 as i64);
            let wide = ((b as u64) << 32) | a as u64;
            Some(match k {
                0 => {
                    if a == 0 {
                        0
                    } else {
                        a.trailing_zeros() + 1
                    }
                }
                1 => a.leading_zeros(),
                2 => a.count_ones(),
                3 => a.reverse_bits(),
                4 => prmt(a, b, c & 0x7777, ""),
                5 => ((wide << (c & 31)) >> 32) as u32,
                6 => (wide >> (c & 31)) as u32,
                7 => ((wide << c.min(32)) >> 32) as u32,
                8 => (wide >> c.min(32)) as u32,
                9 => ((sa * sb) >> 32) as u32,
                10 => ((a as u64 * b as u64) >> 32) as u32,
                11 => (sext24(a) * sext24(b)) as u32,
                12 => ((a & 0xff_ffff) as u64 * (b & 0xff_ffff) as u64) as u32,
                13 => ((sa - sb).unsigned_abs() as u32).wrapping_add(c),
                14 => a.abs_diff(b).wrapping_add(c),
                15 => ((sa + sb) >> 1) as u32,
                16 => ((sa + sb + 1) >> 1) as u32,
                17 => ((a as u64 + b as u64) >> 1) as u32,
                18 => ((a as u64 + b as u64 + 1) >> 1) as u32,
                19 => dp(a, b, c, true, true, None),
                20 => dp(a, b, c, false, false, None),
                21 => dp(a, b, c, true, true, Some(false)),
                22 => dp(a, b, c, false, false, Some(true)),
                23 => fns(a, b & 31, (c % 9) as i32 - 4),
                24 => bfind(a as u64, 32, false, false),
                25 => bfind(a as u64, 32, true, false),
                26 => bfind(a as u64, 32, false, true),
                27 => bfind(a as u64, 32, true, true),
                28 => bfe(a as u64, b, c, 32, false) as u32,
                29 => bfe(a as u64, b, c, 32, true) as u32,
                30 => {
                    let (pos, len) = (c & 0xff, (c >> 8) & 0xff);
                    let mut f = b;
                    let mut i = 0;
                    while i < len && pos + i <= 31 {
                        f = (f & !(1 << (pos + i))) | (((a >> i) & 1) << (pos + i));
                        i += 1;
                    }
                    f
                }
                31 => prmt(a, b, c, ""),
                32 => prmt(a, b, c, "f4e"),
                33 => prmt(a, b, c, "b4e"),
                34 => prmt(a, b, c, "rc8"),
                35 => prmt(a, b, c, "ecl"),
                36 => prmt(a, b, c, "ecr"),
                37 => prmt(a, b, c, "rc16"),
                38 => szext(a, b, false, true),
                39 => szext(a, b, true, false),
                40 => bmsk(a, b, false),
                41 => bmsk(a, b, true),
                42 => a ^ b ^ c,
                43 => sa.max(sb).max(0) as u32,
                44 => (sa + sb).clamp(i32::MIN as i64, i32::MAX as i64) as u32,
                45 => (sa - sb).clamp(i32::MIN as i64, i32::MAX as i64) as u32,
                46 => (((a & 0xff_ffff) as u64 * (b & 0xff_ffff) as u64) >> 16) as u32,
                47 => ((sext24(a) * sext24(b)) as u32).wrapping_add(c),
                _ => return None,
            })
        },
        |_, g, w| g == w,
    );
}

#[test]
fn int64_intrinsics() {
    let n = 512;
    let a = words(n, 0x2222_3333, INT_SPECIALS);
    let b = words(n, 0x4444_5555, INT_SPECIALS);
    let c = words(n, 0x6666_7777, INT_SPECIALS);
    let got = run("int64_ops", 16, &a, &b, &c);
    let names = [
        "__ffsll|__clzll",
        "",
        "__popcll",
        "",
        "__brevll",
        "",
        "__mul64hi",
        "",
        "__umul64hi",
        "",
        "bfind.u64",
        "bfind.s64",
        "bfind.shiftamt.s64",
        "div.u64",
        "rem.s64",
        "",
    ];
    check(
        "int64_ops",
        &got,
        &names,
        |t, k| {
            let x = ((b[t] as u64) << 32) | a[t] as u64;
            let y = ((c[t] as u64) << 32) | b[t] as u64;
            let pair = |v: u64, k: usize| {
                Some(if k.is_multiple_of(2) {
                    v as u32
                } else {
                    (v >> 32) as u32
                })
            };
            let ffs = if x == 0 {
                0
            } else {
                x.trailing_zeros() as u64 + 1
            };
            match k {
                0 | 1 => pair(ffs | (x.leading_zeros() as u64) << 32, k),
                2 | 3 => pair(x.count_ones() as u64, k),
                4 | 5 => pair(x.reverse_bits(), k),
                6 | 7 => pair(((x as i64 as i128 * y as i64 as i128) >> 64) as u64, k),
                8 | 9 => pair(((x as u128 * y as u128) >> 64) as u64, k),
                10 => Some(bfind(x, 64, false, false)),
                11 => Some(bfind(x, 64, true, false)),
                12 => Some(bfind(x, 64, true, true)),
                13 => Some((x / (y | 1)) as u32),
                14 | 15 => pair((x as i64).wrapping_rem((y | 1) as i64) as u64, k - 14),
                _ => None,
            }
        },
        |_, g, w| g == w,
    );
}

// ---- floats -------------------------------------------------------------------------------

const F32_SPECIALS: &[u32] = &[
    0x0000_0000, // +0
    0x8000_0000, // -0
    0x3f80_0000, // 1
    0xbf80_0000, // -1
    0x7f80_0000, // inf
    0xff80_0000, // -inf
    0x7fc0_0000, // NaN
    0xffc0_0001, // -NaN with payload
    0x0000_0001, // smallest subnormal
    0x807f_ffff, // largest negative subnormal
    0x0080_0000, // smallest normal
    0x7f7f_ffff, // largest finite
    0x4780_0000, // 65536
    0x477f_f000, // 65520 (f16 rounding to infinity)
    0x477f_efff, // just below
    0x3380_0000, // 2^-24
    0x3300_0001, // a little over 2^-25
    0x43e0_0000, // 448
    0x43e8_0000, // 464 (e4m3 tie)
    0x43f0_0000, // 480
    0x4760_0000, // 57344
    0x3f80_1000, // 1 + 2^-11 (f16 tie)
    0x3f80_8000, // 1 + 2^-8 (bf16 tie)
];

fn f32_same(g: u32, w: u32) -> bool {
    g == w || (f32::from_bits(g).is_nan() && f32::from_bits(w).is_nan())
}

/// PTX `min`/`max` of f32: NaN operands are ignored (both NaN gives NaN), -0 < +0.
fn minmax(x: f32, y: f32, max: bool) -> f32 {
    if x.is_nan() {
        return y;
    }
    if y.is_nan() {
        return x;
    }
    if x == 0.0 && y == 0.0 {
        let neg = if max {
            x.is_sign_negative() && y.is_sign_negative()
        } else {
            x.is_sign_negative() || y.is_sign_negative()
        };
        return if neg { -0.0 } else { 0.0 };
    }
    if (x > y) == max {
        x
    } else {
        y
    }
}

#[test]
fn float_intrinsics() {
    let n = 1024;
    let a = words(n, 0x1357_9bdf, F32_SPECIALS);
    let b = words(n, 0x2468_ace0, F32_SPECIALS);
    let c = words(n, 0x0f0f_0f0f, F32_SPECIALS);
    let got = run("float_ops", 24, &a, &b, &c);
    let names = [
        "fmaxf",
        "fminf",
        "max.NaN.f32",
        "min.NaN.f32",
        "max.xorsign.abs.f32",
        "min.xorsign.abs.f32",
        "copysignf",
        "isnan",
        "isinf",
        "isfinite",
        "signbit",
        "testp.normal",
        "testp.subnormal",
        "testp.notanumber",
        "fmax(f64) lo",
        "fmax(f64) hi",
        "copysign(f64) hi",
        "max.relu.s32",
        "__saturatef",
        "cvt.rna.tf32.f32",
        "set.lt.u32.f32",
        "set.gtu.f32.f32",
        "set.gt.f32.s32",
    ];
    check(
        "float_ops",
        &got,
        &names,
        |t, k| {
            let (x, y) = (f32::from_bits(a[t]), f32::from_bits(b[t]));
            let nan = |v: f32| {
                if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    v
                }
            };
            let xs = |max: bool| {
                let m = minmax(x.abs(), y.abs(), max);
                // The sign is the XOR of both sign bits, a NaN's included.
                let neg = (a[t] ^ b[t]) >> 31 == 1;
                if x.is_nan() && y.is_nan() {
                    m
                } else if neg {
                    -m
                } else {
                    m
                }
            };
            let e = (a[t] >> 23) & 0xff;
            let m64 = minmax(x, y, true) as f64;
            Some(match k {
                0 => minmax(x, y, true).to_bits(),
                1 => minmax(x, y, false).to_bits(),
                2 => nan(minmax(x, y, true)).to_bits(),
                3 => nan(minmax(x, y, false)).to_bits(),
                4 => xs(true).to_bits(),
                5 => xs(false).to_bits(),
                6 => x.copysign(y).to_bits(),
                7 => x.is_nan() as u32,
                8 => x.is_infinite() as u32,
                9 => x.is_finite() as u32,
                10 => x.is_sign_negative() as u32,
                11 => (e != 0 && e != 0xff) as u32,
                12 => (e == 0 && a[t] & 0x7f_ffff != 0) as u32,
                13 => x.is_nan() as u32,
                14 if m64.is_nan() => return None,
                14 => m64.to_bits() as u32,
                15 => (m64.to_bits() >> 32) as u32,
                16 => ((x as f64).copysign(y as f64).to_bits() >> 32) as u32,
                17 => (a[t] as i32).max(b[t] as i32).max(0) as u32,
                18 => {
                    if x.is_nan() {
                        0
                    } else {
                        x.clamp(0.0, 1.0).to_bits()
                    }
                }
                19 => {
                    // Round to nearest, ties away from zero, on the top 19 bits.
                    if x.is_nan() || x.is_infinite() {
                        return None;
                    }
                    let r = (a[t] as u64 + 0x1000) & !0x1fff;
                    r as u32
                }
                // set.cmp.dtype.stype: compared in the source type; all ones or 1.0.
                20 => {
                    if x < y {
                        u32::MAX
                    } else {
                        0
                    }
                }
                21 => {
                    if x.is_nan() || y.is_nan() || x > y {
                        1.0f32.to_bits()
                    } else {
                        0
                    }
                }
                22 => {
                    if (a[t] as i32) > (b[t] as i32) {
                        1.0f32.to_bits()
                    } else {
                        0
                    }
                }
                _ => return None,
            })
        },
        |k, g, w| {
            if (7..=13).contains(&k) || k == 17 || k >= 20 {
                g == w
            } else {
                f32_same(g, w)
            }
        },
    );
}

/// 16-bit float patterns: every class, with random ones between.
fn halves(n: usize, seed: u32) -> Vec<u32> {
    let sp: &[u16] = &[
        0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0x0001, 0x03ff, 0x0400, 0x7bff,
        0x3555, 0xc000, 0x4000, 0x5bff, 0x3f80, 0xbf80, 0x7f80, 0x7fc0, 0x0080, 0x7f7f,
    ];
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let lo = if i % 2 == 0 {
                sp[(s as usize >> 3) % sp.len()] as u32
            } else {
                s & 0xffff
            };
            let hi = if i % 3 == 0 {
                sp[(s as usize >> 9) % sp.len()] as u32
            } else {
                s >> 16
            };
            hi << 16 | lo
        })
        .collect()
}

/// A 16-bit float format for the references: `half`'s f16 or bf16.
trait H: Copy {
    fn val(bits: u32) -> f64;
    fn round(x: f64) -> u32;
    const NAN: u32 = 0x7fff;
}

impl H for f16 {
    fn val(bits: u32) -> f64 {
        f16::from_bits(bits as u16).to_f64()
    }
    fn round(x: f64) -> u32 {
        nearest::<f16>(x, f16::from_f64(x).to_bits() as u32)
    }
}

impl H for bf16 {
    fn val(bits: u32) -> f64 {
        bf16::from_bits(bits as u16).to_f64()
    }
    fn round(x: f64) -> u32 {
        nearest::<bf16>(x, bf16::from_f64(x).to_bits() as u32)
    }
}

/// The nearest 16-bit value to `x` (ties to even) among `r` and its neighbours: `half`'s
/// f64 conversions may round twice (through f32), so its result is only a starting point.
fn nearest<T: H>(x: f64, r: u32) -> u32 {
    if x.is_nan() || x.is_infinite() || r & 0x7fff == 0 || T::val(r).is_infinite() {
        return r;
    }
    let mut best = r;
    for c in [r.wrapping_sub(1), r + 1] {
        if c & 0x8000 != r & 0x8000 || T::val(c).is_nan() {
            continue;
        }
        let (d, bd) = ((T::val(c) - x).abs(), (T::val(best) - x).abs());
        if d < bd || (d == bd && c & 1 == 0) {
            best = c;
        }
    }
    best
}

fn is_nan16<T: H>(bits: u32) -> bool {
    T::val(bits & 0xffff).is_nan()
}

/// Equal bits, or NaN in both (16-bit elements of `width` bits total).
fn same16<T: H>(g: u32, w: u32, width: u32) -> bool {
    (0..width / 16).all(|i| {
        let (g, w) = ((g >> (16 * i)) & 0xffff, (w >> (16 * i)) & 0xffff);
        g == w || (is_nan16::<T>(g) && is_nan16::<T>(w))
    })
}

/// The reference of one 16-bit float operation on elements `x, y, z` (bits).
fn op16<T: H>(op: &str, x: u32, y: u32, z: u32) -> u32 {
    let (a, b, c) = (T::val(x), T::val(y), T::val(z));
    let nan = a.is_nan() || b.is_nan();
    let pick = |max: bool| -> u32 {
        // min/max: NaN ignored, -0 below +0; the chosen operand's bits.
        if a.is_nan() && b.is_nan() {
            return T::NAN;
        }
        if a.is_nan() {
            return y;
        }
        if b.is_nan() {
            return x;
        }
        if a == 0.0 && b == 0.0 {
            let xneg = x & 0x8000 != 0;
            let yneg = y & 0x8000 != 0;
            return if (xneg && yneg) || (!max && (xneg || yneg)) {
                0x8000
            } else {
                0
            };
        }
        if (a > b) == max {
            x
        } else {
            y
        }
    };
    let relu = |r: u32| {
        if is_nan16::<T>(r) {
            T::NAN
        } else if r & 0x8000 != 0 {
            0
        } else {
            r
        }
    };
    let sat = |v: f64| {
        if v.is_nan() {
            0
        } else {
            T::round(v.clamp(0.0, 1.0))
        }
    };
    match op {
        "add" => T::round(a + b),
        "sub" => T::round(a - b),
        "mul" => T::round(a * b),
        "fma" => T::round(a.mul_add(b, c)),
        "neg" => x ^ 0x8000,
        "abs" => x & 0x7fff,
        "max" => pick(true),
        "min" => pick(false),
        "max_nan" => {
            if nan {
                T::NAN
            } else {
                pick(true)
            }
        }
        "min_nan" => {
            if nan {
                T::NAN
            } else {
                pick(false)
            }
        }
        "fma_relu" => relu(T::round(a.mul_add(b, c))),
        "add_sat" => sat(a + b),
        "fma_sat" => sat(a.mul_add(b, c)),
        _ => unreachable!("{op}"),
    }
}

fn pair16<T: H>(op: &str, x: u32, y: u32, z: u32) -> u32 {
    let lo = op16::<T>(op, x & 0xffff, y & 0xffff, z & 0xffff);
    let hi = op16::<T>(op, x >> 16, y >> 16, z >> 16);
    hi << 16 | lo
}

/// f32 `x` to a 16-bit float in directed mode `mode` ('z', 'm', 'p'), from the nearest
/// value stepped by one toward the wanted side when it lies on the other.
fn directed16<T: H>(x: f32, mode: char) -> u32 {
    let r = T::round(x as f64);
    if x.is_nan() || x.is_infinite() {
        return r;
    }
    let v = T::val(r);
    let x = x as f64;
    let step_down = |r: u32| -> u32 {
        // Toward -inf.
        if r & 0x7fff == 0 {
            0x8001
        } else if r & 0x8000 != 0 {
            r + 1
        } else {
            r - 1
        }
    };
    let step_up = |r: u32| -> u32 {
        if r & 0x7fff == 0 {
            0x0001
        } else if r & 0x8000 != 0 {
            r - 1
        } else {
            r + 1
        }
    };
    match mode {
        'm' if v > x => step_down(r),
        'p' if v < x => step_up(r),
        'z' if v.abs() > x.abs() => {
            if x > 0.0 {
                step_down(r)
            } else {
                step_up(r)
            }
        }
        _ => r,
    }
}

#[test]
fn half_intrinsics() {
    let n = 1024;
    let a = halves(n, 0x1111);
    let b = halves(n, 0x2222);
    let c: Vec<u32> = words(n, 0x3333, F32_SPECIALS)
        .iter()
        .zip(halves(n, 0x4444))
        .enumerate()
        .map(|(i, (&f, h))| if i % 2 == 0 { f } else { h })
        .collect();
    let got = run("half_ops", 40, &a, &b, &c);
    let ops = [
        "add", "sub", "mul", "fma", "neg", "abs", "max", "min", "max_nan", "min_nan", "fma_relu",
        "add_sat", "fma_sat",
    ];
    let pops = [
        "add", "sub", "mul", "fma", "neg", "abs", "max", "min", "max_nan", "min_nan", "fma_relu",
        "add_sat",
    ];
    let mut names: Vec<String> = ops.iter().map(|o| format!("__h{o}")).collect();
    names.extend(pops.iter().map(|o| format!("__h{o}2")));
    names.extend(
        [
            "__heq",
            "__hlt",
            "__hgeu",
            "__hisnan",
            "__heq2_mask",
            "__hlt2_mask",
            "__hle2",
            "__hbgt2",
            "__half2float",
            "__float2half_rn",
            "__float2half_rz",
            "__float2half_rd",
            "__float2half_ru",
            "__floats2half2_rn",
        ]
        .map(String::from),
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    check(
        "half_ops",
        &got,
        &names,
        |t, k| {
            let (x, y, z) = (a[t], b[t], c[t]);
            let (xl, yl) = (x & 0xffff, y & 0xffff);
            let (fa, fb) = (f16::val(xl), f16::val(yl));
            let cmp2 = |f: &dyn Fn(f64, f64) -> bool, one: u32| -> u32 {
                let lo = f(f16::val(x & 0xffff), f16::val(y & 0xffff)) as u32;
                let hi = f(f16::val(x >> 16), f16::val(y >> 16)) as u32;
                ((hi * one) << 16) | (lo * one)
            };
            let cf = f32::from_bits(z);
            Some(match k {
                0..=12 => op16::<f16>(ops[k], xl, yl, z & 0xffff),
                13..=24 => pair16::<f16>(pops[k - 13], x, y, z),
                25 => (fa == fb) as u32,
                26 => (fa < fb) as u32,
                27 => (fa.is_nan() || fb.is_nan() || fa >= fb) as u32,
                28 => fa.is_nan() as u32,
                29 => cmp2(&|p, q| p == q, 0xffff),
                30 => cmp2(&|p, q| p < q, 0xffff),
                31 => cmp2(&|p, q| p <= q, 0x3c00),
                32 => {
                    let lo = f16::val(x & 0xffff) > f16::val(y & 0xffff);
                    let hi = f16::val(x >> 16) > f16::val(y >> 16);
                    (lo && hi) as u32
                }
                33 => (fa as f32).to_bits(),
                34 => f16::round(cf as f64),
                35 => directed16::<f16>(cf, 'z'),
                36 => directed16::<f16>(cf, 'm'),
                37 => directed16::<f16>(cf, 'p'),
                38 => {
                    f16::round(f32::from_bits(z) as f64) << 16
                        | f16::round(f32::from_bits(y) as f64)
                }
                _ => return None,
            })
        },
        |k, g, w| match k {
            0..=12 | 34..=37 => same16::<f16>(g, w, 16),
            13..=24 | 31 | 38 => same16::<f16>(g, w, 32),
            33 => f32_same(g, w),
            _ => g == w,
        },
    );
}

#[test]
fn bf16_intrinsics() {
    let n = 1024;
    let a = halves(n, 0x5555);
    let b = halves(n, 0x6666);
    let c: Vec<u32> = words(n, 0x7777, F32_SPECIALS)
        .iter()
        .zip(halves(n, 0x8888))
        .enumerate()
        .map(|(i, (&f, h))| if i % 2 == 0 { f } else { h })
        .collect();
    let got = run("bf16_ops", 34, &a, &b, &c);
    let ops = [
        "add", "sub", "mul", "fma", "neg", "abs", "max", "min", "max_nan", "min_nan", "fma_relu",
    ];
    let pops = [
        "add", "sub", "mul", "fma", "neg", "abs", "max", "min", "max_nan", "fma_relu",
    ];
    let mut names: Vec<String> = ops.iter().map(|o| format!("__h{o}(bf16)")).collect();
    names.extend(pops.iter().map(|o| format!("__h{o}2(bf16x2)")));
    names.extend(
        [
            "__heq",
            "__hlt2_mask",
            "__bfloat162float",
            "__float2bfloat16",
            "_rz",
            "_rd",
            "_ru",
            "__floats2bfloat162_rn",
            "__double2bfloat16",
            "__double2half",
            "__bfloat162int_rn",
            "__bfloat162uint_rz",
        ]
        .map(String::from),
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    check(
        "bf16_ops",
        &got,
        &names,
        |t, k| {
            let (x, y, z) = (a[t], b[t], c[t]);
            let (xl, yl) = (x & 0xffff, y & 0xffff);
            let (fa, fb) = (bf16::val(xl), bf16::val(yl));
            let cf = f32::from_bits(z);
            let d = cf as f64 * 1.0000001;
            Some(match k {
                0..=10 => op16::<bf16>(ops[k], xl, yl, z & 0xffff),
                11..=20 => pair16::<bf16>(pops[k - 11], x, y, z),
                21 => (fa == fb) as u32,
                22 => {
                    let lo = (fa < fb) as u32;
                    let hi = (bf16::val(x >> 16) < bf16::val(y >> 16)) as u32;
                    ((hi * 0xffff) << 16) | (lo * 0xffff)
                }
                23 => (fa as f32).to_bits(),
                24 => bf16::round(cf as f64),
                25 => directed16::<bf16>(cf, 'z'),
                26 => directed16::<bf16>(cf, 'm'),
                27 => directed16::<bf16>(cf, 'p'),
                28 => {
                    bf16::round(f32::from_bits(z) as f64) << 16
                        | bf16::round(f32::from_bits(y) as f64)
                }
                29 => bf16::round(d),
                30 => f16::round(d),
                31 => {
                    if fa.is_nan() {
                        return None;
                    }
                    fa.round_ties_even().clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32
                }
                32 => {
                    if fa.is_nan() {
                        return None;
                    }
                    fa.trunc().clamp(0.0, u32::MAX as f64) as u32
                }
                _ => return None,
            })
        },
        |k, g, w| match k {
            0..=10 | 24..=27 | 29 => same16::<bf16>(g, w, 16),
            30 => same16::<f16>(g, w, 16),
            11..=20 | 28 => same16::<bf16>(g, w, 32),
            23 => f32_same(g, w),
            _ => g == w,
        },
    );
}

// ---- fp8 ----------------------------------------------------------------------------------

/// An 8-bit float format's value, from its definition.
fn fp8_val(bits: u32, e4m3: bool) -> f64 {
    let (eb, mb, bias) = if e4m3 { (4, 3, 7) } else { (5, 2, 15) };
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((bits >> mb) & ((1 << eb) - 1)) as i32;
    let m = (bits & ((1 << mb) - 1)) as f64;
    if e4m3 && e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if !e4m3 && e == 31 {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if e == 0 {
        sign * m * 2f64.powi(1 - bias - mb)
    } else {
        sign * (1.0 + m / (1 << mb) as f64) * 2f64.powi(e - bias)
    }
}

/// Round to nearest even by searching every code; `.satfinite` clamps to the largest finite
/// value (NaN stays NaN).
fn fp8_round(x: f64, e4m3: bool) -> u32 {
    let nan = 0x7f;
    if x.is_nan() {
        return nan;
    }
    let max_code = if e4m3 { 0x7e } else { 0x7b };
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= fp8_val(max_code, e4m3) {
        return sign | max_code;
    }
    let mut best = 0u32;
    for code in 0..=max_code {
        let (v, bv) = (fp8_val(code, e4m3), fp8_val(best, e4m3));
        let (d, bd) = ((v - a).abs(), (bv - a).abs());
        if d < bd || (d == bd && code & 1 == 0 && best & 1 == 1) {
            best = code;
        }
    }
    sign | best
}

#[test]
fn fp8_conversions() {
    let n = 512;
    let a = halves(n, 0x9999);
    let b = words(n, 0xaaaa, F32_SPECIALS);
    let c = words(n, 0xbbbb, F32_SPECIALS);
    // Scale the random floats into fp8's range half of the time.
    let scale = |v: &[u32]| -> Vec<u32> {
        v.iter()
            .enumerate()
            .map(|(i, &w)| {
                let f = f32::from_bits(w);
                if i % 2 == 1 && f.is_finite() {
                    ((w & 0xffff) as f32 / 64.0 - 512.0).to_bits()
                } else {
                    f.to_bits()
                }
            })
            .collect()
    };
    let (b, c) = (scale(&b), scale(&c));
    let got = run("fp8_ops", 12, &a, &b, &c);
    let names = [
        "float2->e4m3x2 sat",
        "float2->e5m2x2 sat",
        "float2->e4m3x2",
        "float2->e5m2x2",
        "half2->e4m3x2",
        "half2->e5m2x2",
        "bf162->e4m3x2",
        "e4m3x2->half2",
        "e5m2x2->half2",
        "float->e4m3",
        "double->e5m2",
        "e4m3->float",
    ];
    check(
        "fp8_ops",
        &got,
        &names,
        |t, k| {
            let (fx, fy) = (f32::from_bits(b[t]) as f64, f32::from_bits(c[t]) as f64);
            let pair = |lo: u32, hi: u32| hi << 8 | lo;
            let h = |bits: u32| f16::val(bits);
            let nosat = |x: f64, e4m3: bool| -> u32 {
                // Without saturation: past the largest finite value (after rounding) is NaN
                // for e4m3 and infinity for e5m2.
                let r = fp8_round(x, e4m3);
                let max = if e4m3 { 0x7e } else { 0x7b };
                let over = x.is_infinite()
                    || (r & 0x7f == max
                        && x.abs() > fp8_val(max, e4m3)
                        && x.abs()
                            >= fp8_val(max, e4m3)
                                * if e4m3 {
                                    464.0 / 448.0
                                } else {
                                    61440.0 / 57344.0
                                });
                if !over {
                    r
                } else if e4m3 {
                    (r & 0x80) | 0x7f
                } else {
                    (r & 0x80) | 0x7c
                }
            };
            Some(match k {
                0 => pair(fp8_round(fx, true), fp8_round(fy, true)),
                1 => pair(fp8_round(fx, false), fp8_round(fy, false)),
                2 => pair(nosat(fx, true), nosat(fy, true)),
                3 => pair(nosat(fx, false), nosat(fy, false)),
                4 => pair(
                    fp8_round(h(a[t] & 0xffff), true),
                    fp8_round(h(a[t] >> 16), true),
                ),
                5 => pair(
                    fp8_round(h(a[t] & 0xffff), false),
                    fp8_round(h(a[t] >> 16), false),
                ),
                6 => pair(
                    fp8_round(bf16::val(a[t] & 0xffff), true),
                    fp8_round(bf16::val(a[t] >> 16), true),
                ),
                7 | 8 => {
                    let e4 = k == 7;
                    let lo = f16::round(fp8_val(a[t] & 0xff, e4));
                    let hi = f16::round(fp8_val((a[t] >> 8) & 0xff, e4));
                    hi << 16 | lo
                }
                9 => fp8_round(fx, true),
                10 => fp8_round(fx, false),
                11 => (fp8_val(fp8_round(fy, true), true) as f32).to_bits(),
                _ => return None,
            })
        },
        |k, g, w| match k {
            7 | 8 => same16::<f16>(g, w, 32),
            11 => f32_same(g, w),
            _ => {
                // NaN codes: 0x7f/0xff (e4m3), 0x7d..0x7f (e5m2) in either byte.
                let e4 = matches!(k, 0 | 2 | 4 | 6 | 9);
                (0..2).all(|i| {
                    let (g, w) = ((g >> (8 * i)) & 0xff, (w >> (8 * i)) & 0xff);
                    g == w || (fp8_val(g, e4).is_nan() && fp8_val(w, e4).is_nan())
                })
            }
        },
    );
}

// ---- warp, atomics, async copies, cache hints ---------------------------------------------

#[test]
fn warp_intrinsics() {
    let n = 128;
    let a = words(n, 0xcccc, INT_SPECIALS);
    let b = words(n, 0xdddd, INT_SPECIALS);
    let c = words(n, 0xeeee, INT_SPECIALS);
    let got = run("warp_ops", 12, &a, &b, &c);
    let names = [
        "__reduce_add_sync",
        "__reduce_min_sync",
        "__reduce_max_sync",
        "__reduce_and_sync",
        "__reduce_or_sync",
        "__reduce_xor_sync",
        "__match_any_sync",
        "__match_all_sync",
        "__match_all_sync pred",
        "__activemask",
        "__ballot_sync",
        "elect.sync",
    ];
    check(
        "warp_ops",
        &got,
        &names,
        |t, k| {
            let w = t / 32 * 32;
            let lanes = w..w + 32;
            let ballot = |f: &dyn Fn(usize) -> bool| -> u32 {
                lanes
                    .clone()
                    .filter(|&l| f(l))
                    .map(|l| 1u32 << (l - w))
                    .sum()
            };
            let all_b = lanes.clone().all(|l| b[l] & 1 == b[w] & 1);
            Some(match k {
                0 => lanes.clone().fold(0u32, |s, l| s.wrapping_add(a[l])),
                1 => lanes.clone().map(|l| a[l] as i32).min().unwrap() as u32,
                2 => lanes.clone().map(|l| a[l]).max().unwrap(),
                3 => lanes.clone().fold(!0, |s, l| s & a[l]),
                4 => lanes.clone().fold(0, |s, l| s | a[l]),
                5 => lanes.clone().fold(0, |s, l| s ^ a[l]),
                6 => ballot(&|l| a[l] & 3 == a[t] & 3),
                7 => {
                    if all_b {
                        u32::MAX
                    } else {
                        0
                    }
                }
                8 => all_b as u32,
                9 => u32::MAX,
                10 => ballot(&|l| c[l] & 1 == 1),
                11 => 0,
                _ => return None,
            })
        },
        |_, g, w| g == w,
    );
}

#[test]
fn atomics_of_every_type() {
    let n = 256;
    let a = words(n, 0xf00d, INT_SPECIALS);
    let m = module();
    let mut mem = VecMemory::new(BASE, 4 * MB);
    let bytes: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
    mem.write(0, &bytes);
    // Start values: word 14 (min s32) high, 18 (min s64) high, 12 (cas.b16) at 0.
    let mut init = [0u32; 32];
    init[14] = i32::MAX as u32;
    init[18] = u32::MAX;
    init[19] = i32::MAX as u32;
    let ib: Vec<u8> = init.iter().flat_map(|x| x.to_le_bytes()).collect();
    mem.write(3 * MB, &ib);
    let params: Vec<u8> = (0..4u64)
        .flat_map(|k| (BASE + k * MB as u64).to_le_bytes())
        .collect();
    m.launch(
        "atomic_ops",
        &LaunchConfig {
            grid: [4, 1, 1],
            block: [64, 1, 1],
            dynamic_shared_bytes: 0,
        },
        &params,
        &mem,
        &|_| None,
    )
    .unwrap();
    let w: Vec<u32> = mem
        .read(3 * MB, 4 * 32)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let nf = n as f32;
    // f16: 256 ones added one at a time: exact up to 256 (f16 holds integers to 2048).
    assert_eq!(
        f16::from_bits(w[0] as u16).to_f32(),
        nf,
        "atomicAdd(__half)"
    );
    assert_eq!(
        f16::from_bits(w[1] as u16).to_f32(),
        nf,
        "atomicAdd(__half2).x"
    );
    assert_eq!(
        f16::from_bits((w[1] >> 16) as u16).to_f32(),
        2.0 * nf,
        "atomicAdd(__half2).y"
    );
    assert_eq!(bf16::from_bits(w[2] as u16).to_f32(), nf, "atomicAdd(bf16)");
    assert_eq!(
        bf16::from_bits(w[3] as u16).to_f32(),
        nf,
        "atomicAdd(bf162).x"
    );
    assert_eq!(
        bf16::from_bits((w[3] >> 16) as u16).to_f32(),
        2.0 * nf,
        "atomicAdd(bf162).y"
    );
    assert_eq!(f32::from_bits(w[4]), nf, "atomicAdd(float2).x");
    assert_eq!(f32::from_bits(w[5]), 2.0 * nf, "atomicAdd(float2).y");
    for (k, want) in [1.0, 2.0, 3.0, 4.0].iter().enumerate() {
        assert_eq!(
            f32::from_bits(w[8 + k]),
            want * nf,
            "atomicAdd(float4)[{k}]"
        );
    }
    // cas.b16: thread i turns i into i + 1; the 16-bit counter climbs as far as the order of
    // the threads lets it (at least one step, since thread 0 sees 0), never past n.
    let cas = w[12] & 0xffff;
    assert!(
        (1..=n as u32).contains(&cas) && w[12] >> 16 == 0,
        "atomicCAS(u16) {cas}"
    );
    assert_eq!(w[13], *a.iter().max().unwrap(), "atomicMax(u32)");
    assert_eq!(
        w[14] as i32,
        a.iter().map(|&x| x as i32).min().unwrap(),
        "atomicMin(s32)"
    );
    assert_eq!(w[15], a.iter().fold(0, |s, &x| s ^ x), "atomicXor");
    let sum: u64 = a
        .iter()
        .map(|&x| (x as u64) << 8)
        .fold(0, u64::wrapping_add);
    assert_eq!(w[16] as u64 | (w[17] as u64) << 32, sum, "atomicAdd(u64)");
    let min = a.iter().map(|&x| -(x as i64)).min().unwrap();
    assert_eq!(
        (w[18] as u64 | (w[19] as u64) << 32) as i64,
        min,
        "atomicMin(s64)"
    );
    assert_eq!(
        f64::from_bits(w[20] as u64 | (w[21] as u64) << 32),
        128.0,
        "atomicAdd(f64)"
    );
    // inc wraps to 0 past 16, dec wraps to 16 below 0 (or above 16): 256 steps of each.
    assert_eq!(w[22], 256 % 17, "atomicInc");
    assert_eq!(w[23], (17 - 256 % 17), "atomicDec");
    assert_eq!(w[24], 256, "atomicAdd_block");
    assert_eq!(w[25], 512, "atomicAdd_system");
}

#[test]
fn cp_async_griddepcontrol_and_cache_hints() {
    let n = 64;
    let a: Vec<u32> = (0..4 * n as u32).map(|i| i * 3 + 1).collect();
    let b: Vec<u32> = (0..4 * n as u32).map(|i| 0x1000 + i).collect();
    let c: Vec<u32> = (0..4 * n as u32).map(|i| 0x9000_0000 | i).collect();
    let got = run("async_ops", 8, &a, &b, &c);
    for (t, row) in got.iter().enumerate().take(n) {
        let mut want = [0u32; 8];
        want[..4].copy_from_slice(&a[t * 4..t * 4 + 4]);
        // `__pipeline_memcpy_async(dst, src, 8, zfill)`: the last `zfill` bytes are zeros.
        want[4] = if t & 1 == 1 { b[t * 4] } else { 0 };
        want[5] = 0;
        want[6] = c[t];
        want[7] = 7;
        assert_eq!(row[..], want[..], "thread {t}");
    }
    let got = run("cache_ops", 4, &a[..n], &b[..n], &c[..n]);
    for (t, row) in got.iter().enumerate() {
        assert_eq!(
            row[..],
            [a[t], b[t], c[t], a[t].wrapping_add(b[t])],
            "cache-hinted loads and stores, thread {t}"
        );
    }
}

/// Instructions the VM does not run fail the launch with an error naming them, never run as
/// something else.
#[test]
fn unsupported_instructions_are_named() {
    for (body, name) in [
        ("wgmma.fence.sync.aligned;", "wgmma"),
        ("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1], 16, [%r2];", "cp.async.bulk"),
        ("tcgen05.fence::before_thread_sync;", "tcgen05"),
        ("atom.global.exch.b128 %rd2, [%rd1], %rd3;", "atom.global.exch.b128"),
        ("cvt.rn.satfinite.e2m1x2.f32 %rs1, %f1, %f1;", "e2m1x2"),
        ("vadd4.u32.u32.u32.sat %r1, %r1, %r1, %r1;", "vadd4"),
    ] {
        let src = format!(
            ".version 9.0\n.target sm_100\n.address_size 64\n.visible .entry k()\n{{\n\
             .reg .b16 %rs<3>;\n.reg .b32 %r<4>;\n.reg .f32 %f<3>;\n.reg .b64 %rd<4>;\n\
             {body}\nret;\n}}\n"
        );
        let m = Module::parse(&src).unwrap_or_else(|e| panic!("{body}: {e}"));
        let mem = VecMemory::new(BASE, 64);
        let e = m
            .launch(
                "k",
                &LaunchConfig {
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    dynamic_shared_bytes: 0,
                },
                &[],
                &mem,
                &|_| None,
            )
            .unwrap_err();
        assert!(
            matches!(&e, ExecError::Unsupported(t) if t.contains(name)),
            "{body}: {e}"
        );
    }
}

/// Forms whose extra types or modifiers the VM would otherwise drop fail instead.
#[test]
fn forms_the_vm_would_misread_are_refused() {
    for body in [
        "add.f32.f16 %f1, %f1, %rs1;",
        "cvt.pack.sat.u8.s32.b32 %r1, %r1, %r1, %r1;",
        "mad.hi.sat.s32 %r1, %r1, %r1, %r1;",
        "max.abs.f32 %f1, %f1, %f1;",
        "redux.sync.min.f32 %f1, %f1, 0xffffffff;",
    ] {
        let src = format!(
            ".version 9.0\n.target sm_100\n.address_size 64\n.visible .entry k()\n{{\n\
             .reg .b16 %rs<3>;\n.reg .b32 %r<4>;\n.reg .f32 %f<3>;\n{body}\nret;\n}}\n"
        );
        let m = Module::parse(&src).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert!(m.unsupported().next().is_some(), "{body} was accepted");
    }
}

/// `ldmatrix` (x4, x2.trans) feeding `mma.sync` m16n8k16 (f16 and bf16 into f32, f16 into
/// f16), m16n8k8 tf32 and m8n8k4 f64, checked against matrix products computed here (in f64,
/// rounded once to the accumulator's type; tf32 inputs lose their low 13 mantissa bits).
#[test]
fn ldmatrix_and_mma() {
    let mut s = 0x1234_abcdu32;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    // Each word: two f16 values in [-4, 4); read as bf16 or f32 they stay finite too.
    let mut word = || {
        let lo = f16::from_f32((next() % 64) as f32 / 8.0 - 4.0).to_bits() as u32;
        let hi = f16::from_f32((next() % 64) as f32 / 8.0 - 4.0).to_bits() as u32;
        hi << 16 | lo
    };
    let a: Vec<u32> = (0..128).map(|_| word()).collect();
    let b: Vec<u32> = (0..128).map(|_| word()).collect();
    let c: Vec<u32> = (0..128)
        .map(|k| ((k % 23 - 11) as f32 / 4.0).to_bits())
        .collect();
    let mut mem = VecMemory::new(BASE, 4 * MB);
    for (k, v) in [&a, &b, &c].iter().enumerate() {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(k * MB, &bytes);
    }
    let params: Vec<u8> = (0..4u64)
        .flat_map(|k| (BASE + k * MB as u64).to_le_bytes())
        .collect();
    module()
        .launch(
            "mma_ops",
            &LaunchConfig {
                grid: [1, 1, 1],
                block: [32, 1, 1],
                dynamic_shared_bytes: 0,
            },
            &params,
            &mem,
            &|_| None,
        )
        .unwrap();
    let out: Vec<u32> = mem
        .read(3 * MB, 4 * 576)
        .chunks(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    // Element (r, col) of a row-major matrix of 16-bit values stored two to a word.
    let e16 = |v: &[u32], cols: usize, r: usize, col: usize| -> u32 {
        let i = r * cols + col;
        (v[i / 2] >> (16 * (i % 2))) & 0xffff
    };
    let f32w = |w: u32| f32::from_bits(w) as f64;
    let mut failures = Vec::new();
    let mut expect = |what: &str, r: usize, col: usize, got: u32, want: u32| {
        if got != want && failures.len() < 10 {
            failures.push(format!(
                "{what} D[{r}][{col}]: got {got:#x}, want {want:#x}"
            ));
        }
    };
    for r in 0..16 {
        for col in 0..8 {
            // m16n8k16: A 16x16 and B 16x8 of 16-bit values.
            let sum = |val: &dyn Fn(u32) -> f64, acc: f64| -> f64 {
                (0..16).fold(acc, |s, k| {
                    s + val(e16(&a, 16, r, k)) * val(e16(&b, 8, k, col))
                })
            };
            let h = |x: u32| f16::from_bits(x as u16).to_f64();
            let bh = |x: u32| bf16::from_bits(x as u16).to_f64();
            let cv = f32w(c[r * 8 + col]);
            expect(
                "f16->f32",
                r,
                col,
                out[r * 8 + col],
                (sum(&h, cv) as f32).to_bits(),
            );
            expect(
                "bf16->f32",
                r,
                col,
                out[128 + r * 8 + col],
                (sum(&bh, cv) as f32).to_bits(),
            );
            let d16 = (out[256 + r * 4 + col / 2] >> (16 * (col % 2))) & 0xffff;
            expect("f16->f16", r, col, d16, f16::round(sum(&h, 0.0)));
            // m16n8k8 tf32: A 16x8 and B 8x8 as f32 words.
            let tf = |w: u32| f32::from_bits(w & !0x1fff) as f64;
            let t = (0..8).fold(cv, |s, k| s + tf(a[r * 8 + k]) * tf(b[k * 8 + col]));
            expect("tf32", r, col, out[320 + r * 8 + col], (t as f32).to_bits());
            // m8n8k4 f64: A 8x4, B 4x8, C 8x8, the f32 words widened.
            if r < 8 {
                let d = (0..4).fold(f32w(c[r * 8 + col]), |s, k| {
                    s + f32w(a[r * 4 + k]) * f32w(b[k * 8 + col])
                });
                let i = 448 + 2 * (r * 8 + col);
                expect("f64 lo", r, col, out[i], d.to_bits() as u32);
                expect("f64 hi", r, col, out[i + 1], (d.to_bits() >> 32) as u32);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn simd_video_intrinsics() {
    let n = 512;
    let a = words(n, 0x5151, INT_SPECIALS);
    let b = words(n, 0x7373, INT_SPECIALS);
    let got = run("simd_ops", 4, &a, &b, &a);
    let names = ["__vabsdiffu4", "__vsadu4", "__vsadu2", "__vabsdiffs4"];
    let parts = |v: u32, bits: u32| -> Vec<u32> {
        (0..32 / bits)
            .map(|i| (v >> (i * bits)) & ((1u64 << bits) - 1) as u32)
            .collect()
    };
    check(
        "simd_ops",
        &got,
        &names,
        |t, k| {
            let (x, y) = (a[t], b[t]);
            let d8: Vec<u32> = parts(x, 8)
                .iter()
                .zip(parts(y, 8))
                .map(|(p, q)| p.abs_diff(q))
                .collect();
            let d16: Vec<u32> = parts(x, 16)
                .iter()
                .zip(parts(y, 16))
                .map(|(p, q)| p.abs_diff(q))
                .collect();
            Some(match k {
                0 => d8.iter().enumerate().map(|(i, d)| d << (8 * i)).sum(),
                1 => d8.iter().sum(),
                2 => d16.iter().sum(),
                3 => parts(x, 8)
                    .iter()
                    .zip(parts(y, 8))
                    .enumerate()
                    .map(|(i, (&p, q))| {
                        ((p as u8 as i8 as i32 - q as u8 as i8 as i32).unsigned_abs() & 0xff)
                            << (8 * i)
                    })
                    .sum(),
                _ => return None,
            })
        },
        |_, g, w| g == w,
    );
}

/// Device-side `printf` (`vprintf`): each call's text, formatted by the VM, against the host C
/// library's `snprintf` with the same format and arguments.
#[test]
#[allow(clippy::approx_constant)] // 3.14159 is the kernel's own argument
fn device_printf_matches_the_c_library() {
    let n = 64;
    let a: Vec<u32> = (0..n as u32).map(|i| 0xdead_0000 + i * 0x1111).collect();
    let m = module();
    let mut mem = VecMemory::new(BASE, 4 * MB);
    let bytes: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
    mem.write(0, &bytes);
    let params: Vec<u8> = (0..4u64)
        .flat_map(|k| (BASE + k * MB as u64).to_le_bytes())
        .collect();
    // The module's string constants, placed after the buffers as a device would.
    let mut at = 3 * MB + MB / 2;
    let mut addrs = std::collections::HashMap::new();
    for v in m.globals() {
        if let Some(init) = &v.init {
            mem.write(at, init);
        }
        addrs.insert(v.name.clone(), BASE + at as u64);
        at += (v.size as usize).div_ceil(16) * 16;
    }
    m.launch(
        "printf_ops",
        &LaunchConfig {
            grid: [1, 1, 1],
            block: [64, 1, 1],
            dynamic_shared_bytes: 0,
        },
        &params,
        &mem,
        &|name| addrs.get(name).copied(),
    )
    .unwrap();
    let got = String::from_utf8(mem.take_printed()).unwrap();
    let fmt = c"t=%d u=%u x=%#x X=%08X o=%#o c=%c s=%s f=%.3f e=%e E=%.2E g=%g G=%G ll=%lld llu=%llu p=%p %% w=[%5d|%-5d|%05d|%+d|% d] *=[%*d|%.*f] str=[%.2s|%-6s|%6s] h=%hd hh=%hhu zero=[%.0d]\n";
    let mut want = String::new();
    // The three threads' first calls run together (one warp), then their second calls.
    for t in 0..3i32 {
        let mut buf = vec![0u8; 1024];
        // SAFETY: a NUL-terminated format whose conversions match the arguments' C types, and
        // a buffer of the length given.
        let len = unsafe {
            libc::snprintf(
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
                fmt.as_ptr(),
                t as libc::c_int,
                a[t as usize] as libc::c_uint,
                a[t as usize] as libc::c_uint,
                a[t as usize] as libc::c_uint,
                8 + t as libc::c_uint,
                ('A' as i32 + t) as libc::c_int,
                c"hey".as_ptr(),
                (1.5f32 * t as f32) as f64,
                12345.678f64,
                0.000123456f64,
                0.0001 * (t + 1) as f64,
                1e-5 * (t + 1) as f64,
                -1234567890123i64 * (t + 1) as i64,
                u64::MAX - t as u64,
                (0x1230 + t as usize) as *const libc::c_void,
                t,
                t,
                -t,
                t,
                t,
                4 as libc::c_int,
                t,
                2 as libc::c_int,
                3.14159f64,
                c"abcdef".as_ptr(),
                c"ab".as_ptr(),
                c"cd".as_ptr(),
                (70000 + t) as libc::c_int,
                (300 + t) as libc::c_int,
                t,
            )
        };
        want.push_str(std::str::from_utf8(&buf[..len as usize]).unwrap());
    }
    for t in 0..3 {
        want.push_str(&format!("second {}\n", t * 10));
    }
    assert_eq!(got, want);
}

/// Device `malloc`/`free` and `new`/`delete` from the device heap; a block outlives the
/// launch that allocated it; a memory without a heap fails such a kernel by name.
#[test]
fn device_heap() {
    let n = 256;
    let a = words(n, 0x4242, INT_SPECIALS);
    let b: Vec<u32> = (0..n as u32).map(|i| i * 7).collect();
    let m = module();
    let mut mem = VecMemory::new(BASE, 5 * MB).with_heap(MB as u64);
    for (k, v) in [&a, &b].iter().enumerate() {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(k * MB, &bytes);
    }
    let params: Vec<u8> = (0..4u64)
        .flat_map(|k| (BASE + k * MB as u64).to_le_bytes())
        .collect();
    let cfg = |threads: u32| LaunchConfig {
        grid: [threads.div_ceil(64), 1, 1],
        block: [threads.min(64), 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("heap_ops", &cfg(n as u32), &params, &mem, &|_| None)
        .unwrap();
    let out: Vec<u32> = mem
        .read(3 * MB, 8 * n)
        .chunks(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    for t in 0..n {
        let len = 4 + (a[t] & 7) as i32;
        let sum = (0..len).fold(0i32, |s, j| s.wrapping_add((a[t] as i32).wrapping_add(j)));
        assert_eq!(out[2 * t] as i32, sum, "malloc'd block of thread {t}");
        assert_eq!(
            f32::from_bits(out[2 * t + 1]),
            1.5 + b[t] as f32,
            "new[] of thread {t}"
        );
    }
    // A block kept across launches, then freed by another kernel.
    let slot = BASE + 3 * MB as u64;
    let p1: Vec<u8> = slot.to_le_bytes().to_vec();
    m.launch("heap_keep", &cfg(1), &p1, &mem, &|_| None)
        .unwrap();
    let p2: Vec<u8> = slot
        .to_le_bytes()
        .iter()
        .chain((slot + 64).to_le_bytes().iter())
        .copied()
        .collect();
    m.launch("heap_take", &cfg(1), &p2, &mem, &|_| None)
        .unwrap();
    assert_eq!(&mem.read(3 * MB + 64, 4)[..], &1234i32.to_le_bytes()[..]);
    // Freeing it again is a fault.
    let e = m
        .launch("heap_take", &cfg(1), &p2, &mem, &|_| None)
        .unwrap_err();
    assert!(matches!(e, ExecError::IllegalAddress(_)), "{e}");
    // Without a heap: an error naming it.
    let bare = VecMemory::new(BASE, 4 * MB);
    let e = m
        .launch("heap_keep", &cfg(1), &p1, &bare, &|_| None)
        .unwrap_err();
    assert!(
        matches!(&e, ExecError::Unsupported(t) if t.contains("malloc")),
        "{e}"
    );
}

/// `alloca` blocks (used by a callee with a frame of its own), `stacksave`/`stackrestore`,
/// and `slct`.
#[test]
fn alloca_stack_and_slct() {
    let n = 256;
    let a = words(n, 0x6161, INT_SPECIALS);
    let b = words(n, 0x6262, INT_SPECIALS);
    let c = words(n, 0x6363, INT_SPECIALS);
    let got = run("stack_ops", 4, &a, &b, &c);
    check(
        "stack_ops",
        &got,
        &[
            "alloca'd buffer sum",
            "alloca'd buffer last",
            "stacksave/restore",
            "slct.s32",
        ],
        |t, k| {
            let len = 1 + (a[t] & 15) as i32;
            let t32 = t as i32;
            let elem = |i: i32| i.wrapping_mul(t32).wrapping_add(t32 + (i & 3));
            Some(match k {
                0 => (0..len).fold(0i32, |s, i| s.wrapping_add(elem(i))) as u32,
                1 => elem(len - 1) as u32,
                2 => 1,
                3 => {
                    if (c[t] as i32) >= 0 {
                        a[t]
                    } else {
                        b[t]
                    }
                }
                _ => return None,
            })
        },
        |_, g, w| g == w,
    );
}

/// `mma.sync.m16n8k32` with fp8 operands (e4m3 A, e5m2 B, f32 accumulators), as cuBLASLt's
/// fp8 GEMMs use it, against the product computed here from the fp8 definitions.
#[test]
fn mma_fp8() {
    let mut s = 0x0f8f_8f8fu32;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    // Finite codes only: e4m3 without 0x7f/0xff, e5m2 below its infinities.
    let a: Vec<u32> = (0..128)
        .map(|_| {
            u32::from_le_bytes([0u8; 4].map(|_| (next() % 0x7f) as u8 | ((next() & 1) << 7) as u8))
        })
        .collect();
    let b: Vec<u32> = (0..128)
        .map(|_| {
            u32::from_le_bytes([0u8; 4].map(|_| (next() % 0x7c) as u8 | ((next() & 1) << 7) as u8))
        })
        .collect();
    let c: Vec<u32> = (0..128).map(|k| ((k % 9) as f32 - 4.0).to_bits()).collect();
    let mut mem = VecMemory::new(BASE, 4 * MB);
    for (k, v) in [&a, &b, &c].iter().enumerate() {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(k * MB, &bytes);
    }
    let params: Vec<u8> = (0..4u64)
        .flat_map(|k| (BASE + k * MB as u64).to_le_bytes())
        .collect();
    module()
        .launch(
            "mma_fp8",
            &LaunchConfig {
                grid: [1, 1, 1],
                block: [32, 1, 1],
                dynamic_shared_bytes: 0,
            },
            &params,
            &mem,
            &|_| None,
        )
        .unwrap();
    let out: Vec<u32> = mem
        .read(3 * MB, 4 * 128)
        .chunks(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    let byte = |v: &[u32], i: usize| (v[i / 4] >> (8 * (i % 4))) & 0xff;
    for r in 0..16 {
        for col in 0..8 {
            let d = (0..32).fold(f32::from_bits(c[r * 8 + col]) as f64, |s, k| {
                s + fp8_val(byte(&a, r * 32 + k), true) * fp8_val(byte(&b, col * 32 + k), false)
            });
            assert_eq!(
                out[r * 8 + col],
                (d as f32).to_bits(),
                "D[{r}][{col}]: got {}, want {d}",
                f32::from_bits(out[r * 8 + col])
            );
        }
    }
}

/// Predicate logic with an immediate operand: nvcc negates a predicate with
/// `xor.pred %p, %q, -1;` (any nonzero immediate is true), as in cooperative groups'
/// `coalesced_group::ballot(!x)`.
#[test]
fn predicate_logic_with_immediates() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 out, .param .u32 v) {\n\
        .reg .pred %p<8>;\n .reg .b32 %r<8>;\n .reg .b64 %rd<2>;\n\
        ld.param.u64 %rd1, [out];\n ld.param.u32 %r1, [v];\n\
        setp.ne.u32 %p1, %r1, 0;\n\
        xor.pred %p2, %p1, -1;\n and.pred %p3, %p1, -1;\n or.pred %p4, %p1, 0;\n xor.pred %p5, %p1, 1;\n\
        selp.u32 %r2, 1, 0, %p2;\n selp.u32 %r3, 1, 0, %p3;\n selp.u32 %r4, 1, 0, %p4;\n selp.u32 %r5, 1, 0, %p5;\n\
        st.global.v4.u32 [%rd1], {%r2, %r3, %r4, %r5};\n ret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    for v in [0u32, 1] {
        let mem = VecMemory::new(0x1000, 64);
        let mut params = 0x1000u64.to_le_bytes().to_vec();
        params.extend_from_slice(&v.to_le_bytes());
        let cfg = gpufuse_ptx::LaunchConfig {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            dynamic_shared_bytes: 0,
        };
        m.launch("k", &cfg, &params, &mem, &|_| None).unwrap();
        let got: Vec<u8> = mem.read(0, 16).chunks(4).map(|c| c[0]).collect();
        let p = v as u8;
        assert_eq!(got, [1 - p, p, p, 1 - p], "v = {v}");
    }
}
