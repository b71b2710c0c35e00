//! The instruction forms the interpreter specializes at load time (`exec/spec/`) compute what
//! the general path computes: each kernel here runs once as loaded and once with every
//! instruction on the general path ([`Module::without_fast_forms`]), and the two leave the
//! same device memory, or fail with the same error. Operands are registers with garbage above
//! their width, immediates, a destination that is also a source; lanes are predicated off;
//! warps are full and partial; values include zeros, extremes, NaNs, infinities and
//! subnormals.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;
/// Threads of the block: one full warp and one of 13 lanes.
const THREADS: u32 = 45;
/// Input words: 4 per thread slot, 64 slots.
const INPUT: usize = 4 * 64 * 8;
/// Each result slot holds a word per thread slot.
const SLOT: usize = 64 * 8;
/// Where the module's `.global` variable `gbuf` lies (input words no thread reads).
const GBUF: u64 = BASE + 448;
/// The third parameter: bytes with their top bit set, for signed parameter loads.
const NEG: u64 = 0x8f8e_8d8c_8b8a_8988;

/// The input words: special values and pseudo-random ones, with random high bits.
fn inputs() -> Vec<u8> {
    let special: [u64; 24] = [
        0,
        1,
        u64::MAX,
        0xffff_ffff,
        0x8000_0000,
        0x7fff_ffff,
        0x8000_0000_0000_0000,
        0x7fff_ffff_ffff_ffff,
        0x7fc0_0000,           // f32 NaN
        0xff80_0000,           // f32 -inf
        0x7f80_0000,           // f32 inf
        0x0000_0001,           // f32 subnormal
        0x3f80_0000,           // 1.0f
        0xbf80_0000,           // -1.0f
        0x7ff8_0000_0000_0000, // f64 NaN
        0x3ff0_0000_0000_0000, // 1.0
        0xfff0_0000_0000_0000, // -inf
        0x4f00_0000,           // 2^31 as f32
        0xcf00_0001,           // below -2^31 as f32
        31,
        32,
        33,
        64,
        0xffff_8000,
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..INPUT / 8)
        .map(|i| {
            let r = next();
            match i % 3 {
                0 => special[(r % special.len() as u64) as usize],
                1 => (special[(r % special.len() as u64) as usize]) | (next() << 40),
                _ => r >> (r % 61),
            }
        })
        .flat_map(|v: u64| v.to_le_bytes())
        .collect()
}

/// A kernel: `%rd1..%rd4` are this thread's input words, `%rd10` its output word in slot 0,
/// `%p1` true in every third lane; `body` follows.
fn kernel(body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .shared .align 16 .b8 sbuf[1024];\n.global .align 8 .b8 gbuf[64];\n\
         .visible .entry k(.param .u64 in, .param .u64 out, .param .u64 neg)\n{{\n\
         .reg .b64 %rd<64>;\n.reg .b32 %r<64>;\n.reg .f32 %f<64>;\n.reg .f64 %fd<64>;\n\
         .reg .pred %p<8>;\n.reg .b16 %h<16>;\n\
         ld.param.u64 %rd5, [in];\nld.param.u64 %rd6, [out];\n\
         mov.u32 %r1, %tid.x;\ncvt.u64.u32 %rd7, %r1;\nshl.b64 %rd8, %rd7, 3;\n\
         add.u64 %rd9, %rd5, %rd8;\nadd.u64 %rd10, %rd6, %rd8;\n\
         ld.global.u64 %rd1, [%rd9];\nld.global.u64 %rd2, [%rd9+512];\n\
         ld.global.u64 %rd3, [%rd9+1024];\nld.global.u64 %rd4, [%rd9+1536];\n\
         rem.u32 %r2, %r1, 3;\nsetp.eq.u32 %p1, %r2, 0;\n\
         mov.u64 %rd11, sbuf;\nshl.b64 %rd12, %rd7, 4;\nadd.u64 %rd13, %rd11, %rd12;\n\
         {body}\nret;\n}}\n"
    )
}

/// Runs `body` on the loaded module and on the general path: both memories, or both errors.
fn both(body: &str, out_slots: usize) -> Vec<u8> {
    let text = kernel(body);
    let fast = Module::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(fast.unsupported().count(), 0, "{text}");
    let general = Module::parse(&text).unwrap().without_fast_forms();
    let run = |m: &Module| -> (Result<(), ExecError>, Vec<u8>) {
        let len = INPUT + out_slots * SLOT;
        let mut mem = VecMemory::new(BASE, len);
        mem.write(0, &inputs());
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let mut params = BASE.to_le_bytes().to_vec();
        params.extend((BASE + INPUT as u64).to_le_bytes());
        params.extend(NEG.to_le_bytes());
        let r = m
            .launch("k", &cfg, &params, &mem, &|name| {
                (name == "gbuf").then_some(GBUF)
            })
            .map(|_| ());
        (r, mem.read(0, len))
    };
    let (rf, mf) = run(&fast);
    let (rg, mg) = run(&general);
    assert_eq!(rf, rg, "{body}");
    if let Some(i) = (0..mf.len()).find(|&i| mf[i] != mg[i]) {
        let slot = (i - INPUT) / SLOT;
        let lane = (i - INPUT) % SLOT / 8;
        panic!(
            "slot {slot} lane {lane}: fast {:x?} general {:x?}\n{body}",
            &mf[i & !7..(i & !7) + 8],
            &mg[i & !7..(i & !7) + 8]
        );
    }
    mf
}

/// Each instruction template (`D` the destination, `A`, `B`, `C` sources) in several operand
/// shapes, each result stored to a slot of its own; predicated-off lanes keep `%rd4`.
fn run_templates(templates: &[&str]) {
    let shapes: [[&str; 3]; 6] = [
        ["%rd1", "%rd2", "%rd3"],
        ["%rd1", "7", "%rd3"],
        ["%rd2", "%rd3", "-3"],
        ["33", "%rd1", "%rd2"],
        ["%rd3", "%rd3", "%rd3"],
        ["%rd4", "0x80000001", "%rd1"],
    ];
    let mut body = String::new();
    let mut slot = 0;
    for t in templates {
        for (k, [a, b, c]) in shapes.iter().enumerate() {
            // Immediates only where PTX takes them (not as the first source of most forms);
            // the VM takes them anywhere, the two paths alike.
            for guarded in [false, true] {
                let d = format!("%rd{}", 20 + slot % 40);
                let inst = t.replace('A', a).replace('B', b).replace('C', c);
                body += &format!("mov.b64 {d}, %rd4;\n");
                // A destination that is also a source (shape 4 reads D as A).
                let inst = if k == 4 {
                    body += &format!("mov.b64 {d}, %rd3;\n");
                    inst.replacen("%rd3", &d, 1)
                } else {
                    inst
                };
                let inst = inst.replace('D', &d);
                if guarded {
                    body += "@%p1 ";
                }
                body += &format!("{inst};\nst.global.u64 [%rd10+{}], {d};\n", slot * SLOT);
                slot += 1;
            }
        }
    }
    both(&body, slot);
}

#[test]
fn integer_arithmetic_matches_the_general_path() {
    let mut t = Vec::new();
    for ty in ["s32", "u32", "s64", "u64", "s16", "u16", "b32", "b64"] {
        t.push(format!("add.{ty} D, A, B"));
        t.push(format!("sub.{ty} D, A, B"));
        if !ty.starts_with('b') {
            t.push(format!("mul.lo.{ty} D, A, B"));
            t.push(format!("mul.hi.{ty} D, A, B"));
            t.push(format!("div.{ty} D, A, B"));
            t.push(format!("rem.{ty} D, A, B"));
            t.push(format!("mad.lo.{ty} D, A, B, C"));
            t.push(format!("min.{ty} D, A, B"));
            t.push(format!("max.{ty} D, A, B"));
        }
        t.push(format!("and.{ty} D, A, B"));
        t.push(format!("or.{ty} D, A, B"));
        t.push(format!("xor.{ty} D, A, B"));
        t.push(format!("shl.{ty} D, A, B"));
        t.push(format!("shr.{ty} D, A, B"));
    }
    for ty in ["s32", "s64", "s16"] {
        t.push(format!("abs.{ty} D, A"));
        t.push(format!("neg.{ty} D, A"));
    }
    for ty in ["b32", "b64", "b16", "pred"] {
        t.push(format!("not.{ty} D, A"));
    }
    t.push("cnot.b32 D, A".into());
    for op in ["and", "or", "xor"] {
        t.push(format!("{op}.pred D, A, B"));
    }
    for ty in ["s32", "u32", "s16", "u16"] {
        t.push(format!("mul.wide.{ty} D, A, B"));
        t.push(format!("mad.wide.{ty} D, A, B, C"));
    }
    let t: Vec<&str> = t.iter().map(String::as_str).collect();
    run_templates(&t);
}

#[test]
fn float_arithmetic_matches_the_general_path() {
    let mut t = Vec::new();
    for ty in ["f32", "f64"] {
        t.push(format!("add.{ty} D, A, B"));
        t.push(format!("sub.{ty} D, A, B"));
        t.push(format!("mul.{ty} D, A, B"));
        t.push(format!("div.rn.{ty} D, A, B"));
        t.push(format!("fma.rn.{ty} D, A, B, C"));
        t.push(format!("mad.rn.{ty} D, A, B, C"));
    }
    for ty in ["f32", "f64"] {
        for f in ["abs", "neg", "rcp.rn", "sqrt.rn", "rsqrt.approx"] {
            t.push(format!("{f}.{ty} D, A"));
        }
    }
    for f in [
        "sin.approx",
        "cos.approx",
        "ex2.approx",
        "lg2.approx",
        "tanh.approx",
    ] {
        t.push(format!("{f}.f32 D, A"));
    }
    t.push("ex2.approx.ftz.f32 D, A".into());
    t.push("abs.f16 D, A".into());
    t.push("div.full.f32 D, A, B".into());
    t.push("div.approx.f32 D, A, B".into());
    // Forms that keep the general path, beside them.
    t.push("add.rz.f32 D, A, B".into());
    t.push("add.sat.s32 D, A, B".into());
    t.push("min.f32 D, A, B".into());
    let t: Vec<&str> = t.iter().map(String::as_str).collect();
    run_templates(&t);
}

#[test]
fn comparisons_selects_moves_and_conversions_match_the_general_path() {
    let mut t: Vec<String> = Vec::new();
    for ty in ["s32", "u32", "s64", "u64", "s16", "b32", "b64"] {
        for c in ["eq", "ne", "lt", "le", "gt", "ge"] {
            t.push(format!("setp.{c}.{ty} %p2, A, B;\nselp.u64 D, 11, 22, %p2"));
        }
    }
    for ty in ["u32", "u64", "b32"] {
        for c in ["lo", "ls", "hi", "hs"] {
            t.push(format!("setp.{c}.{ty} %p2, A, B;\nselp.u64 D, 11, 22, %p2"));
        }
    }
    for ty in ["f32", "f64"] {
        for c in [
            "eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num",
            "nan",
        ] {
            t.push(format!("setp.{c}.{ty} %p2, A, B;\nselp.u64 D, 11, 22, %p2"));
        }
    }
    // Predicates straight into a register, a negated predicate, a combined comparison.
    t.push("setp.lt.s32 D, A, B".into());
    t.push("setp.lt.s32 %p2, A, B;\nselp.b32 D, A, B, !%p2".into());
    t.push("setp.lt.and.s32 %p2, A, B, %p1;\nselp.b64 D, A, B, %p2".into());
    for ty in ["b32", "b64", "f32", "u16", "s64"] {
        t.push(format!("setp.ne.u32 %p2, C, 0;\nselp.{ty} D, A, B, %p2"));
        t.push(format!("selp.{ty} D, A, B, C"));
        t.push(format!("mov.{ty} D, A"));
    }
    for (d, s) in [
        ("u64", "u32"),
        ("s64", "s32"),
        ("u32", "u64"),
        ("s32", "s64"),
        ("u16", "u32"),
        ("s16", "s32"),
        ("s32", "s16"),
        ("u32", "s8"),
        ("s8", "u32"),
        ("rn.f32.s32", ""),
        ("rn.f32.u32", ""),
        ("rn.f32.s64", ""),
        ("rzi.s32.f32", ""),
        ("rni.s32.f32", ""),
        ("rmi.u32.f32", ""),
        ("rzi.s64.f64", ""),
        ("f64.f32", ""),
        ("rn.f32.f64", ""),
        ("rn.f64.s32", ""),
        ("rn.f16.f32", ""),
        ("f32.f16", ""),
        ("sat.u8.s32", ""),
        ("rz.f32.f64", ""),
    ] {
        let ty = if s.is_empty() {
            d.to_string()
        } else {
            format!("{d}.{s}")
        };
        t.push(format!("cvt.{ty} D, A"));
    }
    // Special registers and kernel parameters (one value for every lane).
    for r in [
        "%tid.x",
        "%tid.y",
        "%ntid.x",
        "%ctaid.x",
        "%nctaid.y",
        "%laneid",
        "%warpid",
        "%lanemask_lt",
        "%lanemask_ge",
        "%dynamic_smem_size",
    ] {
        t.push(format!("mov.u32 D, {r}"));
        t.push(format!("mov.u16 D, {r}"));
    }
    for p in [
        "u64 D, [in]",
        "u32 D, [in+4]",
        "s32 D, [out+4]",
        "s8 D, [in+5]",
        "u8 D, [in+5]",
        "s16 D, [out+2]",
        "b16 D, [out+6]",
        "s8 D, [neg+1]",
        "s16 D, [neg+2]",
        "s32 D, [neg+4]",
        "u32 D, [neg+4]",
        "s64 D, [neg]",
    ] {
        t.push(format!("ld.param.{p}"));
    }
    let t: Vec<&str> = t.iter().map(String::as_str).collect();
    run_templates(&t);
}

/// Loads and stores of every width, signedness and vector length, in shared and global
/// memory, each after a predicated-off store of other values.
#[test]
fn loads_and_stores_match_the_general_path() {
    let mut body = String::new();
    let mut slot = 0;
    // %rd13: this lane's 16 bytes of shared memory; %rd14 its mirror lane's.
    body += "sub.u64 %rd15, 44, %rd7;\nshl.b64 %rd15, %rd15, 4;\nadd.u64 %rd14, %rd11, %rd15;\n";
    // %rd16: this lane's 16 bytes of global memory past the results, %rd17 the mirror's.
    let scratch = 180 * SLOT;
    body += &format!(
        "shl.b64 %rd18, %rd7, 4;\nadd.u64 %rd16, %rd6, {scratch};\nadd.u64 %rd16, %rd16, %rd18;\n\
         add.u64 %rd17, %rd6, {scratch};\nadd.u64 %rd17, %rd17, %rd15;\n"
    );
    let mut out = |body: &mut String, regs: &[&str]| {
        for r in regs {
            *body += &format!("st.global.u64 [%rd10+{}], {r};\n", slot * SLOT);
            slot += 1;
        }
    };
    for (space, mine, mirror) in [("shared", "%rd13", "%rd14"), ("global", "%rd16", "%rd17")] {
        for ty in [
            "u8", "s8", "u16", "s16", "u32", "s32", "f32", "u64", "s64", "b64",
        ] {
            // Fill the lane's 16 bytes, then store one element at +4/+8 (guarded: other value).
            body += &format!("st.{space}.v2.u64 [{mine}], {{%rd1, %rd2}};\n");
            let at = if ty.ends_with("64") { 8 } else { 4 };
            body += &format!("st.{space}.{ty} [{mine}+{at}], %rd3;\n");
            body += &format!("@%p1 st.{space}.{ty} [{mine}+{at}], %rd4;\n");
            body += "bar.sync 0;\n";
            body += &format!("mov.b64 %rd30, %rd4;\nld.{space}.{ty} %rd30, [{mirror}+{at}];\n");
            body += &format!("mov.b64 %rd31, %rd4;\n@%p1 ld.{space}.{ty} %rd31, [{mine}];\n");
            body += &format!(
                "ld.{space}.u64 %rd32, [{mirror}];\nld.{space}.u64 %rd33, [{mirror}+8];\n"
            );
            out(&mut body, &["%rd30", "%rd31", "%rd32", "%rd33"]);
            body += "bar.sync 0;\n";
        }
        for (v, ty) in [
            ("v2", "u32"),
            ("v4", "u32"),
            ("v2", "f32"),
            ("v4", "s16"),
            ("v2", "u64"),
            ("v4", "u8"),
        ] {
            let n = match v {
                "v2" => 2,
                _ => 4,
            };
            let regs: Vec<String> = (0..n).map(|k| format!("%rd{}", 40 + k)).collect();
            let srcs: Vec<String> = (0..n).map(|k| format!("%rd{}", 1 + k % 4)).collect();
            body += &format!("st.{space}.v2.u64 [{mine}], {{%rd3, %rd4}};\n");
            body += &format!("st.{space}.{v}.{ty} [{mine}], {{{}}};\n", srcs.join(", "));
            body += &format!("@%p1 st.{space}.{v}.{ty} [{mine}], {{{}}};\n", {
                let mut s = srcs.clone();
                s.reverse();
                s.join(", ")
            });
            body += "bar.sync 0;\n";
            for r in &regs {
                body += &format!("mov.b64 {r}, %rd4;\n");
            }
            body += &format!("ld.{space}.{v}.{ty} {{{}}}, [{mirror}];\n", regs.join(", "));
            let rs: Vec<&str> = regs.iter().map(String::as_str).collect();
            out(&mut body, &rs);
            body += &format!(
                "@%p1 ld.{space}.{v}.{ty} {{{}}}, [{mine}];\n",
                regs.join(", ")
            );
            out(&mut body, &rs);
            body += "bar.sync 0;\n";
        }
        // Addresses that are a variable plus an offset (every lane the same).
        let var = if space == "shared" { "sbuf" } else { "gbuf" };
        body += &format!("@%p1 st.{space}.u32 [{var}+8], %rd1;\nbar.sync 0;\n");
        body += &format!(
            "ld.{space}.u32 %rd36, [{var}+8];\nld.{space}.v2.u32 {{%rd37, %rd38}}, [{var}+8];\n"
        );
        body += &format!("mov.b64 %rd39, %rd4;\n@%p1 ld.{space}.s16 %rd39, [{var}+10];\n");
        out(&mut body, &["%rd36", "%rd37", "%rd38", "%rd39"]);
        body += "bar.sync 0;\n";
        // An immediate stored, a load whose address register is its destination.
        body += &format!("st.{space}.u32 [{mine}], 0x12345678;\nst.{space}.u64 [{mine}+8], -2;\n");
        body += &format!("mov.b64 %rd34, {mine};\nld.{space}.u32 %rd34, [%rd34];\n");
        body += &format!("mov.b64 %rd35, {mine};\nld.{space}.u64 %rd35, [%rd35+8];\n");
        out(&mut body, &["%rd34", "%rd35"]);
        body += "bar.sync 0;\n";
    }
    assert!(slot < 180, "{slot} result slots");
    both(&body, 182);
}

/// A running lane out of range, misaligned or in another space: the same error on both paths
/// (the specialized form declines, the general path reports it); predicated-off lanes may
/// hold any address.
#[test]
fn faults_match_the_general_path() {
    let cases = [
        // Shared, past the end (1024 bytes and the reserved 1024), every width, load and store.
        "@%p1 add.u64 %rd13, %rd13, 2048;\nld.shared.u32 %rd30, [%rd13];",
        "@%p1 mov.u64 %rd13, 2040;\nld.shared.u64 %rd30, [%rd13+8];",
        "@%p1 mov.u64 %rd13, 2048;\nld.shared.u8 %rd30, [%rd13];",
        "@%p1 add.u64 %rd13, %rd13, 4096;\nst.shared.u16 [%rd13], %rd1;",
        "@%p1 mov.u64 %rd13, 2048;\nld.shared.v4.u32 {%r1, %r2, %r3, %r4}, [%rd13];",
        "@%p1 mov.u64 %rd13, 2048;\nst.shared.v2.u64 [%rd13], {%rd1, %rd2};",
        "@%p1 mov.u64 %rd13, -4;\nld.shared.u32 %rd30, [%rd13];",
        "@%p1 mov.u64 %rd13, -4;\nst.shared.u32 [%rd13], %rd1;",
        // Misaligned.
        "@%p1 add.u64 %rd13, %rd13, 2;\nld.shared.u32 %rd30, [%rd13];",
        "@%p1 add.u64 %rd13, %rd13, 4;\nst.shared.u64 [%rd13], %rd1;",
        "@%p1 add.u64 %rd13, %rd13, 8;\nld.shared.v4.u32 {%r1, %r2, %r3, %r4}, [%rd13];",
        "@%p1 add.u64 %rd13, %rd13, 1;\nst.shared.u16 [%rd13], %rd1;",
        // Global: past the end of the region, before it, misaligned, vectors.
        "@%p1 add.u64 %rd9, %rd9, 100000;\nld.global.u32 %rd30, [%rd9];",
        "@%p1 sub.u64 %rd9, %rd9, 100000;\nld.global.u64 %rd30, [%rd9];",
        "@%p1 add.u64 %rd10, %rd10, 100000;\nst.global.u32 [%rd10], %rd1;",
        "@%p1 add.u64 %rd9, %rd9, 4;\nld.global.u64 %rd30, [%rd9];",
        "@%p1 add.u64 %rd10, %rd10, 2;\nst.global.u32 [%rd10], %rd1;",
        "@%p1 add.u64 %rd9, %rd9, 8;\nld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd9];",
        "@%p1 add.u64 %rd10, %rd10, 8;\nst.global.v2.u64 [%rd10], {%rd1, %rd2};",
        // A parameter read past the parameters.
        "ld.param.u64 %rd30, [neg+8];",
        // A generic load of a shared address runs (on the general path).
        "cvta.shared.u64 %rd30, %rd13;\nst.shared.u32 [%rd13], %rd1;\nld.u32 %rd31, [%rd30];\n\
         st.global.u64 [%rd10], %rd31;",
        // Predicated off: any address.
        "@%p1 mov.u64 %rd13, -4;\n@!%p1 ld.shared.u32 %rd30, [%rd13];\n\
         @!%p1 st.shared.u32 [%rd13], %rd30;\nst.global.u64 [%rd10], %rd30;",
        "@%p1 add.u64 %rd9, %rd9, 3;\n@!%p1 ld.global.u64 %rd30, [%rd9];\n\
         st.global.u64 [%rd10], %rd30;",
    ];
    for (k, body) in cases.iter().enumerate() {
        both(body, 1);
        let text = kernel(body);
        let m = Module::parse(&text).unwrap();
        let mut mem = VecMemory::new(BASE, INPUT + SLOT);
        mem.write(0, &inputs());
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let mut params = BASE.to_le_bytes().to_vec();
        params.extend((BASE + INPUT as u64).to_le_bytes());
        params.extend(NEG.to_le_bytes());
        let r = m.launch("k", &cfg, &params, &mem, &|name| {
            (name == "gbuf").then_some(GBUF)
        });
        assert_eq!(r.is_err(), k < 20, "case {k}: {body}: {r:?}");
    }
}

/// Runs `body` once (loaded as is): the result, and the output slots.
fn once(body: &str, out_slots: usize) -> (Result<(), ExecError>, Vec<u8>) {
    let m = Module::parse(&kernel(body)).unwrap();
    // Eight bytes more: the end of device memory is not a multiple of 16.
    let len = INPUT + out_slots * SLOT + 8;
    let mut mem = VecMemory::new(BASE, len);
    mem.write(0, &inputs());
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let mut params = BASE.to_le_bytes().to_vec();
    params.extend((BASE + INPUT as u64).to_le_bytes());
    params.extend(NEG.to_le_bytes());
    let r = m
        .launch("k", &cfg, &params, &mem, &|name| {
            (name == "gbuf").then_some(GBUF)
        })
        .map(|_| ());
    (r, mem.read(INPUT, out_slots * SLOT))
}

/// `cp.async` of 4, 8 and 16 bytes copies each lane's element whole (the rest of a shorter
/// `src-size` zeroed), and an element partly out of range fails at its first byte out of
/// range, in device memory or in shared memory.
#[test]
fn cp_async_copies_whole_elements_and_faults_at_the_first_byte_out_of_range() {
    let input = inputs();
    for (n, keep) in [(16, 16), (8, 8), (4, 4), (16, 5), (8, 0)] {
        // Lane t: the 16 bytes at in + 16 t into its 16 bytes of shared memory (zeros first).
        let body = format!(
            "st.shared.v2.u64 [%rd13], {{%rd0, %rd0}};\nshl.b64 %rd20, %rd7, 4;\n\
             add.u64 %rd21, %rd5, %rd20;\n\
             cp.async.cg.shared.global [%rd13], [%rd21], {n}, {keep};\n\
             cp.async.wait_all;\nbar.sync 0;\n\
             ld.shared.u64 %rd22, [%rd13];\nld.shared.u64 %rd23, [%rd13+8];\n\
             st.global.u64 [%rd10], %rd22;\nst.global.u64 [%rd10+{SLOT}], %rd23;"
        );
        let (r, out) = once(&body, 2);
        r.unwrap();
        for t in 0..THREADS as usize {
            let mut want = [0u8; 16];
            want[..keep].copy_from_slice(&input[16 * t..16 * t + keep]);
            let got: Vec<u8> = (0..2)
                .flat_map(|k| out[k * SLOT + 8 * t..k * SLOT + 8 * t + 8].to_vec())
                .collect();
            assert_eq!(got, want, "cp.async {n}, {keep}: lane {t}");
        }
    }
    // Lane 3's source: the last 8 bytes of device memory, and 8 past them.
    let end = BASE + (INPUT + SLOT + 8) as u64;
    let body = format!(
        "mov.u64 %rd21, {};\nsetp.eq.u32 %p2, %r1, 3;\n@%p2 mov.u64 %rd21, {};\n\
         cp.async.ca.shared.global [%rd13], [%rd21], 16;",
        BASE,
        end - 8
    );
    assert_eq!(once(&body, 1).0, Err(ExecError::IllegalAddress(end)));
    // Lane 3's destination: past shared memory (1024 bytes and the reserved 1024).
    let body = format!(
        "mov.u64 %rd21, {BASE};\nsetp.eq.u32 %p2, %r1, 3;\n@%p2 mov.u64 %rd13, 2048;\n\
         cp.async.ca.shared.global [%rd13], [%rd21], 8;"
    );
    let shared_window = 0x7F00_0000_0000_0000u64;
    assert_eq!(
        once(&body, 1).0,
        Err(ExecError::IllegalAddress(shared_window + 2048))
    );
}

/// `atom.shared` and `red.shared` of each operation and width, lanes contending for four
/// words (later lanes see earlier lanes' results), predicated lanes, misaligned and
/// out-of-range lanes.
#[test]
fn shared_atomics_match_the_general_path() {
    let mut body = String::from(
        "st.shared.v2.u64 [%rd13], {%rd0, %rd0};\nand.b64 %rd20, %rd7, 3;\n\
         shl.b64 %rd20, %rd20, 3;\nadd.u64 %rd21, %rd11, %rd20;\nbar.sync 0;\n",
    );
    let mut slot = 0;
    for op in [
        "add.u32", "add.s32", "add.u64", "add.f32", "add.f64", "min.s32", "min.u32", "max.s64",
        "max.u64", "min.f32", "exch.b32", "exch.b64", "and.b32", "or.b64", "xor.b32", "inc.u32",
        "dec.u32",
    ] {
        for (guard, val) in [("", "%rd1"), ("@%p1 ", "%rd2"), ("", "5")] {
            body +=
                &format!("mov.b64 %rd30, %rd4;\n{guard}atom.shared.{op} %rd30, [%rd21], {val};\n");
            body += &format!(
                "st.global.u64 [%rd10+{}], %rd30;\nbar.sync 0;\n",
                slot * SLOT
            );
            slot += 1;
            body += &format!("{guard}red.shared.{op} [%rd21+32], {val};\nbar.sync 0;\n");
        }
        body += "ld.shared.u64 %rd31, [%rd21];\nld.shared.u64 %rd32, [%rd21+32];\n";
        for r in ["%rd31", "%rd32"] {
            body += &format!("st.global.u64 [%rd10+{}], {r};\n", slot * SLOT);
            slot += 1;
        }
        body += "bar.sync 0;\nst.shared.v2.u64 [%rd21], {%rd0, %rd0};\n\
                 st.shared.v2.u64 [%rd21+32], {%rd0, %rd0};\nbar.sync 0;\n";
    }
    // A variable's address, every lane the same word.
    body += "st.shared.v2.u64 [sbuf+64], {%rd1, %rd2};\nbar.sync 0;\n";
    body += "atom.shared.add.u32 %rd33, [sbuf+64], %rd1;\n";
    body += &format!("st.global.u64 [%rd10+{}], %rd33;\n", slot * SLOT);
    slot += 1;
    both(&body, slot);
    for body in [
        "@%p1 add.u64 %rd13, %rd13, 2;\natom.shared.add.u32 %rd30, [%rd13], 1;",
        "@%p1 mov.u64 %rd13, 2048;\nred.shared.add.u64 [%rd13], 1;",
        "@%p1 mov.u64 %rd13, -8;\natom.shared.exch.b64 %rd30, [%rd13], 1;",
    ] {
        both(body, 1);
        assert!(once(body, 1).0.is_err(), "{body}");
    }
}

/// Device memory of several allocations with holes between them, as the emulated device keeps
/// it (each allocation its own region).
struct Allocations(Vec<(u64, Vec<std::sync::atomic::AtomicU64>)>);

impl Allocations {
    fn new(sizes: &[(u64, usize)]) -> Allocations {
        Allocations(
            sizes
                .iter()
                .map(|&(start, len)| {
                    let words = (0..len / 8)
                        .map(|i| std::sync::atomic::AtomicU64::new(start + 8 * i as u64))
                        .collect();
                    (start, words)
                })
                .collect(),
        )
    }

    fn words(&self) -> Vec<u64> {
        self.0
            .iter()
            .flat_map(|(_, w)| {
                w.iter()
                    .map(|x| x.load(std::sync::atomic::Ordering::Relaxed))
            })
            .collect()
    }
}

impl gpufuse_ptx::DeviceMemory for Allocations {
    fn region(&self, addr: u64) -> Option<gpufuse_ptx::Region<'_>> {
        self.0.iter().find_map(|(start, words)| {
            let len = 8 * words.len() as u64;
            (addr >= *start && addr - start < len).then_some(gpufuse_ptx::Region {
                start: *start,
                len,
                words,
            })
        })
    }
}

/// A loop over three allocations, each access of another one than the last (the specialized
/// forms keep several regions at hand), lanes stepping off the end of one into the hole
/// after it: the same memory, or the same error, as the general path.
#[test]
fn accesses_alternating_between_allocations_match_the_general_path() {
    let (a, b, c) = (BASE, BASE + 0x10000, BASE + 0x20000);
    let text = |tail: &str| {
        format!(
            ".version 8.0\n.target sm_80\n.address_size 64\n\
             .visible .entry k(.param .u64 a, .param .u64 b, .param .u64 c)\n{{\n\
             .reg .b64 %rd<32>;\n.reg .b32 %r<8>;\n.reg .pred %p<4>;\n\
             ld.param.u64 %rd1, [a];\nld.param.u64 %rd2, [b];\nld.param.u64 %rd3, [c];\n\
             mov.u32 %r1, %tid.x;\ncvt.u64.u32 %rd4, %r1;\nshl.b64 %rd5, %rd4, 3;\n\
             add.u64 %rd6, %rd1, %rd5;\nadd.u64 %rd7, %rd2, %rd5;\nadd.u64 %rd8, %rd3, %rd5;\n\
             mov.u32 %r2, 0;\n\
             $L_loop:\n\
             ld.global.u64 %rd10, [%rd6];\nld.global.u32 %rd11, [%rd7+4];\n\
             add.u64 %rd12, %rd10, %rd11;\nst.global.u64 [%rd8], %rd12;\n\
             ld.global.v2.u32 {{%rd13, %rd14}}, [%rd7];\nst.global.u32 [%rd6+4], %rd13;\n\
             st.global.v2.u32 [%rd7], {{%rd14, %rd12}};\n\
             add.u32 %r2, %r2, 1;\nsetp.lt.u32 %p1, %r2, 5;\n@%p1 bra $L_loop;\n\
             {tail}\nret;\n}}\n"
        )
    };
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let mut params = a.to_le_bytes().to_vec();
    params.extend(b.to_le_bytes());
    params.extend(c.to_le_bytes());
    // The allocations: 45 words each, except `c`'s 40 (lanes 40 to 44 store past its end).
    for (tail, c_len) in [
        ("", 45 * 8),
        ("", 40 * 8),
        ("ld.global.u64 %rd20, [%rd6+360];", 45 * 8),
    ] {
        let run = |general: bool| {
            let m = Module::parse(&text(tail)).unwrap();
            let m = if general { m.without_fast_forms() } else { m };
            let mem = Allocations::new(&[(a, 45 * 8), (b, 45 * 8), (c, c_len)]);
            let r = m.launch("k", &cfg, &params, &mem, &|_| None).map(|_| ());
            (r, mem.words())
        };
        let (fast, general) = (run(false), run(true));
        assert_eq!(fast, general, "{tail} c: {c_len} bytes");
        assert_eq!(
            fast.0.is_ok(),
            c_len == 45 * 8 && tail.is_empty(),
            "{fast:?}"
        );
    }
}
