//! Times `wmma` on the VM: the fixture's shared-memory GEMM (tests/fixtures/wmma.cu) on
//! 256x256x256 f16 and tf32 matrices, and reports wmma.mma per second (with the loads, stores
//! and the interpreted code around them).
//!
//!     cargo run --release -p gpufuse-ptx --example wmma_bench

use gpufuse_ptx::{LaunchConfig, Module, VecMemory};

/// A warp that loads A, B and C once, then runs `wmma.mma` (or `wmma.load`) `n` times.
fn only(n: u32, what: &str) {
    let r8 = |r: &str, k: u32| {
        let v: Vec<String> = (k..k + 8).map(|i| format!("%{r}{i}")).collect();
        format!("{{{}}}", v.join(", "))
    };
    let body = match what {
        "mma" => format!(
            "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {}, {}, {}, {};",
            r8("f", 9),
            r8("r", 1),
            r8("r", 1),
            r8("f", 1)
        ),
        _ => format!(
            "wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {}, [%rd1], %r20;",
            r8("r", 1)
        ),
    };
    let ptx = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .pred %p<2>;\n.reg .b32 %r<24>;\n.reg .f32 %f<20>;\n.reg .b64 %rd<4>;\n\
         ld.param.u64 %rd1, [p];\nmov.u32 %r20, 16;\nmov.u32 %r21, 0;\n\
         wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {}, [%rd1], %r20;\n\
         wmma.load.c.sync.aligned.row.m16n16k16.global.f32 {}, [%rd1], %r20;\n\
         L:\n{body}\nadd.u32 %r21, %r21, 1;\nsetp.lt.u32 %p1, %r21, {n};\n@%p1 bra L;\nret;\n}}\n",
        r8("r", 1),
        r8("f", 1)
    );
    let m = Module::parse(&ptx).unwrap();
    let base = 0x2000_0000_0000u64;
    let mem = VecMemory::new(base, 1 << 20);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let t = std::time::Instant::now();
    m.launch("k", &cfg, &base.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let s = t.elapsed().as_secs_f64();
    println!(
        "wmma.{what} m16n16k16 f16: {:.2} us each",
        s * 1e6 / n as f64
    );
}

fn main() {
    only(20000, "mma");
    only(20000, "load");
    let m = Module::parse(include_str!("../tests/fixtures/wmma.ptx")).unwrap();
    let (n, base, mb) = (256usize, 0x2000_0000_0000u64, 1usize << 20);
    for (kernel, kt) in [("gemm_f16_shared", 16), ("gemm_tf32_shared", 8)] {
        let mem = VecMemory::new(base, 4 * mb);
        let mut p = Vec::new();
        for x in 0..4 {
            p.extend((base + (x * mb) as u64).to_le_bytes());
        }
        for _ in 0..3 {
            p.extend((n as u32).to_le_bytes());
        }
        let cfg = LaunchConfig {
            grid: [16, 1, 1],
            block: [128, 1, 1],
            dynamic_shared_bytes: 0,
        };
        let t = std::time::Instant::now();
        m.launch(kernel, &cfg, &p, &mem, &|_| None).unwrap();
        let s = t.elapsed().as_secs_f64();
        let mmas = (n / 16) * (n / 16) * (n / kt);
        println!(
            "{kernel}: {n}^3 in {s:.3} s, {mmas} wmma.mma, {:.0} per second",
            mmas as f64 / s
        );
    }
}
