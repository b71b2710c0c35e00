//! Cooperative launches (tests/fixtures/cooperative.cu, nvcc 13.5): every block resident at
//! once, so `this_grid().sync()` and flags between blocks work; a grid in which every block
//! waits for memory no block writes fails instead of hanging.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;
const WORKSPACE: u64 = BASE + (1 << 20);

fn module() -> Module {
    Module::parse(include_str!("fixtures/cooperative.ptx")).unwrap()
}

fn params(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

fn grid_sum(threads: usize, grid: u32, block: u32) {
    let m = module();
    let n = 10_000usize;
    let mut mem = VecMemory::new(BASE, 2 << 20);
    let input: Vec<i32> = (0..n as i32).map(|i| i * 7 % 1000 - 300).collect();
    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    mem.write(0, &bytes);
    let (partial, out) = (BASE + (64 << 10), BASE + (128 << 10));
    let p = params(&[BASE, partial, out, n as u64]);
    // Twice: the workspace is left as the first launch left it, as CUDA's is.
    for _ in 0..2 {
        mem.write(64 << 10, &vec![0; 64 << 10]);
        m.launch_with(
            "grid_sum",
            &cfg(grid, block),
            &p,
            &mem,
            &|_| None,
            threads,
            Some(WORKSPACE),
        )
        .unwrap();
        let want: i64 = input.iter().map(|&v| v as i64).sum();
        let got = mem.read(128 << 10, 8 * (1 + (grid * block) as usize));
        let words: Vec<i64> = got
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            words.iter().all(|&w| w == want),
            "{threads} threads: {:?} != {want}",
            &words[..4]
        );
    }
}

#[test]
fn grid_sync_sums_on_one_host_thread() {
    grid_sum(1, 24, 64);
}

#[test]
fn grid_sync_sums_on_several_host_threads() {
    grid_sum(4, 37, 96);
}

#[test]
fn grid_sync_without_a_cooperative_launch_traps() {
    // As on a GPU: the workspace pointer is 0 and cooperative groups traps.
    let m = module();
    let mem = VecMemory::new(BASE, 2 << 20);
    let p = params(&[BASE, BASE + 4096, BASE + 8192, 16]);
    let e = m
        .launch_on("grid_sum", &cfg(2, 32), &p, &mem, &|_| None, 1)
        .unwrap_err();
    assert!(matches!(e, ExecError::Trap), "{e:?}");
}

#[test]
fn blocks_waiting_on_each_other_complete() {
    let m = module();
    for threads in [1, 3] {
        let mem = VecMemory::new(BASE, 2 << 20);
        let p = params(&[BASE]);
        m.launch_with(
            "chain",
            &cfg(50, 32),
            &p,
            &mem,
            &|_| None,
            threads,
            Some(WORKSPACE),
        )
        .unwrap();
        let got = mem.read(0, 4 * 50);
        for b in 0..50 {
            let v = i32::from_le_bytes(got[4 * b..4 * b + 4].try_into().unwrap());
            assert_eq!(v, b as i32 + 1, "{threads} threads, flag {b}");
        }
    }
}

#[test]
fn a_grid_where_no_block_can_progress_fails() {
    let m = module();
    for threads in [1, 2] {
        let mem = VecMemory::new(BASE, 2 << 20);
        let p = params(&[BASE]);
        let e = m
            .launch_with(
                "wait_forever",
                &cfg(8, 64),
                &p,
                &mem,
                &|_| None,
                threads,
                Some(WORKSPACE),
            )
            .unwrap_err();
        assert!(matches!(e, ExecError::Deadlock(_)), "{e:?}");
        assert!(e.to_string().contains("can make progress"), "{e}");
    }
}

/// Warp 0 spins until warp 1 of the same block sets a flag (no barrier between them): warps of
/// a block take turns, so this ends in any launch, cooperative or not.
#[test]
fn warps_of_a_block_waiting_on_each_other_complete() {
    let src = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 flag)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [flag];
    mov.u32 %r1, %tid.x;
    setp.lt.u32 %p1, %r1, 32;
    @%p1 bra WAIT;
    mov.u32 %r2, 7;
    st.volatile.global.u32 [%rd1], %r2;
    ret;
WAIT:
    ld.volatile.global.u32 %r3, [%rd1];
    setp.eq.u32 %p2, %r3, 0;
    @%p2 bra WAIT;
    st.global.u32 [%rd1+4], %r3;
    ret;
}
"#;
    let m = Module::parse(src).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    m.launch_on("spin", &cfg(1, 64), &params(&[BASE]), &mem, &|_| None, 1)
        .unwrap();
    assert_eq!(mem.read(4, 4), 7u32.to_le_bytes());
}
