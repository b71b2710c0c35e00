//! Export tables ("dark API"): private tables NVIDIA's libraries ask the driver for with
//! `cuGetExportTable(&table, &uuid)`. They hold client addresses, pid and thread identity, so
//! they are answered here, never forwarded. docs/export-tables.md describes the design and the
//! tables the runtime uses; docs/driver-interception.md (sections 3 and 4) when the runtime asks
//! for them and what its integrity check computes.
//!
//! One mechanism serves every table. [`TABLES`] is the registry: a UUID, a name, the table and
//! what its unimplemented slots answer. A table is an array of pointer-sized slots built at
//! compile time by [`ExportTable::sized`] (slot 0 = the size in bytes, as the libraries read
//! it) or [`ExportTable::without_size`] (no size slot: context-local storage). Every slot starts as
//! its own *fallback* function, `fallback::<TABLE, SLOT>`: a distinct address per (table,
//! slot), so a call nobody implemented is reported once with its table, slot and first
//! arguments (`GPUFUSE_LOG` set) and answered with the table's fallback code. Implemented slots
//! replace their fallback with [`ExportTable::with`].
//!
//! A UUID outside the registry is never answered with NULL (a library that does not check
//! dereferences it: cuBLASLt's `1734dc26` crashed every bf16/fp16 matmul that way). It gets
//! [`UNKNOWN_TABLE`], every slot a fallback answering `CUDA_ERROR_NOT_SUPPORTED`, and one line
//! on stderr naming it. Only the UUIDs in [`REFUSED`] are refused, each because a test shows
//! its library needs or tolerates the refusal.

mod cublas;
mod cudart;
mod driver_only;
mod tools;
mod topology;

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
    GPU_TOPOLOGY = topology::UUID_1734DC26, "GPU_TOPOLOGY_1734DC26",
        topology::PRIVATE_1734DC26, true, NOT_SUPPORTED;
    CTX_CREATE_BYPASS = driver_only::UUID_CTX_CREATE_BYPASS, "CTX_CREATE_BYPASS",
        driver_only::CTX_CREATE_BYPASS, true, NOT_SUPPORTED;
    DEVICE_EXTENDED_RT = driver_only::UUID_DEVICE_EXTENDED_RT, "DEVICE_EXTENDED_RT",
        driver_only::DEVICE_EXTENDED_RT, true, NOT_SUPPORTED;
}

/// One UUID that is refused (`CUDA_ERROR_INVALID_VALUE`, `*table = NULL`), and why.
pub struct Refusal {
    /// The UUID, 16 bytes in memory order.
    pub uuid: [u8; 16],
    /// Which library asks for it.
    pub asked_by: &'static str,
    /// Why a refusal is the right answer, and the test that shows it.
    pub why: &'static str,
}

/// The UUIDs gpufuse refuses; every other unknown UUID gets [`UNKNOWN_TABLE`].
pub static REFUSED: &[Refusal] = &[
    Refusal {
        uuid: [
            0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41, 0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33,
            0xe3, 0x28,
        ],
        asked_by: "NVRTC 12.x and 13.x",
        why: "NVRTC aborts when given a table it cannot use and compiles normally when \
              refused (test_nvrtc.py, every NVRTC test)",
    },
    Refusal {
        uuid: [
            0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c,
            0x0d, 0xd9,
        ],
        asked_by: "libcudart 12.x and 13.x (and the copies linked into NVIDIA's libraries)",
        why: "the runtime goes on without it (every real-client test runs through a refusal)",
    },
];

/// The registry index of [`UNKNOWN_TABLE`]'s fallbacks (outside [`TABLES`]).
const UNKNOWN: usize = 31;

/// The answer to a UUID nobody registered or refused: no size slot (a library that reads slot
/// 0 as a size sees a large one and goes on to call a slot; one that calls slot 0 reaches a
/// fallback), every slot answering `CUDA_ERROR_NOT_SUPPORTED`.
pub static UNKNOWN_TABLE: ExportTable<MAX_SLOTS> = ExportTable::without_size::<UNKNOWN>();

/// What `cuGetExportTable` answers for a UUID.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// A registered table.
    Known(*const c_void),
    /// A refused UUID ([`REFUSED`]).
    Refused,
    /// [`UNKNOWN_TABLE`].
    Unknown(*const c_void),
}

/// The answer for an export-table UUID. Unknown UUIDs are reported on stderr once each.
pub fn table_for(id: &[u8; 16]) -> Answer {
    if let Some(info) = TABLES.iter().find(|t| &t.uuid == id) {
        if verbose() {
            let _ = writeln!(
                std::io::stderr(),
                "gpufuse: export table {} ({}) served",
                info.name,
                hex(&info.uuid)
            );
        }
        return Answer::Known((info.table)());
    }
    if REFUSED.iter().any(|r| &r.uuid == id) {
        if log_level() > 0 {
            let _ = writeln!(
                std::io::stderr(),
                "gpufuse: refused export table {}",
                hex(id)
            );
        }
        return Answer::Refused;
    }
    if first_unknown(id) {
        let _ = writeln!(
            std::io::stderr(),
            "gpufuse: unknown export table {} asked for; answered with a table whose every \
             slot returns CUDA_ERROR_NOT_SUPPORTED (report it: docs/export-tables.md)",
            hex(id)
        );
    }
    Answer::Unknown(UNKNOWN_TABLE.addr())
}

/// Whether `id` is reported for the first time (the unknown UUIDs seen so far, and the last
/// one, which the unknown table's fallbacks name).
fn first_unknown(id: &[u8; 16]) -> bool {
    let mut seen = UNKNOWN_SEEN.lock().unwrap_or_else(|e| e.into_inner());
    seen.1 = *id;
    if seen.0.contains(id) {
        return false;
    }
    seen.0.push(*id);
    true
}

static UNKNOWN_SEEN: std::sync::Mutex<(Vec<[u8; 16]>, [u8; 16])> =
    std::sync::Mutex::new((Vec::new(), [0; 16]));

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
    if T == UNKNOWN {
        if log_level() > 0 && first_call(T, S) {
            let last = UNKNOWN_SEEN.lock().map(|s| hex(&s.1)).unwrap_or_default();
            let _ = writeln!(
                std::io::stderr(),
                "gpufuse: unknown export table (last asked: {last}) slot {S} called; answered \
                 {NOT_SUPPORTED} (first call: {a0:#x}, {a1:#x}, {a2:#x}, {a3:#x})"
            );
        }
        return NOT_SUPPORTED;
    }
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
        assert!(TABLES.len() < UNKNOWN && UNKNOWN < REPORTED.len());
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
                Answer::Known((t.table)()),
                "{} (entry {i})",
                t.name
            );
            assert!(
                !REFUSED.iter().any(|r| r.uuid == t.uuid),
                "{} refused",
                t.name
            );
        }
    }

    #[test]
    fn only_the_listed_uuids_are_refused_and_no_answer_is_null() {
        // NVRTC's da9151d3: a table makes it abort (docs/export-tables.md).
        for r in REFUSED {
            assert_eq!(table_for(&r.uuid), Answer::Refused, "{}", r.asked_by);
        }
        // Anything else gets the unknown table: never NULL, every slot a fallback.
        let Answer::Unknown(t) = table_for(&[0x5a; 16]) else {
            panic!("an unknown UUID must get the unknown table");
        };
        assert!(!t.is_null());
        for i in 0..MAX_SLOTS {
            assert_ne!(UNKNOWN_TABLE.slot(i), Some(std::ptr::null()), "slot {i}");
        }
        // SAFETY: slot 5 of the unknown table is `fallback::<UNKNOWN, 5>`.
        let f: extern "C" fn(usize, usize, usize, usize) -> CUresult =
            unsafe { std::mem::transmute(UNKNOWN_TABLE.slot(5).unwrap()) };
        assert_eq!(f(0, 0, 0, 0), NOT_SUPPORTED);
    }

    #[test]
    fn cublaslt_topology_table_answers_not_supported_and_clears_its_outputs() {
        // cuBLASLt calls slot 4 through the table pointer without a NULL check (issue 27), and
        // takes its own path on an error.
        let Answer::Known(t) = table_for(&topology::UUID_1734DC26) else {
            panic!("1734dc26 must be served");
        };
        let t = t as *const usize;
        // SAFETY: a registered table of 17 slots; slot 4 is `tpc_layout`.
        let slot4: extern "C" fn(*mut *mut c_void, *mut u64) -> CUresult =
            unsafe { std::mem::transmute(t.add(4).read()) };
        let mut data = 8usize as *mut c_void;
        let mut handle = 9u64;
        assert_eq!(slot4(&mut data, &mut handle), NOT_SUPPORTED);
        assert!(data.is_null());
        assert_eq!(handle, 0);
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
