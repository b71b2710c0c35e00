//! `cp.async`: a copy from global to shared memory that the program waits for with
//! `cp.async.wait_group`/`wait_all`. The VM copies at once, when the instruction runs; the
//! waits are then already satisfied, and reading the destination before waiting (which PTX
//! leaves undefined) sees the copied bytes.

use crate::code::Ins;
use crate::inst::Space;
use crate::lanes::{bad_operand, val_into};
use crate::space::{load, store, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW, WINDOW_MASK};
use crate::warp::{Bits, Env, Group, Warp};
use crate::ExecError;

/// `cp.async.{ca,cg}.shared.global [dst], [src], cp-size{, src-size}`: `src-size` bytes (all
/// `cp-size` when absent) copied, the rest of `cp-size` filled with zeros.
pub fn cp_async(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    ins: &Ins,
    run: u32,
) -> Result<(), ExecError> {
    let mut dst = [0u64; 32];
    crate::space::addrs(w, env, g, ins, &mut dst)?;
    let (base, off) = ins.addr2.ok_or_else(bad_operand)?;
    let mut src = [0u64; 32];
    val_into(w, env, g, base, 8, &mut src)?;
    let win = match ins.m.space2 {
        Some(Space::Shared) => SHARED_WINDOW,
        Some(Space::Local) => LOCAL_WINDOW,
        Some(Space::Param) => PARAM_WINDOW,
        _ => 0,
    };
    for a in src.iter_mut() {
        *a = a.wrapping_add(off as u64);
        if win != 0 && *a & WINDOW_MASK == 0 {
            *a += win;
        }
    }
    let mut size = [0u64; 32];
    val_into(w, env, g, ins.src(0), 4, &mut size)?;
    let mut keep = size;
    if ins.ns > 1 {
        val_into(w, env, g, ins.src(1), 4, &mut keep)?;
    }
    for l in Bits(run) {
        let n = size[l];
        if !matches!(n, 4 | 8 | 16) {
            return Err(ExecError::Unsupported(format!(
                "cp.async of {n} bytes (4, 8 or 16)"
            )));
        }
        for a in [dst[l], src[l]] {
            if a % n != 0 {
                return Err(ExecError::MisalignedAddress(a));
            }
        }
        let k = keep[l].min(n);
        if k == n && copy_words(env, dst[l], src[l], n) {
            continue;
        }
        for i in 0..n {
            let b = if i < k {
                load(w, env, l, src[l] + i, 1)?
            } else {
                0
            };
            store(w, env, l, dst[l] + i, 1, b)?;
        }
    }
    Ok(())
}

/// The common case at once: all `n` bytes (4, 8 or 16, `dst` and `src` aligned to `n`) from
/// device memory to shared memory, both in range; `false` (nothing written) otherwise, and the
/// byte-by-byte copy then runs and reports the first byte out of range.
fn copy_words(env: &mut Env, dst: u64, src: u64, n: u64) -> bool {
    if dst & WINDOW_MASK != SHARED_WINDOW || src & WINDOW_MASK != 0 {
        return false;
    }
    let off = dst - SHARED_WINDOW;
    if off
        .checked_add(n)
        .is_none_or(|e| e > env.shared.len() as u64)
    {
        return false;
    }
    let r = match crate::space::region(env, src, n) {
        Ok(r) if crate::memory::contains(&r, src, n) => r,
        _ => return false,
    };
    let chunk = n.min(8);
    let mut at = 0;
    while at < n {
        let Some(v) = crate::memory::load(&r, src + at, chunk) else {
            return false;
        };
        let i = (off + at) as usize;
        env.shared[i..i + chunk as usize].copy_from_slice(&v.to_le_bytes()[..chunk as usize]);
        at += chunk;
    }
    env.shared_dirty = true;
    true
}
