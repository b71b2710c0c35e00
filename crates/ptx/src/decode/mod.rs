//! Decoding: one PTX statement into an [`Inst`], the parser's side of the seam with the
//! interpreter (`code.rs` then compiles each [`Inst`] into what `exec/` runs).
//!
//! Table-driven: [`OPCODES`] names every opcode the VM runs by its base name (the text before
//! the first dot), with its [`Op`] and the [`Family`] that reads its modifiers and operands;
//! the named modifiers are the table of `modifiers.rs`, operands are read by `operand.rs`. An
//! opcode or modifier not in the tables is an error at load, naming the opcode.

mod modifiers;
mod operand;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use crate::inst::{Inst, Mods, Op, Operand, Space, Ty, Type};
use crate::PtxError;

use operand::operand;
pub use operand::parse_number;

/// How an instruction's modifiers and operands are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// Modifiers from the table, then the operands one by one.
    Plain,
    /// `call`: the return list, the callee, the argument list ([`call`]).
    Call,
    /// `mma.sync`: the shape and types (`tensor.rs`), then the operands.
    Mma,
    /// `wmma.*`: the form (`wmma.rs`), then the operands.
    Wmma,
    /// `tex`, `tld4`, `txq`, `suld`, `sust`, `suq`: `tex.rs` reads the whole instruction.
    Texture,
}

use Family::{Call, Mma, Plain, Texture, Wmma};

/// Every opcode the VM runs, sorted by base name (looked up through an index built once).
/// `cp` and `griddepcontrol` are [`Op::CpAsync`] and [`Op::Griddep`] only with the modifiers
/// [`refine`] accepts.
static OPCODES: &[(&str, Op, Family)] = &[
    ("abs", Op::Abs, Plain),
    ("activemask", Op::Activemask, Plain),
    ("add", Op::Add, Plain),
    ("addc", Op::Addc, Plain),
    ("alloca", Op::Alloca, Plain),
    ("and", Op::And, Plain),
    // Cache-residency hints: no cache, nothing to do (`discard` leaves the line's contents
    // undefined; keeping them is one of the allowed outcomes).
    ("applypriority", Op::Prefetch, Plain),
    ("atom", Op::Atom, Plain),
    ("bar", Op::Bar, Plain),
    ("barrier", Op::Bar, Plain),
    ("bfe", Op::Bfe, Plain),
    ("bfi", Op::Bfi, Plain),
    ("bfind", Op::Bfind, Plain),
    ("bmsk", Op::Bmsk, Plain),
    ("bra", Op::Bra, Plain),
    ("brev", Op::Brev, Plain),
    ("brkpt", Op::Brkpt, Plain),
    ("call", Op::Call, Call),
    ("clz", Op::Clz, Plain),
    ("cnot", Op::Cnot, Plain),
    ("copysign", Op::Copysign, Plain),
    ("cos", Op::Cos, Plain),
    ("cp", Op::CpAsync, Plain),
    ("createpolicy", Op::Createpolicy, Plain),
    ("cvt", Op::Cvt, Plain),
    ("cvta", Op::Cvta, Plain),
    ("discard", Op::Prefetch, Plain),
    ("div", Op::Div, Plain),
    ("dp2a", Op::Dp2a, Plain),
    ("dp4a", Op::Dp4a, Plain),
    ("elect", Op::Elect, Plain),
    ("ex2", Op::Ex2, Plain),
    ("exit", Op::Exit, Plain),
    ("fence", Op::Fence, Plain),
    ("fma", Op::Fma, Plain),
    ("fns", Op::Fns, Plain),
    ("griddepcontrol", Op::Griddep, Plain),
    ("isspacep", Op::Isspacep, Plain),
    ("ld", Op::Ld, Plain),
    ("ldmatrix", Op::Ldmatrix, Plain),
    ("ldu", Op::Ldu, Plain),
    ("lg2", Op::Lg2, Plain),
    ("lop3", Op::Lop3, Plain),
    ("mad", Op::Mad, Plain),
    ("mad24", Op::Mad24, Plain),
    ("madc", Op::Madc, Plain),
    ("match", Op::Match, Plain),
    ("max", Op::Max, Plain),
    ("mbarrier", Op::Mbarrier, Plain),
    ("membar", Op::Membar, Plain),
    ("min", Op::Min, Plain),
    ("mma", Op::Mma, Mma),
    ("mov", Op::Mov, Plain),
    ("mul", Op::Mul, Plain),
    ("mul24", Op::Mul24, Plain),
    ("nanosleep", Op::Nanosleep, Plain),
    ("neg", Op::Neg, Plain),
    ("not", Op::Not, Plain),
    ("or", Op::Or, Plain),
    ("popc", Op::Popc, Plain),
    ("prefetch", Op::Prefetch, Plain),
    ("prefetchu", Op::Prefetch, Plain),
    ("prmt", Op::Prmt, Plain),
    ("rcp", Op::Rcp, Plain),
    ("red", Op::Red, Plain),
    ("redux", Op::Redux, Plain),
    ("rem", Op::Rem, Plain),
    ("ret", Op::Ret, Plain),
    ("rsqrt", Op::Rsqrt, Plain),
    ("sad", Op::Sad, Plain),
    ("selp", Op::Selp, Plain),
    ("set", Op::Set, Plain),
    ("setp", Op::Setp, Plain),
    ("shf", Op::Shf, Plain),
    ("shfl", Op::Shfl, Plain),
    ("shl", Op::Shl, Plain),
    ("shr", Op::Shr, Plain),
    ("sin", Op::Sin, Plain),
    ("slct", Op::Slct, Plain),
    ("sqrt", Op::Sqrt, Plain),
    ("st", Op::St, Plain),
    ("stackrestore", Op::Stackrestore, Plain),
    ("stacksave", Op::Stacksave, Plain),
    ("sub", Op::Sub, Plain),
    ("subc", Op::Subc, Plain),
    ("suld", Op::Suld, Texture),
    ("suq", Op::Suq, Texture),
    ("sust", Op::Sust, Texture),
    ("szext", Op::Szext, Plain),
    ("tanh", Op::Tanh, Plain),
    ("testp", Op::Testp, Plain),
    ("tex", Op::Tex, Texture),
    ("tld4", Op::Tld4, Texture),
    ("trap", Op::Trap, Plain),
    ("txq", Op::Txq, Texture),
    ("vabsdiff2", Op::Vabsdiff, Plain),
    ("vabsdiff4", Op::Vabsdiff, Plain),
    ("vote", Op::Vote, Plain),
    ("wmma", Op::Wmma, Wmma),
    ("xor", Op::Xor, Plain),
];

/// An index of one of the decoding tables by name, built once.
type Index<T> = HashMap<&'static str, T, BuildHasherDefault<Fnv>>;

/// FNV-1a, for the indexes of the decoding tables: their keys are short names, and the tables
/// are fixed (no input can crowd a bucket of them).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The opcode of base name `base` with modifiers `mods`, if the VM runs it.
fn opcode_of(base: &str, mods: &[&str]) -> Option<(Op, Family)> {
    static INDEX: OnceLock<Index<(Op, Family)>> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        let mut index = Index::with_capacity_and_hasher(OPCODES.len(), Default::default());
        index.extend(
            OPCODES
                .iter()
                .map(|&(name, op, family)| (name, (op, family))),
        );
        index
    });
    let &(op, family) = index.get(base)?;
    Some((refine(op, mods)?, family))
}

/// The opcodes whose base name alone does not say what they are: `griddepcontrol.wait` and
/// `.launch_dependents`; `cp.async.{ca,cg}` and the waits of `cp.async`.
fn refine(op: Op, mods: &[&str]) -> Option<Op> {
    match op {
        Op::Griddep => matches!(mods, ["wait"] | ["launch_dependents"]).then_some(op),
        Op::CpAsync => match mods {
            ["async", "commit_group"] | ["async", "wait_group"] | ["async", "wait_all"] => {
                Some(Op::CpAsyncWait)
            }
            ["async", "ca" | "cg", ..] => Some(Op::CpAsync),
            _ => None,
        },
        _ => Some(op),
    }
}

/// One statement split into its parts.
struct Statement<'s> {
    /// The whole statement, for [`Inst::text`].
    text: &'s str,
    /// The guard predicate (`@%p`, `@!%p`): its register and whether it is negated.
    pred: Option<(u32, bool)>,
    /// The opcode with its modifiers (`ld.global.v4.f32`), for error messages.
    opcode: &'s str,
    /// The base name (`ld`) and the modifiers (`global`, `v4`, `f32`).
    base: &'s str,
    mods: Vec<&'s str>,
    /// The operands' text.
    rest: &'s str,
}

impl Statement<'_> {
    fn unsupported(&self) -> PtxError {
        PtxError::Unsupported {
            opcode: self.opcode.to_string(),
        }
    }

    fn inst(&self, op: Op, ty: Type, ty2: Type, space: Space, mods: Mods) -> Inst {
        Inst {
            pred: self.pred,
            op,
            ty,
            ty2,
            space,
            mods,
            args: Vec::new(),
            text: self.text.to_string(),
        }
    }
}

/// Splits a statement into its guard, opcode, modifiers and operands.
fn split<'s>(stmt: &'s str, regs: &HashMap<String, u32>) -> Result<Statement<'s>, PtxError> {
    let mut s = stmt.trim();
    let mut pred = None;
    if let Some(p) = s.strip_prefix('@') {
        let (name, rest) = p
            .split_once(char::is_whitespace)
            .ok_or_else(|| PtxError::Syntax(stmt.to_string()))?;
        let (neg, name) = match name.strip_prefix('!') {
            Some(n) => (true, n),
            None => (false, name),
        };
        let r = *regs
            .get(name)
            .ok_or_else(|| PtxError::Syntax(format!("unknown predicate {name}")))?;
        pred = Some((r, neg));
        s = rest.trim();
    }
    let (opcode, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
    let mut parts = opcode.split('.');
    let base = parts.next().unwrap_or("");
    Ok(Statement {
        text: stmt,
        pred,
        opcode,
        base,
        mods: parts.collect(),
        rest,
    })
}

/// Decodes one statement.
pub fn decode(
    stmt: &str,
    regs: &mut HashMap<String, u32>,
    label: &mut dyn FnMut(&str),
) -> Result<Inst, PtxError> {
    let st = split(stmt, regs)?;
    let (op, family) = opcode_of(st.base, &st.mods).ok_or_else(|| st.unsupported())?;
    // A variant no PTX opcode decodes to.
    let _ = Op::Mov64Split;
    let (mut mods, types, space) = match family {
        Texture => return texture(&st, op, regs, label),
        Mma => {
            let mma = crate::tensor::decode_mma(&st.mods).ok_or_else(|| st.unsupported())?;
            let mods = Mods {
                mma: Some(mma),
                ..Mods::default()
            };
            (mods, Vec::new(), Space::Generic)
        }
        Wmma => {
            let f = crate::wmma::decode(&st.mods).map_err(|why| PtxError::Unsupported {
                opcode: format!("{} ({why})", st.opcode),
            })?;
            let mods = Mods {
                wmma: Some(f),
                ..Mods::default()
            };
            (mods, Vec::new(), f.space)
        }
        Plain | Call => modifiers::read(op, &st.mods).map_err(|()| st.unsupported())?,
    };
    let (ty, ty2) = types_of(op, st.base, &mut mods, &types).ok_or_else(|| st.unsupported())?;
    if family == Call {
        return call(&st, mods, regs);
    }
    let mut inst = st.inst(op, ty, ty2, space, mods);
    // Immediates of `cvt` are typed by the source type; f16/bf16 immediates are their bits
    // (`0x3C00`), not numbers to convert.
    let imm = if op == Op::Cvt { ty2 } else { ty };
    let (float, f32) = (imm.is_float() && imm.size >= 4, imm.size == 4);
    for a in crate::parse::split_top(st.rest) {
        // `{a, b}` vectors and `[...]` addresses are single operands.
        inst.args
            .push(operand(&a, regs, float, f32, label, op == Op::Bra)?);
    }
    if op == Op::Bar && st.base == "bar" && st.mods.first() == Some(&"warp") {
        // `bar.warp.sync mask` (`__syncwarp()`) synchronizes the lanes of its own warp only:
        // never the block's barrier. Min-PC scheduling already holds a lane at it until every
        // lane of the warp behind it (at a lower position) has caught up, so it is a fence.
        inst.op = Op::Membar;
        inst.args.clear();
    }
    Ok(inst)
}

/// The instruction's type and second type from the types its modifiers named, if it is a
/// form the VM runs: a second type only where the instruction reads one, integer saturation
/// and directed rounding only where they are implemented.
fn types_of(op: Op, base: &str, mods: &mut Mods, types: &[Type]) -> Option<(Type, Type)> {
    let b32 = Type {
        kind: Ty::B,
        size: 4,
    };
    let ty = types.first().copied().unwrap_or(b32);
    let ty2 = types.get(1).copied().unwrap_or(ty);
    // A second type only where the instruction reads one (`cvt`, `set`, `dp4a`, `dp2a`):
    // elsewhere it is a form the VM does not run (mixed-precision `add.f32.f16`, `cvt.pack`
    // with three), never one to run with the first type alone.
    let two_types = matches!(op, Op::Cvt | Op::Set | Op::Dp4a | Op::Dp2a | Op::Slct);
    if op == Op::Vabsdiff {
        // `vabsdiff4.dtype.atype.btype`: 32-bit operands, both sources alike; no operand
        // selectors or destination masks (`%r1.b0` would not be a register name).
        mods.simd = if base == "vabsdiff2" { 2 } else { 4 };
        if types.len() != 3 || types.iter().any(|t| t.size != 4) || types[1] != types[2] {
            return None;
        }
    } else if types.len() > 2 || (types.len() == 2 && !two_types) {
        return None;
    }
    // `redux.sync` on floats (`.min/.max{.abs}{.NaN}.f32`) is not implemented.
    if op == Op::Redux && ty.is_float() {
        return None;
    }
    // Integer saturation is implemented for add/sub (s32), mad24 and cvt only.
    if mods.sat
        && !mods.x2.unwrap_or(ty).is_float()
        && !matches!(op, Op::Add | Op::Sub | Op::Mad24 | Op::Cvt)
    {
        return None;
    }
    let small_cvt = op == Op::Cvt && (mods.pk_dst.is_some() || (ty.is_float() && ty.size == 2));
    if mods.rnd.is_some() && !small_cvt && !crate::round::supported(op, ty, ty2, mods.x2.is_some())
    {
        // A directed rounding the VM cannot honour (f16, packed pairs, or an instruction that
        // takes no rounding mode) fails rather than rounding to nearest.
        return None;
    }
    Some((ty, ty2))
}

/// A texture or surface instruction, read by `tex.rs`.
fn texture(
    st: &Statement,
    op: Op,
    regs: &HashMap<String, u32>,
    label: &mut dyn FnMut(&str),
) -> Result<Inst, PtxError> {
    let mut operand_of = |t: &str, float: bool| operand(t, regs, float, true, label, false);
    let (mods, ty, ty2, args) = crate::tex::decode(op, &st.mods, st.rest, &mut operand_of)
        .map_err(|e| match e {
            PtxError::Unsupported { .. } => st.unsupported(),
            e => e,
        })?;
    Ok(Inst {
        args,
        ..st.inst(op, ty, ty2, Space::Global, mods)
    })
}

/// `call{.uni} [(rets),] func[, (args)]`: the callee by name, or, for an indirect call
/// `call [(rets),] %rd[, (args)], prototype`, the register holding its address.
fn call(st: &Statement, mods: Mods, regs: &HashMap<String, u32>) -> Result<Inst, PtxError> {
    let stmt = st.text;
    let items = crate::parse::split_top(st.rest);
    let list = |t: &str| -> Option<Result<Vec<Operand>, PtxError>> {
        let inner = t.trim().strip_prefix('(')?.strip_suffix(')')?;
        Some(
            inner
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| operand(x, regs, false, false, &mut |_| {}, false))
                .collect(),
        )
    };
    let mut it = items.iter().map(String::as_str).peekable();
    let rets = match it.peek().and_then(|t| list(t)) {
        Some(r) => {
            it.next();
            r?
        }
        None => Vec::new(),
    };
    let callee = it
        .next()
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| PtxError::Syntax(format!("call without a function: {stmt}")))?;
    // An indirect call: `call (rets), %rd, (args), prototype;` through a function address.
    let indirect = regs.contains_key(callee) || callee.starts_with('%');
    let callee = if indirect {
        operand(callee, regs, false, false, &mut |_| {}, false)?
    } else {
        Operand::Sym(callee.to_string())
    };
    let args = match it.peek().and_then(|a| list(a)) {
        Some(a) => {
            it.next();
            a?
        }
        None if it.peek().is_some() && !indirect => {
            return Err(PtxError::Syntax(format!("bad call: {stmt}")))
        }
        None => Vec::new(),
    };
    // The prototype (or the target list) of an indirect call: the call site's own argument
    // and return lists say what passes, and each callee is checked against them when called.
    if indirect {
        it.next();
    }
    if it.next().is_some() {
        return Err(st.unsupported());
    }
    let b32 = Type {
        kind: Ty::B,
        size: 4,
    };
    Ok(Inst {
        args: vec![Operand::Vector(rets), callee, Operand::Vector(args)],
        ..st.inst(Op::Call, b32, b32, Space::Generic, mods)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(
            parse_number("0f3F800000", true, true),
            Some(1.0f32.to_bits() as u64)
        );
        assert_eq!(
            parse_number("0d3FF0000000000000", true, false),
            Some(1.0f64.to_bits())
        );
        assert_eq!(parse_number("-1", false, false), Some(u64::MAX));
        assert_eq!(parse_number("0x10", false, false), Some(16));
        assert_eq!(
            parse_number("1.5", true, true),
            Some(1.5f32.to_bits() as u64)
        );
    }

    #[test]
    fn unknown_opcodes_are_named() {
        let mut regs = HashMap::new();
        let e = decode("wgmma.fence.sync.aligned", &mut regs, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("wgmma"), "{e}");
    }

    #[test]
    fn the_opcode_table_is_sorted() {
        for pair in OPCODES.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{} before {}", pair[0].0, pair[1].0);
        }
    }
}
