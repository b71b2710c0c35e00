//! The JIT linker (`Module::link`): units made by `nvcc -rdc=true -ptx` (fixtures/link: the
//! sources are beside their PTX) and hand-written units for each linkage rule.

use gpufuse_ptx::{LaunchConfig, Module, PtxError, VecMemory};

const BASE: u64 = 0x7000_0000;
const UNIT_A: &str = include_str!("fixtures/link/link_a.ptx");
const UNIT_B: &str = include_str!("fixtures/link/link_b.ptx");

/// Device memory with the module's variables in it: bytes [0, 4096) are the kernel's buffer,
/// the variables follow. Returns the memory and each variable's address.
fn load(m: &Module) -> (VecMemory, Vec<(String, u64)>) {
    let mut mem = VecMemory::new(BASE, 1 << 16);
    let mut addrs = Vec::new();
    let mut off = 4096u64;
    for v in m.globals() {
        off = off.div_ceil(v.align.max(8)) * v.align.max(8);
        if let Some(init) = &v.init {
            mem.write(off as usize, init);
        }
        addrs.push((v.name.clone(), BASE + off));
        off += v.size.max(1);
    }
    (mem, addrs)
}

fn one_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

fn u32s(mem: &VecMemory, off: usize, n: usize) -> Vec<u32> {
    mem.read(off, 4 * n)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn link_err(units: &[(&str, &str)]) -> String {
    match Module::link(units) {
        Err(PtxError::Link(m)) => m,
        Err(e) => panic!("not a link error: {e}"),
        Ok(_) => panic!("linked"),
    }
}

/// nvcc's two units: unit A's kernel calls B's `scale`, reads B's `offset`, counts in B's
/// `total`; both units have a `$str` (their printf formats) of their own.
#[test]
fn units_from_nvcc_rdc_link_and_run() {
    // Alone, unit A's PTX names what only unit B defines.
    let e = link_err(&[("link_a.ptx", UNIT_A)]);
    assert!(
        e.contains("`_Z5scalei`") && e.contains("`offset`") && e.contains("`total`"),
        "{e}"
    );

    let m = Module::link(&[("link_a.ptx", UNIT_A), ("link_b.ptx", UNIT_B)]).unwrap();
    let names: Vec<&str> = m.kernels().iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["_Z5applyPii", "_Z6reportPi"]);
    // One `offset` and one `total`, two format strings.
    let vars: Vec<&str> = m.globals().iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        vars.iter().filter(|v| **v == "offset").count(),
        1,
        "{vars:?}"
    );
    assert_eq!(
        vars.iter().filter(|v| v.starts_with("$str")).count(),
        2,
        "{vars:?}"
    );

    let (mut mem, addrs) = load(&m);
    let sym = |n: &str| addrs.iter().find(|(a, _)| a == n).map(|(_, x)| *x);
    let n = 8u32;
    for i in 0..n {
        mem.write(4 * i as usize, &i.to_le_bytes());
    }
    let mut params = BASE.to_le_bytes().to_vec();
    params.extend_from_slice(&n.to_le_bytes());
    m.launch("_Z5applyPii", &one_block(32), &params, &mem, &sym)
        .unwrap();
    let want: Vec<u32> = (0..n).map(|i| 3 * i + 2 + 7 + 1000 + (i % 4 + 1)).collect();
    assert_eq!(u32s(&mem, 0, n as usize), want);
    m.launch(
        "_Z6reportPi",
        &one_block(1),
        &(BASE + 64).to_le_bytes(),
        &mem,
        &sym,
    )
    .unwrap();
    assert_eq!(u32s(&mem, 64, 1), [n]);
    assert_eq!(
        String::from_utf8(mem.take_printed()).unwrap(),
        "unit a 8\nunit b 8\n"
    );
    // The order of the units does not matter.
    let m2 = Module::link(&[("link_b.ptx", UNIT_B), ("link_a.ptx", UNIT_A)]).unwrap();
    assert_eq!(m2.kernels().len(), 2);
}

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// A kernel writing `f()` and the variable `v` to its output.
fn caller() -> String {
    format!(
        "{HEAD}.extern .func (.param .b32 r) f();\n.extern .global .u32 v;\n\
         .func (.param .b32 r) g() {{ st.param.b32 [r], 1; ret; }}\n\
         .visible .entry k(.param .u64 out)\n{{\n.reg .b32 %r<4>;\n.reg .b64 %rd<2>;\n\
         ld.param.u64 %rd1, [out];\n\
         {{ .param .b32 r0; call.uni (r0), f, (); ld.param.b32 %r1, [r0]; }}\n\
         {{ .param .b32 r1; call.uni (r1), g, (); ld.param.b32 %r3, [r1]; }}\n\
         ld.global.u32 %r2, [v];\nst.global.u32 [%rd1], %r1;\nst.global.u32 [%rd1+4], %r2;\n\
         st.global.u32 [%rd1+8], %r3;\nret;\n}}\n"
    )
}

/// A unit defining `f` (returning `fv`) with `link` and `v` (= `vv`) with `vlink`; its own
/// internal `g` returns 2.
fn callee(link: &str, fv: u32, vlink: &str, vv: u32) -> String {
    format!(
        "{HEAD}{vlink} .global .u32 v = {vv};\n\
         .func (.param .b32 r) g() {{ st.param.b32 [r], 2; ret; }}\n\
         {link} .func (.param .b32 r) f() {{ .reg .b32 %x; \
         {{ .param .b32 q; call.uni (q), g, (); ld.param.b32 %x, [q]; }}\n\
         add.u32 %x, %x, {fv}; st.param.b32 [r], %x; ret; }}\n"
    )
}

/// Runs `k` of the linked units: (f(), v, g() as the caller sees it).
fn run(units: &[(&str, &str)]) -> [u32; 3] {
    let m = Module::link(units).unwrap_or_else(|e| panic!("{e}"));
    let (mem, addrs) = load(&m);
    let sym = |n: &str| addrs.iter().find(|(a, _)| a == n).map(|(_, x)| *x);
    m.launch("k", &one_block(1), &BASE.to_le_bytes(), &mem, &sym)
        .unwrap();
    u32s(&mem, 0, 3).try_into().unwrap()
}

#[test]
fn internal_names_stay_in_their_unit() {
    // Both units have an internal `g`: each unit's calls reach its own.
    let a = caller();
    let b = callee(".visible", 10, ".visible", 5);
    assert_eq!(run(&[("a", &a), ("b", &b)]), [12, 5, 1]);
    assert_eq!(run(&[("b", &b), ("a", &a)]), [12, 5, 1]);
}

#[test]
fn weak_definitions_give_way_to_strong_ones() {
    let a = caller();
    let weak = callee(".weak", 100, ".weak", 50);
    let strong = callee(".visible", 10, ".visible", 5);
    let weak2 = callee(".weak", 200, ".weak", 60);
    assert_eq!(run(&[("a", &a), ("w", &weak), ("s", &strong)]), [12, 5, 1]);
    assert_eq!(run(&[("a", &a), ("s", &strong), ("w", &weak)]), [12, 5, 1]);
    // Two weak ones: the first.
    assert_eq!(
        run(&[("a", &a), ("w", &weak), ("w2", &weak2)]),
        [102, 50, 1]
    );
}

#[test]
fn common_variables_are_one_as_large_as_the_largest() {
    let a = caller();
    let f = callee(".visible", 0, ".common", 3);
    let c2 = format!("{HEAD}.common .global .align 8 .u32 v[4];\n");
    let m = Module::link(&[("a", &a), ("f", &f), ("c2", &c2)]).unwrap();
    let v: Vec<_> = m.globals().iter().filter(|g| g.name == "v").collect();
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].size, v[0].align), (16, 8));
    assert_eq!(run(&[("a", &a), ("f", &f), ("c2", &c2)]), [2, 3, 1]);
}

#[test]
fn duplicate_and_unresolved_symbols_are_errors_naming_them() {
    let a = caller();
    let b = callee(".visible", 10, ".visible", 5);
    let e = link_err(&[("a.ptx", &a), ("b.ptx", &b), ("b2.ptx", &b)]);
    assert!(
        e.contains("multiple definitions of `f` (in b.ptx and b2.ptx)")
            && e.contains("multiple definitions of `v`"),
        "{e}"
    );
    let only_f =
        format!("{HEAD}.visible .func (.param .b32 r) f() {{ st.param.b32 [r], 1; ret; }}\n");
    let e = link_err(&[("a.ptx", &a), ("f.ptx", &only_f)]);
    assert_eq!(e, "unresolved: variable `v` (declared in a.ptx)");
    let e = link_err(&[]);
    assert!(e.contains("nothing to link"), "{e}");
    // A name that is a function in one unit and a variable in another.
    let clash = format!("{HEAD}.visible .global .u32 f;\n.visible .global .u32 v;\n");
    let e = link_err(&[("a.ptx", &a), ("f.ptx", &only_f), ("clash.ptx", &clash)]);
    assert!(
        e.contains("`f` is a function in one unit and a variable"),
        "{e}"
    );
    // A syntax error names its unit.
    let e = Module::link(&[("a.ptx", &a), ("bad.ptx", ".version 8.0\nnonsense")])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("bad.ptx: line 2"), "{e}");
}

/// A unit's `.extern .shared` array is the launch's dynamic shared memory, whatever unit
/// declares it; the VM's own functions need no definition.
#[test]
fn dynamic_shared_memory_and_builtins_need_no_definition() {
    let a = format!(
        "{HEAD}.extern .shared .align 4 .b8 dyn[];\n.extern .func (.param .b32 r) h(.param .b32 x);\n\
         .extern .func (.param .b64 r) malloc(.param .b64 n);\n\
         .visible .entry k(.param .u64 out)\n{{\n.reg .b32 %r<4>;\n.reg .b64 %rd<2>;\n\
         ld.param.u64 %rd1, [out];\nmov.u32 %r1, dyn;\nst.shared.u32 [%r1], 41;\n\
         {{ .param .b32 x; st.param.b32 [x], %r1; .param .b32 r; call.uni (r), h, (x); \
         ld.param.b32 %r2, [r]; }}\nst.global.u32 [%rd1], %r2;\nret;\n}}\n"
    );
    let b = format!(
        "{HEAD}.extern .shared .align 16 .b8 dyn[];\n\
         .visible .func (.param .b32 r) h(.param .b32 x) {{ .reg .b32 %v<3>; \
         ld.param.b32 %v1, [x]; mov.u32 %v0, dyn; ld.shared.u32 %v2, [%v0]; \
         add.u32 %v2, %v2, 1; st.param.b32 [r], %v2; ret; }}\n"
    );
    let m = Module::link(&[("a", &a), ("b", &b)]).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    let cfg = LaunchConfig {
        dynamic_shared_bytes: 16,
        ..one_block(1)
    };
    m.launch("k", &cfg, &BASE.to_le_bytes(), &mem, &|_| None)
        .unwrap();
    assert_eq!(u32s(&mem, 0, 1), [42]);
}
