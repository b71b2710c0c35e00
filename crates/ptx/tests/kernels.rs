//! nvcc 13.5 kernels (tests/fixtures/kernels.cu) run by the interpreter, checked against CPU
//! references, each in three builds of the same source: `-O3` (kernels.ptx), `-lineinfo`
//! (kernels.lineinfo.ptx: `.file`/`.loc` lines between statements) and `-G` (kernels.debug.ptx:
//! unoptimized, with DWARF `.section`s). Regenerate with
//! `nvcc -arch=sm_80 -ptx [-lineinfo | -G] -o FILE kernels.cu` (nvcc from `.deps/env.sh`).

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

const PLAIN: &str = include_str!("fixtures/kernels.ptx");
const LINEINFO: &str = include_str!("fixtures/kernels.lineinfo.ptx");
const DEBUG: &str = include_str!("fixtures/kernels.debug.ptx");

fn module(ptx: &str) -> Module {
    Module::parse(ptx).unwrap()
}

/// Each kernel test, once per build of the fixture.
macro_rules! builds {
    ($($test:ident),* $(,)?) => {
        mod plain {
            $(#[test]
            fn $test() {
                super::$test(super::module(super::PLAIN))
            })*
        }
        mod lineinfo {
            $(#[test]
            fn $test() {
                super::$test(super::module(super::LINEINFO))
            })*
        }
        mod debug {
            $(#[test]
            fn $test() {
                super::$test(super::module(super::DEBUG))
            })*
        }
    };
}

builds!(
    vector_add,
    saxpy,
    shared_memory_reduction_with_barriers_and_atomics,
    warp_shuffle_reduction,
    atomic_histogram_is_exact_under_contention,
    tiled_matmul,
    bit_operations,
    out_of_bounds_access_is_an_illegal_address,
    layouts_match_the_rule,
    calls_to_device_functions,
    parallel_blocks_with_contended_atomics_are_exact,
    illegal_address_in_one_parallel_block_fails_the_launch,
);

/// The line-information builds parse to the same kernels as the plain build, with nothing the
/// VM lacks (`parse.rs` checks that every instruction statement is kept).
#[test]
fn line_information_loses_no_statement() {
    let plain = module(PLAIN);
    for (build, ptx) in [("lineinfo", LINEINFO), ("debug", DEBUG)] {
        assert!(
            ptx.contains(".loc"),
            "{build} build has no line information"
        );
        let m = module(ptx);
        assert_eq!(m.unsupported().count(), 0, "{build}");
        let mut names: Vec<_> = m.kernels().iter().map(|k| k.name.clone()).collect();
        let mut want: Vec<_> = plain.kernels().iter().map(|k| k.name.clone()).collect();
        names.sort();
        want.sort();
        assert_eq!(names, want, "{build}");
    }
}

/// A memory with room for `n` buffers of `size` bytes each at BASE + k * size.
fn memory(n: usize, size: usize) -> VecMemory {
    VecMemory::new(BASE, n * size)
}

fn f32s(m: &VecMemory, off: usize, n: usize) -> Vec<f32> {
    m.read(off, 4 * n)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn u32s(m: &VecMemory, off: usize, n: usize) -> Vec<u32> {
    m.read(off, 4 * n)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn write_f32(m: &mut VecMemory, off: usize, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    m.write(off, &bytes);
}

fn write_u32(m: &mut VecMemory, off: usize, v: &[u32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    m.write(off, &bytes);
}

fn params(parts: &[&[u8]], layout: &[gpufuse_ptx::Param]) -> Vec<u8> {
    let len = layout.last().map_or(0, |p| (p.offset + p.size) as usize);
    let mut buf = vec![0u8; len];
    for (p, bytes) in layout.iter().zip(parts) {
        buf[p.offset as usize..p.offset as usize + bytes.len()].copy_from_slice(bytes);
    }
    buf
}

fn launch(
    m: &Module,
    mem: &mut VecMemory,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[&[u8]],
) -> Result<(), ExecError> {
    let k = m.kernel(name).unwrap();
    let p = params(args, &k.params);
    m.launch(
        name,
        &LaunchConfig {
            grid,
            block,
            dynamic_shared_bytes: 0,
        },
        &p,
        mem,
        &|_| None,
    )
    .map(|_| ())
}

const MB: usize = 1 << 20;

fn vector_add(m: Module) {
    let mut mem = memory(3, MB);
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
    write_f32(&mut mem, 0, &a);
    write_f32(&mut mem, MB, &b);
    let (pa, pb, pc) = (BASE, BASE + MB as u64, BASE + 2 * MB as u64);
    launch(
        &m,
        &mut mem,
        "vadd",
        [4, 1, 1],
        [256, 1, 1],
        &[
            &pa.to_le_bytes(),
            &pb.to_le_bytes(),
            &pc.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    )
    .unwrap();
    let c = f32s(&mem, 2 * MB, n);
    assert!(c.iter().enumerate().all(|(i, &x)| x == a[i] + b[i]));
}

fn saxpy(m: Module) {
    let mut mem = memory(2, MB);
    let n = 300usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    write_f32(&mut mem, 0, &x);
    write_f32(&mut mem, MB, &y);
    launch(
        &m,
        &mut mem,
        "saxpy",
        [2, 1, 1],
        [256, 1, 1],
        &[
            &(n as i32).to_le_bytes(),
            &3.0f32.to_le_bytes(),
            &BASE.to_le_bytes(),
            &(BASE + MB as u64).to_le_bytes(),
        ],
    )
    .unwrap();
    let out = f32s(&mem, MB, n);
    assert!(
        out.iter()
            .enumerate()
            .all(|(i, &v)| v == 3.0f32.mul_add(x[i], y[i])),
        "{:?}",
        &out[..4]
    );
}

fn shared_memory_reduction_with_barriers_and_atomics(m: Module) {
    let mut mem = memory(2, MB);
    let n = 2000usize;
    let v: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    write_f32(&mut mem, 0, &v);
    launch(
        &m,
        &mut mem,
        "reduce",
        [8, 1, 1],
        [256, 1, 1],
        &[
            &BASE.to_le_bytes(),
            &(BASE + MB as u64).to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    )
    .unwrap();
    assert_eq!(f32s(&mem, MB, 1)[0], v.iter().sum::<f32>());
}

fn warp_shuffle_reduction(m: Module) {
    let mut mem = memory(2, MB);
    let v: Vec<u32> = (0..128).map(|i| i * 3 + 1).collect();
    write_u32(&mut mem, 0, &v);
    launch(
        &m,
        &mut mem,
        "warpsum",
        [1, 1, 1],
        [128, 1, 1],
        &[&BASE.to_le_bytes(), &(BASE + MB as u64).to_le_bytes()],
    )
    .unwrap();
    let out = u32s(&mem, MB, 4);
    for w in 0..4 {
        assert_eq!(
            out[w],
            v[w * 32..w * 32 + 32].iter().sum::<u32>(),
            "warp {w}"
        );
    }
}

fn atomic_histogram_is_exact_under_contention(m: Module) {
    let mut mem = memory(2, MB);
    let n = 5000usize;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    mem.write(0, &data);
    launch(
        &m,
        &mut mem,
        "histogram",
        [20, 1, 1],
        [256, 1, 1],
        &[
            &BASE.to_le_bytes(),
            &(BASE + MB as u64).to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    )
    .unwrap();
    let mut want = [0u32; 16];
    for d in &data {
        want[(d % 16) as usize] += 1;
    }
    assert_eq!(u32s(&mem, MB, 16), want);
}

fn tiled_matmul(m: Module) {
    let n = 32usize;
    let mut mem = memory(3, MB);
    let a: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 3) as f32 - 1.0).collect();
    write_f32(&mut mem, 0, &a);
    write_f32(&mut mem, MB, &b);
    launch(
        &m,
        &mut mem,
        "matmul",
        [2, 2, 1],
        [16, 16, 1],
        &[
            &BASE.to_le_bytes(),
            &(BASE + MB as u64).to_le_bytes(),
            &(BASE + 2 * MB as u64).to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    )
    .unwrap();
    let c = f32s(&mem, 2 * MB, n * n);
    for r in 0..n {
        for col in 0..n {
            let want: f32 = (0..n).map(|k| a[r * n + k] * b[k * n + col]).sum();
            assert_eq!(c[r * n + col], want, "C[{r}][{col}]");
        }
    }
}

/// `sqrt(x) * s + i`: one fused multiply-add in optimized builds, a rounded multiply then an
/// add in `-G` builds (nvcc contracts nothing there).
fn double_precision(m: Module, fused: bool) {
    let mut mem = memory(1, MB);
    let x: Vec<f64> = (0..64).map(|i| i as f64 * 1.5).collect();
    for (i, v) in x.iter().enumerate() {
        mem.write(8 * i, &v.to_le_bytes());
    }
    launch(
        &m,
        &mut mem,
        "dscale",
        [1, 1, 1],
        [64, 1, 1],
        &[
            &BASE.to_le_bytes(),
            &2.5f64.to_le_bytes(),
            &64i32.to_le_bytes(),
        ],
    )
    .unwrap();
    for (i, v) in x.iter().enumerate() {
        let got = f64::from_le_bytes(mem.read(8 * i, 8).try_into().unwrap());
        let want = if fused {
            v.sqrt().mul_add(2.5, i as f64)
        } else {
            v.sqrt() * 2.5 + i as f64
        };
        assert_eq!(got, want, "{i}");
    }
}

#[test]
fn double_precision_each_build() {
    double_precision(module(PLAIN), true);
    double_precision(module(LINEINFO), true);
    double_precision(module(DEBUG), false);
}

fn bit_operations(m: Module) {
    let mut mem = memory(2, MB);
    let v: Vec<u32> = (0..32)
        .map(|i| (i as u32).wrapping_mul(0x9E37_79B9) ^ (1 << i))
        .collect();
    write_u32(&mut mem, 0, &v);
    launch(
        &m,
        &mut mem,
        "bits",
        [1, 1, 1],
        [32, 1, 1],
        &[&BASE.to_le_bytes(), &(BASE + MB as u64).to_le_bytes()],
    )
    .unwrap();
    let out = u32s(&mem, MB, 128);
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(out[4 * i], x.count_ones());
        assert_eq!(out[4 * i + 1], x.leading_zeros());
        assert_eq!(out[4 * i + 2], x.reverse_bits());
        // __byte_perm(x, 0x11223344, 0x5140): bytes [x0, x4=0x44.., ...] per selector nibbles.
        let bytes = ((0x1122_3344u64) << 32) | x as u64;
        let sel = [0u32, 4, 1, 5];
        let want = sel.iter().enumerate().fold(0u32, |acc, (k, s)| {
            acc | ((((bytes >> (s * 8)) & 0xff) as u32) << (k * 8))
        });
        assert_eq!(out[4 * i + 3], want);
    }
}

fn out_of_bounds_access_is_an_illegal_address(m: Module) {
    let mut mem = memory(1, MB);
    let e = launch(
        &m,
        &mut mem,
        "oob",
        [1, 1, 1],
        [32, 1, 1],
        &[&BASE.to_le_bytes()],
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::IllegalAddress(_)), "{e:?}");
}

fn layouts_match_the_rule(m: Module) {
    let k = m.kernel("saxpy").unwrap();
    let offs: Vec<_> = k.params.iter().map(|p| (p.offset, p.size)).collect();
    assert_eq!(offs, vec![(0, 4), (4, 4), (8, 8), (16, 8)]);
    assert_eq!(m.kernel("reduce").unwrap().static_shared_bytes, 1024);
}

/// Regressions: a module variable right after the header directives (which end at their line,
/// not at a ';'), and a vector operand closing a statement.
#[test]
fn header_directives_and_vector_operands() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n.extern .shared .align 16 .b8 dyn[];\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n.reg .b16 %rs<3>;\n\
        mov.u32 %r1, dyn;\nmov.u32 %r2, 7;\nst.shared.u32 [%r1], %r2;\nld.shared.u32 %r3, [%r1];\n\
        mov.u16 %rs1, 1;\nmov.u16 %rs2, 2;\nmov.b32 %r0, {%rs1, %rs2};\nadd.u32 %r3, %r3, %r0;\n\
        ld.param.u64 %rd1, [out];\nst.global.u32 [%rd1], %r3;\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    assert_eq!(m.target_sm(), 80);
    let mem = memory(1, 64);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 16,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    assert_eq!(u32s(&mem, 0, 1)[0], 7 + 0x0002_0001);
}

/// Regressions from CuPy's CUB kernels (PTX for sm_100): `redux.sync`, packed `f16x2`/`s16x2`
/// arithmetic, `bar.warp.sync`, and statements opened by a `{` after a closing `}`.
#[test]
fn redux_packed_pairs_and_scoped_statements() {
    let ptx = ".version 8.8\n.target sm_100\n.address_size 64\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n\
        mov.u32 %r1, %laneid;\nld.param.u64 %rd1, [out];\n\
        bar.warp.sync -1;\n\
        redux.sync.add.s32 %r2, %r1, -1;\nredux.sync.max.s32 %r3, %r1, -1;\n\
        sub.s32 %r4, 0, %r1;\nredux.sync.min.s32 %r5, %r4, -1;\nredux.sync.or.b32 %r6, %r1, -1;\n\
        mov.b32 %r7, 0x3C004000;\n{\n}\n{add.f16x2 %r8, %r7, %r7;\n}\n\
        mov.b32 %r9, 0x0001FFFF;\nmax.s16x2 %r10, %r9, 0;\n\
        setp.ne.s32 %p1, %r1, 0;\n@%p1 bra $L_end;\n\
        st.global.v4.u32 [%rd1], {%r2, %r3, %r5, %r6};\nst.global.v2.u32 [%rd1+16], {%r8, %r10};\n\
        $L_end:\nret;\n}\n";
    let ptx = ptx.replace(".reg .b64 %rd<4>;", ".reg .b64 %rd<4>;\n.reg .pred %p<2>;");
    let m = Module::parse(&ptx).unwrap();
    assert_eq!(m.unsupported().count(), 0);
    let mem = memory(1, 64);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let got = u32s(&mem, 0, 6);
    assert_eq!(got[0], (0..32).sum::<u32>());
    assert_eq!(got[1], 31);
    assert_eq!(got[2] as i32, -31);
    assert_eq!(got[3], 31);
    // 1.0 + 1.0 = 2.0 (0x4000) and 2.0 + 2.0 = 4.0 (0x4400), per half.
    assert_eq!(got[4], 0x4000_4400);
    // max(1, 0) = 1 in the high half, max(-1, 0) = 0 in the low half.
    assert_eq!(got[5], 0x0001_0000);
}

/// Warp collectives of groups that run one instruction together with different membermasks,
/// as `cg::labeled_partition` makes them (NVIDIA's warpAggregatedAtomicsCG sample): lanes
/// with an even lane id form one group, odd ones another; `redux`, `match`, `vote` and
/// `elect` each compute over the lane's own group. Each lane stores its results.
#[test]
fn collectives_compute_over_each_lanes_membermask() {
    let ptx = ".version 8.8\n.target sm_90\n.address_size 64\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<16>;\n.reg .b64 %rd<4>;\n\
        .reg .pred %p<4>;\n\
        mov.u32 %r1, %laneid;\nand.b32 %r2, %r1, 1;\n\
        setp.eq.u32 %p1, %r2, 0;\nselp.b32 %r3, 0x55555555, 0xAAAAAAAA, %p1;\n\
        redux.sync.max.s32 %r4, %r1, %r3;\n\
        shr.u32 %r5, %r1, 2;\nmatch.any.sync.b32 %r6, %r5, %r3;\n\
        setp.lt.u32 %p2, %r1, 8;\nvote.sync.ballot.b32 %r7, %p2, %r3;\n\
        elect.sync %r8|%p3, %r3;\n\
        ld.param.u64 %rd1, [out];\nmul.wide.u32 %rd2, %r1, 16;\nadd.s64 %rd1, %rd1, %rd2;\n\
        st.global.v4.u32 [%rd1], {%r4, %r6, %r7, %r8};\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    assert_eq!(m.unsupported().count(), 0);
    let mem = memory(1, 32 * 16);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let got = u32s(&mem, 0, 32 * 4);
    for lane in 0..32u32 {
        let group: u32 = if lane % 2 == 0 {
            0x5555_5555
        } else {
            0xAAAA_AAAA
        };
        let row = &got[lane as usize * 4..][..4];
        assert_eq!(
            row[0],
            if lane % 2 == 0 { 30 } else { 31 },
            "redux.max, lane {lane}"
        );
        let same_quad = (0..32u32)
            .filter(|&o| group & (1 << o) != 0 && o / 4 == lane / 4)
            .fold(0, |m, o| m | 1 << o);
        assert_eq!(row[1], same_quad, "match.any, lane {lane}");
        assert_eq!(row[2], group & 0xff, "vote.ballot, lane {lane}");
        assert_eq!(row[3], group.trailing_zeros(), "elect leader, lane {lane}");
    }
}

/// An instruction the VM lacks fails only the kernels that hold it, naming it at launch.
#[test]
fn unsupported_instructions_fail_their_kernel_only() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry good()\n{\nret;\n}\n\
        .visible .entry bad()\n{\n.reg .b32 %r<2>;\nwgmma.fence.sync.aligned;\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let mem = memory(1, 16);
    m.launch("good", &cfg, &[], &mem, &|_| None).unwrap();
    let e = m.launch("bad", &cfg, &[], &mem, &|_| None).unwrap_err();
    assert!(e.to_string().contains("wgmma.fence"), "{e}");
}

fn launch_on(
    m: &Module,
    mem: &VecMemory,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[&[u8]],
    threads: usize,
) -> Result<gpufuse_ptx::LaunchStats, ExecError> {
    let k = m.kernel(name).unwrap();
    let p = params(args, &k.params);
    let cfg = LaunchConfig {
        grid,
        block,
        dynamic_shared_bytes: 0,
    };
    m.launch_on(name, &cfg, &p, mem, &|_| None, threads)
}

/// Device functions: recursion whose depth differs between the lanes of a warp, values
/// returned through `.param`, a callee writing through a pointer into its caller's local array,
/// and warp shuffles inside a callee that every lane entered.
fn calls_to_device_functions(m: Module) {
    let mut mem = memory(3, MB);
    let n = 64usize;
    let input: Vec<u32> = (0..n as u32).map(|t| t % 15).collect();
    write_u32(&mut mem, 0, &input);
    let (a, b) = (2.5f32, -1.0f32);
    launch(
        &m,
        &mut mem,
        "calls",
        [1, 1, 1],
        [n as u32, 1, 1],
        &[
            &BASE.to_le_bytes(),
            &(BASE + MB as u64).to_le_bytes(),
            &(BASE + 2 * MB as u64).to_le_bytes(),
            &a.to_le_bytes(),
            &b.to_le_bytes(),
        ],
    )
    .unwrap();
    fn fib(n: u32) -> u32 {
        if n < 2 {
            n
        } else {
            fib(n - 1) + fib(n - 2)
        }
    }
    let out = u32s(&mem, MB, 4 * n);
    let fout = f32s(&mem, 2 * MB, n);
    for t in 0..n as u32 {
        let o = &out[4 * t as usize..4 * t as usize + 3];
        let warp_sum: u32 = (t / 32 * 32..t / 32 * 32 + 32).sum();
        assert_eq!(o, [fib(t % 15), 8 * t + 28, warp_sum], "thread {t}");
        let x = t as f32;
        assert_eq!(fout[t as usize], (a * x).mul_add(x, b), "thread {t}");
    }
}

/// A recursive device function written by hand: `down(n)` returns n after n nested calls;
/// calls nested too deep fail the launch instead of exhausting the host.
#[test]
fn recursion_depth_is_limited() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .func (.param .b32 r) down(.param .b32 n)\n{\n.reg .b32 %r<4>;\n.reg .pred %p<2>;\n\
        ld.param.u32 %r1, [n];\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 bra DONE;\nsub.u32 %r2, %r1, 1;\n\
        {\n.param .b32 a;\nst.param.b32 [a], %r2;\n.param .b32 q;\ncall.uni (q), down, (a);\n\
        ld.param.b32 %r3, [q];\n}\nadd.u32 %r1, %r3, 1;\nDONE:\nst.param.b32 [r], %r1;\nret;\n}\n\
        .visible .entry k(.param .u64 out, .param .u32 n)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<2>;\n\
        ld.param.u64 %rd1, [out];\nld.param.u32 %r1, [n];\nmov.u32 %r3, %tid.x;\nadd.u32 %r1, %r1, %r3;\n\
        {\n.param .b32 a;\nst.param.b32 [a], %r1;\n.param .b32 q;\ncall.uni (q), down, (a);\n\
        ld.param.b32 %r2, [q];\n}\nmul.wide.u32 %rd0, %r3, 4;\nadd.u64 %rd1, %rd1, %rd0;\n\
        st.global.u32 [%rd1], %r2;\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    assert_eq!(m.unsupported().count(), 0);
    let mem = memory(1, 1024);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let args = |n: u32| [BASE.to_le_bytes().as_slice(), &n.to_le_bytes()].concat();
    m.launch("k", &cfg, &args(100), &mem, &|_| None).unwrap();
    assert_eq!(u32s(&mem, 0, 32), (100..132).collect::<Vec<u32>>());
    let e = m
        .launch("k", &cfg, &args(1000), &mem, &|_| None)
        .unwrap_err();
    assert_eq!(e, ExecError::StackOverflow);
}

/// A call to a function without a body (`vprintf`) fails the kernel's launch, naming it.
#[test]
fn calls_to_undefined_functions_fail_their_kernel() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .extern .func (.param .b32 func_retval0) external_helper(.param .b64 a, .param .b64 b);\n\
        .visible .entry k()\n{\n.reg .b32 %r<2>;\n{\n.param .b64 p0;\nst.param.b64 [p0], 0;\n\
        .param .b64 p1;\nst.param.b64 [p1], 0;\n.param .b32 rv;\n\
        call.uni (rv), external_helper, (p0, p1);\n}\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let e = m
        .launch("k", &cfg, &[], &memory(1, 16), &|_| None)
        .unwrap_err();
    assert!(e.to_string().contains("external_helper"), "{e}");
}

/// Blocks on several host threads: atomics of every kind on the same words give exact results,
/// and byte stores from different blocks into the same words do not clobber each other.
fn parallel_blocks_with_contended_atomics_are_exact(m: Module) {
    let (blocks, threads) = (64u32, 256u32);
    let total = blocks * threads;
    for host_threads in [4, 1] {
        let mem = memory(4, MB);
        let s = launch_on(
            &m,
            &mem,
            "contend",
            [blocks, 1, 1],
            [threads, 1, 1],
            &[
                &BASE.to_le_bytes(),
                &(BASE + MB as u64).to_le_bytes(),
                &(BASE + 2 * MB as u64).to_le_bytes(),
                &(BASE + 3 * MB as u64).to_le_bytes(),
            ],
            host_threads,
        )
        .unwrap();
        assert_eq!(s.threads, host_threads);
        let c = u32s(&mem, 0, 7);
        let sum = |k: u32| (0..total).filter(|g| g % 3 == k).sum::<u32>();
        assert_eq!(
            c,
            [total, sum(0), sum(1), sum(2), total - 1, total, 2 * total],
            "{host_threads} host threads"
        );
        let wide = u64::from_le_bytes(mem.read(MB, 8).try_into().unwrap());
        assert_eq!(wide, total as u64 * ((1 << 32) + 1));
        assert_eq!(f32s(&mem, 2 * MB, 1)[0], total as f32);
        let bytes = mem.read(3 * MB, total as usize);
        assert!(bytes
            .iter()
            .enumerate()
            .all(|(g, &b)| b == (g as u32 * 7) as u8));
    }
}

/// An illegal address in one block of many, with blocks on several threads, fails the launch.
fn illegal_address_in_one_parallel_block_fails_the_launch(m: Module) {
    let mem = memory(1, MB);
    for bad in [0i32, 37, 63] {
        let e = launch_on(
            &m,
            &mem,
            "oob_block",
            [64, 1, 1],
            [128, 1, 1],
            &[&BASE.to_le_bytes(), &bad.to_le_bytes()],
            4,
        )
        .unwrap_err();
        assert!(matches!(e, ExecError::IllegalAddress(_)), "{e:?}");
    }
    launch_on(
        &m,
        &mem,
        "oob_block",
        [64, 1, 1],
        [128, 1, 1],
        &[&BASE.to_le_bytes(), &(-1i32).to_le_bytes()],
        4,
    )
    .unwrap();
    assert!(u32s(&mem, 0, 64 * 128).iter().all(|&x| x == 1));
}

/// A register declared inside `{ }` is a new register that shadows the function's register of
/// the same name until the closing brace (CUDA's math library declares `%r0`..`%r3` in scoped
/// blocks of inline PTX while the function uses its own `%r3` around them).
#[test]
fn scoped_registers_shadow_the_functions_own() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .b32 %r<4>;\n.reg .b64 %rd<2>;\n\
        ld.param.u64 %rd1, [out];\nmov.u32 %r3, 5;\n\
        {\n.reg .u32 %r3, %t;\nmov.u32 %r3, 7;\nmov.u32 %t, 1;\nadd.u32 %r3, %r3, %t;\nmov.u32 %r1, %r3;\n{\n.reg .u32 %r3;\nmov.u32 %r3, 100;\n}\nadd.u32 %r1, %r1, %r3;\n}\n\
        st.global.v2.u32 [%rd1], {%r1, %r3};\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    let mem = memory(1, 64);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    // Inside: %r3 = 7 + 1 = 8 (the inner-inner 100 is gone at its brace), %r1 = 8 + 8.
    assert_eq!(u32s(&mem, 0, 2), [16, 5]);
}

/// `bar.red` (`__syncthreads_count/and/or`): a block barrier that reduces a predicate over every
/// thread of the block, here 40 threads in two warps, with a negated predicate too.
#[test]
fn barrier_reductions_cover_the_whole_block() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .pred %p<8>;\n.reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n\
        ld.param.u64 %rd1, [out];\nmov.u32 %r1, %tid.x;\n\
        setp.lt.u32 %p1, %r1, 7;\nsetp.lt.u32 %p2, %r1, 100;\nsetp.eq.u32 %p3, %r1, 39;\n\
        bar.red.popc.u32 %r2, 0, %p1;\n\
        bar.red.and.pred %p4, 0, %p2;\nbar.red.and.pred %p5, 0, %p1;\n\
        bar.red.or.pred %p6, 0, %p3;\nbar.red.or.pred %p7, 0, !%p2;\n\
        bar.red.popc.u32 %r3, 0, !%p1;\n\
        selp.u32 %r4, 1, 0, %p4;\nselp.u32 %r5, 1, 0, %p5;\nselp.u32 %r6, 1, 0, %p6;\nselp.u32 %r7, 1, 0, %p7;\n\
        mul.wide.u32 %rd2, %r1, 32;\nadd.s64 %rd3, %rd1, %rd2;\n\
        st.global.v2.u32 [%rd3], {%r2, %r3};\nst.global.v4.u32 [%rd3+16], {%r4, %r5, %r6, %r7};\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    assert_eq!(m.unsupported().count(), 0);
    let mem = memory(1, 40 * 32);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [40, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let got = u32s(&mem, 0, 40 * 8);
    for t in 0..40 {
        let row = &got[t * 8..t * 8 + 8];
        assert_eq!([row[0], row[1]], [7, 33], "thread {t} counts");
        assert_eq!(&row[4..], &[1, 0, 1, 0], "thread {t} and/or");
    }
}
