//! Decoded instructions: opcode, types and modifiers resolved once at load, operands bound to
//! register indices; the vocabulary the parser (`decode/`, which reads a statement into an
//! [`Inst`]) and the interpreter (`exec/`) share. `code.rs` compiles each [`Inst`] into the
//! compact form the interpreter runs.

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

    pub(crate) fn parse(t: &str) -> Option<Type> {
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
    /// `call (rets), func, (args)`: `args[0]` is a vector of return operands, `args[1]` the
    /// function's name, `args[2]` a vector of arguments.
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
