//! The JIT linker's exports (`api/link.rs`) driven as a C caller drives them: options and logs
//! in the caller's arrays, inputs checked as they are added, link errors at `cuLinkComplete`.
//! The linker runs in the client, so no server is needed; the image it returns is checked by
//! reading its units back (the device's load of it is tested in crates/device and in the
//! real-client tier).

use std::ffi::{c_void, CString};

use cuda::api::link::*;

const HEAD: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

fn caller() -> String {
    format!(
        "{HEAD}.extern .func (.param .b32 r) f();\n.visible .entry k(.param .u64 out)\n{{\n\
         .reg .b32 %r<2>;\n.reg .b64 %rd<2>;\nld.param.u64 %rd1, [out];\n\
         {{ .param .b32 r0; call.uni (r0), f, (); ld.param.b32 %r1, [r0]; }}\n\
         st.global.u32 [%rd1], %r1;\nret;\n}}\n\0"
    )
}

fn callee() -> String {
    format!("{HEAD}.visible .func (.param .b32 r) f() {{ st.param.b32 [r], 7; ret; }}\n\0")
}

/// `cuLinkCreate_v2` with `n` options from the caller's arrays.
fn create_with(n: u32, opts: *mut u32, vals: *mut *mut c_void, state: &mut CUlinkState) -> i32 {
    // SAFETY: the arrays hold `n` entries each and outlive the state (the tests keep them);
    // log buffers named in them are live and as large as their size options say.
    unsafe { cuLinkCreate_v2(n, opts, vals, state) }
}

/// A link state whose error log is `err` and info log `info`: (state, the option arrays,
/// which must outlive the state).
#[allow(clippy::type_complexity)]
fn create(err: &mut [u8], info: &mut [u8]) -> (CUlinkState, Box<[u32; 5]>, Box<[*mut c_void; 5]>) {
    let mut opts = Box::new([5u32, 6, 3, 4, 2]);
    let mut vals = Box::new([
        err.as_mut_ptr().cast(),
        err.len() as *mut c_void,
        info.as_mut_ptr().cast(),
        info.len() as *mut c_void,
        std::ptr::null_mut(),
    ]);
    let mut state = std::ptr::null_mut();
    assert_eq!(
        create_with(5, opts.as_mut_ptr(), vals.as_mut_ptr(), &mut state),
        0
    );
    (state, opts, vals)
}

/// `cuLinkAddData_v2` of `data` as input type `kind`.
fn add_data(state: CUlinkState, kind: u32, data: &[u8], name: &str) -> i32 {
    let name = CString::new(name).unwrap();
    // SAFETY: `data` and `name` are live for the call; no options.
    unsafe {
        cuLinkAddData_v2(
            state,
            kind,
            data.as_ptr().cast_mut().cast(),
            data.len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

fn add_ptx(state: CUlinkState, text: &str, name: &str) -> i32 {
    add_data(state, 1, text.as_bytes(), name)
}

/// `cuLinkComplete`: its status and a copy of the image.
fn complete(state: CUlinkState) -> (i32, Vec<u8>) {
    let (mut image, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: both outputs are live locals.
    let r = unsafe { cuLinkComplete(state, &mut image, &mut size) };
    if r != 0 {
        return (r, Vec::new());
    }
    // SAFETY: the image lives until cuLinkDestroy, which has not been called.
    let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), size) }.to_vec();
    (r, bytes)
}

fn destroy(state: CUlinkState) -> i32 {
    // SAFETY: the handle is only looked up, never dereferenced.
    unsafe { cuLinkDestroy(state) }
}

fn text(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).into_owned()
}

#[test]
fn links_reports_and_refuses_as_the_driver_does() {
    let (mut err, mut info) = (vec![0u8; 1024], vec![0u8; 1024]);
    let (state, _o, vals) = create(&mut err, &mut info);
    assert_eq!(add_ptx(state, &caller(), "caller.ptx"), 0);
    assert_eq!(add_ptx(state, &callee(), "callee.ptx"), 0);
    let (r, bytes) = complete(state);
    assert_eq!(r, 0);
    let units = gpufuse_fatbin::select_units(&bytes, 80).unwrap();
    assert_eq!(units.len(), 2);
    assert!(units[1].contains("st.param.b32 [r], 7"));
    assert!(text(&info).contains("linked 2 unit(s)"), "{}", text(&info));
    // The info log's size option now holds the bytes written; the wall time is a float.
    assert_eq!(vals[3] as usize, text(&info).len() + 1);
    assert!(f32::from_bits(vals[4] as usize as u32) >= 0.0);
    assert_eq!(destroy(state), 0);
    assert_eq!(destroy(state), 400);

    // Unresolved: the error log names the symbol and the unit.
    let (mut err, mut info) = (vec![0u8; 1024], vec![0u8; 1024]);
    let (state, _o, _v) = create(&mut err, &mut info);
    assert_eq!(add_ptx(state, &caller(), "caller.ptx"), 0);
    assert_eq!(complete(state).0, 200);
    let log = text(&err);
    assert!(
        log.contains("function `f` (declared in caller.ptx)"),
        "{log}"
    );
    // Syntax errors are found when the PTX is added.
    let bad = format!("{HEAD}.frobnicate 1;\n");
    assert_eq!(add_ptx(state, &bad, "bad.ptx"), 218);
    assert!(text(&err).contains("bad.ptx"), "{}", text(&err));
    // Not PTX where PTX was promised, an unknown input type, an unknown option.
    let fatbin = 0xBA55_ED50u32.to_le_bytes().repeat(8);
    assert_eq!(add_data(state, 1, &fatbin, "x"), 218);
    assert_eq!(add_data(state, 9, b"x", "x"), 1);
    let mut opt = [99u32];
    let mut val = [std::ptr::null_mut::<c_void>()];
    let mut s2 = std::ptr::null_mut();
    assert_eq!(
        create_with(1, opt.as_mut_ptr(), val.as_mut_ptr(), &mut s2),
        1
    );
    assert_eq!(destroy(state), 0);
}

/// A program that launches kernels from the device adds NVIDIA's device runtime
/// (libcudadevrt); its unit is accepted and left out of the link (the emulated GPU provides
/// the device runtime), whichever input it is, and the other units keep their names.
#[test]
fn the_device_runtime_is_accepted_and_left_out() {
    let launcher = format!(
        "{HEAD}.extern .func (.param .b32 r) __cudaCDP2LaunchDeviceV2(.param .b64 a, .param .b64 b);\n\
         .extern .func (.param .b32 r) f();\n.visible .entry k() {{ ret; }}\n\0"
    );
    let devrt = ".version 9.5\n.target sm_121\n.address_size 64\n\
        .visible .func (.param .b32 func_retval0) __cudaCDP2LaunchDeviceV2(\n.param .b64 a,\n.param .b64 b\n)\n{\nret;\n}\n\0";
    let (mut err, mut info) = (vec![0u8; 1024], vec![0u8; 1024]);
    let (state, _o, _v) = create(&mut err, &mut info);
    assert_eq!(add_ptx(state, devrt, "cudadevrt.ptx"), 0, "{}", text(&err));
    assert_eq!(add_ptx(state, &launcher, "launcher.ptx"), 0);
    // `f` is defined by no unit: the error names the unit that declared it.
    assert_eq!(complete(state).0, 200);
    assert!(
        text(&err).contains("function `f` (declared in launcher.ptx)"),
        "{}",
        text(&err)
    );
    assert_eq!(add_ptx(state, &callee(), "callee.ptx"), 0);
    let (r, bytes) = complete(state);
    assert_eq!(r, 0, "{}", text(&err));
    let units = gpufuse_fatbin::select_units(&bytes, 100).unwrap();
    assert_eq!(units.len(), 2);
    assert!(units[0].contains(".entry k()") && units[1].contains("st.param.b32 [r], 7"));
    assert_eq!(destroy(state), 0);
}
