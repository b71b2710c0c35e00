//! Every lookup NVIDIA's runtimes made at init (recorded in tests/data) resolves as the driver
//! would: the recorded answer for `flags=0`, and the corrected answers for the `flags=2`
//! entries the recording stub got wrong (docs/driver-interception.md, section 2).

use gpufuse_cuda_types::{resolve_proc, ProcLookup};

/// (symbol, version, flags) -> the correct answer where the data files are wrong.
const CORRECTED: &[(&str, i32, u64, &str)] = &[
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
    (
        "cuStreamUpdateCaptureDependencies",
        11030,
        2,
        "cuStreamUpdateCaptureDependencies_ptsz",
    ),
    (
        "cuStreamUpdateCaptureDependencies",
        12030,
        2,
        "cuStreamUpdateCaptureDependencies_v2_ptsz",
    ),
    ("cuMemcpyBatchAsync", 12080, 2, "cuMemcpyBatchAsync_ptsz"),
    ("cuMemcpyBatchAsync", 13000, 2, "cuMemcpyBatchAsync_v2_ptsz"),
    (
        "cuMemcpy3DBatchAsync",
        12080,
        2,
        "cuMemcpy3DBatchAsync_ptsz",
    ),
    (
        "cuMemcpy3DBatchAsync",
        13000,
        2,
        "cuMemcpy3DBatchAsync_v2_ptsz",
    ),
    ("cuLaunchHostFunc", 10000, 2, "cuLaunchHostFunc_ptsz"),
    ("cuLaunchHostFunc", 13010, 2, "cuLaunchHostFunc_v2_ptsz"),
    ("cuStreamGetCtx", 12050, 2, "cuStreamGetCtx_v2_ptsz"),
    ("cuStreamGetDevice", 12080, 2, "cuStreamGetDevice_ptsz"),
    (
        "cuStreamBeginCaptureToGraph",
        12030,
        2,
        "cuStreamBeginCaptureToGraph_ptsz",
    ),
    (
        "cuStreamBeginRecaptureToGraph",
        13030,
        2,
        "cuStreamBeginRecaptureToGraph_ptsz",
    ),
    (
        "cuStreamGetDevResource",
        13010,
        2,
        "cuStreamGetDevResource_ptsz",
    ),
    (
        "cuMemcpyWithAttributesAsync",
        13020,
        2,
        "cuMemcpyWithAttributesAsync_ptsz",
    ),
    (
        "cuMemcpy3DWithAttributesAsync",
        13020,
        2,
        "cuMemcpy3DWithAttributesAsync_ptsz",
    ),
    (
        "cuMemPrefetchBatchAsync",
        13000,
        2,
        "cuMemPrefetchBatchAsync_ptsz",
    ),
    (
        "cuMemDiscardBatchAsync",
        13000,
        2,
        "cuMemDiscardBatchAsync_ptsz",
    ),
    (
        "cuMemDiscardAndPrefetchBatchAsync",
        13000,
        2,
        "cuMemDiscardAndPrefetchBatchAsync_ptsz",
    ),
    // Graphics interop (cudaGL.h, cudaVDPAU.h): the recording stub had no typedefs for these
    // and answered the base name; the typedef rule gives the _v2 ABI the driver exports.
    ("cuGLCtxCreate", 3020, 0, "cuGLCtxCreate_v2"),
    ("cuGLMapBufferObject", 3020, 0, "cuGLMapBufferObject_v2"),
    (
        "cuGLMapBufferObject",
        7000,
        2,
        "cuGLMapBufferObject_v2_ptds",
    ),
    (
        "cuGLMapBufferObjectAsync",
        3020,
        0,
        "cuGLMapBufferObjectAsync_v2",
    ),
    (
        "cuGLMapBufferObjectAsync",
        7000,
        2,
        "cuGLMapBufferObjectAsync_v2_ptsz",
    ),
    ("cuVDPAUCtxCreate", 3020, 0, "cuVDPAUCtxCreate_v2"),
];

fn check(file: &str) -> usize {
    let text = std::fs::read_to_string(format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR")))
        .unwrap();
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (lhs, answer) = line.split_once('=').unwrap();
        let (sym, rest) = lhs.split_once('@').unwrap();
        let (ver, flags) = rest.split_once('/').unwrap();
        let (ver, flags): (i32, u64) = (ver.parse().unwrap(), flags.parse().unwrap());
        let got = resolve_proc(sym, ver, flags);
        if sym.is_empty() {
            assert_eq!(got, ProcLookup::UnknownSymbol);
            continue;
        }
        let want = CORRECTED
            .iter()
            .find(|(s, v, f, _)| *f == flags && *s == sym && *v == ver)
            .map(|(_, _, _, w)| w.to_string())
            .unwrap_or_else(|| answer.to_string());
        if want.starts_with("NOT FOUND") {
            // Names the recording stub lacked resolve when the public headers declare them
            // (cuMemGetLocationInfo); the cuSubgrid* names are in no public header.
            let public = gpufuse_cuda_types::DRIVER_EXPORTS.contains(&sym);
            assert_eq!(
                matches!(got, ProcLookup::Found(_)),
                public,
                "{line}: {got:?}"
            );
        } else if got != ProcLookup::Found(leak(want.clone())) {
            mismatches.push(format!("{line} -> {got:?}"));
        }
        checked += 1;
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    checked
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
fn libcudart_12_9_lookups_resolve() {
    assert!(check("libcudart-12.9-lookups.txt") >= 418);
}

#[test]
fn libcudart_13_5_lookups_resolve() {
    assert!(check("libcudart-13.5-lookups.txt") >= 480);
}
