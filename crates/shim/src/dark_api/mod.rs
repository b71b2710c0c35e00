//! Export tables ("dark API"): private tables NVIDIA's libraries ask the driver for with
//! `cuGetExportTable(&table, &uuid)`. They hold client addresses, pid and thread identity, so
//! they are answered here, never forwarded. docs/export-tables.md describes the design;
//! docs/cuda-driver-interception.md §4–5 (shared) the tables the runtime uses.
//!
//! One mechanism serves every table. [`TABLES`] is the registry: a UUID, a name, the table and
//! what its unimplemented slots answer. A table is an array of pointer-sized slots built at
//! compile time by [`ExportTable::sized`] (slot 0 = the size in bytes, as the libraries read
//! it) or [`ExportTable::without_size`] (no size slot: context-local storage). Every slot starts as
//! its own *fallback* function, `fallback::<TABLE, SLOT>`: a distinct address per (table,
//! slot), so a call nobody implemented is reported once with its table, slot and first
//! arguments (`GPUFUSE_LOG` set) and answered with the table's fallback code. Implemented slots
//! replace their fallback with [`ExportTable::with`]. UUIDs not in the registry are refused.

mod cublas;
mod cudart;
mod tools;

use std::ffi::c_void;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::status::{CUresult, NOT_SUPPORTED, SUCCESS};

pub use cudart::cls_forget;

/// The most slots a table may have (the fallback functions are instantiated for these).
pub const MAX_SLOTS: usize = 128;

/// An array of pointer-sized slots, shared with C.
#[repr(C)]
pub struct ExportTable<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable after construction and hold only addresses of functions
// and sizes; sharing them between threads reads nothing mutable.
unsafe impl<const N: usize> Sync for ExportTable<N> {}

impl<const N: usize> ExportTable<N> {
    /// A table of `N` slots for registry entry `T`: slot 0 holds the size in bytes
    /// (8 × `N`), every other slot the fallback of (`T`, slot).
    pub const fn sized<const T: usize>() -> Self {
        let mut s = fallbacks::<T, N>();
        s[0] = (N * std::mem::size_of::<*const c_void>()) as *const c_void;
        Self(s)
    }

    /// A table of `N` slots for registry entry `T` without a size slot: slot 0 is a function.
    pub const fn without_size<const T: usize>() -> Self {
        Self(fallbacks::<T, N>())
    }

    /// The table with `slot` implemented by `f` (an `extern "C" fn` cast to a pointer).
    pub const fn with(mut self, slot: usize, f: *const c_void) -> Self {
        self.0[slot] = f;
        self
    }

    /// The address handed to the application.
    pub fn addr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }

    /// Slot `i`, for tests and for the integrity check (which hashes a slot's address).
    pub fn slot(&self, i: usize) -> Option<*const c_void> {
        self.0.get(i).copied()
    }

    /// The number of slots.
    pub const fn len(&self) -> usize {
        N
    }

    /// Never true: every table has slots. (Clippy wants it next to `len`.)
    pub const fn is_empty(&self) -> bool {
        N == 0
    }
}

/// One known export table.
pub struct TableInfo {
    /// The UUID, 16 bytes in memory order.
    pub uuid: [u8; 16],
    /// What it is (names follow ZLUDA and Lupine where they have one).
    pub name: &'static str,
    /// The table's address.
    pub table: fn() -> *const c_void,
    /// Its slot count.
    pub slots: usize,
    /// Whether slot 0 holds the size in bytes.
    pub sized: bool,
    /// What a slot gpufuse does not implement returns.
    pub fallback: CUresult,
}

macro_rules! known_tables {
    ($($index:ident = $uuid:expr, $name:literal, $table:path, $sized:expr, $fallback:expr;)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[repr(usize)]
        enum Index { $($index,)* }
        /// Registry indices: the `T` of `ExportTable::sized::<T>()`.
        pub(crate) mod ix {
            $(pub const $index: usize = super::Index::$index as usize;)*
        }
        /// Every export table gpufuse answers, indexed by the constants above.
        pub static TABLES: &[TableInfo] = &[$(TableInfo {
            uuid: $uuid,
            name: $name,
            table: || $table.addr(),
            slots: $table.len(),
            sized: $sized,
            fallback: $fallback,
        },)*];
    };
}

// Fallbacks. Tables whose unknown slots the runtime calls answer success (libcudart 12.9 and
// 13.5 were observed to need it and to tolerate it). Every other table answers
// CUDA_ERROR_NOT_SUPPORTED: a success that writes nothing would leave the caller reading an
// output it never got (cuBLASLt reads TOOLS_TLS slot 2's context without checking it), while
// an error takes the library's own "unavailable" path (docs/export-tables.md).
known_tables! {
    CUDART_INTERFACE = cudart::UUID_CUDART_INTERFACE, "CUDART_INTERFACE",
        cudart::CUDART_INTERFACE, true, SUCCESS;
    TOOLS_RUNTIME_HOOKS = cudart::UUID_HOOKS, "TOOLS_RUNTIME_CALLBACK_HOOKS",
        cudart::HOOKS, true, SUCCESS;
    TOOLS_TLS = cudart::UUID_TOOLS_TLS, "TOOLS_TLS", cudart::TOOLS_TLS, true, NOT_SUPPORTED;
    CONTEXT_LOCAL_STORAGE = cudart::UUID_CLS, "CONTEXT_LOCAL_STORAGE_V0301",
        cudart::CLS_TABLE, false, SUCCESS;
    CONTEXT_WRAPPER = cudart::UUID_CTX_WRAPPER, "CONTEXT_WRAPPER", cudart::CTX_WRAPPER, true, SUCCESS;
    INTEGRITY_CHECK = cudart::UUID_INTEGRITY, "INTEGRITY_CHECK", cudart::INTEGRITY, true, SUCCESS;
    PRIVATE_21318C60 = cublas::UUID_21318C60, "PRIVATE_21318C60",
        cublas::PRIVATE_21318C60, true, NOT_SUPPORTED;
    TOOLS_MODULE = tools::UUID_TOOLS_MODULE, "TOOLS_MODULE", tools::TOOLS_MODULE, true,
        NOT_SUPPORTED;
}

/// The table for an export-table UUID, or None to refuse it (the caller logs refusals).
pub fn table_for(id: &[u8; 16]) -> Option<*const c_void> {
    let info = TABLES.iter().find(|t| &t.uuid == id)?;
    if verbose() {
        let _ = writeln!(
            std::io::stderr(),
            "gpufuse: export table {} ({}) served",
            info.name,
            hex(&info.uuid)
        );
    }
    Some((info.table)())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// 0 = quiet, 1 = `GPUFUSE_LOG` set, 2 = `GPUFUSE_LOG=debug` or `trace`. Read once.
fn log_level() -> u8 {
    static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
    let l = LEVEL.load(Ordering::Relaxed);
    if l != u8::MAX {
        return l;
    }
    let l = match std::env::var("GPUFUSE_LOG") {
        Ok(v) if v.contains("debug") || v.contains("trace") => 2,
        Ok(_) => 1,
        Err(std::env::VarError::NotUnicode(_)) => 1,
        Err(std::env::VarError::NotPresent) => 0,
    };
    LEVEL.store(l, Ordering::Relaxed);
    l
}

fn verbose() -> bool {
    log_level() >= 2
}

/// Which (table, slot) fallbacks have been reported: one bit per slot.
static REPORTED: [[AtomicU64; MAX_SLOTS / 64]; 32] =
    [const { [const { AtomicU64::new(0) }; MAX_SLOTS / 64] }; 32];

fn first_call(table: usize, slot: usize) -> bool {
    let Some(words) = REPORTED.get(table) else {
        return false;
    };
    let Some(word) = words.get(slot / 64) else {
        return false;
    };
    let bit = 1u64 << (slot % 64);
    word.fetch_or(bit, Ordering::Relaxed) & bit == 0
}

/// The function in every slot gpufuse does not implement: slot `S` of registry entry `T`.
/// It reads nothing the caller passed; the four integer-register arguments are only printed
/// (as numbers) in the once-per-slot report, to show what the library asked.
extern "C" fn fallback<const T: usize, const S: usize>(
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
) -> CUresult {
    let Some(info) = TABLES.get(T) else {
        return NOT_SUPPORTED;
    };
    if log_level() > 0 && first_call(T, S) {
        let _ = writeln!(
            std::io::stderr(),
            "gpufuse: export table {} ({}) slot {S} is not implemented; answered {} \
             (first call: {a0:#x}, {a1:#x}, {a2:#x}, {a3:#x})",
            info.name,
            &hex(&info.uuid)[..8],
            info.fallback,
        );
    }
    info.fallback
}

macro_rules! fallback_slots {
    ($t:ident; $($s:literal)*) => {
        [$(fallback::<$t, $s> as *const c_void,)*]
    };
}

/// Slots 0..N of table `T`, each its own fallback.
const fn fallbacks<const T: usize, const N: usize>() -> [*const c_void; N] {
    let all: [*const c_void; MAX_SLOTS] = fallback_slots!(T;
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
        61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89
        90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113
        114 115 116 117 118 119 120 121 122 123 124 125 126 127);
    let mut out = [std::ptr::null(); N];
    let mut i = 0;
    while i < N {
        out[i] = all[i];
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_consistent() {
        assert!(TABLES.len() <= REPORTED.len());
        for (i, t) in TABLES.iter().enumerate() {
            assert!(t.slots <= MAX_SLOTS, "{}", t.name);
            assert_eq!(
                TABLES.iter().filter(|u| u.uuid == t.uuid).count(),
                1,
                "{} listed twice",
                t.name
            );
            assert_eq!(
                table_for(&t.uuid),
                Some((t.table)()),
                "{} (entry {i})",
                t.name
            );
        }
    }

    #[test]
    fn unknown_uuids_are_refused() {
        // NVRTC 12.9's da9151d3: a table makes it abort (docs/cuda-driver-interception.md §4).
        let nvrtc = [
            0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41, 0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33,
            0xe3, 0x28,
        ];
        assert_eq!(table_for(&nvrtc), None);
        assert_eq!(table_for(&[0; 16]), None);
    }

    #[test]
    fn sized_tables_start_with_their_size_and_have_no_null_slots() {
        for t in TABLES {
            let p = (t.table)() as *const usize;
            for i in 0..t.slots {
                // SAFETY: the registry's tables are statics of `t.slots` pointer-sized slots.
                let v = unsafe { p.add(i).read() };
                assert_ne!(v, 0, "{} slot {i} is NULL", t.name);
                if i == 0 && t.sized {
                    assert_eq!(v, 8 * t.slots, "{} size slot", t.name);
                }
            }
        }
    }

    #[test]
    fn fallbacks_are_distinct_per_slot_and_answer_the_table_code() {
        let t = ExportTable::<8>::sized::<{ ix::PRIVATE_21318C60 }>();
        let mut seen = std::collections::HashSet::new();
        for i in 1..8 {
            assert!(
                seen.insert(t.slot(i).unwrap() as usize),
                "slot {i} shares an address"
            );
        }
        let f: extern "C" fn(usize, usize, usize, usize) -> CUresult =
            fallback::<{ ix::PRIVATE_21318C60 }, 3>;
        assert_eq!(f(0, 0, 0, 0), TABLES[ix::PRIVATE_21318C60].fallback);
        let f: extern "C" fn(usize, usize, usize, usize) -> CUresult =
            fallback::<{ ix::CONTEXT_WRAPPER }, 3>;
        assert_eq!(f(0, 0, 0, 0), SUCCESS);
        let f: extern "C" fn(usize, usize, usize, usize) -> CUresult = fallback::<1000, 3>;
        assert_eq!(f(0, 0, 0, 0), NOT_SUPPORTED);
    }
}
