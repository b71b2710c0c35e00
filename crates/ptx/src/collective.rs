//! Warp-wide instructions: `activemask`, `vote`, `redux`, `match`, `shfl`. Each sees the lanes
//! of the group that pass the guard, the lanes that run it together under min-PC scheduling,
//! and of those only the ones in each lane's own `membermask`: lanes of different groups (a
//! `labeled_partition`, `tiled_partition`) run one instruction together with different masks,
//! and each group computes on its own members.

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

/// Each running lane's group: the running lanes in its `membermask` (source `k`), or all of
/// `run` for the forms without one (`vote` before `.sync`).
fn groups(
    w: &Warp,
    env: &Env,
    g: &Group,
    ins: &Ins,
    k: usize,
    run: u32,
) -> Result<[u32; 32], ExecError> {
    let mut out = [run; 32];
    if k < ins.ns as usize {
        let masks = val(w, env, g, ins, k, 4)?;
        for l in Bits(run) {
            out[l] = run & masks[l] as u32;
        }
    }
    Ok(out)
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
            // elect.sync d|p, membermask: the lowest lane of each group is its leader.
            let groups = groups(w, env, g, ins, 0, run)?;
            let (mut leader, mut pred) = ([0u64; 32], [0u64; 32]);
            for l in Bits(run) {
                leader[l] = groups[l].trailing_zeros() as u64;
                pred[l] = (l as u64 == leader[l]) as u64;
            }
            if ins.dvec {
                put(w, g, ins.d[0], &leader, run);
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
            let groups = groups(w, env, g, ins, 1, run)?;
            let mut yes = 0u32;
            for l in Bits(run) {
                yes |= ((v[l] != 0) as u32) << l;
            }
            let mut r = [0u64; 32];
            for l in Bits(run) {
                let (group, ballot) = (groups[l], yes & groups[l]);
                let all = ballot == group;
                r[l] = match ins.m.vote_mode {
                    VoteMode::All => all as u64,
                    VoteMode::Any => (ballot != 0) as u64,
                    VoteMode::Uni => (all || ballot == 0) as u64,
                    VoteMode::Ballot => ballot as u64,
                };
            }
            put(w, g, ins.d[0], &r, run);
        }
        Op::Redux => {
            // redux.sync.op.type d, a, membermask: every lane gets the whole reduction.
            let v = val(w, env, g, ins, 0, ty.size)?;
            let groups = groups(w, env, g, ins, 1, run)?;
            let mut out = [0u64; 32];
            for l in Bits(run) {
                let mut acc: Option<u64> = None;
                for o in Bits(groups[l]) {
                    let x = v[o] & 0xffff_ffff;
                    acc = Some(match acc {
                        None => x,
                        Some(y) => alu::redux(ins.m.atom_op, ty, y, x).ok_or_else(unsupported)?,
                    });
                }
                out[l] = acc.unwrap_or(0);
            }
            put(w, g, ins.d[0], &out, run);
        }
        Op::Match => {
            let v = val(w, env, g, ins, 0, ty.size)?;
            let groups = groups(w, env, g, ins, 1, run)?;
            let (mut out, mut pred) = ([0u64; 32], [0u64; 32]);
            for l in Bits(run) {
                let mut m = 0u32;
                for o in Bits(groups[l]) {
                    m |= ((v[o] == v[l]) as u32) << o;
                }
                let all = m == groups[l];
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
