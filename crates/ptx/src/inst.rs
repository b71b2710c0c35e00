//! Decoded instructions: opcode, types and modifiers resolved once at load, operands bound to
//! register indices. An opcode the interpreter does not implement is an error at load, naming it.
//! `code.rs` then compiles these into the compact form the interpreter runs.

use std::collections::HashMap;

use crate::PtxError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    B,
    U,
    S,
    F,
    /// bf16: a float kind of its own (f16 is `F` of size 2).
    Bf,
    Pred,
}

/// A scalar type: kind and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Type {
    pub kind: Ty,
    pub size: u8,
}

impl Type {
    /// A float type (f16, bf16, f32, f64).
    #[inline(always)]
    pub fn is_float(self) -> bool {
        matches!(self.kind, Ty::F | Ty::Bf)
    }

    /// A type's name (`b32`, `f16`, `pred`, ...), for the instruction decoders of other modules.
    pub fn parse_pub(t: &str) -> Option<Type> {
        Type::parse(t)
    }

    fn parse(t: &str) -> Option<Type> {
        if t == "bf16" {
            return Some(Type {
                kind: Ty::Bf,
                size: 2,
            });
        }
        let (kind, bits) = match t.as_bytes().first()? {
            b'b' => (Ty::B, &t[1..]),
            b'u' => (Ty::U, &t[1..]),
            b's' => (Ty::S, &t[1..]),
            b'f' => (Ty::F, &t[1..]),
            b'p' if t == "pred" => {
                return Some(Type {
                    kind: Ty::Pred,
                    size: 1,
                })
            }
            _ => return None,
        };
        let bits: u8 = bits.parse().ok()?;
        matches!(bits, 8 | 16 | 32 | 64).then_some(Type {
            kind,
            size: bits / 8,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Mov,
    Ld,
    St,
    Ldu,
    Cvta,
    Cvt,
    Add,
    Sub,
    Mul,
    Mad,
    Fma,
    Div,
    Rem,
    Min,
    Max,
    Abs,
    Neg,
    And,
    Or,
    Xor,
    Not,
    Shl,
    Shr,
    Setp,
    Selp,
    Set,
    Bra,
    Ret,
    Exit,
    Bar,
    Atom,
    Red,
    Shfl,
    Vote,
    Activemask,
    Rcp,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Ex2,
    Lg2,
    Tanh,
    Popc,
    Clz,
    Brev,
    Bfe,
    Bfi,
    Prmt,
    Shf,
    Membar,
    Fence,
    Addc,
    Subc,
    Madc,
    Mul24,
    Mad24,
    Sad,
    Trap,
    Copysign,
    Testp,
    Cnot,
    Lop3,
    Match,
    Brkpt,
    Nanosleep,
    Prefetch,
    Isspacep,
    Mov64Split,
    Dp4a,
    Redux,
    /// `bfind{.shiftamt}`: the most significant non-sign bit.
    Bfind,
    /// `griddepcontrol.wait` / `.launch_dependents`: the VM runs a grid only after the one
    /// before it has finished, so both are satisfied already.
    Griddep,
    /// `mbarrier.{init,inval,arrive,arrive_drop,test_wait,try_wait,pending_count}`: the
    /// sub-operation is [`Mods::mbar`]. A barrier is a `.b64` word: the pending count in
    /// bits 0..32, the expected count in bits 32..63, the phase in bit 63.
    Mbarrier,
    /// `cp.async.{ca,cg}.shared.global [dst], [src], size{, src-size}`: done at once (its
    /// completion is only promised by the waits below, which are then satisfied).
    CpAsync,
    /// `cp.async.commit_group`, `cp.async.wait_group N`, `cp.async.wait_all`.
    CpAsyncWait,
    /// `createpolicy`: an opaque cache-eviction policy (the VM has no cache).
    Createpolicy,
    /// `fns.b32 d, mask, base, offset`: the n-th set bit.
    Fns,
    /// `dp2a.{lo,hi}`: two 16x8-bit products added.
    Dp2a,
    /// `szext.{wrap,clamp}.{u32,s32}`: sign or zero extension from a bit position.
    Szext,
    /// `bmsk.{wrap,clamp}.b32`: a mask of `b` bits from bit `a`.
    Bmsk,
    /// `elect.sync d|p, membermask`: one leader lane.
    Elect,
    /// `mma.sync.aligned` (`tensor.rs`): the form is in [`Mods::mma`].
    Mma,
    /// `ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16`.
    Ldmatrix,
    /// `wmma.load`, `wmma.store`, `wmma.mma` (`wmma.rs`): the form is in [`Mods::wmma`].
    Wmma,
    /// `vabsdiff2`/`vabsdiff4{.add}`: SIMD absolute differences of halfwords or bytes
    /// (default selectors and masks only), what `__vabsdiffu4`/`__vsadu4` use.
    Vabsdiff,
    /// `alloca.u64 ptr, size{, align}` (`ALLOCA_WINDOW`), `stacksave`, `stackrestore`.
    Alloca,
    Stacksave,
    Stackrestore,
    /// `slct.dtype.{s32,f32} d, a, b, c`: `c >= 0 ? a : b`.
    Slct,
    /// `call (rets), func, (args)`: args[0] is a vector of return operands, args[1] the
    /// function's name, args[2] a vector of arguments.
    Call,
    /// Texture and surface instructions (`tex.rs`); the form is in [`Mods::tex`]. `tex`/`tld4`
    /// and `suld`: destinations, then the handle and coordinates as sources; `sust`: the
    /// handle and coordinates as sources, the values in [`crate::code::Code::lists`];
    /// `txq`/`suq`: one destination and the handle.
    Tex,
    Tld4,
    Txq,
    Suld,
    Sust,
    Suq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Generic,
    Global,
    Shared,
    Local,
    Param,
    Const,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sreg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    Laneid,
    Warpid,
    Nwarpid,
    Smid,
    Nsmid,
    Clock,
    Clock64,
    LanemaskEq,
    LanemaskLt,
    LanemaskLe,
    LanemaskGt,
    LanemaskGe,
    DynSmem,
    Globaltimer,
    /// `%reserved_smem_offset_begin`, `_end`, `_cap`, `_0`, `_1` (0 to 4): the block's reserved
    /// shared memory (`launch.rs`, [`crate::RESERVED_SHARED`]).
    ReservedSmem(u8),
    /// `%envreg0` to `%envreg31`: what the driver passes a launch. A cooperative launch's
    /// grid workspace (what `this_grid().sync()` counts arrivals in) is `%envreg1:%envreg2`
    /// (high and low words); every other one reads 0.
    Envreg(u8),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Base {
    Reg(u32),
    Sym(String),
    Abs,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Reg(u32),
    /// A register negated (`!%p` in selp/set/and of predicates).
    NotReg(u32),
    Imm(u64),
    Special(Sreg),
    Addr {
        base: Base,
        offset: i64,
    },
    Vector(Vec<Operand>),
    Sym(String),
    Label(usize),
    Sink,
}

/// A comparison of `setp`/`set`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cmp {
    #[default]
    None,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// The boolean combination of `setp.cmp.bop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BoolOp {
    #[default]
    None,
    And,
    Or,
    Xor,
}

/// The operation of `atom`, `red` and `redux`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtomOp {
    #[default]
    None,
    Add,
    Min,
    Max,
    Exch,
    Cas,
    And,
    Or,
    Xor,
    Inc,
    Dec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShflMode {
    #[default]
    Idx,
    Up,
    Down,
    Bfly,
}

/// `vote` modes, and `match.any`/`match.all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VoteMode {
    #[default]
    Ballot,
    All,
    Any,
    Uni,
}

/// What an `mbarrier` instruction does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MbarOp {
    #[default]
    None,
    Init,
    Inval,
    Arrive,
    ArriveDrop,
    TestWait,
    TryWait,
    PendingCount,
}

impl MbarOp {
    /// Whether the instruction writes a destination (and its address, if any, comes second).
    pub fn has_dst(self) -> bool {
        !matches!(self, MbarOp::Init | MbarOp::Inval)
    }
}

/// Flags and sub-opcodes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mods {
    /// `mbarrier`'s sub-operation, and `.parity` (the wait takes a phase parity, not a state).
    pub mbar: MbarOp,
    pub parity: bool,
    pub hi: bool,
    pub lo: bool,
    pub wide: bool,
    pub cc: bool,
    pub sat: bool,
    pub rnd_int: Option<char>, // 'n','z','m','p' for cvt.rni/rzi/...
    /// A directed rounding mode of float arithmetic and `cvt`: 'z', 'm', 'p' for `.rz`, `.rm`,
    /// `.rp` (`round.rs`); `.rn`, the default, is `None` and keeps the fast paths.
    pub rnd: Option<char>,
    pub vec: u8,
    pub cmp: Cmp,
    pub bool_op: BoolOp,
    pub atom_op: AtomOp,
    pub shfl_mode: ShflMode,
    pub vote_mode: VoteMode,
    pub shf_left: bool,
    pub shf_wrap: bool,
    pub space2: Option<Space>,
    pub to: bool,
    pub uni: bool,
    /// Packed pairs (`f16x2`, `s16x2`, `u16x2`): the element type; the register is 32 bits.
    pub x2: Option<Type>,
    /// `bar.red.{popc,and,or}`: a block barrier that also reduces a predicate over the block
    /// (`__syncthreads_count/and/or`); the reduction is `atom_op` (Add counts).
    pub bar_red: bool,
    /// `min/max.NaN`: a NaN operand gives the canonical NaN.
    pub nan: bool,
    /// `min/max.xorsign.abs`: the magnitude's min/max with the sign of `a ^ b`.
    pub xorsign: bool,
    /// `.relu`: negative results become +0.
    pub relu: bool,
    /// `bfind.shiftamt`: the shift that brings the bit to the top.
    pub shiftamt: bool,
    /// `.satfinite`: out-of-range floats become the largest finite value.
    pub satfinite: bool,
    /// `.L2::cache_hint`: the last operand is a cache policy (not a value).
    pub cache_hint: bool,
    /// `testp.<mode>`.
    pub testp: TestpMode,
    /// `prmt.b32.<mode>`.
    pub prmt: PrmtMode,
    /// `cvt` to or from packed formats (`f16x2`, `bf16x2`, `e4m3x2`, `e5m2x2`).
    pub pk_dst: Option<crate::half::Packed>,
    pub pk_src: Option<crate::half::Packed>,
    /// `mma`'s shape and types.
    pub mma: Option<crate::tensor::Mma>,
    /// `ldmatrix.trans`.
    pub trans: bool,
    /// `wmma`'s operation, shape, types and layouts.
    pub wmma: Option<crate::wmma::Wmma>,
    /// SIMD lanes of a video instruction (2 or 4), and its `.add` secondary operation.
    pub simd: u8,
    pub simd_add: bool,
    /// The form of a texture or surface instruction.
    pub tex: Option<crate::tex::TexOp>,
}

/// What `testp` tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TestpMode {
    #[default]
    Finite,
    Infinite,
    Number,
    NotANumber,
    Normal,
    Subnormal,
}

/// `prmt` modes: the default selector form, and the fixed permutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrmtMode {
    #[default]
    Generic,
    F4e,
    B4e,
    Rc8,
    Ecl,
    Ecr,
    Rc16,
}

#[derive(Debug, Clone)]
pub struct Inst {
    pub pred: Option<(u32, bool)>,
    pub op: Op,
    pub ty: Type,
    pub ty2: Type,
    pub space: Space,
    pub mods: Mods,
    pub args: Vec<Operand>,
    pub text: String,
}

impl Inst {
    /// A `trap` standing in for a statement the VM cannot run.
    pub fn trap(text: &str) -> Inst {
        let b32 = Type {
            kind: Ty::B,
            size: 4,
        };
        Inst {
            pred: None,
            op: Op::Trap,
            ty: b32,
            ty2: b32,
            space: Space::Generic,
            mods: Mods::default(),
            args: Vec::new(),
            text: text.to_string(),
        }
    }

    pub fn resolve_label(&mut self, target: usize) {
        for a in &mut self.args {
            if let Operand::Label(l) = a {
                *l = target;
            }
        }
    }
}

/// A number as raw bits of the given float width (if `float`) or as an integer.
pub fn parse_number(tok: &str, float: bool, f32: bool) -> Option<u64> {
    let t = tok.trim();
    if let Some(h) = t.strip_prefix("0f").or_else(|| t.strip_prefix("0F")) {
        let bits = u32::from_str_radix(h, 16).ok()?;
        return Some(if f32 || !float {
            bits as u64
        } else {
            (f32::from_bits(bits) as f64).to_bits()
        });
    }
    if let Some(h) = t.strip_prefix("0d").or_else(|| t.strip_prefix("0D")) {
        let bits = u64::from_str_radix(h, 16).ok()?;
        return Some(if f32 {
            (f64::from_bits(bits) as f32).to_bits() as u64
        } else {
            bits
        });
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t),
    };
    let body = body.trim_end_matches('U');
    let int = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if body.len() > 1 && body.starts_with('0') && body.bytes().all(|b| b.is_ascii_digit()) {
        u64::from_str_radix(&body[1..], 8).ok()
    } else {
        body.parse::<u64>().ok()
    };
    match int {
        Some(v) if !float || !body.contains(['.', 'e', 'E']) => {
            if float {
                let f = if neg { -(v as f64) } else { v as f64 };
                return Some(if f32 {
                    (f as f32).to_bits() as u64
                } else {
                    f.to_bits()
                });
            }
            Some(if neg { v.wrapping_neg() } else { v })
        }
        _ => {
            let f: f64 = t.parse().ok()?;
            Some(if f32 {
                (f as f32).to_bits() as u64
            } else {
                f.to_bits()
            })
        }
    }
}

fn special(name: &str) -> Option<Sreg> {
    let dim = |s: &str| match s {
        "x" => Some(0),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((base, d)) = name.split_once('.') {
        let d = dim(d)?;
        return Some(match base {
            "%tid" => Sreg::Tid(d),
            "%ntid" => Sreg::Ntid(d),
            "%ctaid" => Sreg::Ctaid(d),
            "%nctaid" => Sreg::Nctaid(d),
            _ => return None,
        });
    }
    Some(match name {
        "%laneid" => Sreg::Laneid,
        "%warpid" => Sreg::Warpid,
        "%nwarpid" => Sreg::Nwarpid,
        "%smid" => Sreg::Smid,
        "%nsmid" => Sreg::Nsmid,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%lanemask_eq" => Sreg::LanemaskEq,
        "%lanemask_lt" => Sreg::LanemaskLt,
        "%lanemask_le" => Sreg::LanemaskLe,
        "%lanemask_gt" => Sreg::LanemaskGt,
        "%lanemask_ge" => Sreg::LanemaskGe,
        "%dynamic_smem_size" => Sreg::DynSmem,
        "%globaltimer" => Sreg::Globaltimer,
        "%reserved_smem_offset_begin" => Sreg::ReservedSmem(0),
        "%reserved_smem_offset_end" => Sreg::ReservedSmem(1),
        "%reserved_smem_offset_cap" => Sreg::ReservedSmem(2),
        "%reserved_smem_offset_0" => Sreg::ReservedSmem(3),
        "%reserved_smem_offset_1" => Sreg::ReservedSmem(4),
        _ => {
            let n: u8 = name.strip_prefix("%envreg")?.parse().ok()?;
            return (n < 32).then_some(Sreg::Envreg(n));
        }
    })
}

fn operand(
    text: &str,
    regs: &HashMap<String, u32>,
    float: bool,
    f32: bool,
    label: &mut dyn FnMut(&str),
    is_branch: bool,
) -> Result<Operand, PtxError> {
    let t = text.trim();
    if t == "_" {
        return Ok(Operand::Sink);
    }
    // The warp size, a constant operand (what nvcc emits for `warpSize`).
    if t == "WARP_SZ" {
        return Ok(Operand::Imm(32));
    }
    if let Some((d, p)) = t.split_once('|') {
        // `d|p`: a value and a predicate destination (shfl, setp).
        return Ok(Operand::Vector(vec![
            operand(d, regs, float, f32, label, false)?,
            operand(p, regs, float, f32, label, false)?,
        ]));
    }
    if let Some(inner) = t.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        let items = inner
            .split(',')
            .map(|x| operand(x, regs, float, f32, label, false))
            .collect::<Result<_, _>>()?;
        return Ok(Operand::Vector(items));
    }
    if let Some(inner) = t.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        let inner = inner.replace(' ', "");
        let (base, off) = match inner.find(['+', '-']).filter(|&p| p > 0) {
            Some(p) => (
                &inner[..p],
                parse_number(inner[p..].trim_start_matches('+'), false, false).map(|v| v as i64),
            ),
            None => (inner.as_str(), Some(0)),
        };
        let offset = off.ok_or_else(|| PtxError::Syntax(format!("bad address {t}")))?;
        let base = if let Some(&r) = regs.get(base) {
            Base::Reg(r)
        } else if let Some(v) = parse_number(base, false, false) {
            return Ok(Operand::Addr {
                base: Base::Abs,
                offset: v as i64 + offset,
            });
        } else {
            Base::Sym(base.to_string())
        };
        return Ok(Operand::Addr { base, offset });
    }
    if let Some(r) = t.strip_prefix('!') {
        return regs
            .get(r)
            .map(|&i| Operand::NotReg(i))
            .ok_or_else(|| PtxError::Syntax(format!("unknown register {r}")));
    }
    if let Some(&r) = regs.get(t) {
        return Ok(Operand::Reg(r));
    }
    if let Some(s) = special(t) {
        return Ok(Operand::Special(s));
    }
    if t.starts_with('%') {
        return Err(PtxError::Syntax(format!("unknown register {t}")));
    }
    if let Some(v) = parse_number(t, float, f32) {
        return Ok(Operand::Imm(v));
    }
    if is_branch {
        label(t);
        return Ok(Operand::Label(usize::MAX));
    }
    Ok(Operand::Sym(t.to_string()))
}

fn space_of(m: &str) -> Option<Space> {
    Some(match m {
        "global" => Space::Global,
        "shared" | "shared::cta" | "shared::cluster" => Space::Shared,
        "local" => Space::Local,
        "param" => Space::Param,
        "const" => Space::Const,
        _ => return None,
    })
}

fn cmp_of(m: &str) -> Option<Cmp> {
    Some(match m {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" => Cmp::Lt,
        "le" => Cmp::Le,
        "gt" => Cmp::Gt,
        "ge" => Cmp::Ge,
        "lo" => Cmp::Lo,
        "ls" => Cmp::Ls,
        "hi" => Cmp::Hi,
        "hs" => Cmp::Hs,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

fn atom_of(m: &str) -> Option<AtomOp> {
    Some(match m {
        "add" => AtomOp::Add,
        "min" => AtomOp::Min,
        "max" => AtomOp::Max,
        "exch" => AtomOp::Exch,
        "cas" => AtomOp::Cas,
        "and" => AtomOp::And,
        "or" => AtomOp::Or,
        "xor" => AtomOp::Xor,
        "inc" => AtomOp::Inc,
        "dec" => AtomOp::Dec,
        _ => return None,
    })
}

/// Decodes one statement.
pub fn decode(
    stmt: &str,
    regs: &mut HashMap<String, u32>,
    label: &mut dyn FnMut(&str),
) -> Result<Inst, PtxError> {
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
    let mods_s: Vec<&str> = parts.collect();
    let unsupported = || PtxError::Unsupported {
        opcode: opcode.to_string(),
    };
    let op = match base {
        "mov" => Op::Mov,
        "ld" => Op::Ld,
        "ldu" => Op::Ldu,
        "st" => Op::St,
        "cvta" => Op::Cvta,
        "cvt" => Op::Cvt,
        "add" => Op::Add,
        "sub" => Op::Sub,
        "mul" => Op::Mul,
        "mad" => Op::Mad,
        "fma" => Op::Fma,
        "div" => Op::Div,
        "rem" => Op::Rem,
        "min" => Op::Min,
        "max" => Op::Max,
        "abs" => Op::Abs,
        "neg" => Op::Neg,
        "and" => Op::And,
        "or" => Op::Or,
        "xor" => Op::Xor,
        "not" => Op::Not,
        "cnot" => Op::Cnot,
        "shl" => Op::Shl,
        "shr" => Op::Shr,
        "setp" => Op::Setp,
        "selp" => Op::Selp,
        "set" => Op::Set,
        "bra" => Op::Bra,
        "ret" => Op::Ret,
        "exit" => Op::Exit,
        "bar" | "barrier" => Op::Bar,
        "atom" => Op::Atom,
        "red" => Op::Red,
        "shfl" => Op::Shfl,
        "vote" => Op::Vote,
        "activemask" => Op::Activemask,
        "rcp" => Op::Rcp,
        "sqrt" => Op::Sqrt,
        "rsqrt" => Op::Rsqrt,
        "sin" => Op::Sin,
        "cos" => Op::Cos,
        "ex2" => Op::Ex2,
        "lg2" => Op::Lg2,
        "tanh" => Op::Tanh,
        "popc" => Op::Popc,
        "clz" => Op::Clz,
        "brev" => Op::Brev,
        "bfe" => Op::Bfe,
        "bfi" => Op::Bfi,
        "prmt" => Op::Prmt,
        "shf" => Op::Shf,
        "membar" => Op::Membar,
        "fence" => Op::Fence,
        "addc" => Op::Addc,
        "subc" => Op::Subc,
        "madc" => Op::Madc,
        "mul24" => Op::Mul24,
        "mad24" => Op::Mad24,
        "sad" => Op::Sad,
        "trap" => Op::Trap,
        "copysign" => Op::Copysign,
        "testp" => Op::Testp,
        "lop3" => Op::Lop3,
        "match" => Op::Match,
        "brkpt" => Op::Brkpt,
        "nanosleep" => Op::Nanosleep,
        "prefetch" | "prefetchu" => Op::Prefetch,
        "isspacep" => Op::Isspacep,
        "dp4a" => Op::Dp4a,
        "redux" => Op::Redux,
        "call" => Op::Call,
        "bfind" => Op::Bfind,
        "mbarrier" => Op::Mbarrier,
        "griddepcontrol" if matches!(mods_s.as_slice(), ["wait"] | ["launch_dependents"]) => {
            Op::Griddep
        }
        "cp" => match mods_s.as_slice() {
            ["async", "commit_group"] | ["async", "wait_group"] | ["async", "wait_all"] => {
                Op::CpAsyncWait
            }
            ["async", "ca" | "cg", ..] => Op::CpAsync,
            _ => return Err(unsupported()),
        },
        "createpolicy" => Op::Createpolicy,
        "fns" => Op::Fns,
        "dp2a" => Op::Dp2a,
        "szext" => Op::Szext,
        "bmsk" => Op::Bmsk,
        "elect" => Op::Elect,
        "mma" => Op::Mma,
        "ldmatrix" => Op::Ldmatrix,
        "wmma" => Op::Wmma,
        "alloca" => Op::Alloca,
        "stacksave" => Op::Stacksave,
        "stackrestore" => Op::Stackrestore,
        "slct" => Op::Slct,
        "vabsdiff2" => Op::Vabsdiff,
        "vabsdiff4" => Op::Vabsdiff,
        // Cache-residency hints: no cache, nothing to do (`discard` leaves the line's
        // contents undefined; keeping them is one of the allowed outcomes).
        "discard" | "applypriority" => Op::Prefetch,
        "tex" => Op::Tex,
        "tld4" => Op::Tld4,
        "txq" => Op::Txq,
        "suld" => Op::Suld,
        "sust" => Op::Sust,
        "suq" => Op::Suq,
        _ => return Err(unsupported()),
    };
    if matches!(
        op,
        Op::Tex | Op::Tld4 | Op::Txq | Op::Suld | Op::Sust | Op::Suq
    ) {
        let mut operand_of = |t: &str, float: bool| operand(t, regs, float, true, label, false);
        let (mods, ty, ty2, args) = crate::tex::decode(op, &mods_s, rest, &mut operand_of)
            .map_err(|e| match e {
                PtxError::Unsupported { .. } => unsupported(),
                e => e,
            })?;
        return Ok(Inst {
            pred,
            op,
            ty,
            ty2,
            space: Space::Global,
            mods,
            args,
            text: stmt.to_string(),
        });
    }
    let _ = Op::Mov64Split;
    let mut mods = Mods::default();
    let mut types = Vec::new();
    let mut space = Space::Generic;
    if op == Op::Mma {
        mods.mma = Some(crate::tensor::decode_mma(&mods_s).ok_or_else(unsupported)?);
    }
    if op == Op::Wmma {
        let f = crate::wmma::decode(&mods_s).map_err(|why| PtxError::Unsupported {
            opcode: format!("{opcode} ({why})"),
        })?;
        space = f.space;
        mods.wmma = Some(f);
    }
    for m in &mods_s {
        if op == Op::Mma || op == Op::Wmma {
            break;
        }
        if let Some(t) = Type::parse(m) {
            types.push(t);
            continue;
        }
        if op == Op::Cvt {
            if let Some(p) = crate::half::Packed::parse(m) {
                if types.is_empty() && mods.pk_dst.is_none() {
                    mods.pk_dst = Some(p);
                } else {
                    mods.pk_src = Some(p);
                }
                types.push(Type {
                    kind: Ty::B,
                    size: if p.bits() == 8 { 2 } else { 4 },
                });
                if p == crate::half::Packed::Tf32 && mods.pk_src.is_some() {
                    return Err(unsupported());
                }
                continue;
            }
        }
        if let Some(elem) = m.strip_suffix("x2").and_then(Type::parse) {
            let packed_ok = match op {
                Op::Add | Op::Sub | Op::Mul | Op::Min | Op::Max => true,
                Op::Fma | Op::Neg | Op::Abs | Op::Set | Op::Setp | Op::Tanh | Op::Ex2 => {
                    elem.is_float()
                }
                // `atom.add.noftz.{f16x2,bf16x2}`, `red` alike.
                Op::Atom | Op::Red => elem.is_float(),
                _ => false,
            };
            if !packed_ok || elem.size != 2 {
                return Err(unsupported());
            }
            if mods.x2.is_some_and(|e| e != elem) {
                return Err(unsupported());
            }
            mods.x2 = Some(elem);
            types.push(Type {
                kind: Ty::B,
                size: 4,
            });
            continue;
        }
        if let Some(sp) = space_of(m) {
            if op == Op::CpAsync && space != Space::Generic {
                // `cp.async.ca.shared.global`: the destination's space, then the source's.
                mods.space2 = Some(sp);
            } else if op == Op::Cvta || op == Op::Isspacep {
                mods.space2 = Some(sp);
            } else {
                space = sp;
            }
            continue;
        }
        match *m {
            "hi" => mods.hi = true,
            "lo" => mods.lo = true,
            "wide" => mods.wide = true,
            "cc" => mods.cc = true,
            "sat" => mods.sat = true,
            "satfinite" => mods.satfinite = true,
            "NaN" if matches!(op, Op::Min | Op::Max) => mods.nan = true,
            "xorsign" if matches!(op, Op::Min | Op::Max) => mods.xorsign = true,
            "abs" if matches!(op, Op::Min | Op::Max) && mods.xorsign => {}
            "relu" if matches!(op, Op::Min | Op::Max | Op::Fma | Op::Cvt) => mods.relu = true,
            "shiftamt" if op == Op::Bfind => mods.shiftamt = true,
            "L2::cache_hint" => mods.cache_hint = true,
            "finite" if op == Op::Testp => mods.testp = TestpMode::Finite,
            "infinite" if op == Op::Testp => mods.testp = TestpMode::Infinite,
            "number" if op == Op::Testp => mods.testp = TestpMode::Number,
            "notanumber" if op == Op::Testp => mods.testp = TestpMode::NotANumber,
            "normal" if op == Op::Testp => mods.testp = TestpMode::Normal,
            "subnormal" if op == Op::Testp => mods.testp = TestpMode::Subnormal,
            "f4e" if op == Op::Prmt => mods.prmt = PrmtMode::F4e,
            "b4e" if op == Op::Prmt => mods.prmt = PrmtMode::B4e,
            "rc8" if op == Op::Prmt => mods.prmt = PrmtMode::Rc8,
            "ecl" if op == Op::Prmt => mods.prmt = PrmtMode::Ecl,
            "ecr" if op == Op::Prmt => mods.prmt = PrmtMode::Ecr,
            "rc16" if op == Op::Prmt => mods.prmt = PrmtMode::Rc16,
            "clamp" if matches!(op, Op::Shf | Op::Szext | Op::Bmsk) => {}
            "wrap" if matches!(op, Op::Szext | Op::Bmsk) => mods.shf_wrap = true,
            "wait" | "launch_dependents" if op == Op::Griddep => {}
            "init" if op == Op::Mbarrier => mods.mbar = MbarOp::Init,
            "inval" if op == Op::Mbarrier => mods.mbar = MbarOp::Inval,
            "arrive" if op == Op::Mbarrier => mods.mbar = MbarOp::Arrive,
            "arrive_drop" if op == Op::Mbarrier => mods.mbar = MbarOp::ArriveDrop,
            "test_wait" if op == Op::Mbarrier => mods.mbar = MbarOp::TestWait,
            "try_wait" if op == Op::Mbarrier => mods.mbar = MbarOp::TryWait,
            "pending_count" if op == Op::Mbarrier => mods.mbar = MbarOp::PendingCount,
            "parity" if op == Op::Mbarrier => mods.parity = true,
            "async" | "commit_group" | "wait_group" | "wait_all"
                if matches!(op, Op::CpAsync | Op::CpAsyncWait) => {}
            "fractional"
            | "range"
            | "L2::evict_last"
            | "L2::evict_normal"
            | "L2::evict_first"
            | "L2::evict_unchanged"
                if op == Op::Createpolicy => {}
            "L2::evict_last" | "L2::evict_normal" | "L2::evict_first" | "L2::evict_unchanged"
                if op == Op::Prefetch => {}
            "L2" if op == Op::Prefetch => {}
            "sync" | "aligned" | "m8n8" | "x1" | "x2" | "x4" if op == Op::Ldmatrix => {}
            "trans" if op == Op::Ldmatrix => mods.trans = true,
            "add" if op == Op::Vabsdiff => mods.simd_add = true,
            "rni" => mods.rnd_int = Some('n'),
            "rzi" => mods.rnd_int = Some('z'),
            "rmi" => mods.rnd_int = Some('m'),
            "rpi" => mods.rnd_int = Some('p'),
            "rz" => mods.rnd = Some('z'),
            "rm" => mods.rnd = Some('m'),
            "rp" => mods.rnd = Some('p'),
            "rna" if op == Op::Cvt => mods.rnd = Some('a'),
            "v2" => mods.vec = 2,
            "v4" => mods.vec = 4,
            "to" => mods.to = true,
            "l" if op == Op::Shf => mods.shf_left = true,
            "wrap" => mods.shf_wrap = true,
            "up" if op == Op::Shfl => mods.shfl_mode = ShflMode::Up,
            "down" if op == Op::Shfl => mods.shfl_mode = ShflMode::Down,
            "bfly" if op == Op::Shfl => mods.shfl_mode = ShflMode::Bfly,
            "idx" if op == Op::Shfl => mods.shfl_mode = ShflMode::Idx,
            "all" if matches!(op, Op::Vote | Op::Match) => mods.vote_mode = VoteMode::All,
            "any" if matches!(op, Op::Vote | Op::Match) => mods.vote_mode = VoteMode::Any,
            "uni" if op == Op::Vote => mods.vote_mode = VoteMode::Uni,
            "ballot" if op == Op::Vote => mods.vote_mode = VoteMode::Ballot,
            "uni" => mods.uni = true,
            _ if matches!(op, Op::Atom | Op::Red | Op::Redux) && atom_of(m).is_some() => {
                mods.atom_op = atom_of(m).unwrap_or_default()
            }
            _ if (op == Op::Setp || op == Op::Set) && cmp_of(m).is_some() => {
                mods.cmp = cmp_of(m).unwrap_or_default()
            }
            "warp" if op == Op::Bar => {}
            "red" if op == Op::Bar => mods.bar_red = true,
            "popc" if op == Op::Bar => mods.atom_op = AtomOp::Add,
            "and" if op == Op::Bar => mods.atom_op = AtomOp::And,
            "or" if op == Op::Bar => mods.atom_op = AtomOp::Or,
            "and" if op == Op::Setp || op == Op::Set => mods.bool_op = BoolOp::And,
            "or" if op == Op::Setp || op == Op::Set => mods.bool_op = BoolOp::Or,
            "xor" if op == Op::Setp || op == Op::Set => mods.bool_op = BoolOp::Xor,
            // Caching, ordering, scope and approximation qualifiers change nothing here, nor does
            // `.rn`, the rounding the VM does by default.
            "rn"
            | "approx"
            | "full"
            | "ftz"
            | "nc"
            | "ca"
            | "cg"
            | "cs"
            | "lu"
            | "cv"
            | "wb"
            | "wt"
            | "sync"
            | "aligned"
            | "volatile"
            | "relaxed"
            | "acquire"
            | "release"
            | "acq_rel"
            | "sc"
            | "gpu"
            | "cta"
            | "sys"
            | "gl"
            | "L1"
            | "L2"
            | "noftz"
            | "arrive"
            | "red"
            | "popc"
            | "r"
            | "ptr"
            | "weak"
            | "mmio"
            | "cluster"
            | "proxy"
            | "async"
            | "L2::64B"
            | "L2::128B"
            | "L2::256B"
            | "L1::no_allocate"
            | "L1::evict_last"
            | "L1::evict_normal"
            | "L1::evict_unchanged"
            | "L1::evict_first"
            | "L2::evict_last"
            | "L2::evict_first"
            | "L2::evict_normal"
            | "L2::evict_unchanged"
            | "u32x2" => {}
            _ => return Err(unsupported()),
        }
    }
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
            return Err(unsupported());
        }
        types.remove(0);
    } else if types.len() > 2 || (types.len() == 2 && !two_types) {
        return Err(unsupported());
    }
    // `redux.sync` on floats (`.min/.max{.abs}{.NaN}.f32`) is not implemented.
    if op == Op::Redux && ty.is_float() {
        return Err(unsupported());
    }
    // Integer saturation is implemented for add/sub (s32), mad24 and cvt only.
    if mods.sat
        && !mods.x2.unwrap_or(ty).is_float()
        && !matches!(op, Op::Add | Op::Sub | Op::Mad24 | Op::Cvt)
    {
        return Err(unsupported());
    }
    let small_cvt = op == Op::Cvt && (mods.pk_dst.is_some() || (ty.is_float() && ty.size == 2));
    if mods.rnd.is_some() && !small_cvt && !crate::round::supported(op, ty, ty2, mods.x2.is_some())
    {
        // A directed rounding the VM cannot honour (f16, packed pairs, or an instruction that
        // takes no rounding mode) fails rather than rounding to nearest.
        return Err(unsupported());
    }
    // f16/bf16 immediates are their bits (`0x3C00`), not numbers to convert.
    let float = ty.is_float() && ty.size >= 4;
    let f32 = ty.size == 4;
    let is_branch = op == Op::Bra;
    if op == Op::Call {
        return decode_call(stmt, pred, mods, rest, regs, &unsupported);
    }
    let mut args = Vec::new();
    for a in crate::parse::split_top(rest) {
        // `{a, b}` vectors and `[...]` addresses are single operands (calls are decoded above).
        // Immediates of cvt are typed by the source type.
        let (fl, f3) = if op == Op::Cvt {
            (ty2.is_float() && ty2.size >= 4, ty2.size == 4)
        } else {
            (float, f32)
        };
        args.push(operand(&a, regs, fl, f3, label, is_branch)?);
    }
    if op == Op::Bar && base == "bar" && mods_s.first() == Some(&"warp") {
        // `bar.warp.sync mask` (`__syncwarp()`) synchronizes the lanes of its own warp only:
        // never the block's barrier. Min-PC scheduling already holds a lane at it until every
        // lane of the warp behind it (at a lower position) has caught up, so it is a fence.
        return Ok(Inst {
            pred,
            op: Op::Membar,
            ty,
            ty2,
            space,
            mods,
            args: Vec::new(),
            text: stmt.to_string(),
        });
    }
    Ok(Inst {
        pred,
        op,
        ty,
        ty2,
        space,
        mods,
        args,
        text: stmt.to_string(),
    })
}

/// `call{.uni} [(rets),] func[, (args)]`: the callee by name, or, for an indirect call
/// `call [(rets),] %rd[, (args)], prototype`, the register holding its address.
fn decode_call(
    stmt: &str,
    pred: Option<(u32, bool)>,
    mods: Mods,
    rest: &str,
    regs: &HashMap<String, u32>,
    unsupported: &dyn Fn() -> PtxError,
) -> Result<Inst, PtxError> {
    let items = crate::parse::split_top(rest);
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
        return Err(unsupported());
    }
    let b32 = Type {
        kind: Ty::B,
        size: 4,
    };
    Ok(Inst {
        pred,
        op: Op::Call,
        ty: b32,
        ty2: b32,
        space: Space::Generic,
        mods,
        args: vec![Operand::Vector(rets), callee, Operand::Vector(args)],
        text: stmt.to_string(),
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
}
