//! CUDA driver facts, generated from NVIDIA's headers by `scripts/gen_cuda_types.py`
//! (checked in; `scripts/check_cuda_types.sh` verifies they are current):
//! the names a real `libcuda.so.1` exports, the `cuGetProcAddress` version table
//! ([`resolve_proc`]; how it is derived: `docs/driver-interception.md`, section 2), the
//! `CUresult` codes, and the C structs the driver API takes ([`structs`]: `CUDA_MEMCPY2D/3D`,
//! array, resource and texture descriptors, graph node parameters, `CUlaunchConfig`, VMM
//! properties, as `scripts/gen_cuda_structs.py` lists them; `#[repr(C)]`, header names, their
//! size, alignment and offsets asserted at compile time and checked against each `cuda.h` by a
//! C compiler); and what `cuGetErrorString` says for each code, read from NVIDIA's libcudart
//! by `scripts/gen_result_texts.py`. No dependencies, no unsafe.

#![forbid(unsafe_code)]
#![allow(clippy::type_complexity)]

/// The driver API's C structs, as CUDA 12's `cuda.h` declares them (`CUDA_MEMCPY2D`,
/// `CUDA_RESOURCE_DESC`, `CUlaunchConfig`, ...), with the header's type and member names; the
/// typedefs they use (enums as `c_int`, handles as `*mut c_void`).
#[allow(non_camel_case_types, non_snake_case)]
pub mod structs {
    include!("generated/structs.rs");
}

mod generated {
    pub mod exports;
    pub mod proc_table;
    pub mod result;
}

pub use generated::exports::DRIVER_EXPORTS;
pub use generated::proc_table::FAMILIES;
pub use generated::result::*;

mod result_text;
pub use result_text::RESULT_TEXTS;

/// What `cuGetErrorString` says for `code` (NVIDIA's text; `scripts/gen_result_texts.py`).
pub fn result_text(code: CUresult) -> Option<&'static str> {
    RESULT_TEXTS
        .binary_search_by_key(&code, |&(c, _)| c)
        .ok()
        .map(|i| RESULT_TEXTS[i].1)
}

/// `CUresult`.
pub type CUresult = i32;

/// The answer to `cuGetProcAddress(symbol, cudaVersion, flags)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcLookup {
    /// The export implementing the requested ABI.
    Found(&'static str),
    /// No such driver function (status 1).
    UnknownSymbol,
    /// Known, but every ABI is newer than the caller (status 2).
    VersionTooNew,
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 2;

/// Resolves a symbol the way the driver does: the highest ABI version not newer than
/// `cuda_version`; with the per-thread flag, that ABI's `_ptds`/`_ptsz` export if one exists.
pub fn resolve_proc(symbol: &str, cuda_version: i32, flags: u64) -> ProcLookup {
    let Ok(i) = FAMILIES.binary_search_by(|f| f.0.cmp(symbol)) else {
        // Functions without a typedef resolve to their exact name.
        return match DRIVER_EXPORTS.binary_search(&symbol) {
            Ok(j) => ProcLookup::Found(DRIVER_EXPORTS[j]),
            Err(_) => ProcLookup::UnknownSymbol,
        };
    };
    let (_, defaults, per_thread) = FAMILIES[i];
    let Some(&(_, default)) = defaults.iter().rev().find(|(v, _)| *v <= cuda_version) else {
        return ProcLookup::VersionTooNew;
    };
    if flags & PER_THREAD != 0 {
        if let Some(&(_, pt)) = per_thread.iter().rev().find(|(v, _)| *v <= cuda_version) {
            // Only the per-thread variant of the ABI that was selected.
            if pt
                .strip_suffix("_ptds")
                .or_else(|| pt.strip_suffix("_ptsz"))
                == Some(default)
            {
                return ProcLookup::Found(pt);
            }
        }
    }
    ProcLookup::Found(default)
}

/// The name of a `CUresult` value (`CUDA_ERROR_OUT_OF_MEMORY`).
pub fn result_name(code: CUresult) -> Option<&'static str> {
    let r = generated::result::RESULTS;
    r.binary_search_by_key(&code, |&(v, _)| v)
        .ok()
        .map(|i| r[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_for_binary_search() {
        assert!(FAMILIES.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(DRIVER_EXPORTS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn documented_cases_resolve() {
        use ProcLookup::Found;
        let cases = [
            ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
            ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
            ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
            ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
            ("cuCtxGetDevice", 2000, 0, "cuCtxGetDevice"),
            ("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"),
            ("cuCtxSynchronize", 2000, 0, "cuCtxSynchronize"),
            ("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"),
            (
                "cuDevicePrimaryCtxRelease",
                7000,
                0,
                "cuDevicePrimaryCtxRelease",
            ),
            ("cuDeviceGetUuid", 9020, 0, "cuDeviceGetUuid"),
            ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
            ("cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds"),
            ("cuLaunchKernel", 4000, 0, "cuLaunchKernel"),
            ("cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz"),
            (
                "cuStreamBeginCapture",
                10010,
                2,
                "cuStreamBeginCapture_v2_ptsz",
            ),
            ("cuStreamGetCaptureInfo", 10010, 0, "cuStreamGetCaptureInfo"),
            (
                "cuStreamGetCaptureInfo",
                11030,
                0,
                "cuStreamGetCaptureInfo_v2",
            ),
            (
                "cuStreamGetCaptureInfo",
                12030,
                0,
                "cuStreamGetCaptureInfo_v3",
            ),
            (
                "cuStreamGetCaptureInfo",
                10010,
                2,
                "cuStreamGetCaptureInfo_ptsz",
            ),
            (
                "cuStreamGetCaptureInfo",
                11030,
                2,
                "cuStreamGetCaptureInfo_v2_ptsz",
            ),
            (
                "cuStreamGetCaptureInfo",
                12030,
                2,
                "cuStreamGetCaptureInfo_v3_ptsz",
            ),
            ("cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"),
            ("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
            ("cuEventElapsedTime", 2000, 0, "cuEventElapsedTime"),
            ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
            ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
            ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
            ("cuGetExportTable", 3000, 0, "cuGetExportTable"),
        ];
        for (sym, ver, flags, want) in cases {
            assert_eq!(
                resolve_proc(sym, ver, flags),
                Found(want),
                "{sym}@{ver}/{flags}"
            );
        }
        assert_eq!(resolve_proc("", 0, 0), ProcLookup::UnknownSymbol);
        assert_eq!(
            resolve_proc("cuNoSuchThing", 12000, 0),
            ProcLookup::UnknownSymbol
        );
        assert_eq!(
            resolve_proc("cuMemAlloc", 1000, 0),
            ProcLookup::VersionTooNew
        );
    }

    #[test]
    fn every_result_has_nvidias_text() {
        for &(code, name) in generated::result::RESULTS {
            assert!(result_text(code).is_some(), "{code} {name}");
        }
        assert_eq!(result_text(500), Some("named symbol not found"));
        assert_eq!(result_text(1), Some("invalid argument"));
        assert_eq!(result_text(0), Some("no error"));
        assert_eq!(result_text(12345), None);
    }

    #[test]
    fn result_names() {
        assert_eq!(result_name(0), Some("CUDA_SUCCESS"));
        assert_eq!(result_name(2), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(result_name(123456), None);
    }
}
