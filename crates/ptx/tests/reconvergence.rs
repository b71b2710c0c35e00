//! Divergent lanes meet again at the branch's immediate post-dominator, as on a GPU, whatever
//! the compiler's block layout: warp-synchronous code (no `__syncwarp`) that swaps values
//! between lanes in a loop, with one side of a branch placed out of line after the loop,
//! reads what the previous round wrote. Min-PC scheduling alone let the lanes on the inline
//! side start the next round first (CuPy's 32-thread bitonic select for `partition` is such
//! code).

use gpufuse_ptx::{LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

/// A kernel of one warp over a shared array `s[l] = l`, `rounds` rounds of `body`, storing
/// `s` to `out`. `body` reads `%r10 = s[(l+1) % 32]` first; `%p1` is "lane even", `%r4` the
/// lane's own slot, `%r7` the neighbour's. `tail` is placed after the kernel's `ret`.
fn kernel(body: &str, tail: &str, rounds: u32) -> Module {
    let ptx = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 out)\n{{\n.reg .pred %p<4>;\n.reg .b32 %r<20>;\n\
         .reg .b64 %rd<8>;\n.shared .align 4 .b8 s[128];\n\
         mov.u32 %r1, %tid.x;\nshl.b32 %r2, %r1, 2;\nmov.u32 %r3, s;\nadd.s32 %r4, %r3, %r2;\n\
         st.shared.u32 [%r4], %r1;\nadd.s32 %r5, %r1, 1;\nand.b32 %r5, %r5, 31;\n\
         shl.b32 %r6, %r5, 2;\nadd.s32 %r7, %r3, %r6;\nmov.u32 %r8, 0;\nand.b32 %r9, %r1, 1;\n\
         setp.eq.s32 %p1, %r9, 0;\nand.b32 %r12, %r1, 3;\nsetp.eq.s32 %p3, %r12, 0;\n\
         LOOP:\nld.shared.u32 %r10, [%r7];\n{body}\n\
         JOIN:\nadd.s32 %r8, %r8, 1;\nsetp.lt.s32 %p2, %r8, {rounds};\n@%p2 bra LOOP;\n\
         ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd2, %rd1;\n\
         mul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd4, %rd2, %rd3;\nld.shared.u32 %r11, [%r4];\n\
         st.global.u32 [%rd4], %r11;\nret;\n{tail}\n}}\n"
    );
    Module::parse(&ptx).unwrap()
}

fn run(m: &Module) -> Vec<u32> {
    let mem = VecMemory::new(BASE, 4096);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    mem.read(0, 128)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The lockstep result: each round every lane reads its neighbour, then every lane writes
/// `f(lane, value)`.
fn lockstep(rounds: u32, f: impl Fn(usize, u32) -> u32) -> Vec<u32> {
    let mut s: Vec<u32> = (0..32).collect();
    for _ in 0..rounds {
        let v: Vec<u32> = (0..32).map(|l| s[(l + 1) % 32]).collect();
        for l in 0..32 {
            s[l] = f(l, v[l]);
        }
    }
    s
}

#[test]
fn an_out_of_line_branch_side_rejoins_before_the_next_round() {
    // Odd lanes store inline; even lanes jump past the kernel's end, store, and come back.
    let m = kernel(
        "add.s32 %r10, %r10, 1;\n@%p1 bra FAR;\nst.shared.u32 [%r4], %r10;",
        "FAR:\nst.shared.u32 [%r4], %r10;\nbra JOIN;",
        5,
    );
    assert_eq!(run(&m), lockstep(5, |_, v| v + 1));
}

#[test]
fn nested_out_of_line_branches_rejoin() {
    // Even lanes go out of line, where lanes 0 mod 4 go further out; each adds its own amount.
    let m = kernel(
        "@%p1 bra FAR;\nadd.s32 %r10, %r10, 1;\nst.shared.u32 [%r4], %r10;",
        "FAR:\n@%p3 bra FARTHER;\nadd.s32 %r10, %r10, 10;\nst.shared.u32 [%r4], %r10;\nbra JOIN;\n\
         FARTHER:\nadd.s32 %r10, %r10, 100;\nst.shared.u32 [%r4], %r10;\nbra JOIN;",
        4,
    );
    let want = lockstep(4, |l, v| {
        if l % 4 == 0 {
            v + 100
        } else if l % 2 == 0 {
            v + 10
        } else {
            v + 1
        }
    });
    assert_eq!(run(&m), want);
}

#[test]
fn lanes_that_leave_a_loop_early_wait_at_its_exit() {
    // Lanes run 1 + (lane % 3) inner iterations (a divergent loop) before the round's store.
    let m = kernel(
        "rem.u32 %r13, %r1, 3;\nmov.u32 %r14, 0;\nINNER:\nadd.s32 %r10, %r10, 1;\n\
         add.s32 %r14, %r14, 1;\nsetp.le.u32 %p2, %r14, %r13;\n@%p2 bra INNER;\n\
         st.shared.u32 [%r4], %r10;",
        "",
        3,
    );
    assert_eq!(run(&m), lockstep(3, |l, v| v + 1 + (l % 3) as u32));
}

/// Lanes past the end of the data jump to the kernel's `ret` while the others go through
/// block barriers (CuPy's batch scan): the meeting point is the `ret`, and the barriers must
/// not wait for the lanes parked there.
#[test]
fn lanes_parked_at_a_join_do_not_block_a_barrier() {
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 out)\n{\n.reg .pred %p<4>;\n.reg .b32 %r<20>;\n\
        .reg .b64 %rd<8>;\n.shared .align 4 .b8 s[256];\n\
        mov.u32 %r1, %tid.x;\nsetp.ge.u32 %p1, %r1, 40;\n@%p1 bra DONE;\n\
        shl.b32 %r2, %r1, 2;\nmov.u32 %r3, s;\nadd.s32 %r4, %r3, %r2;\nst.shared.u32 [%r4], %r1;\n\
        bar.sync 0;\nxor.b32 %r5, %r1, 1;\nshl.b32 %r6, %r5, 2;\nadd.s32 %r7, %r3, %r6;\n\
        ld.shared.u32 %r8, [%r7];\nbar.sync 0;\nld.param.u64 %rd1, [out];\n\
        cvta.to.global.u64 %rd2, %rd1;\nmul.wide.u32 %rd3, %r1, 4;\nadd.s64 %rd4, %rd2, %rd3;\n\
        st.global.u32 [%rd4], %r8;\nDONE:\nret;\n}\n";
    let m = Module::parse(ptx).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    let got: Vec<u32> = mem
        .read(0, 4 * 40)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<u32> = (0..40).map(|l| l ^ 1).collect();
    assert_eq!(got, want);
}
