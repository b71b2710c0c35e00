//! Warp-wide instructions: `activemask`, `vote`, `redux`, `match`, `shfl`. Each sees the lanes
//! of the group that pass the guard, the lanes that run it together under min-PC scheduling.

use crate::alu::{self, PRED};
use crate::code::Ins;
use crate::inst::{Op, ShflMode, VoteMode};
use crate::lanes::{put, val_into};
use crate::warp::{Bits, Env, Group, Lanes, Warp};
use crate::ExecError;

fn val(w: &Warp, env: &Env, g: &Group, ins: &Ins, k: usize, size: u8) -> Result<Lanes, ExecError> {
    let mut o = [0u64; 32];
    val_into(w, env, g, ins.src(k), size, &mut o)?;
    Ok(o)
}

/// Executes a warp-wide instruction for `run`'s lanes.
pub fn exec(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    ins: &Ins,
    run: u32,
    unsupported: &dyn Fn() -> ExecError,
) -> Result<(), ExecError> {
    let ty = ins.ty;
    match ins.op {
        Op::Elect => {
            // elect.sync d|p, membermask: the lowest lane is the leader.
            let leader = run.trailing_zeros() as u64;
            let mut pred = [0u64; 32];
            for l in Bits(run) {
                pred[l] = (l as u64 == leader) as u64;
            }
            if ins.dvec {
                put(w, g, ins.d[0], &[leader; 32], run);
                if ins.nd > 1 {
                    put(w, g, ins.d[1], &pred, run);
                }
            } else {
                put(w, g, ins.d[0], &pred, run);
            }
        }
        Op::Activemask => {
            put(w, g, ins.d[0], &[run as u64; 32], run);
        }
        Op::Vote => {
            // vote.sync.mode.pred d, {!}a, membermask
            let v = val(w, env, g, ins, 0, PRED.size)?;
            let mut ballot = 0u32;
            for l in Bits(run) {
                ballot |= ((v[l] != 0) as u32) << l;
            }
            let all = ballot == run;
            let r = match ins.m.vote_mode {
                VoteMode::All => all as u64,
                VoteMode::Any => (ballot != 0) as u64,
                VoteMode::Uni => (all || ballot == 0) as u64,
                VoteMode::Ballot => ballot as u64,
            };
            put(w, g, ins.d[0], &[r; 32], run);
        }
        Op::Redux => {
            // redux.sync.op.type d, a, membermask: every lane gets the whole reduction.
            let v = val(w, env, g, ins, 0, ty.size)?;
            let mut acc: Option<u64> = None;
            for l in Bits(run) {
                let x = v[l] & 0xffff_ffff;
                acc = Some(match acc {
                    None => x,
                    Some(y) => alu::redux(ins.m.atom_op, ty, y, x).ok_or_else(unsupported)?,
                });
            }
            put(w, g, ins.d[0], &[acc.unwrap_or(0); 32], run);
        }
        Op::Match => {
            let v = val(w, env, g, ins, 0, ty.size)?;
            let (mut out, mut pred) = ([0u64; 32], [0u64; 32]);
            for l in Bits(run) {
                let mut m = 0u32;
                for o in Bits(run) {
                    m |= ((v[o] == v[l]) as u32) << o;
                }
                let all = m == run;
                out[l] = match ins.m.vote_mode {
                    VoteMode::All if !all => 0,
                    _ => m as u64,
                };
                pred[l] = all as u64;
            }
            put(w, g, ins.d[0], &out, run);
            if ins.dvec && ins.nd > 1 {
                put(w, g, ins.d[1], &pred, run);
            }
        }
        Op::Shfl => {
            // shfl.sync.mode.b32 d[|p], a, b, c, membermask
            let src = val(w, env, g, ins, 0, 4)?;
            let b = val(w, env, g, ins, 1, 4)?;
            let c = val(w, env, g, ins, 2, 4)?;
            let (mut out, mut ok_out) = ([0u64; 32], [0u64; 32]);
            for l in Bits(run) {
                let lane = l as i64;
                let bval = b[l] as i64;
                let c = c[l] as i64;
                let seg_mask = (c >> 8) & 0x1f;
                let min_lane = lane & seg_mask;
                let max_lane = min_lane | ((c & 0x1f) & !seg_mask);
                let j = match ins.m.shfl_mode {
                    ShflMode::Up => lane - bval,
                    ShflMode::Down => lane + bval,
                    ShflMode::Bfly => lane ^ bval,
                    ShflMode::Idx => min_lane | (bval & !seg_mask),
                };
                let ok = match ins.m.shfl_mode {
                    ShflMode::Up => j >= min_lane,
                    _ => j <= max_lane,
                };
                let j = if ok && (0..32).contains(&j) && run & (1 << j) != 0 {
                    j
                } else {
                    lane
                };
                out[l] = src[j as usize];
                ok_out[l] = ok as u64;
            }
            put(w, g, ins.d[0], &out, run);
            if ins.dvec && ins.nd > 1 {
                put(w, g, ins.d[1], &ok_out, run);
            }
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}
