//! Fast paths for the loads and stores that dominate kernels' inner loops: one 4- or 8-byte
//! element (`ld`/`st` without a vector) through a register plus an offset, in shared memory or
//! (loads of global, constant and generic addresses) in the device memory region of the
//! block's last device-memory access. Each first checks every
//! running lane (address in the space, in range, aligned) and then moves the data with no
//! per-lane dispatch; when any lane fails a check it answers `false` and the general path
//! (`memory.rs` over `space.rs`) runs the instruction, reporting the error it finds. Both
//! paths give the same registers and memory (`crates/ptx/tests/fast_paths.rs`).

use std::sync::atomic::Ordering;

use crate::alu::{mask, sext};
use crate::code::{Ins, Src};
use crate::inst::{Space, Ty};
use crate::lanes::put;
use crate::space::{SHARED_WINDOW, WINDOW_MASK};
use crate::warp::{Bits, Env, Group, Lanes, Warp};

/// Each running lane's address of `ins`'s `[reg+offset]` operand, if the base is a register.
#[inline(always)]
fn reg_addrs(w: &Warp, g: &Group, ins: &Ins) -> Option<Lanes> {
    let (Src::Reg(r), off) = ins.addr? else {
        return None;
    };
    let row = &w.levels[g.depth][r as usize];
    let mut a = [0u64; 32];
    for (o, &x) in a.iter_mut().zip(row) {
        *o = x.wrapping_add(off as u64);
    }
    Some(a)
}

/// Whether `ins` is a plain single-element access of 4 or 8 bytes this module handles.
#[inline(always)]
fn plain(ins: &Ins, n: usize) -> bool {
    ins.m.vec <= 1 && (n == 4 || n == 8) && !ins.dvec && !ins.svec
}

/// Shared-memory offsets of every running lane, if all are in range and aligned to `n`.
#[inline(always)]
fn shared_offsets(a: &Lanes, run: u32, n: usize, len: usize) -> Option<Lanes> {
    let mut o = [0u64; 32];
    let mut bad = 0u64;
    for l in Bits(run) {
        let x = a[l];
        let off = if x & WINDOW_MASK == SHARED_WINDOW {
            x - SHARED_WINDOW
        } else {
            x
        };
        // An address in another window is far beyond any shared memory: out of range.
        // (`checked_add`: an address within `n` bytes of the top must not wrap into range.)
        bad |= off.checked_add(n as u64).is_none_or(|e| e > len as u64) as u64
            | (off & (n as u64 - 1));
        o[l] = off;
    }
    (bad == 0).then_some(o)
}

/// `ld.shared` / `ld` of global memory: `true` when done here.
#[inline(always)]
pub(super) fn ld(w: &mut Warp, env: &mut Env, g: &Group, ins: &Ins, run: u32) -> bool {
    let n = ins.ty.size as usize;
    if !plain(ins, n) || ins.nd != 1 {
        return false;
    }
    let Some(a) = reg_addrs(w, g, ins) else {
        return false;
    };
    let mut out = [0u64; 32];
    match ins.space {
        Space::Shared => {
            let Some(o) = shared_offsets(&a, run, n, env.shared.len()) else {
                return false;
            };
            let sh = &env.shared;
            for l in Bits(run) {
                let i = o[l] as usize;
                out[l] = if n == 4 {
                    u32::from_le_bytes([sh[i], sh[i + 1], sh[i + 2], sh[i + 3]]) as u64
                } else {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&sh[i..i + 8]);
                    u64::from_le_bytes(b)
                };
            }
        }
        Space::Global | Space::Generic | Space::Const => {
            let Some(r) = env.region else {
                return false;
            };
            if !r.start.is_multiple_of(8) {
                return false;
            }
            let mut bad = 0u64;
            for l in Bits(run) {
                let off = a[l].wrapping_sub(r.start);
                bad |= off.checked_add(n as u64).is_none_or(|e| e > r.len) as u64
                    | (off & (n as u64 - 1));
            }
            if bad != 0 {
                return false;
            }
            let m = mask(n as u8);
            for l in Bits(run) {
                let off = a[l] - r.start;
                let word = r.words[(off / 8) as usize].load(Ordering::Relaxed);
                out[l] = (word >> ((off % 8) * 8)) & m;
            }
        }
        _ => return false,
    }
    if ins.ty.kind == Ty::S && n == 4 {
        for l in Bits(run) {
            out[l] = sext(out[l], 4) as u64;
        }
    }
    put(w, g, ins.d[0], &out, run);
    true
}

/// `st.shared` of one element: `true` when done here. (Global stores keep the general path,
/// which merges sub-word stores with concurrent neighbours.)
#[inline(always)]
pub(super) fn st_shared(w: &Warp, env: &mut Env, g: &Group, ins: &Ins, run: u32) -> bool {
    let n = ins.ty.size as usize;
    if ins.space != Space::Shared || !plain(ins, n) || ins.ns != 1 {
        return false;
    }
    let Some(a) = reg_addrs(w, g, ins) else {
        return false;
    };
    let Some(o) = shared_offsets(&a, run, n, env.shared.len()) else {
        return false;
    };
    let m = mask(n as u8);
    let value = |l: usize| -> Option<u64> {
        match ins.s[0] {
            Src::Reg(r) => Some(w.levels[g.depth][r as usize][l] & m),
            Src::Imm(v) => Some(v & m),
            _ => None,
        }
    };
    if value(0).is_none() {
        return false;
    }
    env.shared_dirty = true;
    let sh = &mut env.shared;
    for l in Bits(run) {
        let i = o[l] as usize;
        let v = value(l).unwrap_or(0).to_le_bytes();
        sh[i..i + n].copy_from_slice(&v[..n]);
    }
    true
}
