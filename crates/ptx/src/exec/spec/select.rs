//! The load-time half of the specialized forms: which [`Fast`] form, if any, an instruction
//! takes, one function per family. Run once per instruction by `code.rs`, never at run time.

use super::{Addr, Bin, Fast, Opnd, Tern, Un, F32, F64};
use crate::alu::{self, mask};
use crate::code::{Dst, Ins, Src};
use crate::inst::{AtomOp, BoolOp, Cmp, Op, Space, Sreg, Ty};

fn opnd(s: Src, size: u8) -> Option<Opnd> {
    match s {
        Src::Reg(r) => Some(Opnd::Reg(r)),
        Src::Imm(v) => Some(Opnd::Imm(v & mask(size))),
        _ => None,
    }
}

/// Source `k` of `ins` as an operand of `size` bytes, if it is a register or an immediate.
fn src(ins: &Ins, k: usize, size: u8) -> Option<Opnd> {
    opnd(ins.src(k), size)
}

/// The `[base+offset]` operand of a load or store, if its base is a register or a symbol.
fn addr(ins: &Ins) -> Option<(Addr, u64)> {
    match ins.addr? {
        (Src::Reg(r), off) => Some((Addr::Reg(r), off as u64)),
        (Src::Sym(id), off) => Some((Addr::Sym(id), off as u64)),
        _ => None,
    }
}

fn dreg(d: Dst) -> Option<u32> {
    match d {
        Dst::Reg(r) => Some(r),
        Dst::Sink => None,
    }
}

/// What the forms look at of an instruction's type: an integer of 1, 2, 4 or 8 bytes, and
/// signed; its size in bytes and the mask of that size.
struct Shape {
    int: bool,
    signed: bool,
    size: u8,
    tm: u64,
}

fn shape(ins: &Ins) -> Shape {
    let ty = ins.ty;
    Shape {
        int: matches!(ty.kind, Ty::U | Ty::S | Ty::B) && matches!(ty.size, 1 | 2 | 4 | 8),
        signed: ty.kind == Ty::S,
        size: ty.size,
        tm: mask(ty.size),
    }
}

/// One destination, not a vector.
fn single(ins: &Ins) -> bool {
    !ins.dvec && ins.nd == 1
}

/// The fast form of `ins`, if it has one.
pub fn specialize(ins: &Ins) -> Fast {
    let m = &ins.m;
    // Modifiers none of the forms take.
    if m.x2.is_some() || m.sat || m.rnd.is_some() || m.cc || m.relu {
        return Fast::None;
    }
    form(ins).unwrap_or(Fast::None)
}

fn form(ins: &Ins) -> Option<Fast> {
    let (m, size) = (&ins.m, ins.ty.size);
    let single = single(ins);
    match ins.op {
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Rem
        | Op::Min
        | Op::Max
        | Op::And
        | Op::Or
        | Op::Xor
        | Op::Shl
        | Op::Shr => binary(ins),
        Op::Setp => setp(ins),
        Op::Fma | Op::Mad => mad(ins),
        Op::Selp => selp(ins),
        Op::Mov
            if single
                && !ins.svec
                && ins.ns == 1
                && matches!(ins.s[0], Src::Sreg(s) if !matches!(s, Sreg::Clock | Sreg::Clock64 | Sreg::Globaltimer)) =>
        {
            mov_sreg(ins)
        }
        Op::Ld
            if ins.space == Space::Param
                && single
                && ins.ns == 0
                && m.vec <= 1
                && matches!(size, 1 | 2 | 4 | 8) =>
        {
            ld_param(ins)
        }
        Op::Mov if single && !ins.svec && ins.ns == 1 => Some(Fast::Un {
            op: Un::Mov,
            d: dreg(ins.d[0])?,
            a: src(ins, 0, size)?,
            ma: mask(size),
        }),
        Op::Abs
        | Op::Neg
        | Op::Rcp
        | Op::Sqrt
        | Op::Rsqrt
        | Op::Sin
        | Op::Cos
        | Op::Ex2
        | Op::Lg2
        | Op::Tanh
        | Op::Not
        | Op::Cnot
            if single && ins.ns == 1 =>
        {
            unary(ins)
        }
        Op::Cvt
            if single
                && ins.ns == 1
                && m.pk_dst.is_none()
                && m.pk_src.is_none()
                && matches!(ins.ty2.size, 1 | 2 | 4 | 8)
                && matches!(ins.ty2.kind, Ty::U | Ty::S | Ty::B | Ty::F) =>
        {
            Some(Fast::Un {
                op: Un::Cvt,
                d: dreg(ins.d[0])?,
                a: src(ins, 0, ins.ty2.size)?,
                ma: mask(ins.ty2.size),
            })
        }
        Op::Ld | Op::Ldu => ld(ins),
        Op::Atom | Op::Red
            if ins.space == Space::Shared
                && m.vec <= 1
                && matches!(size, 4 | 8)
                && m.atom_op != AtomOp::Cas
                && ins.ns == 1
                && !ins.dvec
                && alu::atom(m.atom_op, ins.ty, 0, 0, 0).is_some() =>
        {
            atom_shared(ins)
        }
        Op::St => st(ins),
        _ => None,
    }
}

/// Integer, predicate, f32 and f64 operations of two operands.
fn binary(ins: &Ins) -> Option<Fast> {
    let (ty, m) = (ins.ty, &ins.m);
    let Shape {
        int,
        signed,
        size,
        tm,
    } = shape(ins);
    if !single(ins) || ins.ns != 2 {
        return None;
    }
    let d = dreg(ins.d[0])?;
    let shift = matches!(ins.op, Op::Shl | Op::Shr);
    let bsize = if shift { 4 } else { size };
    let (a, b) = (src(ins, 0, size)?, src(ins, 1, bsize)?);
    let bits = size as u64 * 8;
    let f32 = ty == F32;
    let f64 = ty == F64;
    let op = match ins.op {
        Op::Add if int => Bin::Add(tm),
        Op::Sub if int => Bin::Sub(tm),
        Op::Mul if int && !m.wide && !m.hi => Bin::MulLo(tm),
        Op::Mul if int && m.wide && size < 8 && signed => Bin::MulWideS(size),
        Op::Mul if int && m.wide && size < 8 => Bin::MulWideU,
        Op::Mul if int && m.hi && signed => Bin::MulHiS(size, bits, tm),
        Op::Mul if int && m.hi => Bin::MulHiU(bits, tm),
        Op::Div if int && signed => Bin::DivS(size, tm),
        Op::Div if int => Bin::DivU,
        Op::Rem if int && signed => Bin::RemS(size, tm),
        Op::Rem if int => Bin::RemU,
        Op::Shl if int => Bin::Shl(bits, tm),
        Op::Shr if int && signed => Bin::ShrS(size, bits, tm),
        Op::Shr if int => Bin::ShrU(bits),
        Op::Min if int && signed => Bin::MinS(size, tm),
        Op::Max if int && signed => Bin::MaxS(size, tm),
        Op::Min if int => Bin::MinU,
        Op::Max if int => Bin::MaxU,
        Op::And if int => Bin::And,
        Op::Or if int => Bin::Or,
        Op::Xor if int => Bin::Xor,
        Op::And if ty.kind == Ty::Pred => Bin::PredAnd,
        Op::Or if ty.kind == Ty::Pred => Bin::PredOr,
        Op::Xor if ty.kind == Ty::Pred => Bin::PredXor,
        Op::Add if f32 => Bin::AddF32,
        Op::Sub if f32 => Bin::SubF32,
        Op::Mul if f32 => Bin::MulF32,
        Op::Div if f32 => Bin::DivF32,
        Op::Add if f64 => Bin::AddF64,
        Op::Sub if f64 => Bin::SubF64,
        Op::Mul if f64 => Bin::MulF64,
        Op::Div if f64 => Bin::DivF64,
        _ => return None,
    };
    Some(Fast::Bin {
        op,
        d,
        a,
        b,
        ma: tm,
        mb: mask(bsize),
    })
}

/// `setp` of integers (the comparisons of their signedness), f32 and f64, without a boolean
/// combination.
fn setp(ins: &Ins) -> Option<Fast> {
    let Shape { int, size, tm, .. } = shape(ins);
    let m = &ins.m;
    if !single(ins) || ins.ns != 2 || m.bool_op != BoolOp::None {
        return None;
    }
    let d = dreg(ins.d[0])?;
    let (a, b) = (src(ins, 0, size)?, src(ins, 1, size)?);
    let c = m.cmp;
    let op = match ins.ty.kind {
        Ty::S if int && matches!(c, Cmp::Eq | Cmp::Ne | Cmp::Lt | Cmp::Le | Cmp::Gt | Cmp::Ge) => {
            Bin::SetpS(c, size)
        }
        Ty::U | Ty::B if int => Bin::SetpU(match c {
            Cmp::Lo => Cmp::Lt,
            Cmp::Ls => Cmp::Le,
            Cmp::Hi => Cmp::Gt,
            Cmp::Hs => Cmp::Ge,
            Cmp::Eq | Cmp::Ne | Cmp::Lt | Cmp::Le | Cmp::Gt | Cmp::Ge => c,
            _ => return None,
        }),
        Ty::F if size == 4 && c != Cmp::None => Bin::SetpF32(c),
        Ty::F if size == 8 && c != Cmp::None => Bin::SetpF64(c),
        _ => return None,
    };
    Some(Fast::Bin {
        op,
        d,
        a,
        b,
        ma: tm,
        mb: tm,
    })
}

/// `fma` of f32 and f64, integer `mad.lo` and `mad.wide`.
fn mad(ins: &Ins) -> Option<Fast> {
    let (ty, m) = (ins.ty, &ins.m);
    let Shape {
        int,
        signed,
        size,
        tm,
    } = shape(ins);
    if !single(ins) || ins.ns != 3 || m.hi {
        return None;
    }
    let d = dreg(ins.d[0])?;
    let csize = if m.wide { size.saturating_mul(2) } else { size };
    let (a, b, c) = (src(ins, 0, size)?, src(ins, 1, size)?, src(ins, 2, csize)?);
    let op = if ty == F32 {
        Tern::FmaF32
    } else if ty == F64 {
        Tern::FmaF64
    } else if ins.op == Op::Mad && int && !m.wide {
        Tern::MadLo(tm)
    } else if ins.op == Op::Mad && int && size < 8 && signed {
        Tern::MadWideS(size)
    } else if ins.op == Op::Mad && int && size < 8 {
        Tern::MadWideU
    } else {
        return None;
    };
    Some(Fast::Tern {
        op,
        d,
        a,
        b,
        c,
        m: tm,
        mc: mask(csize),
    })
}

fn selp(ins: &Ins) -> Option<Fast> {
    let Shape { size, tm, .. } = shape(ins);
    if !single(ins) || ins.ns != 3 {
        return None;
    }
    let d = dreg(ins.d[0])?;
    let (a, b, c) = (src(ins, 0, size)?, src(ins, 1, size)?, src(ins, 2, 1)?);
    Some(Fast::Tern {
        op: Tern::Selp,
        d,
        a,
        b,
        c,
        m: tm,
        mc: mask(1),
    })
}

/// `mov` of a special register (the caller has checked it is one, and not a clock).
fn mov_sreg(ins: &Ins) -> Option<Fast> {
    let Src::Sreg(s) = ins.s[0] else {
        return None;
    };
    Some(Fast::MovSreg {
        d: dreg(ins.d[0])?,
        s,
        m: mask(ins.ty.size),
    })
}

/// `ld.param` of a kernel parameter (the caller has checked the shape).
fn ld_param(ins: &Ins) -> Option<Fast> {
    let (Src::KernelParam(base), off) = ins.addr? else {
        return None;
    };
    Some(Fast::LdParam {
        d: dreg(ins.d[0])?,
        at: base.wrapping_add(off as u64),
        n: ins.ty.size,
        sext: ins.ty.kind == Ty::S,
    })
}

/// Integer `abs`, `neg`, `not`; `not.pred`, `cnot`; f32 and f64 functions of one operand.
fn unary(ins: &Ins) -> Option<Fast> {
    let Shape { int, size, tm, .. } = shape(ins);
    let ty = ins.ty;
    let float = ty.kind == Ty::F && matches!(size, 4 | 8);
    let op = match ins.op {
        Op::Abs if int => Un::AbsS(size),
        Op::Neg if int => Un::NegS(size),
        Op::Not if int => Un::Not(tm),
        Op::Not if ty.kind == Ty::Pred => Un::IsZero,
        Op::Cnot => Un::IsZero,
        Op::Not => return None,
        _ if float => Un::Float,
        _ => return None,
    };
    Some(Fast::Un {
        op,
        d: dreg(ins.d[0])?,
        a: src(ins, 0, size)?,
        ma: tm,
    })
}

/// `ld`/`ldu` of one element or a vector from shared, global, generic or constant memory.
fn ld(ins: &Ins) -> Option<Fast> {
    let nv = ins.m.vec.max(1);
    let n = ins.ty.size;
    let shared = match ins.space {
        Space::Shared => true,
        Space::Global | Space::Generic | Space::Const => false,
        _ => return None,
    };
    if !matches!(n, 1 | 2 | 4 | 8)
        || !matches!(nv, 1 | 2 | 4)
        || ins.nd != nv
        || ins.dvec != (nv > 1)
        || ins.ns != 0
    {
        return None;
    }
    let (a, off) = addr(ins)?;
    Some(Fast::Ld {
        shared,
        d: ins.d,
        nv,
        a,
        off,
        n,
        sext: ins.ty.kind == Ty::S,
    })
}

/// `atom.shared`/`red.shared` (the caller has checked the shape).
fn atom_shared(ins: &Ins) -> Option<Fast> {
    let (a, off) = addr(ins)?;
    let size = ins.ty.size;
    Some(Fast::AtomShared {
        op: ins.m.atom_op,
        ty: ins.ty,
        d: if ins.op == Op::Atom {
            ins.d[0]
        } else {
            Dst::Sink
        },
        a,
        off,
        n: size,
        v: src(ins, 0, size)?,
    })
}

/// `st` of one element or a vector to shared or global memory.
fn st(ins: &Ins) -> Option<Fast> {
    let nv = ins.m.vec.max(1);
    let n = ins.ty.size;
    let shared = match ins.space {
        Space::Shared => true,
        Space::Global => false,
        _ => return None,
    };
    if !matches!(n, 1 | 2 | 4 | 8)
        || !matches!(nv, 1 | 2 | 4)
        || ins.ns != nv
        || ins.svec != (nv > 1)
        || ins.m.cache_hint
    {
        return None;
    }
    let (a, off) = addr(ins)?;
    let mut v = [Opnd::Imm(0); 4];
    for (k, slot) in v.iter_mut().enumerate().take(nv as usize) {
        *slot = src(ins, k, n)?;
    }
    Some(Fast::St {
        shared,
        v,
        nv,
        a,
        off,
        n,
    })
}
