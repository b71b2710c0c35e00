//! The export table (`exports.toml`, generated into `cuda::exports::DECLARED`), the functions
//! the built `libcuda.so` defines, and NVIDIA's export list agree: every table name once, every
//! one of NVIDIA's names, the library exports exactly NVIDIA's list, and every name the table
//! does not declare answers `CUDA_ERROR_NOT_SUPPORTED`.

use std::collections::BTreeSet;
use std::ffi::CString;

use cuda::exports::{Call, DECLARED};
use gpufuse_cuda_types::DRIVER_EXPORTS;
use object::{Object, ObjectSymbol};

fn library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().parent().unwrap().join("libcuda.so");
    assert!(
        lib.exists(),
        "{} missing: build the shim first",
        lib.display()
    );
    lib
}

/// Every name the table declares: its functions and their generated per-thread aliases.
fn declared_names() -> Vec<&'static str> {
    DECLARED
        .iter()
        .flat_map(|d| std::iter::once(d.name).chain(d.per_thread))
        .collect()
}

#[test]
fn every_declared_name_is_an_nvidia_export_and_appears_once() {
    let driver: BTreeSet<&str> = DRIVER_EXPORTS.iter().copied().collect();
    let names = declared_names();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a name is declared twice");
    let foreign: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !driver.contains(n))
        .collect();
    assert!(foreign.is_empty(), "not NVIDIA's exports: {foreign:?}");
    // The table is the implemented surface: hundreds of functions, both kinds of call.
    assert!(DECLARED.len() > 250, "{} declared", DECLARED.len());
    assert!(DECLARED.iter().any(|d| d.call == Call::Quiet));
    assert!(DECLARED.iter().any(|d| d.call == Call::Sync));
    for d in DECLARED {
        if let Some(alias) = d.per_thread {
            let base = alias
                .strip_suffix("_ptds")
                .or_else(|| alias.strip_suffix("_ptsz"));
            assert_eq!(
                base,
                Some(d.name),
                "{alias} is no per-thread form of {}",
                d.name
            );
        }
        assert!(
            cuda::exports::address(d.name).is_some(),
            "{} has no address",
            d.name
        );
    }
}

#[test]
fn the_library_exports_exactly_nvidias_list() {
    let data = std::fs::read(library()).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let exported: BTreeSet<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|n| n.starts_with("cu"))
        .collect();
    let driver: BTreeSet<String> = DRIVER_EXPORTS.iter().map(|s| s.to_string()).collect();
    let extra: Vec<&String> = exported.difference(&driver).collect();
    let missing: Vec<&String> = driver.difference(&exported).collect();
    assert!(
        extra.is_empty(),
        "exported but not NVIDIA's (declare them in exports.toml): {extra:?}"
    );
    assert!(missing.is_empty(), "NVIDIA's but not exported: {missing:?}");
    let exported_list: BTreeSet<&str> = cuda::exports::EXPORTED.iter().copied().collect();
    assert_eq!(exported_list.len(), driver.len());
}

#[test]
fn undeclared_names_are_stubs_and_declared_ones_are_not() {
    let path = CString::new(library().to_str().unwrap()).unwrap();
    // SAFETY: dlopen with a valid NUL-terminated path; loading the shim runs no code.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen failed");
    let declared: BTreeSet<&str> = declared_names().into_iter().collect();
    let mut stubs = 0;
    for name in DRIVER_EXPORTS {
        let sym = CString::new(*name).unwrap();
        // SAFETY: valid handle and symbol name.
        let f = unsafe { libc::dlsym(handle, sym.as_ptr()) };
        assert!(!f.is_null(), "{name} is not exported");
        if declared.contains(name) {
            continue;
        }
        // SAFETY: an undeclared name is a generated stub, `extern "C" fn() -> i32`, which
        // reads no arguments.
        let stub: extern "C" fn() -> i32 = unsafe { std::mem::transmute(f) };
        assert_eq!(
            stub(),
            801,
            "{name} is not a stub answering CUDA_ERROR_NOT_SUPPORTED"
        );
        stubs += 1;
    }
    assert_eq!(stubs + declared.len(), DRIVER_EXPORTS.len());
    // SAFETY: the handle came from dlopen above.
    unsafe { libc::dlclose(handle) };
}
