//! A host thread reuses its last block's warps and shared memory for the next launch (so a
//! stream of small launches allocates and zeroes nothing): what one launch left behind must not
//! show in the next. Shared memory a launch wrote reads as zeros in the next launch, one that
//! only read it keeps it clean, and thread coordinates follow the new launch's shape.

use gpufuse_ptx::{LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

/// `fill_shared`: every thread writes `tid + 1` into word `tid` of a 256-word shared array.
/// `read_shared(out)`: every thread copies word `tid` of the shared array to `out[tid]`, then
/// its `%tid.x` and `%tid.y` to `out[256 + 2*tid]` and `out[256 + 2*tid + 1]`.
const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry fill_shared()
{
    .shared .align 4 .b8 words[1024];
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    mov.u32 %r1, %tid.x;
    add.u32 %r2, %r1, 1;
    mul.wide.u32 %rd1, %r1, 4;
    mov.u64 %rd2, words;
    add.u64 %rd3, %rd2, %rd1;
    st.shared.u32 [%rd3], %r2;
    ret;
}

.visible .entry read_shared(.param .u64 out)
{
    .shared .align 4 .b8 words[1024];
    .reg .b32 %r<6>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r4, %tid.y;
    mov.u32 %r5, %ntid.x;
    mad.lo.u32 %r1, %r4, %r5, %r1;
    mul.wide.u32 %rd2, %r1, 4;
    mov.u64 %rd3, words;
    add.u64 %rd4, %rd3, %rd2;
    ld.shared.u32 %r2, [%rd4];
    add.u64 %rd5, %rd1, %rd2;
    st.global.u32 [%rd5], %r2;
    mul.wide.u32 %rd6, %r1, 8;
    add.u64 %rd7, %rd1, 1024;
    add.u64 %rd8, %rd7, %rd6;
    mov.u32 %r3, %tid.x;
    st.global.u32 [%rd8], %r3;
    st.global.u32 [%rd8+4], %r4;
    ret;
}
"#;

fn u32s(mem: &VecMemory, n: usize) -> Vec<u32> {
    mem.read(0, 4 * n)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn launch(m: &Module, kernel: &str, block: [u32; 3], mem: &VecMemory) {
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block,
        dynamic_shared_bytes: 0,
    };
    let params = if kernel == "read_shared" {
        BASE.to_le_bytes().to_vec()
    } else {
        Vec::new()
    };
    // One host thread: every launch reuses the same spare block state.
    m.launch_on(kernel, &cfg, &params, mem, &|_| None, 1)
        .unwrap();
}

#[test]
fn a_launch_sees_nothing_of_the_last_ones_shared_memory_or_shape() {
    let m = Module::parse(PTX).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    launch(&m, "fill_shared", [256, 1, 1], &mem);
    launch(&m, "read_shared", [256, 1, 1], &mem);
    let out = u32s(&mem, 256 + 512);
    assert!(
        out[..256].iter().all(|&w| w == 0),
        "shared memory written by the last launch reads as zeros"
    );
    // Read again (nothing wrote it since), in another shape: still zeros, new coordinates.
    launch(&m, "read_shared", [16, 8, 1], &mem);
    let out = u32s(&mem, 256 + 512);
    assert!(out[..128].iter().all(|&w| w == 0));
    for t in 0..128usize {
        assert_eq!(out[256 + 2 * t], (t % 16) as u32, "tid.x of thread {t}");
        assert_eq!(out[256 + 2 * t + 1], (t / 16) as u32, "tid.y of thread {t}");
    }
    // The same shape twice: the coordinates kept from the last launch are still right.
    launch(&m, "read_shared", [16, 8, 1], &mem);
    let again = u32s(&mem, 256 + 512);
    assert_eq!(again, out);
}
