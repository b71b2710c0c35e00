//! `mbarrier` (what `cuda::barrier` and cooperative groups' arrive/wait compile to, found in
//! NVIDIA's simpleAWBarrier sample): two warps exchange data through shared memory across two
//! phases of one barrier, waiting with `test_wait` on a state token and `try_wait.parity`.

use gpufuse_ptx::{LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x7000_0000;

const PTX: &str = r#".version 8.0
.target sm_80
.address_size 64
.shared .align 8 .b64 bar;
.shared .align 4 .b32 data[64];
.visible .entry k(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, bar;
    mov.u32 %r3, data;
    setp.ne.u32 %p1, %r1, 0;
    mov.u32 %r4, %ntid.x;
    @!%p1 mbarrier.init.shared::cta.b64 [%r2], %r4;
    bar.sync 0;
    // Phase 0: store tid, arrive, wait on the token, read the mirror lane's value.
    shl.b32 %r5, %r1, 2;
    add.u32 %r6, %r3, %r5;
    st.shared.u32 [%r6], %r1;
    mbarrier.arrive.release.cta.shared.b64 %rd2, [%r2];
    mbarrier.pending_count.b64 %r12, %rd2;
$W0:
    mbarrier.test_wait.shared.b64 %p2, [%r2], %rd2;
    @!%p2 bra $W0;
    sub.u32 %r7, 63, %r1;
    shl.b32 %r8, %r7, 2;
    add.u32 %r9, %r3, %r8;
    ld.shared.u32 %r10, [%r9];
    // Phase 1: everyone has read; store 100 + tid, wait on parity 1.
    bar.sync 0;
    add.u32 %r11, %r1, 100;
    st.shared.u32 [%r6], %r11;
    mbarrier.arrive.shared.b64 _, [%r2];
$W1:
    mbarrier.try_wait.parity.shared.b64 %p3, [%r2], 1;
    @!%p3 bra $W1;
    ld.shared.u32 %r13, [%r9];
    cvt.u64.u32 %rd3, %r1;
    shl.b64 %rd4, %rd3, 4;
    add.u64 %rd5, %rd1, %rd4;
    st.global.v4.u32 [%rd5], {%r10, %r13, %r12, %r4};
    ret;
}
"#;

#[test]
fn two_phases_of_one_barrier_order_two_warps() {
    let m = Module::parse(PTX).unwrap();
    assert_eq!(
        m.unsupported().count(),
        0,
        "{:?}",
        m.unsupported().collect::<Vec<_>>()
    );
    let mem = VecMemory::new(BASE, 64 * 16);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let got = mem.read(0, 64 * 16);
    for t in 0..64u32 {
        let w = |k: usize| {
            let o = 16 * t as usize + 4 * k;
            u32::from_le_bytes(got[o..o + 4].try_into().unwrap())
        };
        assert_eq!(w(0), 63 - t, "phase 0, thread {t}");
        assert_eq!(w(1), 100 + 63 - t, "phase 1, thread {t}");
        // The token is the barrier before the arrival: 64 minus the arrivals before it.
        assert!(
            (1..=64).contains(&w(2)),
            "pending count {} of thread {t}",
            w(2)
        );
    }
}

#[test]
fn unknown_mbarrier_forms_are_unsupported_not_skipped() {
    let src = PTX.replace(
        "mbarrier.arrive.shared.b64 _, [%r2];",
        "mbarrier.arrive.expect_tx.shared.b64 _, [%r2], 8;",
    );
    let m = Module::parse(&src).unwrap();
    let un: Vec<_> = m.unsupported().collect();
    assert_eq!(un.len(), 1);
    assert!(un[0].1.contains("mbarrier"), "{un:?}");
}
