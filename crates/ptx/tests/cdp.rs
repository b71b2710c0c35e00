//! Device-side launches (CUDA Dynamic Parallelism, `devrt.rs`): kernels from
//! fixtures/cdp/cdp.cu, compiled by nvcc with `-rdc=true` (the PTX beside it), launch
//! children with arguments, nest, launch in order within a stream, tail-launch, allocate, copy
//! and fail to launch.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x7000_0000;
const PTX: &str = include_str!("fixtures/cdp/cdp.ptx");
/// Bytes of memory; the last `HEAP` are the device heap.
const MEM: usize = 1 << 20;
const HEAP: u64 = 256 << 10;

fn module() -> Module {
    Module::parse(PTX).expect("cdp.ptx parses")
}

fn memory() -> VecMemory {
    VecMemory::new(BASE, MEM).with_heap(HEAP)
}

/// `kernel`'s parameter bytes: each value at its parameter's offset, in its size.
fn params(m: &Module, kernel: &str, values: &[u64]) -> Vec<u8> {
    let k = m.kernel(kernel).expect("kernel");
    assert_eq!(k.params.len(), values.len(), "{kernel}'s parameters");
    let mut out = vec![0u8; k.param_bytes as usize];
    for (p, v) in k.params.iter().zip(values) {
        let at = p.offset as usize;
        out[at..at + p.size as usize].copy_from_slice(&v.to_le_bytes()[..p.size as usize]);
    }
    out
}

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

fn launch(
    m: &Module,
    mem: &VecMemory,
    kernel: &str,
    c: LaunchConfig,
    values: &[u64],
) -> Result<gpufuse_ptx::LaunchStats, ExecError> {
    m.launch(kernel, &c, &params(m, kernel, values), mem, &|_| None)
}

fn i32s(mem: &VecMemory, off: usize, n: usize) -> Vec<i32> {
    mem.read(off, 4 * n)
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn each_block_launches_a_child_with_its_arguments() {
    let m = module();
    let mem = memory();
    let per_block = 40u64;
    let stats = launch(&m, &mem, "_Z6parentPii", cfg(3, 64), &[BASE, per_block]).unwrap();
    let got = i32s(&mem, 0, 3 * per_block as usize);
    let want: Vec<i32> = (0..3)
        .flat_map(|b| (0..per_block as i32).map(move |i| 1000 * (b + 1) + i))
        .collect();
    assert_eq!(got, want);
    // The host's launch counts its children's instructions too.
    assert!(stats.lane_instructions > 3 * per_block, "{stats:?}");
    // Every parameter buffer went back to the heap.
    let heap = gpufuse_ptx::DeviceMemory::heap(&mem).unwrap();
    let (base, len) = heap.range();
    assert_eq!(heap.alloc(len), Some(base));
}

#[test]
fn launches_nest_until_the_depth_limit() {
    let m = module();
    let mem = memory();
    // Ten levels: each grid's depth and shape as its parent launched it.
    launch(&m, &mem, "_Z4nestPiii", cfg(1, 1), &[BASE, 0, 9]).unwrap();
    let log = i32s(&mem, 0, 4 * 10);
    for d in 0..10i32 {
        let row = &log[4 * d as usize..4 * d as usize + 4];
        let shape = if d == 0 {
            [1, 1]
        } else {
            [(d - 1) % 4 + 1, (d - 1) % 4 + 2]
        };
        // The deepest did not launch: its status stays 0.
        assert_eq!(row, [d, shape[0], shape[1], 0], "depth {d}");
    }
    // Asked for 30 levels: the grid at depth 24 cannot launch (cudaErrorLaunchMaxDepthExceeded),
    // every grid above it could.
    let mem = memory();
    launch(&m, &mem, "_Z4nestPiii", cfg(1, 1), &[BASE, 0, 30]).unwrap();
    let log = i32s(&mem, 0, 4 * 26);
    for d in 0..24 {
        assert_eq!(log[4 * d], d as i32);
        assert_eq!(log[4 * d + 3], 0, "depth {d}");
    }
    assert_eq!(log[4 * 24], 24);
    assert_eq!(log[4 * 24 + 3], 65, "cudaErrorLaunchMaxDepthExceeded");
    assert_eq!(&log[4 * 25..4 * 26], [0, 0, 0, 0], "no grid at depth 25");
}

#[test]
fn launches_into_one_stream_run_in_order_and_a_copy_after_them() {
    let m = module();
    let mut mem = memory();
    let (order, counter, src, dst) = (0u64, 64u64, 128u64, 256u64);
    let data: Vec<u8> = (0..16i32).flat_map(|v| (v * 3).to_le_bytes()).collect();
    mem.write(src as usize, &data);
    launch(
        &m,
        &mem,
        "_Z8in_orderPiS_S_S_i",
        cfg(1, 1),
        &[BASE + order, BASE + counter, BASE + src, BASE + dst, 16],
    )
    .unwrap();
    assert_eq!(i32s(&mem, order as usize, 8), (0..8).collect::<Vec<_>>());
    assert_eq!(i32s(&mem, counter as usize, 1), [8]);
    assert_eq!(mem.read(dst as usize, 64), data);
}

#[test]
fn a_tail_launch_runs_after_all_the_parents_other_work() {
    let m = module();
    let mem = memory();
    launch(
        &m,
        &mem,
        "_Z11tail_parentPiS_",
        cfg(1, 1),
        &[BASE, BASE + 64],
    )
    .unwrap();
    // The fire-and-forget child, its own child, then the tail launch made before them.
    assert_eq!(i32s(&mem, 0, 3), [0, 1, 2]);
}

#[test]
fn launch_errors_reach_cuda_get_last_error() {
    let m = module();
    let mem = memory();
    let (status, counter, out) = (0u64, 64u64, 128u64);
    let launches = 3000u64;
    launch(
        &m,
        &mem,
        "_Z6errorsPiS_S_i",
        cfg(3, 1024),
        &[BASE + status, BASE + counter, BASE + out, launches],
    )
    .unwrap();
    let s = i32s(&mem, status as usize, 6);
    // A block of 2048 threads: cudaErrorInvalidConfiguration, peeked, then taken.
    assert_eq!(&s[..3], [9, 9, 0]);
    // The launch with dynamic shared memory went.
    assert_eq!(s[3], 0);
    assert_eq!(i32s(&mem, out as usize, 1), [(0..64).sum::<i32>()]);
    // Of 3000 launches, 2048 may wait at once (one more waits already: shared_sum); the rest
    // fail with cudaErrorLaunchPendingCountExceeded and never run.
    let ok = 2048 - 1;
    assert_eq!(s[4], launches as i32 - ok);
    assert_eq!(s[5], launches as i32 - ok);
    assert_eq!(i32s(&mem, counter as usize, 1), [ok]);
}

#[test]
fn device_malloc_and_a_tail_launch_that_frees() {
    let m = module();
    let mem = memory();
    launch(&m, &mem, "_Z11with_mallocPii", cfg(1, 1), &[BASE, 24]).unwrap();
    assert_eq!(i32s(&mem, 0, 24), (7..31).collect::<Vec<_>>());
    let heap = gpufuse_ptx::DeviceMemory::heap(&mem).unwrap();
    let (base, len) = heap.range();
    assert_eq!(heap.alloc(len), Some(base), "the block was freed");
}

/// A fault in a child fails the host's launch with it.
#[test]
fn a_fault_in_a_child_fails_the_whole_launch() {
    let m = module();
    let mem = memory();
    let e = launch(&m, &mem, "_Z6parentPii", cfg(1, 32), &[0x10, 8]).unwrap_err();
    assert!(matches!(e, ExecError::IllegalAddress(_)), "{e:?}");
}

/// The device runtime's functions the VM lacks fail the kernels that call them, naming them;
/// the module still links.
#[test]
fn a_missing_device_runtime_function_is_named() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .extern .func (.param .b32 r) __cudaCDP2DeviceGetAttribute(.param .b64 a, .param .b32 b, .param .b32 c);\n\
        .visible .entry k(.param .u64 p) {\n .reg .b32 %r<2>;\n .reg .b64 %rd<2>;\n ld.param.u64 %rd1, [p];\n\
        { .param .b64 a0; st.param.b64 [a0], %rd1; .param .b32 a1; st.param.b32 [a1], 1; .param .b32 a2; st.param.b32 [a2], 0; .param .b32 r0;\n\
        call.uni (r0), __cudaCDP2DeviceGetAttribute, (a0, a1, a2); ld.param.b32 %r1, [r0]; }\n ret;\n}\n";
    let m = Module::link(&[("a", ptx)]).expect("links");
    let mem = memory();
    let e = m
        .launch("k", &cfg(1, 1), &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap_err();
    assert!(
        matches!(&e, ExecError::Unsupported(s) if s.contains("__cudaCDP2DeviceGetAttribute")),
        "{e:?}"
    );
}

/// A block beyond the child's `__launch_bounds__` (`.maxntid`) is
/// `cudaErrorInvalidConfiguration` at the launch call; a fitting one runs.
#[test]
fn a_launch_beyond_the_childs_bounds_fails_at_the_call() {
    let m = module();
    let mem = memory();
    launch(
        &m,
        &mem,
        "_Z14launch_boundedPiS_",
        cfg(1, 1),
        &[BASE, BASE + 64],
    )
    .unwrap();
    assert_eq!(i32s(&mem, 0, 2), [9, 0]);
    assert_eq!(i32s(&mem, 64, 1), [128]);
}
