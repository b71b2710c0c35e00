//! Directed rounding modifiers (`.rz`, `.rm`, `.rp`) of float arithmetic and conversions, run
//! as one-instruction kernels and checked against known values.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

/// Runs `body` in a one-thread kernel whose `%rd1` holds the output address; the body leaves
/// its result in `%f1` (f32) or `%fd1` (f64), stored as `store` (`f32` or `f64`).
fn run(body: &str, store: &str) -> Result<u64, ExecError> {
    let reg = if store == "f32" { "%f1" } else { "%fd1" };
    let ptx = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 out)\n{{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n\
         .reg .f32 %f<4>;\n.reg .f64 %fd<4>;\n.reg .b16 %h<4>;\n\
         ld.param.u64 %rd1, [out];\n{body}\nst.global.{store} [%rd1], {reg};\nret;\n}}\n"
    );
    let m = Module::parse(&ptx).unwrap();
    let mem = VecMemory::new(BASE, 64);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)?;
    Ok(u64::from_le_bytes(mem.read(0, 8).try_into().unwrap()))
}

fn f32_of(body: &str) -> f32 {
    f32::from_bits(run(body, "f32").unwrap() as u32)
}

fn f64_of(body: &str) -> f64 {
    f64::from_bits(run(body, "f64").unwrap())
}

fn up32(x: f32) -> f32 {
    f32::from_bits(x.to_bits() + 1)
}

fn f32imm(x: f32) -> String {
    format!("0f{:08X}", x.to_bits())
}

fn f64imm(x: f64) -> String {
    format!("0d{:016X}", x.to_bits())
}

#[test]
fn add_sub_f32() {
    let (one, tiny) = (f32imm(1.0), f32imm(2f32.powi(-30)));
    let add = |m: &str| f32_of(&format!("add{m}.f32 %f1, {one}, {tiny};"));
    assert_eq!(add(".rz"), 1.0);
    assert_eq!(add(".rm"), 1.0);
    assert_eq!(add(".rn"), 1.0);
    assert_eq!(add(""), 1.0);
    assert_eq!(add(".rp"), up32(1.0));
    // Negative results: toward zero is up, down is away from zero.
    let (mone, mtiny) = (f32imm(-1.0), f32imm(-(2f32.powi(-30))));
    let sub = |m: &str| f32_of(&format!("sub{m}.f32 %f1, {mone}, {tiny};"));
    assert_eq!(sub(".rz"), -1.0);
    assert_eq!(sub(".rp"), -1.0);
    assert_eq!(sub(".rm"), -up32(1.0));
    let add = |m: &str| f32_of(&format!("add{m}.ftz.f32 %f1, {mone}, {mtiny};"));
    assert_eq!(add(".rm"), -up32(1.0));
    assert_eq!(add(".rz"), -1.0);
    // Overflow: only rounding up (or to nearest) reaches infinity.
    let max = f32imm(f32::MAX);
    let add = |m: &str| f32_of(&format!("add{m}.f32 %f1, {max}, {max};"));
    assert_eq!(add(".rz"), f32::MAX);
    assert_eq!(add(".rm"), f32::MAX);
    assert_eq!(add(".rp"), f32::INFINITY);
    assert_eq!(add(".rn"), f32::INFINITY);
    // An exact zero sum is -0 rounding down, +0 otherwise.
    let z = f32_of(&format!("add.rm.f32 %f1, {one}, {mone};"));
    assert!(z == 0.0 && z.is_sign_negative());
    let z = f32_of(&format!("add.rz.f32 %f1, {one}, {mone};"));
    assert!(z == 0.0 && z.is_sign_positive());
}

#[test]
fn mul_div_sqrt_rcp() {
    // (1 + 2^-52)^2 = 1 + 2^-51 + 2^-104.
    let x = f64imm(1.0 + f64::EPSILON);
    let mul = |m: &str| f64_of(&format!("mul{m}.f64 %fd1, {x}, {x};"));
    let lo = 1.0 + 2.0 * f64::EPSILON;
    assert_eq!(mul(".rm"), lo);
    assert_eq!(mul(".rz"), lo);
    assert_eq!(mul(".rn"), lo);
    assert_eq!(mul(".rp"), f64::from_bits(lo.to_bits() + 1));
    let mx = f64imm(-(1.0 + f64::EPSILON));
    assert_eq!(
        f64_of(&format!("mul.rm.f64 %fd1, {mx}, {x};")),
        -f64::from_bits(lo.to_bits() + 1)
    );
    assert_eq!(f64_of(&format!("mul.rz.f64 %fd1, {mx}, {x};")), -lo);
    // 1/3 in f32 rounds up to nearest.
    let (one, three) = (f32imm(1.0), f32imm(3.0));
    let div = |m: &str| f32_of(&format!("div{m}.f32 %f1, {one}, {three};")).to_bits();
    assert_eq!(div(".rn"), 0x3EAA_AAAB);
    assert_eq!(div(".rp"), 0x3EAA_AAAB);
    assert_eq!(div(".rm"), 0x3EAA_AAAA);
    assert_eq!(div(".rz"), 0x3EAA_AAAA);
    let rcp = |m: &str| f32_of(&format!("rcp{m}.f32 %f1, {three};")).to_bits();
    assert_eq!(
        (rcp(".rn"), rcp(".rz"), rcp(".rp")),
        (0x3EAA_AAAB, 0x3EAA_AAAA, 0x3EAA_AAAB)
    );
    let rcp = |m: &str| f64_of(&format!("rcp{m}.f64 %fd1, {};", f64imm(-3.0))).to_bits();
    // -1/3 to nearest lies above the exact value (1/3 rounds down).
    assert_eq!(rcp(".rp"), (-1.0f64 / 3.0).to_bits());
    assert_eq!(rcp(".rz"), (-1.0f64 / 3.0).to_bits());
    assert_eq!(rcp(".rm"), (-1.0f64 / 3.0).to_bits() + 1);
    // sqrt(2) rounds up to nearest in f64.
    let two = f64imm(2.0);
    let sqrt = |m: &str| f64_of(&format!("sqrt{m}.f64 %fd1, {two};")).to_bits();
    assert_eq!(sqrt(".rn"), 0x3FF6_A09E_667F_3BCD);
    assert_eq!(sqrt(".rp"), 0x3FF6_A09E_667F_3BCD);
    assert_eq!(sqrt(".rm"), 0x3FF6_A09E_667F_3BCC);
    assert_eq!(sqrt(".rz"), 0x3FF6_A09E_667F_3BCC);
    // A product that overflows: toward zero stays finite.
    let big = f64imm(1e300);
    assert_eq!(f64_of(&format!("mul.rz.f64 %fd1, {big}, {big};")), f64::MAX);
    assert_eq!(
        f64_of(&format!("mul.rp.f64 %fd1, {big}, {big};")),
        f64::INFINITY
    );
}

#[test]
fn fused_multiply_add() {
    let (one, tiny) = (f32imm(1.0), f32imm(2f32.powi(-60)));
    let fma = |m: &str, c: &str| f32_of(&format!("fma{m}.f32 %f1, {one}, {one}, {c};"));
    assert_eq!(fma(".rn", &tiny), 1.0);
    assert_eq!(fma(".rz", &tiny), 1.0);
    assert_eq!(fma(".rp", &tiny), up32(1.0));
    let mtiny = f32imm(-(2f32.powi(-60)));
    assert_eq!(fma(".rm", &mtiny), f32::from_bits(1.0f32.to_bits() - 1));
    assert_eq!(fma(".rp", &mtiny), 1.0);
    let (one, tiny) = (f64imm(1.0), f64imm(2f64.powi(-100)));
    let fma = |m: &str| f64_of(&format!("mad{m}.f64 %fd1, {one}, {one}, {tiny};"));
    assert_eq!(fma(".rn"), 1.0);
    assert_eq!(fma(".rm"), 1.0);
    assert_eq!(fma(".rp"), f64::from_bits(1.0f64.to_bits() + 1));
}

#[test]
fn conversions() {
    // 0.1 in f32 rounds up to nearest.
    let x = f64imm(0.1);
    let cvt = |m: &str| f32_of(&format!("mov.f64 %fd2, {x};\ncvt{m}.f32.f64 %f1, %fd2;")).to_bits();
    assert_eq!(cvt(".rn"), 0x3DCC_CCCD);
    assert_eq!(cvt(".rz"), 0x3DCC_CCCC);
    assert_eq!(cvt(".rm"), 0x3DCC_CCCC);
    assert_eq!(cvt(".rp"), 0x3DCC_CCCD);
    // 2^40 + 1: f32 steps are 2^17 there.
    let n: i64 = (1 << 40) + 1;
    let cvt = |m: &str, v: i64| f32_of(&format!("mov.b64 %rd2, {v};\ncvt{m}.f32.s64 %f1, %rd2;"));
    let (lo, hi) = ((1u64 << 40) as f32, ((1u64 << 40) + (1 << 17)) as f32);
    assert_eq!(cvt(".rn", n), lo);
    assert_eq!(cvt(".rm", n), lo);
    assert_eq!(cvt(".rz", n), lo);
    assert_eq!(cvt(".rp", n), hi);
    assert_eq!(cvt(".rz", -n), -lo);
    assert_eq!(cvt(".rm", -n), -hi);
    assert_eq!(cvt(".rp", -n), -lo);
    // 2^62 + 1 to f64: steps of 2^10.
    let n: i64 = (1 << 62) + 1;
    let cvt = |m: &str| f64_of(&format!("mov.b64 %rd2, {n};\ncvt{m}.f64.s64 %fd1, %rd2;"));
    assert_eq!(cvt(".rn"), (1u64 << 62) as f64);
    assert_eq!(cvt(".rp"), ((1u64 << 62) + (1 << 10)) as f64);
    // u32::MAX to f32.
    let cvt = |m: &str| f32_of(&format!("mov.b32 %r2, -1;\ncvt{m}.f32.u32 %f1, %r2;"));
    assert_eq!(cvt(".rm"), 4294967040.0);
    assert_eq!(cvt(".rz"), 4294967040.0);
    assert_eq!(cvt(".rp"), 4294967296.0);
    assert_eq!(cvt(".rn"), 4294967296.0);
    // To nearest, a 64-bit integer is rounded once (not via f64): 2^63 + 2^39 + 1.
    let v: u64 = (1 << 63) + (1 << 39) + 1;
    let got = f32_of(&format!("mov.b64 %rd2, {v};\ncvt.rn.f32.u64 %f1, %rd2;"));
    assert_eq!(got, ((1u64 << 63) + (1 << 40)) as f32);
}

/// Directed rounding the VM does not implement fails, naming the instruction.
#[test]
fn unsupported_directed_rounding_fails() {
    for body in [
        "mov.b16 %h1, 0x3C00;\nadd.rz.f16 %h2, %h1, %h1;\nmov.f32 %f1, 0f00000000;",
        "mov.b32 %r1, 0x3C003C00;\nadd.rm.f16x2 %r2, %r1, %r1;\nmov.f32 %f1, 0f00000000;",
        "mov.b16 %h1, 0x3C00;\nmul.rp.f16 %h2, %h1, %h1;\nmov.f32 %f1, 0f00000000;",
    ] {
        let e = run(body, "f32").unwrap_err();
        assert!(matches!(e, ExecError::Unsupported(_)), "{body}: {e}");
    }
}
