//! State spaces as a lane sees them: shared, local and parameter memory live in windows of the
//! generic address space; everything else is device memory, reached through the region of the
//! last access (`memory.rs` does the word-level access).

use crate::code::Ins;
use crate::inst::Space;
use crate::lanes::{bad_operand, val_into};
use crate::memory;
use crate::warp::{Bits, Env, Group, Lanes, Warp};
use crate::ExecError;

/// Generic-address windows of the state spaces that are not device memory.
pub const SHARED_WINDOW: u64 = 0x7F00_0000_0000_0000;
pub const LOCAL_WINDOW: u64 = 0x7E00_0000_0000_0000;
pub const PARAM_WINDOW: u64 = 0x7D00_0000_0000_0000;
pub const WINDOW_MASK: u64 = 0xFF00_0000_0000_0000;
/// Function addresses (`mov.u64 %rd, func;`, `.u64 table[] = {func, ...}`): function `i` of a
/// module (the `i`-th `.entry` or `.func` definition with a body, in the module's text order)
/// is at `FUNCTION_WINDOW + 8 * i`. No memory lives in this window: a load or store through a
/// function address is an illegal address, and an indirect call through anything else is too.
pub const FUNCTION_WINDOW: u64 = 0x7C00_0000_0000_0000;
/// `alloca` blocks: a lane's dynamic stack, apart from its call frames (so a later call's
/// frame never overlaps a block). Local-space pointers into it carry this window; loads,
/// stores and atomics through them (local or generic) reach the lane's own stack.
pub const ALLOCA_WINDOW: u64 = 0x7B00_0000_0000_0000;

/// The pseudo device address of function `index` of a module (see [`FUNCTION_WINDOW`]).
pub const fn function_address(index: usize) -> u64 {
    FUNCTION_WINDOW + 8 * index as u64
}

/// The function index an address names, if it is a function address.
pub const fn function_index(addr: u64) -> Option<usize> {
    if addr & WINDOW_MASK == FUNCTION_WINDOW && addr & 7 == 0 {
        Some(((addr - FUNCTION_WINDOW) / 8) as usize)
    } else {
        None
    }
}

/// The address of the `[...]` operand in every lane: shared, local and parameter-space
/// addresses become generic addresses in their window.
#[inline(always)]
pub fn addrs(w: &Warp, env: &Env, g: &Group, ins: &Ins, out: &mut Lanes) -> Result<(), ExecError> {
    let (base, off) = ins.addr.ok_or_else(bad_operand)?;
    val_into(w, env, g, base, 8, out)?;
    let win = match ins.space {
        Space::Shared => SHARED_WINDOW,
        Space::Local => LOCAL_WINDOW,
        Space::Param => PARAM_WINDOW,
        _ => 0,
    };
    let keep = if ins.addr32 {
        u32::MAX as u64
    } else {
        u64::MAX
    };
    for a in out.iter_mut() {
        *a = a.wrapping_add(off as u64) & keep;
        if win != 0 && *a & WINDOW_MASK == 0 {
            *a += win;
        }
    }
    Ok(())
}

/// Fails with [`ExecError::MisalignedAddress`] when a running lane's address is not a multiple
/// of the access size (the element size times the vector width). Parameter space is laid out by
/// the compiler and not checked.
#[inline(always)]
pub fn aligned(ins: &Ins, a: &Lanes, run: u32) -> Result<(), ExecError> {
    let size = ins.ty.size as u64 * (ins.m.vec.max(1) as u64);
    if size <= 1 || ins.space == Space::Param {
        return Ok(());
    }
    let mut any = 0u64;
    for l in Bits(run) {
        any |= a[l];
    }
    if any & (size - 1) == 0 {
        return Ok(());
    }
    match Bits(run).map(|l| a[l]).find(|x| x & (size - 1) != 0) {
        Some(x) if x & WINDOW_MASK != PARAM_WINDOW => Err(ExecError::MisalignedAddress(x)),
        _ => Ok(()),
    }
}

/// The device memory region holding `[a, a + n)`, from the cache or the device.
#[inline(always)]
pub fn region<'a>(env: &mut Env<'a>, a: u64, n: u64) -> Result<crate::Region<'a>, ExecError> {
    if let Some(r) = env.region {
        if memory::contains(&r, a, n) {
            return Ok(r);
        }
    }
    let r = env.l.mem.region(a).ok_or(ExecError::IllegalAddress(a))?;
    env.region = Some(r);
    Ok(r)
}

/// Loads element `k` of `N` bytes at each lane's address.
#[inline(always)]
pub fn load_lanes<const N: u64>(
    w: &Warp,
    env: &mut Env,
    a: &Lanes,
    k: usize,
    run: u32,
    out: &mut Lanes,
) -> Result<(), ExecError> {
    for l in Bits(run) {
        out[l] = load(w, env, l, a[l].wrapping_add(k as u64 * N), N)?;
    }
    Ok(())
}

/// Loads `n` bytes at generic or window address `a` for lane `l`.
#[inline(always)]
pub fn load(w: &Warp, env: &mut Env, l: usize, a: u64, n: u64) -> Result<u64, ExecError> {
    let v = match a & WINDOW_MASK {
        SHARED_WINDOW => memory::read_bytes(&env.shared, a - SHARED_WINDOW, n),
        LOCAL_WINDOW => memory::read_bytes(&w.local[l], a - LOCAL_WINDOW, n),
        PARAM_WINDOW => memory::read_bytes(env.l.params, a - PARAM_WINDOW, n),
        ALLOCA_WINDOW => memory::read_bytes(&w.alloca[l], a - ALLOCA_WINDOW, n),
        _ => memory::load(&region(env, a, n)?, a, n),
    };
    v.ok_or(ExecError::IllegalAddress(a))
}

#[inline(always)]
pub fn store(
    w: &mut Warp,
    env: &mut Env,
    l: usize,
    a: u64,
    n: u64,
    v: u64,
) -> Result<(), ExecError> {
    let ok = match a & WINDOW_MASK {
        SHARED_WINDOW => {
            env.shared_dirty = true;
            memory::write_bytes(&mut env.shared, a - SHARED_WINDOW, n, v)
        }
        LOCAL_WINDOW => memory::write_bytes(&mut w.local[l], a - LOCAL_WINDOW, n, v),
        PARAM_WINDOW => None,
        ALLOCA_WINDOW => memory::write_bytes(&mut w.alloca[l], a - ALLOCA_WINDOW, n, v),
        _ => {
            let exclusive = env.l.exclusive;
            env.wrote();
            memory::store(&region(env, a, n)?, a, n, v, exclusive)
        }
    };
    ok.ok_or(ExecError::IllegalAddress(a))
}

/// An atomic read-modify-write for lane `l`; returns the old value.
pub fn atomic(
    w: &mut Warp,
    env: &mut Env,
    l: usize,
    a: u64,
    n: u64,
    f: impl Fn(u64) -> u64,
) -> Result<u64, ExecError> {
    let illegal = ExecError::IllegalAddress(a);
    let plain = |buf: &mut [u8], off: u64| -> Option<u64> {
        let old = memory::read_bytes(buf, off, n)?;
        memory::write_bytes(buf, off, n, f(old))?;
        Some(old)
    };
    match a & WINDOW_MASK {
        SHARED_WINDOW => {
            env.shared_dirty = true;
            plain(&mut env.shared, a - SHARED_WINDOW)
        }
        LOCAL_WINDOW => plain(&mut w.local[l], a - LOCAL_WINDOW),
        PARAM_WINDOW => None,
        ALLOCA_WINDOW => plain(&mut w.alloca[l], a - ALLOCA_WINDOW),
        _ => {
            // Only a write that changes memory counts as one (a failed compare-and-swap in a
            // spin loop does not): what a cooperative grid's hang detection needs.
            let r = region(env, a, n)?;
            let old = memory::rmw(&r, a, n, &f);
            if old.is_some_and(|o| f(o) != o) {
                env.wrote();
            }
            old
        }
    }
    .ok_or(illegal)
}
