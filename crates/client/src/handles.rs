//! Client-minted handles. A handle is `kind << 48 | counter`: never NULL, and its kind can be
//! told from its value (a `CUkernel` is accepted wherever a `CUfunction` is).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Kind {
    Context = 1,
    Module = 2,
    Function = 3,
    Kernel = 4,
    Library = 5,
    Stream = 6,
    Event = 7,
    MemPool = 8,
    Graph = 9,
    GraphExec = 10,
    /// Physical memory (`CUmemGenericAllocationHandle`).
    Physical = 11,
    /// `CUarray`.
    Array = 12,
    /// `CUtexObject`, `CUsurfObject`: the values kernels get.
    TexObject = 13,
    SurfObject = 14,
}

const SHIFT: u32 = 48;
static NEXT: AtomicU64 = AtomicU64::new(1);

/// A new handle of `kind`, unique in this process.
pub fn mint(kind: Kind) -> u64 {
    ((kind as u64) << SHIFT) | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether `h` is a handle of `kind`.
pub fn is(h: u64, kind: Kind) -> bool {
    h >> SHIFT == kind as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_unique_nonzero_and_tagged() {
        let a = mint(Kind::Stream);
        let b = mint(Kind::Stream);
        let k = mint(Kind::Kernel);
        assert!(a != 0 && a != b);
        assert!(is(a, Kind::Stream) && !is(a, Kind::Event));
        assert!(is(k, Kind::Kernel) && !is(k, Kind::Function));
    }
}
