//! `wmma.load`/`wmma.mma`/`wmma.store` as nvcc 13.5 emits them for CUDA's `nvcuda::wmma`
//! (tests/fixtures/wmma.cu; regenerate wmma.ptx with `nvcc -arch=sm_80 -ptx`), run by the
//! interpreter and checked against matrix products computed here: every type family (f16 with
//! f16 or f32 accumulators, bf16, tf32, f64, s8/u8), every shape, row- and column-major
//! operands with padded leading dimensions, global and shared memory; and the launches that
//! must fail.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};
use half::{bf16, f16};

const BASE: u64 = 0x2000_0000_0000;
const MB: usize = 1 << 20;

fn module() -> Module {
    Module::parse(include_str!("fixtures/wmma.ptx")).unwrap()
}

/// Element types as the host stores them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum T {
    F16,
    Bf16,
    F32,
    F64,
    S8,
    U8,
    S32,
}

impl T {
    fn size(self) -> usize {
        match self {
            T::S8 | T::U8 => 1,
            T::F16 | T::Bf16 => 2,
            T::F32 | T::S32 => 4,
            T::F64 => 8,
        }
    }

    fn bits(self, x: f64) -> u64 {
        match self {
            T::F16 => f16::from_f64(x).to_bits() as u64,
            T::Bf16 => bf16::from_f64(x).to_bits() as u64,
            T::F32 => (x as f32).to_bits() as u64,
            T::F64 => x.to_bits(),
            T::S8 | T::U8 => x as i64 as u64 & 0xff,
            T::S32 => x as i64 as u64 & 0xffff_ffff,
        }
    }

    fn value(self, b: u64) -> f64 {
        match self {
            T::F16 => f16::from_bits(b as u16).to_f64(),
            T::Bf16 => bf16::from_bits(b as u16).to_f64(),
            T::F32 => f32::from_bits(b as u32) as f64,
            T::F64 => f64::from_bits(b),
            T::S8 => b as u8 as i8 as f64,
            T::U8 => b as u8 as f64,
            T::S32 => b as u32 as i32 as f64,
        }
    }

    /// Rounds a value to this type, as the accumulator does.
    fn round(self, x: f64) -> f64 {
        self.value(self.bits(x))
    }
}

struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }

    /// A value of type `t` that it holds exactly: eighths in [-2, 2) for floats, any 8-bit
    /// integer but -128 (which the kernels negate), integers up to 2^20 for s32.
    fn elem(&mut self, t: T) -> f64 {
        let r = self.next();
        match t {
            T::S8 => (r % 255) as f64 - 127.0,
            T::U8 => (r % 256) as f64,
            T::S32 => (r % (1 << 21)) as f64 - (1 << 20) as f64,
            _ => (r % 32) as f64 / 8.0 - 2.0,
        }
    }
}

/// A `rows x cols` matrix (row-major values) laid out row- or column-major with leading
/// dimension `ld`; the padding holds 0xAB bytes.
fn lay_out(v: &[f64], rows: usize, cols: usize, t: T, row: bool, ld: usize) -> Vec<u8> {
    let lines = if row { rows } else { cols };
    let mut out = vec![0xABu8; ld * lines * t.size()];
    for r in 0..rows {
        for c in 0..cols {
            let at = if row { r * ld + c } else { c * ld + r } * t.size();
            out[at..at + t.size()]
                .copy_from_slice(&t.bits(v[r * cols + c]).to_le_bytes()[..t.size()]);
        }
    }
    out
}

/// One tile kernel of the fixture: `D = alpha * ((sa * A) * B + C)`.
struct Tile {
    name: &'static str,
    mnk: (usize, usize, usize),
    ab: T,
    cd: T,
    /// Row-major A, B, and C/D.
    rows: (bool, bool, bool),
}

fn tile_params(ptrs: [u64; 4], ld: [u32; 4], sa: f32, alpha: f32) -> Vec<u8> {
    let mut p = Vec::new();
    for x in ptrs {
        p.extend(x.to_le_bytes());
    }
    for x in ld {
        p.extend(x.to_le_bytes());
    }
    p.extend(sa.to_le_bytes());
    p.extend(alpha.to_le_bytes());
    p
}

fn warp() -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

fn run_tile(m: &Module, t: &Tile, seed: u32) {
    let (mm, nn, kk) = t.mnk;
    let mut rng = Rng(seed);
    let a: Vec<f64> = (0..mm * kk).map(|_| rng.elem(t.ab)).collect();
    let b: Vec<f64> = (0..kk * nn).map(|_| rng.elem(t.ab)).collect();
    let c: Vec<f64> = (0..mm * nn).map(|_| rng.elem(t.cd)).collect();
    // Leading dimensions: the tile's line rounded up to 16 bytes (what wmma requires), plus
    // 16 bytes (32 for D), so that padding is read past and must be skipped.
    let ld = |t: T, line: usize, extra: usize| {
        (line * t.size()).next_multiple_of(16) / t.size() + extra * 16 / t.size()
    };
    let (ra, rb, rc) = t.rows;
    let lda = ld(t.ab, if ra { kk } else { mm }, 1);
    let ldb = ld(t.ab, if rb { nn } else { kk }, 1);
    let ldc = ld(t.cd, if rc { nn } else { mm }, 1);
    let ldd = ld(t.cd, if rc { nn } else { mm }, 2);
    let mut mem = VecMemory::new(BASE, 4 * MB);
    mem.write(0, &lay_out(&a, mm, kk, t.ab, ra, lda));
    mem.write(MB, &lay_out(&b, kk, nn, t.ab, rb, ldb));
    mem.write(2 * MB, &lay_out(&c, mm, nn, t.cd, rc, ldc));
    let d_len = ldd * if rc { mm } else { nn } * t.cd.size();
    mem.write(3 * MB, &vec![0xCD; d_len + 64]);
    let (sa, alpha) = match t.ab {
        T::S8 => (-1.0, 1.0),
        T::U8 => (1.0, 1.0),
        _ => (2.0, 0.5),
    };
    let ptrs = [0, 1, 2, 3].map(|k| BASE + (k * MB) as u64);
    let p = tile_params(
        ptrs,
        [lda, ldb, ldc, ldd].map(|x| x as u32),
        sa as f32,
        alpha as f32,
    );
    m.launch(t.name, &warp(), &p, &mem, &|_| None)
        .unwrap_or_else(|e| panic!("{}: {e}", t.name));
    let out = mem.read(3 * MB, d_len + 64);
    for r in 0..mm {
        for col in 0..nn {
            let mut s = c[r * nn + col];
            for x in 0..kk {
                s += t.ab.round(sa * a[r * kk + x]) * b[x * nn + col];
            }
            let acc = t.cd.round(s);
            let want = t.cd.round(alpha * acc);
            let at = if rc { r * ldd + col } else { col * ldd + r } * t.cd.size();
            let mut bytes = [0u8; 8];
            bytes[..t.cd.size()].copy_from_slice(&out[at..at + t.cd.size()]);
            let got = t.cd.value(u64::from_le_bytes(bytes));
            assert_eq!(got, want, "{} D[{r}][{col}]", t.name);
        }
    }
    // Nothing written outside the tile: its padding and the bytes after it keep their fill.
    let mut written = vec![false; d_len + 64];
    for r in 0..mm {
        for col in 0..nn {
            let at = if rc { r * ldd + col } else { col * ldd + r } * t.cd.size();
            written[at..at + t.cd.size()].fill(true);
        }
    }
    for (k, (&byte, &w)) in out.iter().zip(&written).enumerate() {
        assert!(w || byte == 0xCD, "{}: byte {k} outside D written", t.name);
    }
}

macro_rules! tiles {
    ($($name:ident: $mnk:expr, $ab:ident, $cd:ident, $rows:expr;)*) => {
        $(#[test]
        fn $name() {
            let t = Tile {
                name: stringify!($name),
                mnk: $mnk,
                ab: T::$ab,
                cd: T::$cd,
                rows: $rows,
            };
            let m = module();
            for seed in [0x1234_5678, 0x9e37_79b9] {
                run_tile(&m, &t, seed);
            }
        })*
    };
}

tiles! {
    f16_m16n16k16_rc_f32: (16, 16, 16), F16, F32, (true, false, true);
    f16_m16n16k16_cr_f16: (16, 16, 16), F16, F16, (false, true, false);
    f16_m32n8k16_rr_f32: (32, 8, 16), F16, F32, (true, true, false);
    f16_m8n32k16_cc_f16: (8, 32, 16), F16, F16, (false, false, true);
    bf16_m16n16k16_rc: (16, 16, 16), Bf16, F32, (true, false, true);
    bf16_m32n8k16_cr: (32, 8, 16), Bf16, F32, (false, true, false);
    bf16_m8n32k16_rr: (8, 32, 16), Bf16, F32, (true, true, true);
    tf32_m16n16k8_rc: (16, 16, 8), F32, F32, (true, false, true);
    tf32_m16n16k8_cr: (16, 16, 8), F32, F32, (false, true, false);
    f64_m8n8k4_rc: (8, 8, 4), F64, F64, (true, false, true);
    f64_m8n8k4_cr: (8, 8, 4), F64, F64, (false, true, false);
    s8_m16n16k16_rc: (16, 16, 16), S8, S32, (true, false, true);
    u8_m32n8k16_cr: (32, 8, 16), U8, S32, (false, true, false);
    s8_m8n32k16_rr: (8, 32, 16), S8, S32, (true, true, true);
}

/// cvt.rna.tf32.f32: to nearest, ties away from zero, at 10 mantissa bits.
fn tf32(x: f32) -> f32 {
    f32::from_bits((x.to_bits() + 0x1000) & !0x1fff)
}

/// The shared-memory GEMM of the fixture (several warps, tiles staged in shared memory, K in
/// steps), f16 and tf32 (`__float_to_tf32` on the fragments): D = A * B + C, summed in f64 from
/// C in k order and rounded to f32 after each step, as the VM's accumulator is.
fn shared_gemm(kernel: &str, t: T, kt: usize) {
    let (m, n, k) = (48, 32, 64);
    let mut rng = Rng(0x0bad_cafe);
    // tf32: arbitrary f32 values in [-1, 1), rounded by the kernel; f16: exact eighths.
    let mut elem = |_| {
        if t == T::F32 {
            (rng.next() as i32 as f64 / 2f64.powi(31)) as f32 as f64
        } else {
            rng.elem(T::F16)
        }
    };
    let a: Vec<f64> = (0..m * k).map(&mut elem).collect();
    // B column-major: its column j is row j of an n x k matrix.
    let bt: Vec<f64> = (0..n * k).map(&mut elem).collect();
    let c: Vec<f64> = (0..m * n).map(|_| rng.elem(T::F32)).collect();
    let mut mem = VecMemory::new(BASE, 4 * MB);
    let bytes = |v: &[f64], t: T| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| t.bits(x).to_le_bytes()[..t.size()].to_vec())
            .collect()
    };
    mem.write(0, &bytes(&a, t));
    mem.write(MB, &bytes(&bt, t));
    mem.write(2 * MB, &bytes(&c, T::F32));
    let mut p = Vec::new();
    for x in 0..4 {
        p.extend((BASE + (x * MB) as u64).to_le_bytes());
    }
    for x in [m, n, k] {
        p.extend((x as u32).to_le_bytes());
    }
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared_bytes: 0,
    };
    module()
        .launch(kernel, &cfg, &p, &mem, &|_| None)
        .unwrap_or_else(|e| panic!("{kernel}: {e}"));
    let out = mem.read(3 * MB, 4 * m * n);
    let rnd = |x: f64| {
        if t == T::F32 {
            tf32(x as f32) as f64
        } else {
            x
        }
    };
    for r in 0..m {
        for col in 0..n {
            let mut acc = c[r * n + col];
            for step in (0..k).step_by(kt) {
                for x in step..step + kt {
                    acc += rnd(a[r * k + x]) * rnd(bt[col * k + x]);
                }
                acc = acc as f32 as f64;
            }
            let at = 4 * (r * n + col);
            let got = f32::from_le_bytes(out[at..at + 4].try_into().unwrap());
            assert_eq!(got as f64, acc, "{kernel} D[{r}][{col}]");
        }
    }
}

#[test]
fn gemm_f16_in_shared_memory() {
    shared_gemm("gemm_f16_shared", T::F16, 16);
}

#[test]
fn gemm_tf32_in_shared_memory() {
    shared_gemm("gemm_tf32_shared", T::F32, 8);
}

fn tile_launch(m: &Module, block: u32, a_off: u64, lda: u32) -> Result<(), ExecError> {
    let mem = VecMemory::new(BASE, 4 * MB);
    let ptrs = [0, 1, 2, 3].map(|k| BASE + (k * MB) as u64);
    let mut ptrs = ptrs;
    ptrs[0] += a_off;
    let p = tile_params(ptrs, [lda, 16, 16, 16], 1.0, 1.0);
    let cfg = LaunchConfig {
        block: [block, 1, 1],
        ..warp()
    };
    m.launch("f16_m16n16k16_rc_f32", &cfg, &p, &mem, &|_| None)
        .map(|_| ())
}

/// A partial warp, a misaligned matrix or stride and an address outside memory fail the launch.
#[test]
fn bad_launches_fail() {
    let m = module();
    tile_launch(&m, 32, 0, 16).unwrap();
    match tile_launch(&m, 16, 0, 16) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("partial warp"), "{why}"),
        r => panic!("partial warp: {r:?}"),
    }
    assert_eq!(
        tile_launch(&m, 32, 8, 16),
        Err(ExecError::MisalignedAddress(BASE + 8))
    );
    // A stride of 20 halves (40 bytes): the second row is misaligned.
    assert_eq!(
        tile_launch(&m, 32, 0, 20),
        Err(ExecError::MisalignedAddress(BASE + 40))
    );
    assert!(matches!(
        tile_launch(&m, 32, 8 * MB as u64, 16),
        Err(ExecError::IllegalAddress(_))
    ));
}

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

fn hand_kernel(body: &str) -> Result<(), ExecError> {
    let ptx = format!(
        "{HEAD}.visible .entry k(.param .u64 p)\n{{\n.reg .pred %p<2>;\n.reg .b32 %r<16>;\n\
         .reg .b64 %rd<4>;\nld.param.u64 %rd1, [p];\n{body}\nret;\n}}\n"
    );
    let m = Module::parse(&ptx).unwrap();
    let mem = VecMemory::new(BASE, MB);
    m.launch("k", &warp(), &BASE.to_le_bytes(), &mem, &|_| None)
        .map(|_| ())
}

/// Forms the VM does not run, unknown modifiers and wrong operand lists fail the launch
/// naming them; so do lanes that disagree on the address.
#[test]
fn unsupported_forms_are_named() {
    let regs8 = "{%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}";
    for (body, want) in [
        (
            "wmma.load.a.sync.aligned.row.m8n8k32.s4 {%r1}, [%rd1];".to_string(),
            ".s4",
        ),
        (
            format!("wmma.load.a.sync.aligned.row.m16n16k16.global.f16.foo {regs8}, [%rd1];"),
            ".foo",
        ),
        (
            "wmma.load.a.sync.aligned.row.m16n16k16.f16 {%r1, %r2, %r3, %r4}, [%rd1];"
                .to_string(),
            "4 destination",
        ),
        (
            format!("wmma.mma.sync.aligned.row.col.m16n16k8.f32.f32 {regs8}, {regs8}, {regs8}, {regs8};"),
            "types",
        ),
    ] {
        match hand_kernel(&body) {
            Err(ExecError::Unsupported(why)) => assert!(why.contains(want), "{body}: {why}"),
            r => panic!("{body}: {r:?}"),
        }
    }
    // Each lane a different address.
    let body = format!(
        "mov.u32 %r9, %laneid;\nmul.wide.u32 %rd2, %r9, 32;\nadd.s64 %rd3, %rd1, %rd2;\n\
         wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {regs8}, [%rd3];"
    );
    match hand_kernel(&body) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("different address"), "{why}"),
        r => panic!("lane addresses: {r:?}"),
    }
    // Half the warp branched away: a partial warp.
    let body = format!(
        "mov.u32 %r9, %laneid;\nsetp.lt.u32 %p1, %r9, 16;\n@%p1 bra DONE;\n\
         wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {regs8}, [%rd1];\nDONE:"
    );
    match hand_kernel(&body) {
        Err(ExecError::Unsupported(why)) => assert!(why.contains("partial warp"), "{why}"),
        r => panic!("divergent warp: {r:?}"),
    }
}

/// s8 products summed past the s32 range: `wmma.mma` wraps, `.satfinite` clamps.
#[test]
fn integer_accumulators_wrap_or_saturate() {
    let r = |name: &str, from: u32, n: u32| {
        let v: Vec<String> = (from..from + n).map(|i| format!("%{name}{i}")).collect();
        format!("{{{}}}", v.join(", "))
    };
    let (a, b, c) = (r("r", 1, 2), r("r", 3, 2), r("r", 5, 8));
    let body = format!(
        "add.s64 %rd2, %rd1, 256;\nadd.s64 %rd3, %rd1, 512;\n\
         wmma.load.a.sync.aligned.row.m16n16k16.global.s8 {a}, [%rd1];\n\
         wmma.load.b.sync.aligned.col.m16n16k16.global.s8 {b}, [%rd2];\n\
         wmma.load.c.sync.aligned.row.m16n16k16.global.s32 {c}, [%rd3];\n\
         wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32 {d1}, {a}, {b}, {c};\n\
         wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32.satfinite {d2}, {a}, {b}, {c};\n\
         add.s64 %rd2, %rd1, 2048;\nadd.s64 %rd3, %rd1, 3072;\n\
         wmma.store.d.sync.aligned.row.m16n16k16.global.s32 [%rd2], {d1};\n\
         wmma.store.d.sync.aligned.row.m16n16k16.global.s32 [%rd3], {d2};",
        d1 = r("r", 13, 8),
        d2 = r("r", 21, 8),
    );
    let ptx = format!(
        "{HEAD}.visible .entry k(.param .u64 p)\n{{\n.reg .b32 %r<40>;\n.reg .b64 %rd<4>;\n\
         ld.param.u64 %rd1, [p];\n{body}\nret;\n}}\n"
    );
    let mut rng = Rng(0x5eed);
    let av: Vec<i64> = (0..256)
        .map(|_| [127, -128, 100, -3][rng.next() as usize % 4])
        .collect();
    let bv: Vec<i64> = (0..256)
        .map(|_| [127, -128, 90, 5][rng.next() as usize % 4])
        .collect();
    let cv: Vec<i64> = (0..256)
        .map(|k| match k % 3 {
            0 => i32::MAX as i64 - 1000,
            1 => i32::MIN as i64 + 1000,
            _ => (rng.next() % 2000) as i64 - 1000,
        })
        .collect();
    let mut mem = VecMemory::new(BASE, MB);
    mem.write(0, &av.iter().map(|&x| x as u8).collect::<Vec<_>>());
    mem.write(256, &bv.iter().map(|&x| x as u8).collect::<Vec<_>>());
    let cb: Vec<u8> = cv.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    mem.write(512, &cb);
    Module::parse(&ptx)
        .unwrap()
        .launch("k", &warp(), &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let read = |off: usize| -> Vec<i32> {
        mem.read(off, 1024)
            .chunks(4)
            .map(|w| i32::from_le_bytes(w.try_into().unwrap()))
            .collect()
    };
    let (wrapped, saturated) = (read(2048), read(3072));
    let (mut over, mut under) = (0, 0);
    for row in 0..16 {
        for col in 0..16 {
            // A row-major; B column-major: column `col` is bytes 16 * col.. of its buffer.
            let s: i64 = cv[row * 16 + col]
                + (0..16)
                    .map(|x| av[row * 16 + x] * bv[col * 16 + x])
                    .sum::<i64>();
            over += (s > i32::MAX as i64) as u32;
            under += (s < i32::MIN as i64) as u32;
            let at = row * 16 + col;
            assert_eq!(wrapped[at], s as i32, "wrapped D[{row}][{col}]");
            let clamped = s.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
            assert_eq!(saturated[at], clamped, "saturated D[{row}][{col}]");
        }
    }
    assert!(over > 0 && under > 0, "the data overflows both ways");
}
