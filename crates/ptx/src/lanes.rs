//! A group's operands: read for all 32 lanes at once into arrays, computed in loops over the
//! lanes of a mask, written back under that mask.

use crate::alu::mask;
use crate::code::{Dst, Ins, Src};
use crate::inst::Sreg;
use crate::space::{LOCAL_WINDOW, PARAM_WINDOW};
use crate::warp::{Bits, Env, Group, Lanes, Warp};
use crate::ExecError;

#[inline(always)]
pub fn map1(a: &Lanes, run: u32, f: impl Fn(u64) -> u64) -> Lanes {
    let mut o = [0u64; 32];
    if run == u32::MAX {
        for l in 0..32 {
            o[l] = f(a[l]);
        }
    } else {
        for l in Bits(run) {
            o[l] = f(a[l]);
        }
    }
    o
}

#[inline(always)]
pub fn map2(a: &Lanes, b: &Lanes, run: u32, f: impl Fn(u64, u64) -> u64) -> Lanes {
    let mut o = [0u64; 32];
    if run == u32::MAX {
        for l in 0..32 {
            o[l] = f(a[l], b[l]);
        }
    } else {
        for l in Bits(run) {
            o[l] = f(a[l], b[l]);
        }
    }
    o
}

#[inline(always)]
pub fn map3(a: &Lanes, b: &Lanes, c: &Lanes, run: u32, f: impl Fn(u64, u64, u64) -> u64) -> Lanes {
    let mut o = [0u64; 32];
    if run == u32::MAX {
        for l in 0..32 {
            o[l] = f(a[l], b[l], c[l]);
        }
    } else {
        for l in Bits(run) {
            o[l] = f(a[l], b[l], c[l]);
        }
    }
    o
}

#[inline(always)]
pub fn try_map2(
    a: &Lanes,
    b: &Lanes,
    run: u32,
    f: impl Fn(u64, u64) -> Option<u64>,
) -> Option<Lanes> {
    let mut o = [0u64; 32];
    for l in Bits(run) {
        o[l] = f(a[l], b[l])?;
    }
    Some(o)
}

pub fn special(w: &Warp, env: &Env, s: Sreg, l: usize) -> u64 {
    let c = &env.l.cfg;
    let lane = l as u32;
    match s {
        Sreg::Tid(d) => w.tid[l][d as usize % 3] as u64,
        Sreg::Ntid(d) => c.block[d as usize % 3] as u64,
        Sreg::Ctaid(d) => env.ctaid[d as usize % 3] as u64,
        Sreg::Nctaid(d) => c.grid[d as usize % 3] as u64,
        Sreg::Laneid => lane as u64,
        Sreg::Warpid => w.index as u64,
        Sreg::Nwarpid => 64,
        Sreg::Smid => 0,
        Sreg::Nsmid => 108,
        Sreg::Clock | Sreg::Clock64 | Sreg::Globaltimer => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        Sreg::LanemaskEq => 1 << lane,
        Sreg::LanemaskLt => (1u64 << lane) - 1,
        Sreg::LanemaskLe => (1u64 << (lane + 1)) - 1,
        Sreg::LanemaskGt => !((1u64 << (lane + 1)) - 1) & 0xffff_ffff,
        Sreg::LanemaskGe => !((1u64 << lane) - 1) & 0xffff_ffff,
        Sreg::DynSmem => c.dynamic_shared_bytes as u64,
        Sreg::Envreg(1) => env.l.workspace >> 32,
        Sreg::Envreg(2) => env.l.workspace & 0xffff_ffff,
        Sreg::Envreg(_) => 0,
        Sreg::ReservedSmem(k) => {
            // The reserved region is the last RESERVED_SHARED bytes of the block's shared memory.
            let begin = (env.l.shared_bytes as u64).saturating_sub(crate::RESERVED_SHARED);
            match k {
                0 | 3 => begin,
                1 => begin + crate::RESERVED_SHARED,
                2 => crate::RESERVED_SHARED,
                _ => begin + crate::RESERVED_SHARED / 2,
            }
        }
    }
}

pub fn bad_operand() -> ExecError {
    ExecError::Unsupported("an operand that has no value".into())
}

/// An operand's value in every lane, read as `size` bytes.
pub fn val(w: &Warp, env: &Env, g: &Group, s: Src, size: u8) -> Result<Lanes, ExecError> {
    let mut out = [0u64; 32];
    val_into(w, env, g, s, size, &mut out)?;
    Ok(out)
}

/// [`val`] into `out`.
#[inline(never)]
pub fn val_into(
    w: &Warp,
    env: &Env,
    g: &Group,
    s: Src,
    size: u8,
    out: &mut Lanes,
) -> Result<(), ExecError> {
    let m = mask(size);
    *out = match s {
        Src::Reg(r) => {
            let row = &w.levels[g.depth][r as usize];
            for (o, &x) in out.iter_mut().zip(row) {
                *o = x & m;
            }
            return Ok(());
        }
        Src::NotReg(r) => {
            let row = &w.levels[g.depth][r as usize];
            for (o, &x) in out.iter_mut().zip(row) {
                *o = (x == 0) as u64;
            }
            return Ok(());
        }
        Src::Imm(v) => [v & m; 32],
        Src::Sreg(s @ (Sreg::Clock | Sreg::Clock64 | Sreg::Globaltimer)) => {
            [special(w, env, s, 0) & m; 32]
        }
        Src::Sreg(s) => std::array::from_fn(|l| special(w, env, s, l) & m),
        Src::Sym(id) => {
            let v = env
                .l
                .syms
                .get(id as usize)
                .copied()
                .flatten()
                .ok_or_else(|| {
                    let name = match env.l.prog.symbols.get(id as usize) {
                        Some(crate::code::SymKind::Global(n)) => n.as_str(),
                        _ => "?",
                    };
                    ExecError::Unsupported(format!("unknown symbol {name}"))
                })?;
            [v; 32]
        }
        Src::Local(off) => [g.base.wrapping_add(off); 32],
        Src::FrameParam(off) => [LOCAL_WINDOW + g.base.wrapping_add(off); 32],
        Src::KernelParam(off) => [PARAM_WINDOW + off; 32],
        Src::Bad => return Err(bad_operand()),
    };
    Ok(())
}

/// Writes `v` to a destination register in `run`'s lanes.
#[inline(always)]
pub fn put(w: &mut Warp, g: &Group, d: Dst, v: &Lanes, run: u32) {
    if let Dst::Reg(r) = d {
        let row = &mut w.levels[g.depth][r as usize];
        if run == u32::MAX {
            *row = *v;
        } else {
            for l in Bits(run) {
                row[l] = v[l];
            }
        }
    }
}

/// `f` of each running lane's operands, written straight into destination `d` (no result
/// array to copy); a sink destination (`_`) takes nothing.
#[inline(always)]
pub fn put_map2(
    w: &mut Warp,
    g: &Group,
    d: Dst,
    x: &Lanes,
    y: &Lanes,
    run: u32,
    f: impl Fn(u64, u64) -> u64,
) {
    if let Dst::Reg(r) = d {
        let row = &mut w.levels[g.depth][r as usize];
        if run == u32::MAX {
            for l in 0..32 {
                row[l] = f(x[l], y[l]);
            }
        } else {
            for l in Bits(run) {
                row[l] = f(x[l], y[l]);
            }
        }
    }
}

/// [`put_map2`] of three operands.
#[inline(always)]
pub fn put_map3(
    w: &mut Warp,
    g: &Group,
    d: Dst,
    (x, y, z): (&Lanes, &Lanes, &Lanes),
    run: u32,
    f: impl Fn(u64, u64, u64) -> u64,
) {
    if let Dst::Reg(r) = d {
        let row = &mut w.levels[g.depth][r as usize];
        if run == u32::MAX {
            for l in 0..32 {
                row[l] = f(x[l], y[l], z[l]);
            }
        } else {
            for l in Bits(run) {
                row[l] = f(x[l], y[l], z[l]);
            }
        }
    }
}

/// The lanes of the group whose guard predicate holds.
#[inline(always)]
pub fn guard(w: &Warp, g: &Group, ins: &Ins) -> u32 {
    match ins.guard {
        None => g.mask,
        Some((r, neg)) => {
            let row = &w.levels[g.depth][r as usize];
            let mut m = 0u32;
            for (l, &x) in row.iter().enumerate() {
                m |= (((x != 0) != neg) as u32) << l;
            }
            m & g.mask
        }
    }
}
