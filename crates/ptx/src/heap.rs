//! The device heap of `malloc`/`free` in kernels (`new`/`delete`): a range of device memory
//! the device reserves for a session (8 MiB, CUDA's default `cudaLimitMallocHeapSize`), handed
//! out first-fit in 16-byte-aligned blocks. Blocks outlive the launch that allocated them, as
//! on a GPU; `malloc` returns NULL when the heap is exhausted. Launches' blocks run on several
//! host threads, so the free list is behind a lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// CUDA's default device heap size.
pub const DEFAULT_HEAP: u64 = 8 << 20;
const ALIGN: u64 = 16;

#[derive(Debug)]
struct State {
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
    /// Allocated blocks: start -> length.
    used: HashMap<u64, u64>,
}

/// A heap over `[base, base + len)`.
#[derive(Debug)]
pub struct Heap {
    base: u64,
    len: u64,
    state: Mutex<State>,
}

impl Heap {
    pub fn new(base: u64, len: u64) -> Heap {
        let start = base.div_ceil(ALIGN) * ALIGN;
        let len = len.saturating_sub(start - base) / ALIGN * ALIGN;
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(start, len);
        }
        Heap {
            base: start,
            len,
            state: Mutex::new(State {
                free,
                used: HashMap::new(),
            }),
        }
    }

    /// The heap's first address and length.
    pub fn range(&self) -> (u64, u64) {
        (self.base, self.len)
    }

    /// A block of at least `size` bytes (16-byte aligned), or `None` when none is left. A
    /// zero size gets a block of its own too (C's `malloc(0)` may return a unique pointer).
    pub fn alloc(&self, size: u64) -> Option<u64> {
        let n = size.max(1).checked_add(ALIGN - 1)? / ALIGN * ALIGN;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (&start, &len) = s.free.iter().find(|(_, &len)| len >= n)?;
        s.free.remove(&start);
        if len > n {
            s.free.insert(start + n, len - n);
        }
        s.used.insert(start, n);
        Some(start)
    }

    /// Returns a block; `false` if `addr` is not one `alloc` gave (and not yet freed).
    /// `free(NULL)` does nothing and is not an error.
    pub fn free(&self, addr: u64) -> bool {
        if addr == 0 {
            return true;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(n) = s.used.remove(&addr) else {
            return false;
        };
        let (mut start, mut len) = (addr, n);
        // Merge with the free neighbours.
        if let Some((&p, &pl)) = s.free.range(..addr).next_back() {
            if p + pl == addr {
                s.free.remove(&p);
                start = p;
                len += pl;
            }
        }
        if let Some(&nl) = s.free.get(&(addr + n)) {
            s.free.remove(&(addr + n));
            len += nl;
        }
        s.free.insert(start, len);
        true
    }
}

/// `malloc(size)` / `free(ptr)` called by `run`'s lanes (lowest first): each lane's block, or
/// NULL, goes to its return value. A device memory without a heap fails the launch; freeing
/// what is not a live block is an illegal address (a GPU's behaviour is undefined).
pub fn call(
    w: &mut crate::warp::Warp,
    env: &mut crate::warp::Env,
    g: &crate::warp::Group,
    cs: &crate::code::CallSite,
    run: u32,
    malloc: bool,
) -> Result<(), crate::ExecError> {
    use crate::code::Src;
    use crate::space::{load, store, LOCAL_WINDOW};
    use crate::ExecError;
    let heap =
        env.l.mem.heap().ok_or_else(|| {
            ExecError::Unsupported("device malloc/free without a device heap".into())
        })?;
    let arg = *cs.args.first().ok_or(ExecError::Unsupported(
        "malloc/free without an argument".into(),
    ))?;
    let vals = match arg {
        Src::FrameParam(_) => [0; 32],
        a => crate::lanes::val(w, env, g, a, 8)?,
    };
    for l in crate::warp::Bits(run) {
        let v = match arg {
            Src::FrameParam(off) => load(w, env, l, LOCAL_WINDOW + g.base + off, 8)?,
            _ => vals[l],
        };
        if !malloc {
            if !heap.free(v) {
                return Err(ExecError::IllegalAddress(v));
            }
            continue;
        }
        let p = heap.alloc(v).unwrap_or(0);
        match cs.rets.first() {
            Some(&Src::FrameParam(off)) => store(w, env, l, LOCAL_WINDOW + g.base + off, 8, p)?,
            Some(&Src::Reg(r)) => {
                if let Some(row) = w.levels[g.depth].get_mut(r as usize) {
                    row[l] = p;
                }
            }
            _ => {}
        }
    }
    w.goto(run, g.pc + 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_disjoint_and_reused() {
        let h = Heap::new(0x1008, 1024);
        let a = h.alloc(10).unwrap();
        let b = h.alloc(100).unwrap();
        assert_eq!(a % 16, 0);
        assert!(b >= a + 16);
        assert!(h.free(a));
        assert!(!h.free(a), "double free");
        assert!(!h.free(b + 8), "not a block");
        let c = h.alloc(16).unwrap();
        assert_eq!(c, a, "first fit reuses the freed block");
        assert!(h.alloc(2000).is_none());
        assert!(h.free(b) && h.free(c));
        let (base, len) = h.range();
        assert_eq!(h.alloc(len), Some(base), "freed neighbours merge");
    }
}
