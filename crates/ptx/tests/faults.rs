//! Faults a GPU raises that the VM must raise too: misaligned accesses and device-side
//! `assert()` (a call of the `.extern` function `__assertfail`).

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

fn kernel(body: &str, decls: &str) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n{decls}\n\
         .visible .entry k(.param .u64 out)\n{{\n.reg .b32 %r<8>;\n.reg .b64 %rd<12>;\n\
         .reg .pred %p<4>;\nld.param.u64 %rd1, [out];\n{body}\nret;\n}}\n"
    )
}

fn launch(
    ptx: &str,
    mem: &VecMemory,
    threads: u32,
    symbols: &dyn Fn(&str) -> Option<u64>,
) -> Result<(), ExecError> {
    let m = Module::parse(ptx).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), mem, symbols)
        .map(|_| ())
}

fn run(body: &str) -> Result<(), ExecError> {
    let mem = VecMemory::new(BASE, 4096);
    launch(&kernel(body, ""), &mem, 32, &|_| None)
}

#[test]
fn misaligned_accesses_fault() {
    let e = run("ld.global.u32 %r1, [%rd1+1];").unwrap_err();
    assert_eq!(e, ExecError::MisalignedAddress(BASE + 1));
    assert_eq!(
        run("st.global.u32 [%rd1+3], %r1;").unwrap_err(),
        ExecError::MisalignedAddress(BASE + 3)
    );
    // Vectors need the whole access aligned; an element-aligned v4 is not enough.
    assert_eq!(
        run("ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1+4];").unwrap_err(),
        ExecError::MisalignedAddress(BASE + 4)
    );
    assert_eq!(
        run("ld.global.v2.u64 {%rd2, %rd3}, [%rd1+8];").unwrap_err(),
        ExecError::MisalignedAddress(BASE + 8)
    );
    // Only one lane misaligned is enough; generic addresses too.
    assert_eq!(
        run(
            "mov.u32 %r1, %tid.x;\nsetp.eq.u32 %p1, %r1, 5;\nselp.u64 %rd2, 2, 0, %p1;\n\
             add.u64 %rd3, %rd1, %rd2;\nld.u32 %r2, [%rd3];"
        )
        .unwrap_err(),
        ExecError::MisalignedAddress(BASE + 2)
    );
    assert_eq!(
        run("atom.global.add.u32 %r1, [%rd1+2], 1;").unwrap_err(),
        ExecError::MisalignedAddress(BASE + 2)
    );
    assert!(matches!(
        run("red.global.add.u64 [%rd1+4], 1;").unwrap_err(),
        ExecError::MisalignedAddress(_)
    ));
    // Shared and local memory.
    let shared = ".shared .align 8 .b8 buf[64];\nmov.u64 %rd2, buf;\nld.shared.u32 %r1, [%rd2+6];";
    assert!(matches!(
        run(shared).unwrap_err(),
        ExecError::MisalignedAddress(_)
    ));
    let local = ".local .align 8 .b8 loc[16];\nmov.u64 %rd2, loc;\nst.local.u64 [%rd2+4], %rd1;";
    assert!(matches!(
        run(local).unwrap_err(),
        ExecError::MisalignedAddress(_)
    ));
    // Aligned accesses, bytes anywhere, and predicated-off lanes are fine.
    run(
        "ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1+16];\nld.global.u8 %r1, [%rd1+3];\n\
         st.global.u64 [%rd1+8], %rd1;\nsetp.ne.u32 %p1, 0, 0;\n@%p1 ld.global.u32 %r1, [%rd1+1];",
    )
    .unwrap();
}

const ASSERT_DECL: &str = ".extern .func __assertfail\n(\n.param .b64 __assertfail_param_0,\n\
    .param .b64 __assertfail_param_1,\n.param .b32 __assertfail_param_2,\n\
    .param .b64 __assertfail_param_3,\n.param .b64 __assertfail_param_4\n)\n;\n\
    .global .align 1 .b8 $str[6] = {120, 32, 60, 32, 51, 0};\n\
    .global .align 1 .b8 $str$1[5] = {107, 46, 99, 117, 0};\n\
    .global .align 1 .b8 __unnamed_1[5] = {118, 111, 105, 100, 0};";

/// The call sequence nvcc emits for `assert(x < 3)` in thread `tid == 7`.
const ASSERT_BODY: &str = "mov.u32 %r1, %tid.x;\nsetp.ne.u32 %p1, %r1, 7;\n@%p1 bra $L_ok;\n\
    mov.u64 %rd2, $str;\ncvta.global.u64 %rd3, %rd2;\nmov.u64 %rd4, $str$1;\n\
    cvta.global.u64 %rd5, %rd4;\nmov.u64 %rd6, __unnamed_1;\ncvta.global.u64 %rd7, %rd6;\n\
    mov.u32 %r2, 42;\nmov.u64 %rd8, 1;\n\
    { // callseq 0, 0\n.param .b64 param0;\nst.param.b64 [param0], %rd3;\n\
    .param .b64 param1;\nst.param.b64 [param1], %rd5;\n.param .b32 param2;\n\
    st.param.b32 [param2], %r2;\n.param .b64 param3;\nst.param.b64 [param3], %rd7;\n\
    .param .b64 param4;\nst.param.b64 [param4], %rd8;\n\
    call.uni \n__assertfail, \n(\nparam0, \nparam1, \nparam2, \nparam3, \nparam4\n);\n\
    } // callseq 0\n$L_ok:\nst.global.u32 [%rd1], %r1;";

#[test]
fn device_assert_ends_the_kernel_with_its_message() {
    let ptx = kernel(ASSERT_BODY, ASSERT_DECL);
    let mut mem = VecMemory::new(BASE, 4096);
    let syms = |name: &str| match name {
        "$str" => Some(BASE + 1024),
        "$str$1" => Some(BASE + 1040),
        "__unnamed_1" => Some(BASE + 1056),
        _ => None,
    };
    mem.write(1024, b"x < 3\0");
    mem.write(1040, b"k.cu\0");
    mem.write(1056, b"void\0");
    let e = launch(&ptx, &mem, 32, &syms).unwrap_err();
    assert_eq!(
        e,
        ExecError::Assert("k.cu:42: void: Assertion `x < 3` failed.".into())
    );
    // The strings unreadable (outside device memory): the generic message.
    let e = launch(&ptx, &mem, 32, &|_| Some(0x10)).unwrap_err();
    assert_eq!(e, ExecError::Assert("device-side assert triggered".into()));
    // No thread reaching the call: the kernel completes.
    launch(&ptx, &mem, 4, &syms).unwrap();
}

#[test]
fn other_functions_without_a_body_stay_unsupported() {
    // Device-side launch (CUDA dynamic parallelism) has no body in the module either.
    let decls = ".extern .func (.param .b32 r) cudaGetParameterBufferV2\n(\n.param .b64 a,\n.param .b64 b\n)\n;";
    let body = "{\n.param .b64 param0;\nst.param.b64 [param0], %rd1;\n.param .b64 param1;\n\
        st.param.b64 [param1], %rd1;\n.param .b32 retval0;\n\
        call.uni (retval0), cudaGetParameterBufferV2, (param0, param1);\n}";
    let mem = VecMemory::new(BASE, 4096);
    let e = launch(&kernel(body, decls), &mem, 1, &|_| None).unwrap_err();
    assert!(
        matches!(&e, ExecError::Unsupported(m) if m.contains("cudaGetParameterBufferV2")),
        "{e}"
    );
}
