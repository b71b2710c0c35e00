//! Indirect calls through function addresses, tables of function addresses in module
//! variables, and `bar.warp.sync` beside a block barrier: hand-written PTX in nvcc's forms.

use gpufuse_ptx::{function_address, ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

/// Three device functions `(a, b) -> a + b`, `a - b`, `a * b` (functions 0, 1, 2 of the
/// module), a kernel calling one of them per lane through a register, and one calling through
/// a table in a module variable.
const FUNCS: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.func (.param .b32 r) op_add(.param .b32 a, .param .b32 b);
.global .align 8 .u64 table[4] = {op_mul, op_add, op_sub, 0};

.func (.param .b32 r) op_add(.param .b32 a, .param .b32 b)
{
    .reg .b32 %r<4>;
    ld.param.b32 %r1, [a];
    ld.param.b32 %r2, [b];
    add.s32 %r3, %r1, %r2;
    st.param.b32 [r], %r3;
    ret;
}
.func (.param .b32 r) op_sub(.param .b32 a, .param .b32 b)
{
    .reg .b32 %r<4>;
    ld.param.b32 %r1, [a];
    ld.param.b32 %r2, [b];
    sub.s32 %r3, %r1, %r2;
    st.param.b32 [r], %r3;
    ret;
}
.func (.param .b32 r) op_mul(.param .b32 a, .param .b32 b)
{
    .reg .b32 %r<4>;
    ld.param.b32 %r1, [a];
    ld.param.b32 %r2, [b];
    mul.lo.s32 %r3, %r1, %r2;
    st.param.b32 [r], %r3;
    ret;
}

// out[t] = f(t, 7) with f = op_add, op_sub, op_mul for t % 3 = 0, 1, 2.
.visible .entry by_register(.param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    rem.u32 %r2, %r1, 3;
    mov.u64 %rd2, op_add;
    mov.u64 %rd3, op_sub;
    cvta.global.u64 %rd4, op_mul;
    setp.eq.u32 %p1, %r2, 1;
    selp.b64 %rd5, %rd3, %rd2, %p1;
    setp.eq.u32 %p2, %r2, 2;
    selp.b64 %rd5, %rd4, %rd5, %p2;
    { // callseq 0, 0
    .param .b32 param0;
    st.param.b32 [param0+0], %r1;
    .param .b32 param1;
    st.param.b32 [param1+0], 7;
    .param .b32 retval0;
    prototype_0 : .callprototype (.param .b32 _) _ (.param .b32 _, .param .b32 _);
    call (retval0),
    %rd5,
    (
    param0,
    param1
    )
    , prototype_0;
    ld.param.b32 %r3, [retval0+0];
    } // callseq 0
    mul.wide.u32 %rd6, %r1, 4;
    add.s64 %rd7, %rd1, %rd6;
    st.global.u32 [%rd7], %r3;
    ret;
}

// out[t] = table[t % 3](t, 5); the address of op_sub goes to out2.
.visible .entry by_table(.param .u64 out, .param .u64 out2)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    rem.u32 %r2, %r1, 3;
    mul.wide.u32 %rd2, %r2, 8;
    mov.u64 %rd3, table;
    add.s64 %rd4, %rd3, %rd2;
    ld.global.u64 %rd5, [%rd4];
    {
    .param .b32 param0;
    st.param.b32 [param0+0], %r1;
    .param .b32 param1;
    st.param.b32 [param1+0], 5;
    .param .b32 retval0;
    prototype_1 : .callprototype (.param .b32 _) _ (.param .b32 _, .param .b32 _);
    call (retval0), %rd5, (param0, param1), prototype_1;
    ld.param.b32 %r3, [retval0+0];
    }
    mul.wide.u32 %rd6, %r1, 4;
    add.s64 %rd7, %rd1, %rd6;
    st.global.u32 [%rd7], %r3;
    ld.param.u64 %rd8, [out2];
    mov.u64 %rd9, op_sub;
    st.global.u64 [%rd8], %rd9;
    ret;
}

// Calls through table[3] (0) on odd lanes, or through the kernel's own address on lane 2.
.visible .entry bad_target(.param .u64 which)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [which];
    mov.u64 %rd2, op_add;
    setp.ne.u64 %p1, %rd1, 0;
    @%p1 mov.u64 %rd2, %rd1;
    {
    .param .b32 param0;
    st.param.b32 [param0+0], 1;
    .param .b32 param1;
    st.param.b32 [param1+0], 2;
    .param .b32 retval0;
    prototype_2 : .callprototype (.param .b32 _) _ (.param .b32 _, .param .b32 _);
    call (retval0), %rd2, (param0, param1), prototype_2;
    }
    ret;
}
"#;

fn cfg(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

fn u32s(m: &VecMemory, off: usize, n: usize) -> Vec<u32> {
    m.read(off, 4 * n)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Lanes of one warp call different functions through a register: each runs its own, and
/// gets its own return value; `mov` and `cvta` of a function's name give its address.
#[test]
fn indirect_calls_dispatch_per_lane() {
    let m = Module::parse(FUNCS).unwrap();
    assert_eq!(
        m.unsupported().count(),
        0,
        "{:?}",
        m.unsupported().collect::<Vec<_>>()
    );
    let mem = VecMemory::new(BASE, 4096);
    let n = 70u32;
    m.launch("by_register", &cfg(n), &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let out = u32s(&mem, 0, n as usize);
    for t in 0..n {
        let want = match t % 3 {
            0 => t + 7,
            1 => t.wrapping_sub(7),
            _ => t * 7,
        };
        assert_eq!(out[t as usize], want, "thread {t}");
    }
}

/// `.u64 table[] = {op_mul, op_add, op_sub, 0}` holds the functions' addresses (function `i`
/// of the module at `function_address(i)`), and calls through the loaded entries work.
#[test]
fn tables_of_function_addresses() {
    let m = Module::parse(FUNCS).unwrap();
    let g = &m.globals()[0];
    assert_eq!(g.name, "table");
    let init = g.init.clone().unwrap();
    let want: Vec<u8> = [
        function_address(2),
        function_address(0),
        function_address(1),
        0,
    ]
    .iter()
    .flat_map(|a| a.to_le_bytes())
    .collect();
    assert_eq!(init, want);
    // Device memory: out at +0, out2 at +1024, the table at +2048.
    let mut mem = VecMemory::new(BASE, 4096);
    mem.write(2048, &init);
    let table = BASE + 2048;
    let params: Vec<u8> = [BASE, BASE + 1024]
        .iter()
        .flat_map(|a| a.to_le_bytes())
        .collect();
    let n = 40u32;
    m.launch("by_table", &cfg(n), &params, &mem, &|s| {
        (s == "table").then_some(table)
    })
    .unwrap();
    let out = u32s(&mem, 0, n as usize);
    for t in 0..n {
        let want = match t % 3 {
            0 => t * 5,
            1 => t + 5,
            _ => t.wrapping_sub(5),
        };
        assert_eq!(out[t as usize], want, "thread {t}");
    }
    let sub = u64::from_le_bytes(mem.read(1024, 8).try_into().unwrap());
    assert_eq!(sub, function_address(1));
}

/// A call through an address that is no device function (0, a data address, a kernel's
/// address) is an illegal address.
#[test]
fn indirect_calls_of_non_functions_are_illegal_addresses() {
    let m = Module::parse(FUNCS).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    m.launch("bad_target", &cfg(32), &0u64.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let kernel = function_address(3); // by_register, an entry
    for bad in [
        1u64,
        BASE,
        kernel,
        function_address(99),
        function_address(0) + 4,
    ] {
        let e = m
            .launch("bad_target", &cfg(32), &bad.to_le_bytes(), &mem, &|_| None)
            .unwrap_err();
        assert_eq!(e, ExecError::IllegalAddress(bad), "{bad:#x}");
    }
}

/// warp.cu's `syncwarp_barrier`: warp 0 runs `bar.warp.sync` several times inside
/// `if (warp == 0)` while warp 1 waits at `bar.sync 0`. The warp barriers must not count
/// toward the block's: warp 1 leaves its barrier only after warp 0 wrote 2.
#[test]
fn warp_barriers_do_not_release_the_block_barrier() {
    let ptx = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry syncwarp(.param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .shared .align 4 .u32 s;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    shr.u32 %r2, %r1, 5;
    setp.ne.s32 %p1, %r2, 0;
    @%p1 bra $L_wait;
    st.shared.u32 [s], 1;
    bar.warp.sync -1;
    bar.warp.sync -1;
    bar.warp.sync -1;
    ld.shared.u32 %r3, [s];
    add.s32 %r3, %r3, 1;
    bar.warp.sync -1;
    st.shared.u32 [s], %r3;
$L_wait:
    bar.sync 0;
    ld.shared.u32 %r4, [s];
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r4;
    ret;
}
"#;
    let m = Module::parse(ptx).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    m.launch("syncwarp", &cfg(96), &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    assert_eq!(u32s(&mem, 0, 96), vec![2; 96]);
}
