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

/// A link state whose error log is `err` and info log `info`: (state, the option arrays,
/// which must outlive the state).
fn create(err: &mut [u8], info: &mut [u8]) -> (CUlinkState, Box<[u32; 5]>, Box<[*mut c_void; 5]>) {
    let opts = Box::new([5u32, 6, 3, 4, 2]);
    let mut vals = Box::new([
        err.as_mut_ptr().cast(),
        err.len() as *mut c_void,
        info.as_mut_ptr().cast(),
        info.len() as *mut c_void,
        std::ptr::null_mut(),
    ]);
    let mut state = std::ptr::null_mut();
    let r = unsafe { cuLinkCreate_v2(5, opts.as_ptr().cast_mut(), vals.as_mut_ptr(), &mut state) };
    assert_eq!(r, 0);
    (state, opts, vals)
}

fn add_ptx(state: CUlinkState, text: &str, name: &str) -> i32 {
    let name = CString::new(name).unwrap();
    unsafe {
        cuLinkAddData_v2(
            state,
            1,
            text.as_ptr().cast_mut().cast(),
            text.len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
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
    let (mut image, mut size) = (std::ptr::null_mut(), 0usize);
    assert_eq!(unsafe { cuLinkComplete(state, &mut image, &mut size) }, 0);
    let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), size) }.to_vec();
    let units = gpufuse_fatbin::select_units(&bytes, 80).unwrap();
    assert_eq!(units.len(), 2);
    assert!(units[1].contains("st.param.b32 [r], 7"));
    assert!(text(&info).contains("linked 2 unit(s)"), "{}", text(&info));
    // The info log's size option now holds the bytes written; the wall time is a float.
    assert_eq!(vals[3] as usize, text(&info).len() + 1);
    assert!(f32::from_bits(vals[4] as usize as u32) >= 0.0);
    assert_eq!(unsafe { cuLinkDestroy(state) }, 0);
    assert_eq!(unsafe { cuLinkDestroy(state) }, 400);

    // Unresolved: the error log names the symbol and the unit.
    let (mut err, mut info) = (vec![0u8; 1024], vec![0u8; 1024]);
    let (state, _o, _v) = create(&mut err, &mut info);
    assert_eq!(add_ptx(state, &caller(), "caller.ptx"), 0);
    assert_eq!(unsafe { cuLinkComplete(state, &mut image, &mut size) }, 200);
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
    let name = CString::new("x").unwrap();
    let add = |kind: u32, data: &[u8]| unsafe {
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
    };
    assert_eq!(add(1, &fatbin), 218);
    assert_eq!(add(9, b"x"), 1);
    let mut opt = [99u32];
    let mut val = [std::ptr::null_mut::<c_void>()];
    let mut s2 = std::ptr::null_mut();
    assert_eq!(
        unsafe { cuLinkCreate(1, opt.as_mut_ptr(), val.as_mut_ptr(), &mut s2) },
        1
    );
    assert_eq!(unsafe { cuLinkDestroy(state) }, 0);
}
