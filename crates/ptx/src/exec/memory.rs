//! Data movement, lane by lane: `mov` (with vector packing), loads and stores, address-space
//! conversions and tests, atomics and reductions, `mbarrier`, the stack (`alloca`,
//! `stacksave`/`stackrestore`), `cp.async` and cache policies.

use crate::alu::{self, sext, U32};
use crate::code::Ins;
use crate::inst::{Op, Space, Ty, Type};
use crate::lanes::{map1, put};
use crate::space::{
    addrs, aligned, atomic, load_lanes, store, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW,
    WINDOW_MASK,
};
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
        Op::Mov if ins.dvec => unpack(w, env, ins, g, run)?,
        Op::Mov if ins.svec => pack(w, env, ins, g, run)?,
        Op::Mov => {
            lanes!(x, w, env, g, ins, 0, ty);
            put(w, g, d0, &x, run);
        }
        Op::Ld | Op::Ldu if super::fast::ld(w, env, g, ins, run) => {}
        Op::St if super::fast::st_shared(w, env, g, ins, run) => {}
        Op::Ld | Op::Ldu => ld_lanes(w, env, ins, g, run)?,
        Op::St => st_lanes(w, env, ins, g, run)?,
        Op::Cvta => cvta(w, env, ins, g, run)?,
        Op::Isspacep => isspacep(w, env, ins, g, run)?,
        Op::Mbarrier => mbarrier(w, env, ins, g, run, unsupported)?,
        Op::Atom | Op::Red => atom(w, env, ins, g, run, unsupported)?,
        Op::Alloca => alloca(w, env, ins, g, run)?,
        Op::Stacksave => stacksave(w, ins, g, run),
        Op::Stackrestore => stackrestore(w, env, ins, g, run)?,
        Op::Createpolicy => {
            // An opaque policy: the VM has no cache for it to steer.
            put(w, g, d0, &[0; 32], run);
        }
        Op::CpAsync => crate::copy::cp_async(w, env, g, ins, run)?,
        _ => return Err(unsupported()),
    }
    Ok(())
}

/// `mov.b64 {lo, hi}, %rd`: a value unpacked into its parts.
fn unpack(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    lanes!(x, w, env, g, ins, 0, ty);
    let n = ins.nd as u32;
    let bits = (ty.size as u32 * 8) / n.max(1);
    let m = low_bits(bits);
    for k in 0..ins.nd as usize {
        let sh = bits * k as u32;
        let part = map1(&x, run, |x| x.checked_shr(sh).unwrap_or(0) & m);
        put(w, g, ins.d[k], &part, run);
    }
    Ok(())
}

/// `mov.b64 %rd, {lo, hi}`: parts packed into one value.
fn pack(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    let n = ins.ns as u32;
    let bits = (ty.size as u32 * 8) / n.max(1);
    let part_ty = Type {
        kind: Ty::B,
        size: (bits / 8) as u8,
    };
    let m = low_bits(bits);
    let mut x = [0u64; 32];
    for k in 0..ins.ns as usize {
        lanes!(p, w, env, g, ins, k, part_ty);
        let sh = bits * k as u32;
        for l in Bits(run) {
            x[l] |= (p[l] & m).checked_shl(sh).unwrap_or(0);
        }
    }
    put(w, g, d0, &x, run);
    Ok(())
}

/// `ld`, `ldu` off the fast paths: each element lane by lane.
fn ld_lanes(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let mut a = [0u64; 32];
    addrs(w, env, g, ins, &mut a)?;
    aligned(ins, &a, run)?;
    for k in 0..ins.nd as usize {
        let mut out = [0u64; 32];
        match ty.size {
            4 => load_lanes::<4>(w, env, &a, k, run, &mut out)?,
            8 => load_lanes::<8>(w, env, &a, k, run, &mut out)?,
            2 => load_lanes::<2>(w, env, &a, k, run, &mut out)?,
            _ => load_lanes::<1>(w, env, &a, k, run, &mut out)?,
        }
        if ty.kind == Ty::S {
            out = map1(&out, run, |x| sext(x, ty.size) as u64);
        }
        put(w, g, ins.d[k], &out, run);
    }
    Ok(())
}

/// `st` off the fast paths: each element lane by lane.
fn st_lanes(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let mut a = [0u64; 32];
    addrs(w, env, g, ins, &mut a)?;
    aligned(ins, &a, run)?;
    let n = ty.size as u64;
    for k in 0..ins.ns as usize {
        lanes!(x, w, env, g, ins, k, ty);
        for l in Bits(run) {
            store(w, env, l, a[l].wrapping_add(k as u64 * n), n, x[l])?;
        }
    }
    Ok(())
}

/// `cvta`, `cvta.to`: between a window of the generic space and its own space.
fn cvta(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(x, w, env, g, ins, 0, ty);
    let win = match ins.m.space2 {
        Some(Space::Shared) => SHARED_WINDOW,
        Some(Space::Local) => LOCAL_WINDOW,
        Some(Space::Param) => PARAM_WINDOW,
        _ => 0,
    };
    let to = ins.m.to;
    let r = map1(&x, run, |x| {
        if to {
            if win != 0 && x & WINDOW_MASK == win {
                x - win
            } else {
                x
            }
        } else if x & WINDOW_MASK == 0 {
            x + win
        } else {
            x
        }
    });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `isspacep`: whether a generic address is in the space.
fn isspacep(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let d0 = ins.d[0];
    lanes!(
        x,
        w,
        env,
        g,
        ins,
        0,
        Type {
            kind: Ty::U,
            size: 8
        }
    );
    let space = ins.m.space2;
    let r = map1(&x, run, |x| {
        (match space {
            Some(Space::Shared) => x & WINDOW_MASK == SHARED_WINDOW,
            Some(Space::Local) => x & WINDOW_MASK == LOCAL_WINDOW,
            Some(Space::Global) => x & WINDOW_MASK == 0,
            _ => false,
        }) as u64
    });
    put(w, g, d0, &r, run);
    Ok(())
}

/// `mbarrier`: `init`, `inval`, arrivals, waits (a test of the phase), the pending count.
fn mbarrier(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let d0 = ins.d[0];
    use crate::inst::MbarOp;
    let m = ins.m.mbar;
    let b64 = crate::inst::Type {
        kind: crate::inst::Ty::B,
        size: 8,
    };
    if m == MbarOp::None {
        return Err(unsupported());
    }
    if m == MbarOp::PendingCount {
        lanes!(st, w, env, g, ins, 0, b64);
        put(w, g, d0, &map1(&st, run, |s| s & 0xffff_ffff), run);
        return Ok(());
    }
    let mut a = [0u64; 32];
    addrs(w, env, g, ins, &mut a)?;
    if let Some(l) = Bits(run).find(|&l| a[l] % 8 != 0) {
        return Err(ExecError::MisalignedAddress(a[l]));
    }
    let x = if ins.ns > 0 {
        v!(w, env, g, ins, 0, b64)
    } else {
        [1; 32]
    };
    let mut r = [0u64; 32];
    for l in Bits(run) {
        let xl = x[l];
        r[l] = match m {
            MbarOp::Init => {
                let n = xl & 0x7fff_ffff;
                crate::space::atomic(w, env, l, a[l], 8, |_| n | n << 32)?
            }
            MbarOp::Inval => crate::space::atomic(w, env, l, a[l], 8, |_| 0)?,
            MbarOp::Arrive | MbarOp::ArriveDrop => {
                let drop = m == MbarOp::ArriveDrop;
                let count = if ins.ns > 0 { xl & 0xffff_ffff } else { 1 };
                // The state token: the barrier before this arrival (its phase).
                crate::space::atomic(w, env, l, a[l], 8, |o| mbar_arrive(o, count, drop))?
            }
            _ => {
                let now = crate::space::atomic(w, env, l, a[l], 8, |o| o)?;
                let phase = if ins.m.parity { xl & 1 } else { xl >> 63 };
                (now >> 63 != phase) as u64
            }
        };
    }
    if m.has_dst() {
        put(w, g, d0, &r, run);
    }
    Ok(())
}

/// `atom`, `red` (and their vector forms): one atomic read-modify-write per lane and element.
fn atom(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    let mut a = [0u64; 32];
    addrs(w, env, g, ins, &mut a)?;
    aligned(ins, &a, run)?;
    let (op, n) = (ins.m.atom_op, ty.size as u64);
    if alu::atom(op, ty, 0, 0, 0).is_none() {
        return Err(unsupported());
    }
    let x2 = ins.m.x2;
    let rmw = move |o: u64, x: u64, y: u64| match x2 {
        // `atom.add.noftz.f16x2`: each half.
        Some(e) => {
            let lo = alu::atom(op, e, o & 0xffff, x & 0xffff, 0).unwrap_or(o);
            let hi = alu::atom(op, e, o >> 16 & 0xffff, x >> 16 & 0xffff, 0).unwrap_or(o);
            (hi & 0xffff) << 16 | (lo & 0xffff)
        }
        None => alu::atom(op, ty, o, x, y).unwrap_or(o),
    };
    // `atom.v2.f32.add {d0, d1}, [a], {b0, b1}`: one atomic per element.
    let elems = if ins.m.vec > 1 { ins.m.vec as usize } else { 1 };
    if elems > 1 && (op == crate::inst::AtomOp::Cas || ins.ns as usize != elems) {
        return Err(unsupported());
    }
    for k in 0..elems {
        lanes!(x, w, env, g, ins, k, ty);
        let y = if op == crate::inst::AtomOp::Cas {
            v!(w, env, g, ins, 1, ty)
        } else {
            [0; 32]
        };
        let mut old = [0u64; 32];
        for l in Bits(run) {
            let (xl, yl) = (x[l], y[l]);
            let at = a[l].wrapping_add(k as u64 * n);
            old[l] = atomic(w, env, l, at, n, |o| rmw(o, xl, yl))?;
        }
        if ins.op == Op::Atom {
            put(w, g, ins.d[k], &old, run);
        }
    }
    Ok(())
}

/// `alloca.u64 ptr, size{, align}`: a block on the lane's alloca stack.
fn alloca(w: &mut Warp, env: &mut Env, ins: &Ins, g: &Group, run: u32) -> Result<(), ExecError> {
    let ty = ins.ty;
    let d0 = ins.d[0];
    lanes!(size, w, env, g, ins, 0, ty);
    let align = if ins.ns > 1 {
        v!(w, env, g, ins, 1, U32)
    } else {
        [8; 32]
    };
    let mut r = [0u64; 32];
    for l in Bits(run) {
        let a = align[l].clamp(1, 1 << 12).next_power_of_two();
        let stack = &mut w.alloca[l];
        let start = (stack.len() as u64).div_ceil(a) * a;
        let end = start
            .checked_add(size[l])
            .filter(|&e| e <= crate::warp::MAX_LOCAL);
        let Some(end) = end else {
            return Err(ExecError::StackOverflow);
        };
        stack.resize(end as usize, 0);
        r[l] = crate::space::ALLOCA_WINDOW + start;
    }
    put(w, g, d0, &r, run);
    Ok(())
}

/// `stacksave`: the top of the lane's alloca stack.
fn stacksave(w: &mut Warp, ins: &Ins, g: &Group, run: u32) {
    let d0 = ins.d[0];
    let mut r = [0u64; 32];
    for l in Bits(run) {
        r[l] = crate::space::ALLOCA_WINDOW + w.alloca[l].len() as u64;
    }
    put(w, g, d0, &r, run);
}

/// `stackrestore`: the alloca stack back to a saved top.
fn stackrestore(
    w: &mut Warp,
    env: &mut Env,
    ins: &Ins,
    g: &Group,
    run: u32,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    lanes!(x, w, env, g, ins, 0, ty);
    for l in Bits(run) {
        let sp = x[l].wrapping_sub(crate::space::ALLOCA_WINDOW);
        if sp > w.alloca[l].len() as u64 {
            return Err(ExecError::IllegalAddress(x[l]));
        }
        w.alloca[l].truncate(sp as usize);
    }
    Ok(())
}
/// The low `bits` bits.
fn low_bits(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// An `mbarrier` word after `count` arrivals (`drop`: they also leave the barrier, lowering
/// the expected count of later phases): when no arrival is pending, the phase completes: the
/// phase bit flips and the pending count starts again at the expected count.
fn mbar_arrive(o: u64, count: u64, drop: bool) -> u64 {
    let mut expected = o >> 32 & 0x7fff_ffff;
    let mut pending = o & 0xffff_ffff;
    let mut phase = o >> 63;
    if drop {
        expected = expected.saturating_sub(count);
    }
    pending = pending.saturating_sub(count);
    if pending == 0 {
        phase ^= 1;
        pending = expected;
    }
    phase << 63 | expected << 32 | pending
}
