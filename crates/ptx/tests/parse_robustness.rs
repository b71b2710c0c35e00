//! The parser answers any text with a module or an error, never a panic (the server parses
//! what clients send): random PTX-like text, and nvcc's PTX with pieces cut out or spliced in.

use gpufuse_ptx::Module;
use proptest::prelude::*;

const FIXTURE: &str = include_str!("fixtures/kernels.lineinfo.ptx");

/// Fragments of PTX that the mutations splice in: directives, declarations, braces, numbers
/// at the edges of the parser's arithmetic.
const PIECES: &[&str] = &[
    ".version 9.0\n",
    ".target sm_80\n",
    ".address_size 64\n",
    ".loc 1 2 3\n",
    ".file 1 \"a.cu\"\n",
    "{",
    "}",
    ";",
    "(",
    ")",
    "[",
    "]",
    ",",
    "=",
    "<",
    ">",
    "@",
    "!",
    ":",
    ".reg .b32 %r<4294967296>;",
    ".reg .b32 %r<3>;",
    ".global .b128 x = {1, -1};",
    ".global .b8 y[18446744073709551615];",
    ".shared .align 9223372036854775808 .b8 z[1];",
    ".param .b8 p[4294967295]",
    ".maxntid 4294967295, 4294967295, 4294967295",
    ".reqntid 0",
    ".entry",
    ".func",
    ".visible",
    ".extern",
    ".alias a, b;",
    ".section .debug_info {",
    ".pragma \"x\";",
    "\"",
    "/*",
    "*/",
    "//",
    "@@DWARF x\n",
    ".attribute(.managed)",
    ".attribute(.unified(1, 2))",
    "%r1",
    "$L__BB0_1:",
    "bra $L__BB0_1;",
    "-",
    "0f7FC00000",
    "1e308",
    "0x",
    "\n",
    " ",
    "\u{e9}",
    ".callprototype (.param .b32 _) _ ();",
    ".branchtargets a, b;",
    "call (x), f, (y);",
    "ld.param.u64 %rd1, [p];",
];

fn check(src: &str) {
    // Either outcome is fine; a panic fails the test.
    let _ = Module::parse(src);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_ptx_like_text(pieces in proptest::collection::vec(0..PIECES.len(), 0..40)) {
        let src: String = pieces.iter().map(|&i| PIECES[i]).collect();
        check(&src);
        check(&format!(".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n{src}\n}}\n"));
    }

    #[test]
    fn nvcc_ptx_cut_and_spliced(at in 0usize..FIXTURE.len(), len in 0usize..400,
                                piece in 0..PIECES.len()) {
        let at = (0..=at).rev().find(|&i| FIXTURE.is_char_boundary(i)).unwrap_or(0);
        let end = (at + len).min(FIXTURE.len());
        let end = (end..=FIXTURE.len()).find(|&i| FIXTURE.is_char_boundary(i)).unwrap_or(FIXTURE.len());
        check(&format!("{}{}", &FIXTURE[..at], &FIXTURE[end..]));
        check(&format!("{}{}{}", &FIXTURE[..at], PIECES[piece], &FIXTURE[at..]));
    }

    #[test]
    fn arbitrary_text(src in "\\PC{0,200}") {
        check(&src);
    }
}
