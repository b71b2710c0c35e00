//! Instructions specialized at load time. [`specialize`] looks at each compiled instruction
//! once (`code.rs`) and, for the forms that dominate kernels' inner loops, picks a [`Fast`]
//! form that names the exact operation, value width and signedness and whose operands are
//! only registers and immediates (immediates already cut to their operand's width). [`exec`]
//! then runs it with one dispatch per instruction, not per lane: each operand is read straight
//! from its register row (an immediate is spread once), every lane is computed in one loop
//! the compiler can vectorize, and only the running lanes' results are written. Integer and
//! float arithmetic, multiply-add, comparisons, `selp`, `mov`, `cvt`, float functions of one
//! operand, predicate logic, and single-element or vector loads and stores of shared and
//! global memory through a register plus an offset.
//!
//! Each form computes exactly what the general path (`arith.rs`, `memory.rs`) computes, with
//! the same scalar expressions. A load or store first checks every running lane (address in
//! the space, in range, aligned); when one fails, [`exec`] answers `false` and the general path
//! runs the instruction and reports the fault it finds. Arithmetic on lanes that are not
//! running is computed and dropped: no form can fault or panic on any value (integer division
//! is guarded against zero as the general path guards it). `crates/ptx/tests/spec_forms.rs`
//! runs kernels with and without these forms and compares.

use std::sync::atomic::Ordering;

use crate::alu::{self, f32v, mask, sext};
use crate::code::{Dst, Ins};
use crate::inst::{AtomOp, Cmp, Sreg, Ty, Type};
use crate::space::{SHARED_WINDOW, WINDOW_MASK};
use crate::warp::{Bits, Env, Group, Lanes, Warp};

mod select;

pub use select::specialize;

/// A source operand of a fast form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Opnd {
    Reg(u32),
    /// Already masked to the operand's width.
    Imm(u64),
}

/// `sext` with the width chosen once, outside the lanes' loop: `$body` with `$sx` the sign
/// extension of a value of `$size` bytes.
macro_rules! by_width {
    ($size:expr, $sx:ident, $body:expr) => {
        match $size {
            4 => {
                let $sx = |v: u64| v as u32 as i32 as i64;
                $body
            }
            8 => {
                let $sx = |v: u64| v as i64;
                $body
            }
            2 => {
                let $sx = |v: u64| v as u16 as i16 as i64;
                $body
            }
            _ => {
                let $sx = |v: u64| v as u8 as i8 as i64;
                $body
            }
        }
    };
}

/// The base of a load's or store's address.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Addr {
    Reg(u32),
    /// A module symbol (a shared variable's offset, a global variable's address): the same in
    /// every lane, resolved by the launch.
    Sym(u32),
}

/// Two-operand operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bin {
    Add(u64),
    Sub(u64),
    MulLo(u64),
    /// `mul.wide.s*`: the operands' byte width.
    MulWideS(u8),
    MulWideU,
    /// `mul.hi`: the operands' bits and the mask; the signed one their byte width too.
    MulHiS(u8, u64, u64),
    MulHiU(u64, u64),
    /// Integer division and remainder (as [`alu::arith`]: by zero, all ones and the dividend).
    DivS(u8, u64),
    DivU,
    RemS(u8, u64),
    RemU,
    /// Shifts: the value's bits and mask; the signed shift its width too.
    Shl(u64, u64),
    ShrU(u64),
    ShrS(u8, u64, u64),
    MinS(u8, u64),
    MaxS(u8, u64),
    MinU,
    MaxU,
    And,
    Or,
    Xor,
    /// `and`, `or`, `xor` of predicates (any nonzero value is true).
    PredAnd,
    PredOr,
    PredXor,
    AddF32,
    SubF32,
    MulF32,
    DivF32,
    AddF64,
    SubF64,
    MulF64,
    DivF64,
    /// `setp` of signed integers of this width, unsigned integers, f32, f64.
    SetpS(Cmp, u8),
    SetpU(Cmp),
    SetpF32(Cmp),
    SetpF64(Cmp),
}

/// Three-operand operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tern {
    FmaF32,
    FmaF64,
    MadLo(u64),
    MadWideS(u8),
    MadWideU,
    /// `selp d, a, b, c`: `c` is the predicate.
    Selp,
}

/// One-operand operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Un {
    Mov,
    /// `cvt` without rounding modifiers or packed types: [`alu::cvt`] of the instruction.
    Cvt,
    /// f32 and f64 `abs`, `neg`, `rcp`, `sqrt`, `rsqrt`, `sin`, `cos`, `ex2`, `lg2`, `tanh`:
    /// [`alu::unary_float`] of the instruction.
    Float,
    /// Integer `abs` and `neg` of this width.
    AbsS(u8),
    NegS(u8),
    /// `not` of an integer of this mask.
    Not(u64),
    /// `not.pred`, `cnot`: 1 for zero, else 0.
    IsZero,
}

/// An instruction's specialized form, or `None` for the general path.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Fast {
    #[default]
    None,
    Bin {
        op: Bin,
        d: u32,
        a: Opnd,
        b: Opnd,
        ma: u64,
        mb: u64,
    },
    Tern {
        op: Tern,
        d: u32,
        a: Opnd,
        b: Opnd,
        c: Opnd,
        /// Masks of `a` and `b`, and of `c`.
        m: u64,
        mc: u64,
    },
    Un {
        op: Un,
        d: u32,
        a: Opnd,
        ma: u64,
    },
    /// `ld` of `nv` elements of `n` bytes (1, 2, 4, 8) at `[a+off]`, shared memory (`shared`)
    /// or device memory; `sext`: signed elements.
    Ld {
        shared: bool,
        d: [Dst; 4],
        nv: u8,
        a: Addr,
        off: u64,
        n: u8,
        sext: bool,
    },
    /// `mov` of a special register other than the clocks.
    MovSreg {
        d: u32,
        s: Sreg,
        m: u64,
    },
    /// `ld.param` of a kernel parameter (`n` bytes at `at` of the parameter buffer): one value
    /// for every lane.
    LdParam {
        d: u32,
        at: u64,
        n: u8,
        sext: bool,
    },
    /// `atom.shared` / `red.shared` (not `cas`) of one element of `n` bytes (4 or 8) at
    /// `[a+off]`: the lanes one after another, as [`alu::atom`] of the instruction's type.
    AtomShared {
        op: AtomOp,
        ty: Type,
        d: Dst,
        a: Addr,
        off: u64,
        n: u8,
        v: Opnd,
    },
    /// `st` of `nv` elements of `n` bytes at `[a+off]`, shared memory or global.
    St {
        shared: bool,
        v: [Opnd; 4],
        nv: u8,
        a: Addr,
        off: u64,
        n: u8,
    },
}

const F32: Type = Type {
    kind: Ty::F,
    size: 4,
};
const F64: Type = Type {
    kind: Ty::F,
    size: 8,
};

/// An operand's 32 lanes: a register's row, or `tmp` filled with an immediate.
macro_rules! row {
    ($regs:expr, $o:expr, $tmp:ident) => {
        match $o {
            Opnd::Reg(r) => &$regs[r as usize],
            Opnd::Imm(v) => {
                $tmp = [v; 32];
                &$tmp
            }
        }
    };
}

/// Writes the running lanes of `o` to register `d`.
#[inline(always)]
fn write(regs: &mut [Lanes], d: u32, o: &Lanes, run: u32) {
    let row = &mut regs[d as usize];
    if run == u32::MAX {
        *row = *o;
    } else {
        for l in Bits(run) {
            row[l] = o[l];
        }
    }
}

/// The register file split around destination row `d`: that row mutable, the others shared.
struct Split<'a> {
    lo: &'a [Lanes],
    hi: &'a [Lanes],
    d: usize,
}

impl Split<'_> {
    /// Row `r` (not `d`).
    #[inline(always)]
    fn row(&self, r: u32) -> &Lanes {
        let r = r as usize;
        if r < self.d {
            &self.lo[r]
        } else {
            &self.hi[r - self.d - 1]
        }
    }
}

/// Row `d` and the other rows, if no register operand of `srcs` is `d`.
#[inline(always)]
fn split<'a>(regs: &'a mut [Lanes], d: u32, srcs: &[Opnd]) -> Option<(&'a mut Lanes, Split<'a>)> {
    if srcs.contains(&Opnd::Reg(d)) {
        return None;
    }
    let (lo, rest) = regs.split_at_mut_checked(d as usize)?;
    let (out, hi) = rest.split_first_mut()?;
    Some((
        out,
        Split {
            lo,
            hi,
            d: d as usize,
        },
    ))
}

/// An operand's 32 lanes from a [`Split`]: a register's row, or `tmp` filled with an
/// immediate.
macro_rules! srow {
    ($s:expr, $o:expr, $tmp:ident) => {
        match $o {
            Opnd::Reg(r) => $s.row(r),
            Opnd::Imm(v) => {
                $tmp = [v; 32];
                &$tmp
            }
        }
    };
}

/// `d = f(a, b)` in the running lanes: straight into `d`'s row when it is no source, else
/// through a temporary.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bin(
    regs: &mut [Lanes],
    d: u32,
    a: Opnd,
    b: Opnd,
    ma: u64,
    mb: u64,
    run: u32,
    f: impl Fn(u64, u64) -> u64,
) {
    if let Some((out, s)) = split(regs, d, &[a, b]) {
        let (ta, tb): (Lanes, Lanes);
        let x = srow!(s, a, ta);
        let y = srow!(s, b, tb);
        if run == u32::MAX {
            for l in 0..32 {
                out[l] = f(x[l] & ma, y[l] & mb);
            }
        } else {
            for l in Bits(run) {
                out[l] = f(x[l] & ma, y[l] & mb);
            }
        }
        return;
    }
    let (ta, tb): (Lanes, Lanes);
    let x = row!(regs, a, ta);
    let y = row!(regs, b, tb);
    let mut o = [0u64; 32];
    for l in 0..32 {
        o[l] = f(x[l] & ma, y[l] & mb);
    }
    write(regs, d, &o, run);
}

/// `d = f(a, b, c)` in the running lanes, as [`bin`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tern(
    regs: &mut [Lanes],
    d: u32,
    (a, b, c): (Opnd, Opnd, Opnd),
    m: u64,
    mc: u64,
    run: u32,
    f: impl Fn(u64, u64, u64) -> u64,
) {
    if let Some((out, s)) = split(regs, d, &[a, b, c]) {
        let (ta, tb, tc): (Lanes, Lanes, Lanes);
        let x = srow!(s, a, ta);
        let y = srow!(s, b, tb);
        let z = srow!(s, c, tc);
        if run == u32::MAX {
            for l in 0..32 {
                out[l] = f(x[l] & m, y[l] & m, z[l] & mc);
            }
        } else {
            for l in Bits(run) {
                out[l] = f(x[l] & m, y[l] & m, z[l] & mc);
            }
        }
        return;
    }
    let (ta, tb, tc): (Lanes, Lanes, Lanes);
    let x = row!(regs, a, ta);
    let y = row!(regs, b, tb);
    let z = row!(regs, c, tc);
    let mut o = [0u64; 32];
    for l in 0..32 {
        o[l] = f(x[l] & m, y[l] & m, z[l] & mc);
    }
    write(regs, d, &o, run);
}

/// `d = f(a, b, c)` computed for all 32 lanes at once by `f` (no masks: `f` reads what it
/// needs of each word), written in the running lanes.
#[inline(always)]
fn tern_lanes(
    regs: &mut [Lanes],
    d: u32,
    (a, b, c): (Opnd, Opnd, Opnd),
    run: u32,
    f: impl Fn(&Lanes, &Lanes, &Lanes, &mut Lanes),
) {
    if run == u32::MAX {
        if let Some((out, s)) = split(regs, d, &[a, b, c]) {
            let (ta, tb, tc): (Lanes, Lanes, Lanes);
            f(srow!(s, a, ta), srow!(s, b, tb), srow!(s, c, tc), out);
            return;
        }
    }
    let (ta, tb, tc): (Lanes, Lanes, Lanes);
    let mut o = [0u64; 32];
    f(
        row!(regs, a, ta),
        row!(regs, b, tb),
        row!(regs, c, tc),
        &mut o,
    );
    write(regs, d, &o, run);
}

#[inline(always)]
fn f32op(a: u64, b: u64, f: impl Fn(f32, f32) -> f32) -> u64 {
    f(f32v(a), f32v(b)).to_bits() as u64
}

#[inline(always)]
fn f64op(a: u64, b: u64, f: impl Fn(f64, f64) -> f64) -> u64 {
    f(f64::from_bits(a), f64::from_bits(b)).to_bits()
}

/// Runs `ins`'s fast form for the lanes `run` (not empty) of `g`: `false` when it has none, or
/// a lane fails a memory check (the general path then runs it).
#[inline(always)]
pub fn exec(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> bool {
    match ins.fast {
        Fast::None => false,
        Fast::Bin {
            op,
            d,
            a,
            b,
            ma,
            mb,
        } => {
            binary(&mut w.levels[g.depth], op, d, a, b, ma, mb, run);
            true
        }
        Fast::Tern {
            op,
            d,
            a,
            b,
            c,
            m,
            mc,
        } => {
            ternary(&mut w.levels[g.depth], op, d, (a, b, c), m, mc, run);
            true
        }
        Fast::Un { op, d, a, ma } => {
            unary(&mut w.levels[g.depth], ins, op, d, a, ma, run);
            true
        }
        Fast::MovSreg { d, s, m } => {
            mov_sreg(w, env, g, d, s, m, run);
            true
        }
        Fast::LdParam { d, at, n, sext } => {
            let Some(v) = crate::memory::read_bytes(env.l.params, at, n as u64) else {
                return false;
            };
            let v = if sext { alu::sext(v, n) as u64 } else { v };
            write(&mut w.levels[g.depth], d, &[v; 32], run);
            true
        }
        Fast::Ld {
            shared,
            d,
            nv,
            a,
            off,
            n,
            sext,
        } => match (shared, n) {
            (true, 4) => ld_shared::<4>(w, env, g, &d, nv, a, off, sext, run),
            (true, 8) => ld_shared::<8>(w, env, g, &d, nv, a, off, sext, run),
            (true, 2) => ld_shared::<2>(w, env, g, &d, nv, a, off, sext, run),
            (true, _) => ld_shared::<1>(w, env, g, &d, nv, a, off, sext, run),
            (false, 4) => ld_region::<4>(w, env, g, &d, nv, a, off, sext, run),
            (false, 8) => ld_region::<8>(w, env, g, &d, nv, a, off, sext, run),
            (false, 2) => ld_region::<2>(w, env, g, &d, nv, a, off, sext, run),
            (false, _) => ld_region::<1>(w, env, g, &d, nv, a, off, sext, run),
        },
        Fast::AtomShared {
            op,
            ty,
            d,
            a,
            off,
            n,
            v,
        } => match n {
            4 => atom_shared::<4>(w, env, g, op, ty, d, a, off, v, run),
            _ => atom_shared::<8>(w, env, g, op, ty, d, a, off, v, run),
        },
        Fast::St {
            shared,
            v,
            nv,
            a,
            off,
            n,
        } => match (shared, n) {
            (true, 4) => st_shared::<4>(w, env, g, &v, nv, a, off, run),
            (true, 8) => st_shared::<8>(w, env, g, &v, nv, a, off, run),
            (true, 2) => st_shared::<2>(w, env, g, &v, nv, a, off, run),
            (true, _) => st_shared::<1>(w, env, g, &v, nv, a, off, run),
            (false, 4) => st_region::<4>(w, env, g, &v, nv, a, off, run),
            (false, 8) => st_region::<8>(w, env, g, &v, nv, a, off, run),
            (false, 2) => st_region::<2>(w, env, g, &v, nv, a, off, run),
            (false, _) => st_region::<1>(w, env, g, &v, nv, a, off, run),
        },
    }
}

/// `d = op(a, b, c)` in the running lanes.
#[inline(always)]
fn ternary(
    regs: &mut [Lanes],
    op: Tern,
    d: u32,
    abc: (Opnd, Opnd, Opnd),
    m: u64,
    mc: u64,
    run: u32,
) {
    match op {
        Tern::FmaF32 => tern_lanes(regs, d, abc, run, alu::fma_f32_lanes),
        Tern::FmaF64 => tern(regs, d, abc, m, mc, run, |a, b, c| {
            f64::from_bits(a)
                .mul_add(f64::from_bits(b), f64::from_bits(c))
                .to_bits()
        }),
        Tern::MadLo(tm) => tern(regs, d, abc, m, mc, run, |a, b, c| {
            a.wrapping_mul(b).wrapping_add(c) & tm
        }),
        Tern::MadWideS(size) => by_width!(
            size,
            sx,
            tern(regs, d, abc, m, mc, run, |a, b, c| {
                (sx(a).wrapping_mul(sx(b)) as u64).wrapping_add(c)
            })
        ),
        Tern::MadWideU => tern(regs, d, abc, m, mc, run, |a, b, c| {
            a.wrapping_mul(b).wrapping_add(c)
        }),
        Tern::Selp => tern(
            regs,
            d,
            abc,
            m,
            mc,
            run,
            |a, b, c| if c != 0 { a } else { b },
        ),
    }
}

/// `d = op(a)` in the running lanes.
#[inline(always)]
fn unary(regs: &mut [Lanes], ins: &Ins, op: Un, d: u32, a: Opnd, ma: u64, run: u32) {
    let ta: Lanes;
    let x = row!(regs, a, ta);
    let mut o = [0u64; 32];
    match op {
        Un::Mov => {
            for l in 0..32 {
                o[l] = x[l] & ma;
            }
        }
        Un::Cvt => {
            for l in Bits(run) {
                o[l] = alu::cvt(ins, x[l] & ma);
            }
        }
        Un::Float => {
            for l in Bits(run) {
                o[l] = alu::unary_float(ins, x[l] & ma).unwrap_or(0);
            }
        }
        Un::AbsS(size) => {
            for l in 0..32 {
                o[l] = sext(x[l] & ma, size).wrapping_abs() as u64 & ma;
            }
        }
        Un::NegS(size) => {
            for l in 0..32 {
                o[l] = sext(x[l] & ma, size).wrapping_neg() as u64 & ma;
            }
        }
        Un::Not(m) => {
            for l in 0..32 {
                o[l] = !x[l] & m;
            }
        }
        Un::IsZero => {
            for l in 0..32 {
                o[l] = (x[l] & ma == 0) as u64;
            }
        }
    }
    write(regs, d, &o, run);
}

/// `mov` of special register `s` (masked by `m`) to `d` in the running lanes.
#[inline(always)]
fn mov_sreg(w: &mut Warp, env: &Env, g: &Group, d: u32, s: Sreg, m: u64, run: u32) {
    let mut o = [0u64; 32];
    match s {
        Sreg::Tid(k) => {
            let k = k as usize % 3;
            for (o, t) in o.iter_mut().zip(&w.tid) {
                *o = t[k] as u64 & m;
            }
        }
        Sreg::Ntid(_) | Sreg::Ctaid(_) | Sreg::Nctaid(_) | Sreg::DynSmem => {
            o = [crate::lanes::special(w, env, s, 0) & m; 32];
        }
        _ => {
            for l in Bits(run) {
                o[l] = crate::lanes::special(w, env, s, l) & m;
            }
        }
    }
    write(&mut w.levels[g.depth], d, &o, run);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn binary(regs: &mut [Lanes], op: Bin, d: u32, a: Opnd, b: Opnd, ma: u64, mb: u64, run: u32) {
    macro_rules! each {
        ($f:expr) => {
            bin(regs, d, a, b, ma, mb, run, $f)
        };
    }
    macro_rules! cmps {
        ($c:expr, $conv:expr) => {{
            let cv = $conv;
            match $c {
                Cmp::Eq => each!(|a, b| (cv(a) == cv(b)) as u64),
                Cmp::Ne => each!(|a, b| (cv(a) != cv(b)) as u64),
                Cmp::Lt => each!(|a, b| (cv(a) < cv(b)) as u64),
                Cmp::Le => each!(|a, b| (cv(a) <= cv(b)) as u64),
                Cmp::Gt => each!(|a, b| (cv(a) > cv(b)) as u64),
                _ => each!(|a, b| (cv(a) >= cv(b)) as u64),
            }
        }};
    }
    macro_rules! fcmps {
        ($c:expr, $t:expr) => {
            match $c {
                Cmp::Eq => each!(|a, b| alu::cmp(Cmp::Eq, a, b, $t) as u64),
                Cmp::Ne => each!(|a, b| alu::cmp(Cmp::Ne, a, b, $t) as u64),
                Cmp::Lt => each!(|a, b| alu::cmp(Cmp::Lt, a, b, $t) as u64),
                Cmp::Le => each!(|a, b| alu::cmp(Cmp::Le, a, b, $t) as u64),
                Cmp::Gt => each!(|a, b| alu::cmp(Cmp::Gt, a, b, $t) as u64),
                Cmp::Ge => each!(|a, b| alu::cmp(Cmp::Ge, a, b, $t) as u64),
                c => each!(|a, b| alu::cmp(c, a, b, $t) as u64),
            }
        };
    }
    match op {
        Bin::Add(m) => each!(|a, b| a.wrapping_add(b) & m),
        Bin::Sub(m) => each!(|a, b| a.wrapping_sub(b) & m),
        Bin::MulLo(m) => each!(|a, b| a.wrapping_mul(b) & m),
        Bin::MulWideS(size) => by_width!(size, sx, each!(|a, b| sx(a).wrapping_mul(sx(b)) as u64)),
        Bin::MulWideU => each!(|a, b| a.wrapping_mul(b)),
        Bin::MulHiS(size, bits, m) => by_width!(
            size,
            sx,
            each!(|a, b| ((sx(a) as i128 * sx(b) as i128) >> bits) as u64 & m)
        ),
        Bin::MulHiU(bits, m) if bits <= 32 => each!(|a, b| (a.wrapping_mul(b) >> bits) & m),
        Bin::MulHiU(bits, m) => each!(|a, b| ((a as u128 * b as u128) >> bits) as u64 & m),
        Bin::DivS(size, m) => by_width!(
            size,
            sx,
            each!(|a, b| if b == 0 {
                m
            } else {
                sx(a).wrapping_div(sx(b)) as u64 & m
            })
        ),
        Bin::DivU => each!(|a, b| a.checked_div(b).unwrap_or(ma)),
        Bin::RemS(size, m) => by_width!(
            size,
            sx,
            each!(|a, b| if b == 0 {
                a
            } else {
                sx(a).wrapping_rem(sx(b)) as u64 & m
            })
        ),
        Bin::RemU => each!(|a, b| if b == 0 { a } else { a % b }),
        Bin::Shl(bits, m) => each!(|a, b| if b >= bits { 0 } else { (a << b) & m }),
        Bin::ShrU(bits) => each!(|a, b| if b >= bits { 0 } else { a >> b }),
        Bin::ShrS(size, bits, m) => {
            by_width!(
                size,
                sx,
                each!(|a, b| (sx(a) >> b.min(bits).min(63)) as u64 & m)
            )
        }
        Bin::MinS(size, m) => by_width!(size, sx, each!(|a, b| sx(a).min(sx(b)) as u64 & m)),
        Bin::MaxS(size, m) => by_width!(size, sx, each!(|a, b| sx(a).max(sx(b)) as u64 & m)),
        Bin::MinU => each!(|a, b| a.min(b)),
        Bin::MaxU => each!(|a, b| a.max(b)),
        Bin::And => each!(|a, b| a & b),
        Bin::Or => each!(|a, b| a | b),
        Bin::Xor => each!(|a, b| a ^ b),
        Bin::PredAnd => each!(|a, b| (a != 0 && b != 0) as u64),
        Bin::PredOr => each!(|a, b| (a != 0 || b != 0) as u64),
        Bin::PredXor => each!(|a, b| ((a != 0) ^ (b != 0)) as u64),
        Bin::AddF32 => each!(|a, b| f32op(a, b, |p, q| p + q)),
        Bin::SubF32 => each!(|a, b| f32op(a, b, |p, q| p - q)),
        Bin::MulF32 => each!(|a, b| f32op(a, b, |p, q| p * q)),
        Bin::DivF32 => each!(|a, b| ((f32v(a) as f64 / f32v(b) as f64) as f32).to_bits() as u64),
        Bin::AddF64 => each!(|a, b| f64op(a, b, |p, q| p + q)),
        Bin::SubF64 => each!(|a, b| f64op(a, b, |p, q| p - q)),
        Bin::MulF64 => each!(|a, b| f64op(a, b, |p, q| p * q)),
        Bin::DivF64 => each!(|a, b| f64op(a, b, |p, q| p / q)),
        Bin::SetpS(c, size) => by_width!(size, sx, cmps!(c, sx)),
        Bin::SetpU(c) => cmps!(c, |v: u64| v),
        Bin::SetpF32(c) => fcmps!(c, F32),
        Bin::SetpF64(c) => fcmps!(c, F64),
    }
}

/// Each lane's base address of a load or store: a register's row, or a symbol's address in
/// `tmp` (the function answers `false` when the launch has no address for the symbol: the
/// general path reports it).
macro_rules! base_row {
    ($regs:expr, $env:expr, $a:expr, $tmp:ident) => {
        match $a {
            Addr::Reg(r) => &$regs[r as usize],
            Addr::Sym(id) => {
                let Some(v) = $env.l.syms.get(id as usize).copied().flatten() else {
                    return false;
                };
                $tmp = [v; 32];
                &$tmp
            }
        }
    };
}

/// `N` little-endian bytes of `b` at `i`.
#[inline(always)]
fn read<const N: usize>(b: &[u8], i: usize) -> u64 {
    let mut x = [0u8; 8];
    x[..N].copy_from_slice(&b[i..i + N]);
    u64::from_le_bytes(x)
}

/// The shared-memory offset of each lane's `[a+off]` (`k`-th element of `N` bytes), and
/// whether every running lane's access of `size` bytes is in range and aligned. Lanes out of
/// range get offset 0.
#[inline(always)]
fn shared_offsets(row: &Lanes, off: u64, size: u64, len: u64, run: u32) -> Option<Lanes> {
    if len < size {
        return None;
    }
    let mut o = [0u64; 32];
    let mut bad = 0u32;
    for l in 0..32 {
        let x = row[l].wrapping_add(off);
        let s = if x & WINDOW_MASK == SHARED_WINDOW {
            x - SHARED_WINDOW
        } else {
            x
        };
        let ok = s <= len - size && s & (size - 1) == 0;
        bad |= (!ok as u32) << l;
        o[l] = if ok { s } else { 0 };
    }
    (bad & run == 0).then_some(o)
}

/// One lane's load of `N` bytes of shared memory at `x + off`: the value and whether the
/// address is in range (at most `lim`) and aligned (0 is read instead when not).
#[inline(always)]
fn shared_one<const N: usize>(sh: &[u8], x: u64, off: u64, lim: u64, sext_: bool) -> (u64, bool) {
    let x = x.wrapping_add(off);
    let s = if x & WINDOW_MASK == SHARED_WINDOW {
        x - SHARED_WINDOW
    } else {
        x
    };
    let ok = s <= lim && s & (N as u64 - 1) == 0;
    let v = read::<N>(sh, if ok { s as usize } else { 0 });
    (if sext_ { sext(v, N as u8) as u64 } else { v }, ok)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn ld_shared<const N: usize>(
    w: &mut Warp,
    env: &Env,
    g: &Group,
    d: &[Dst; 4],
    nv: u8,
    a: Addr,
    off: u64,
    sext_: bool,
    run: u32,
) -> bool {
    let regs = &mut w.levels[g.depth][..];
    let size = N as u64 * nv as u64;
    let sh = &env.shared[..];
    let len = sh.len() as u64;
    if let (1, Dst::Reg(dr), true) = (nv, d[0], len >= size) {
        let srcs: &[Opnd] = match a {
            Addr::Reg(r) => &[Opnd::Reg(r)],
            Addr::Sym(_) => &[],
        };
        if let Some((out, s)) = split(regs, dr, srcs) {
            // One pass: address, check, load, straight into the destination. When a lane
            // fails, the general path runs the instruction again and writes every running
            // lane of the destination (or fails the launch).
            let tmp: Lanes;
            let row = match a {
                Addr::Reg(r) => s.row(r),
                Addr::Sym(id) => {
                    let Some(v) = env.l.syms.get(id as usize).copied().flatten() else {
                        return false;
                    };
                    tmp = [v; 32];
                    &tmp
                }
            };
            let lim = len - size;
            let one = |x: u64| shared_one::<N>(sh, x, off, lim, sext_);
            let mut good = true;
            if run == u32::MAX {
                for l in 0..32 {
                    let (v, ok) = one(row[l]);
                    out[l] = v;
                    good &= ok;
                }
            } else {
                for l in Bits(run) {
                    let (v, ok) = one(row[l]);
                    out[l] = v;
                    good &= ok;
                }
            }
            return good;
        }
    }
    let tmp: Lanes;
    let Some(o) = shared_offsets(base_row!(regs, env, a, tmp), off, size, len, run) else {
        return false;
    };
    load_values(regs, d, nv, run, |l, k| {
        let v = read::<N>(sh, o[l] as usize + k * N);
        if sext_ {
            sext(v, N as u8) as u64
        } else {
            v
        }
    });
    true
}

/// A load's values into its destination registers: element `k` of lane `l` is `get(l, k)`,
/// for each running lane (the offsets were copied out before, so each element goes straight
/// into its register).
#[inline(always)]
fn load_values(
    regs: &mut [Lanes],
    d: &[Dst; 4],
    nv: u8,
    run: u32,
    mut get: impl FnMut(usize, usize) -> u64,
) {
    for (k, dk) in d.iter().enumerate().take(nv as usize) {
        let Dst::Reg(r) = *dk else {
            continue;
        };
        let row = &mut regs[r as usize];
        if run == u32::MAX {
            for (l, x) in row.iter_mut().enumerate() {
                *x = get(l, k);
            }
        } else {
            for l in Bits(run) {
                row[l] = get(l, k);
            }
        }
    }
}

/// A store's values: `put(l, k, x)` for element `k` of each running lane `l`, lane by lane and
/// each lane's elements in order (a later lane's store to the same bytes wins, as on the
/// general path).
#[inline(always)]
fn store_values(
    regs: &[Lanes],
    v: &[Opnd; 4],
    nv: u8,
    run: u32,
    mut put: impl FnMut(usize, usize, u64),
) {
    for l in Bits(run) {
        for (k, x) in v.iter().enumerate().take(nv as usize) {
            let x = match *x {
                Opnd::Reg(r) => regs[r as usize][l],
                Opnd::Imm(x) => x,
            };
            put(l, k, x);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn st_shared<const N: usize>(
    w: &Warp,
    env: &mut Env,
    g: &Group,
    v: &[Opnd; 4],
    nv: u8,
    a: Addr,
    off: u64,
    run: u32,
) -> bool {
    let regs = &w.levels[g.depth][..];
    let size = N as u64 * nv as u64;
    let tmp: Lanes;
    let shared_len = env.shared.len() as u64;
    let Some(o) = shared_offsets(base_row!(regs, env, a, tmp), off, size, shared_len, run) else {
        return false;
    };
    env.shared_dirty = true;
    let sh = &mut env.shared[..];
    store_values(regs, v, nv, run, |l, k, x| {
        let i = o[l] as usize + k * N;
        sh[i..i + N].copy_from_slice(&x.to_le_bytes()[..N]);
    });
    true
}

/// The device memory region holding `addr`: one of the block's recent regions, or else the
/// device's (then the most recent).
#[inline(always)]
fn region_of<'a>(env: &mut Env<'a>, addr: u64) -> Option<crate::Region<'a>> {
    let hit = |r: &crate::Region| addr.wrapping_sub(r.start) < r.len;
    if let Some(r) = env.recent.iter().flatten().find(|r| hit(r)) {
        return Some(*r);
    }
    // The VM's own windows hold no device memory.
    use crate::space::{ALLOCA_WINDOW, FUNCTION_WINDOW, LOCAL_WINDOW, PARAM_WINDOW};
    if matches!(
        addr & WINDOW_MASK,
        SHARED_WINDOW | LOCAL_WINDOW | PARAM_WINDOW | ALLOCA_WINDOW | FUNCTION_WINDOW
    ) {
        return None;
    }
    let r = env.l.mem.region(addr)?;
    env.recent.rotate_right(1);
    env.recent[0] = Some(r);
    Some(r)
}

/// Each lane's offset of `[a+off]` in device-memory region `r`, if every running
/// lane's access of `size` bytes lies in it, aligned. Lanes out of range get offset 0.
#[inline(always)]
fn region_offsets(row: &Lanes, off: u64, size: u64, r: &crate::Region, run: u32) -> Option<Lanes> {
    if r.len < size || !r.start.is_multiple_of(8) || r.len > r.words.len() as u64 * 8 {
        return None;
    }
    let mut o = [0u64; 32];
    let mut bad = 0u32;
    for l in 0..32 {
        let x = row[l].wrapping_add(off);
        let s = x.wrapping_sub(r.start);
        let ok = s <= r.len - size && x & (size - 1) == 0;
        bad |= (!ok as u32) << l;
        o[l] = if ok { s } else { 0 };
    }
    (bad & run == 0).then_some(o)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn ld_region<const N: usize>(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    d: &[Dst; 4],
    nv: u8,
    a: Addr,
    off: u64,
    sext_: bool,
    run: u32,
) -> bool {
    let regs = &mut w.levels[g.depth][..];
    let size = N as u64 * nv as u64;
    let tmp: Lanes;
    let row = base_row!(regs, env, a, tmp);
    let first = row[run.trailing_zeros() as usize & 31].wrapping_add(off);
    let Some(r) = region_of(env, first) else {
        return false;
    };
    let Some(o) = region_offsets(row, off, size, &r, run) else {
        return false;
    };
    let m = mask(N as u8);
    load_values(regs, d, nv, run, |l, k| {
        let at = o[l] + (k * N) as u64;
        let word = r.words[(at / 8) as usize].load(Ordering::Relaxed);
        let v = (word >> ((at % 8) * 8)) & m;
        if sext_ {
            sext(v, N as u8) as u64
        } else {
            v
        }
    });
    true
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn st_region<const N: usize>(
    w: &Warp,
    env: &mut Env,
    g: &Group,
    v: &[Opnd; 4],
    nv: u8,
    a: Addr,
    off: u64,
    run: u32,
) -> bool {
    let regs = &w.levels[g.depth][..];
    let size = N as u64 * nv as u64;
    let tmp: Lanes;
    let row = base_row!(regs, env, a, tmp);
    let first = row[run.trailing_zeros() as usize & 31].wrapping_add(off);
    let Some(r) = region_of(env, first) else {
        return false;
    };
    let Some(o) = region_offsets(row, off, size, &r, run) else {
        return false;
    };
    let exclusive = env.l.exclusive;
    env.wrote();
    let m = mask(N as u8);
    store_values(regs, v, nv, run, |l, k, x| {
        let at = o[l] + (k * N) as u64;
        let word = &r.words[(at / 8) as usize];
        let sh = (at % 8) * 8;
        let (wm, wv) = (m << sh, (x & m) << sh);
        if wm == u64::MAX {
            word.store(wv, Ordering::Relaxed);
        } else if exclusive {
            let old = word.load(Ordering::Relaxed);
            word.store((old & !wm) | wv, Ordering::Relaxed);
        } else {
            let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some((old & !wm) | wv)
            });
        }
    });
    true
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn atom_shared<const N: usize>(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    op: AtomOp,
    ty: Type,
    d: Dst,
    a: Addr,
    off: u64,
    v: Opnd,
    run: u32,
) -> bool {
    let regs = &mut w.levels[g.depth][..];
    let tmp: Lanes;
    let shared_len = env.shared.len() as u64;
    let Some(o) = shared_offsets(base_row!(regs, env, a, tmp), off, N as u64, shared_len, run)
    else {
        return false;
    };
    let m = mask(N as u8);
    let tv: Lanes;
    let x = row!(regs, v, tv);
    let mut old = [0u64; 32];
    env.shared_dirty = true;
    let sh = &mut env.shared[..];
    for l in Bits(run) {
        let i = o[l] as usize;
        let was = read::<N>(sh, i);
        let new = alu::atom(op, ty, was, x[l] & m, 0).unwrap_or(was);
        sh[i..i + N].copy_from_slice(&new.to_le_bytes()[..N]);
        old[l] = was;
    }
    if let Dst::Reg(r) = d {
        write(regs, r, &old, run);
    }
    true
}
