//! The interpreter's fast paths for single-element loads and stores (`exec/fast.rs`) give what
//! the general path gives: values of every width and signedness, only the running lanes
//! written, and the same faults when a lane's address is out of range, misaligned or in
//! another space (the fast path declines, the general path reports it).

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

fn kernel(body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .shared .align 8 .b8 sbuf[256];\n\
         .const .align 8 .b8 cbuf[16] = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};\n\
         .visible .entry k(.param .u64 out)\n{{\n.reg .b32 %r<16>;\n.reg .b64 %rd<16>;\n\
         .reg .f32 %f<4>;\n.reg .pred %p<4>;\nld.param.u64 %rd1, [out];\n\
         mov.u32 %r1, %tid.x;\nmov.u64 %rd2, sbuf;\ncvt.u64.u32 %rd3, %r1;\n{body}\nret;\n}}\n"
    )
}

/// Where the test places the module's `.const` variable `cbuf` (the device would).
const CBUF: u64 = BASE + 3072;

fn launch(body: &str, mem: &VecMemory) -> Result<(), ExecError> {
    let m = Module::parse(&kernel(body)).unwrap();
    assert_eq!(m.unsupported().count(), 0);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), mem, &|name| {
        (name == "cbuf").then_some(CBUF)
    })
    .map(|_| ())
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap())
}

#[test]
fn loads_and_stores_give_the_general_paths_values() {
    let mut mem = VecMemory::new(BASE, 4096);
    // Global input at BASE + 2048: words 1000 + i.
    let input: Vec<u8> = (0..64u32).flat_map(|i| (1000 + i).to_le_bytes()).collect();
    mem.write(2048, &input);
    mem.write((CBUF - BASE) as usize, &(1..=16u8).collect::<Vec<_>>());
    // Each lane: shared u32 (tid * 3 - 5, negative for tid < 2) and u64, read back by the
    // mirror lane; an s32 load widened by cvt.s64.s32; a global and a generic load; a const
    // load; odd lanes only store to a second shared slot (the even lanes' slots stay 0).
    let body = "shl.b64 %rd4, %rd3, 2;\nadd.u64 %rd5, %rd2, %rd4;\n\
        mul.lo.u32 %r2, %r1, 3;\nsub.u32 %r2, %r2, 5;\nst.shared.u32 [%rd5], %r2;\n\
        shl.b64 %rd6, %rd3, 3;\nadd.u64 %rd7, %rd2, %rd6;\ncvt.u64.u32 %rd8, %r2;\n\
        add.u64 %rd8, %rd8, 0x100000000;\nst.shared.u64 [%rd7+128], %rd8;\n\
        and.b32 %r3, %r1, 1;\nsetp.eq.u32 %p1, %r3, 1;\n\
        @%p1 st.shared.u32 [%rd5+0], 77;\n\
        bar.sync 0;\n\
        sub.u32 %r4, 31, %r1;\nmul.wide.u32 %rd9, %r4, 4;\nadd.u64 %rd10, %rd2, %rd9;\n\
        ld.shared.s32 %r5, [%rd10];\ncvt.s64.s32 %rd11, %r5;\n\
        mul.wide.u32 %rd9, %r4, 8;\nadd.u64 %rd10, %rd2, %rd9;\nld.shared.u64 %rd12, [%rd10+128];\n\
        add.u64 %rd13, %rd1, %rd4;\nld.global.u32 %r6, [%rd13+2048];\n\
        ld.u32 %r7, [%rd13+2052];\n\
        and.b64 %rd14, %rd3, 1;\nmov.u64 %rd15, cbuf;\nshl.b64 %rd14, %rd14, 3;\n\
        add.u64 %rd15, %rd15, %rd14;\nld.const.u64 %rd14, [%rd15];\n\
        shl.b64 %rd15, %rd3, 5;\nadd.u64 %rd15, %rd1, %rd15;\n\
        st.global.u64 [%rd15], %rd11;\nst.global.u64 [%rd15+8], %rd12;\n\
        st.global.u32 [%rd15+16], %r6;\nst.global.u32 [%rd15+20], %r7;\n\
        st.global.u64 [%rd15+24], %rd14;";
    launch(body, &mem).unwrap();
    let got = mem.read(0, 1024);
    for t in 0..32u32 {
        let m = 31 - t;
        let row = &got[32 * t as usize..32 * t as usize + 32];
        let stored = if m % 2 == 1 {
            77
        } else {
            (m * 3).wrapping_sub(5)
        };
        assert_eq!(
            u64_at(row, 0),
            stored as i32 as i64 as u64,
            "s32 load, lane {t}"
        );
        let wide = (m * 3).wrapping_sub(5) as u64 + (1 << 32);
        assert_eq!(u64_at(row, 1), wide, "u64 load, lane {t}");
        assert_eq!(u32_at(row, 4), 1000 + t, "global load, lane {t}");
        assert_eq!(u32_at(row, 5), 1001 + t, "generic load, lane {t}");
        let c = if t % 2 == 0 {
            0x0807_0605_0403_0201
        } else {
            0x100f_0e0d_0c0b_0a09
        };
        assert_eq!(u64_at(row, 3), c, "const load, lane {t}");
    }
}

#[test]
fn out_of_range_and_misaligned_lanes_still_fault() {
    let run = |body: &str| launch(body, &VecMemory::new(BASE, 4096));
    // One lane past the end of shared memory.
    let past =
        "setp.eq.u32 %p1, %r1, 9;\n@%p1 add.u64 %rd2, %rd2, 65536;\nld.shared.u32 %r2, [%rd2];";
    assert!(matches!(run(past), Err(ExecError::IllegalAddress(_))));
    let past_st =
        "setp.eq.u32 %p1, %r1, 9;\n@%p1 add.u64 %rd2, %rd2, 4096;\nst.shared.u32 [%rd2], %r1;";
    assert!(matches!(run(past_st), Err(ExecError::IllegalAddress(_))));
    // One lane misaligned.
    let odd = "setp.eq.u32 %p1, %r1, 3;\n@%p1 add.u64 %rd2, %rd2, 2;\nld.shared.u32 %r2, [%rd2];";
    assert!(matches!(run(odd), Err(ExecError::MisalignedAddress(_))));
    let odd_st =
        "setp.eq.u32 %p1, %r1, 3;\n@%p1 add.u64 %rd2, %rd2, 4;\nst.shared.u64 [%rd2], %rd3;";
    assert!(matches!(run(odd_st), Err(ExecError::MisalignedAddress(_))));
    // Global: a first load caches the region, then one lane steps past its end.
    let global = "ld.global.u32 %r2, [%rd1];\nsetp.eq.u32 %p1, %r1, 30;\n\
        @%p1 add.u64 %rd1, %rd1, 4096;\nld.global.u32 %r3, [%rd1];";
    assert_eq!(run(global), Err(ExecError::IllegalAddress(BASE + 4096)));
    let global_odd = "ld.global.u32 %r2, [%rd1];\nsetp.eq.u32 %p1, %r1, 30;\n\
        @%p1 add.u64 %rd1, %rd1, 4;\nld.global.u64 %rd4, [%rd1];";
    assert_eq!(run(global_odd), Err(ExecError::MisalignedAddress(BASE + 4)));
    // Lanes predicated off may hold any address.
    let off = "setp.eq.u32 %p1, %r1, 9;\n@%p1 add.u64 %rd2, %rd2, 4096;\n\
        @!%p1 ld.shared.u32 %r2, [%rd2];\n@!%p1 st.shared.u32 [%rd2], %r2;";
    run(off).unwrap();
}

/// A 32-bit register as an address base makes a 32-bit address: `[%r+off]` with `%r`
/// "negative" (CUTLASS computes shared-memory offsets so) wraps to a small offset, in the fast
/// paths and the general path alike, for loads, stores and vector accesses.
#[test]
fn a_32_bit_base_register_wraps_the_address_in_32_bits() {
    let mem = VecMemory::new(BASE, 4096);
    // %r4 = sbuf + tid*8 - 49280 (mod 2^32); [%r4+49280] is sbuf + tid*8.
    let body = "mov.u32 %r2, sbuf;\nshl.b32 %r3, %r1, 3;\nadd.u32 %r4, %r2, %r3;\n\
        sub.u32 %r4, %r4, 49280;\nadd.u32 %r5, %r1, 7;\nst.shared.u32 [%r4+49280], %r5;\n\
        st.shared.u32 [%r4+49284], %r1;\nbar.sync 0;\nld.shared.v2.u32 {%r6, %r7}, [%r4+49280];\n\
        add.u32 %r8, %r6, %r7;\nshl.b64 %rd4, %rd3, 2;\nadd.u64 %rd5, %rd1, %rd4;\n\
        st.global.u32 [%rd5], %r8;";
    launch(body, &mem).unwrap();
    let out = mem.read(0, 128);
    for l in 0..32 {
        assert_eq!(u32_at(&out, l), 2 * l as u32 + 7, "lane {l}");
    }
}
