//! Bit and byte instructions, lane by lane: population count, leading zeros, reversal, field
//! extract and insert, byte permute, `bfind`, `fns`, dot products of bytes and halves
//! (`dp2a`, `dp4a`), sign/zero extension, masks, `vabsdiff`, funnel shifts, `lop3`, `sad`.

use crate::alu::{self, mask, sext, U32};
use crate::code::Ins;
use crate::inst::{Op, Ty};
use crate::lanes::{map1, map2, map3, put};
use crate::warp::{Bits, Env, Group, Warp};
use crate::ExecError;

/// Runs `ins` (an instruction of this family) for the lanes `run` of group `g`.
pub(super) fn exec(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    match ins.op {
        Op::Popc => {
            lanes!(x, w, env, g, ins, 0, ty);
            put(w, g, d0, &map1(&x, run, |x| x.count_ones() as u64), run);
        }
        Op::Clz => {
            lanes!(x, w, env, g, ins, 0, ty);
            let unused = 64 - ty.size as u32 * 8;
            let r = map1(&x, run, |x| (x.leading_zeros() - unused) as u64);
            put(w, g, d0, &r, run);
        }
        Op::Brev => {
            lanes!(x, w, env, g, ins, 0, ty);
            let sh = 64 - ty.size as u32 * 8;
            put(w, g, d0, &map1(&x, run, |x| x.reverse_bits() >> sh), run);
        }
        Op::Bfe => {
            lanes!(x, w, env, g, ins, 0, ty);
            lanes!(pos, w, env, g, ins, 1, U32);
            lanes!(len, w, env, g, ins, 2, U32);
            let r = map3(&x, &pos, &len, run, |x, p, n| {
                alu::bfe(ty, x, p & 0xff, n & 0xff)
            });
            put(w, g, d0, &r, run);
        }
        Op::Bfi => {
            lanes!(x, w, env, g, ins, 0, ty);
            lanes!(y, w, env, g, ins, 1, ty);
            lanes!(pos, w, env, g, ins, 2, U32);
            lanes!(len, w, env, g, ins, 3, U32);
            let mut r = [0u64; 32];
            for l in Bits(run) {
                r[l] = alu::bfi(ty, x[l], y[l], pos[l] & 0xff, len[l] & 0xff);
            }
            put(w, g, d0, &r, run);
        }
        Op::Prmt => {
            lanes!(x, w, env, g, ins, 0, ty);
            lanes!(y, w, env, g, ins, 1, ty);
            lanes!(s, w, env, g, ins, 2, ty);
            let mode = ins.m.prmt;
            let r = map3(&x, &y, &s, run, |a, b, c| alu::prmt_mode(mode, a, b, c));
            put(w, g, d0, &r, run);
        }
        Op::Bfind => {
            lanes!(x, w, env, g, ins, 0, ty);
            let sa = ins.m.shiftamt;
            put(w, g, d0, &map1(&x, run, |x| alu::bfind(ty, sa, x)), run);
        }
        Op::Fns => {
            lanes!(m, w, env, g, ins, 0, U32);
            lanes!(b, w, env, g, ins, 1, U32);
            lanes!(o, w, env, g, ins, 2, U32);
            put(w, g, d0, &map3(&m, &b, &o, run, alu::fns), run);
        }
        Op::Dp2a => {
            lanes!(x, w, env, g, ins, 0, ty);
            lanes!(y, w, env, g, ins, 1, ins.ty2);
            lanes!(z, w, env, g, ins, 2, ty);
            let r = map3(&x, &y, &z, run, |x, y, z| alu::dp2a(ins, x, y, z));
            put(w, g, d0, &r, run);
        }
        Op::Szext => {
            lanes!(x, w, env, g, ins, 0, ty);
            lanes!(b, w, env, g, ins, 1, U32);
            let wrap = ins.m.shf_wrap;
            put(
                w,
                g,
                d0,
                &map2(&x, &b, run, |x, b| alu::szext(ty, wrap, x, b)),
                run,
            );
        }
        Op::Bmsk => {
            lanes!(a, w, env, g, ins, 0, U32);
            lanes!(b, w, env, g, ins, 1, U32);
            let wrap = ins.m.shf_wrap;
            put(
                w,
                g,
                d0,
                &map2(&a, &b, run, |a, b| alu::bmsk(wrap, a, b)),
                run,
            );
        }
        Op::Vabsdiff => vabsdiff(w, env, ins, g, run)?,
        Op::Shf => shf(w, env, ins, g, run)?,
        Op::Lop3 => lop3(w, env, ins, g, run)?,
        Op::Sad => sad(w, env, ins, g, run)?,
        Op::Dp4a => {
            lanes!(x, w, env, g, ins, 0, ty);
            lanes!(y, w, env, g, ins, 1, ins.ty2);
            lanes!(z, w, env, g, ins, 2, ty);
            put(
                w,
                g,
                d0,
                &map3(&x, &y, &z, run, |x, y, z| alu::dp4a(ins, x, y, z)),
                run,
            );
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}

/// `vabsdiff2`, `vabsdiff4{.add}`: SIMD absolute differences.
fn vabsdiff(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    // d = each element's |a - b| (or their sum plus c with `.add`); `ty` is the
    // sources' type (its kind says whether the elements are signed).
    lanes!(x, w, env, g, ins, 0, U32);
    lanes!(y, w, env, g, ins, 1, U32);
    lanes!(z, w, env, g, ins, 2, U32);
    let (n, add, signed) = (ins.m.simd as u32, ins.m.simd_add, ty.kind == Ty::S);
    let bits = 32 / n.max(1);
    let r = map3(&x, &y, &z, run, |a, b, c| {
        let m = (1u64 << bits) - 1;
        let (mut d, mut sum) = (0u64, c & 0xffff_ffff);
        for i in 0..n {
            let (p, q) = ((a >> (i * bits)) & m, (b >> (i * bits)) & m);
            let diff = if signed {
                (sext(p, (bits / 8) as u8) - sext(q, (bits / 8) as u8)).unsigned_abs()
            } else {
                p.abs_diff(q)
            };
            d |= (diff & m) << (i * bits);
            sum = sum.wrapping_add(diff);
        }
        if add {
            sum & 0xffff_ffff
        } else {
            d
        }
    });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `shf.{l,r}.{wrap,clamp}`: a funnel shift of the 64-bit `hi:lo`.
fn shf(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(lo, w, env, g, ins, 0, ty);
    lanes!(hi, w, env, g, ins, 1, ty);
    lanes!(sh, w, env, g, ins, 2, ty);
    let (wrap, left) = (ins.m.shf_wrap, ins.m.shf_left);
    let r = map3(&lo, &hi, &sh, run, |lo, hi, sh| {
        let sh = if wrap { sh & 31 } else { sh.min(32) };
        let x = (hi << 32) | (lo & 0xffff_ffff);
        (if left { (x << sh) >> 32 } else { x >> sh }) & 0xffff_ffff
    });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `lop3`: any logic function of three operands, by its lookup table.
fn lop3(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, ty);
    lanes!(z, w, env, g, ins, 2, ty);
    lanes!(lut, w, env, g, ins, 3, ty);
    let mut r = [0u64; 32];
    for l in Bits(run) {
        r[l] = alu::lop3(x[l], y[l], z[l], lut[l]);
    }
    put(w, g, d0, &r, run);
    Ok(())
}

/// `sad`: `|a - b| + c`.
fn sad(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    lanes!(y, w, env, g, ins, 1, ty);
    lanes!(z, w, env, g, ins, 2, ty);
    let r = map3(&x, &y, &z, run, |x, y, z| {
        let d = if ty.kind == Ty::S {
            sext(x, ty.size)
                .wrapping_sub(sext(y, ty.size))
                .unsigned_abs()
        } else {
            x.abs_diff(y)
        };
        d.wrapping_add(z) & mask(ty.size)
    });
    put(w, g, d0, &r, run);
    Ok(())
}
