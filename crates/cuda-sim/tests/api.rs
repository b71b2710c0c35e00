//! The simulated driver through `gpufuse_cuda_driver::Driver`: device queries, memory,
//! modules, and the error codes of bad handles, arguments and NULL pointers.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;

use common::*;
use gpufuse_cuda_driver::Stream;

const MEM: u64 = 1 << 30;

fn sim() -> (std::sync::MutexGuard<'static, ()>, &'static Sim) {
    sim_with(&[("GPUFUSE_SIM_DEVICES", "2"), ("GPUFUSE_SIM_MEM", "1GiB")])
}

#[test]
fn exports_every_entry_point_the_driver_resolves_and_is_not_the_shim() {
    let (_g, s) = sim();
    let raw = include_str!("../../cuda-driver/src/raw.rs");
    let table = &raw[raw.find("fns! {").expect("the fns! table")..];
    let names: Vec<&str> = table
        .lines()
        .filter_map(|l| l.trim().split_once(": fn(").map(|(n, _)| n))
        .filter(|n| n.starts_with("cu"))
        .collect();
    assert!(names.len() > 60, "{names:?}");
    for n in names {
        let name = format!("{n}\0");
        // SAFETY: only probing for the symbol.
        let found = unsafe { s.lib.get::<*const c_void>(name.as_bytes()) }.is_ok();
        assert!(found, "{n}");
    }
    // SAFETY: as above.
    assert!(unsafe { s.lib.get::<*const c_void>(b"gpufuse_shim_version\0") }.is_err());
}

#[test]
fn device_queries() {
    let (_g, s) = sim();
    let d = &s.d;
    assert_eq!(d.driver_version().unwrap(), 13000);
    assert_eq!(d.device_count().unwrap(), 2);
    assert_eq!(d.device_name(0).unwrap(), "gpufuse simulated GPU");
    assert_eq!(d.total_mem(1).unwrap(), MEM);
    let (u0, u1) = (d.uuid(0).unwrap(), d.uuid(1).unwrap());
    assert_ne!(u0, u1);
    assert_ne!(u0, [0; 16]);
    for (attr, want) in [
        (1, 1024),
        (10, 32),
        (16, 132),
        (75, 9),
        (76, 0),
        (41, 1),
        (102, 1),
        (39, 2048),
    ] {
        assert_eq!(d.attribute(0, attr).unwrap(), want, "attribute {attr}");
    }
    for attr in 1..=161 {
        d.attribute(1, attr).unwrap();
    }
    assert_eq!(code(d.attribute(0, 162)), 1);
    assert_eq!(code(d.attribute(0, 0)), 1);
    assert_eq!(code(d.attribute(2, 1)), 101);
    assert_eq!(code(d.device(2)), 101);
    assert_eq!(code(d.device(-1)), 101);
    assert_eq!(d.limit(0).unwrap(), 1024);
    assert_eq!(d.limit(1).unwrap(), 8650752);
    assert_eq!(d.limit(2).unwrap(), 8388608);
    assert_eq!(code(d.limit(99)), 1);
    assert_eq!(d.stream_priority_range().unwrap(), (0, -5));
    assert_eq!(d.granularity(0).unwrap(), G);
    // A second device has its own primary context.
    d.primary_context(1).unwrap();
    d.primary_context(s.dev).unwrap();
}

#[test]
fn vmm_alloc_and_round_trip_byte_for_byte() {
    let (_g, s) = sim();
    let d = &s.d;
    let hint = 0x6000_0000_0000u64;
    let va = d.reserve(4 * G, hint).unwrap();
    assert_eq!(va, hint, "a free hint is honoured");
    let other = d.reserve(G, hint).unwrap();
    assert_ne!(other, hint, "a taken hint is not");
    d.free_reservation(other, G).unwrap();
    // Two mappings side by side; a copy across them.
    let h1 = d.map_new(s.dev, va, 2 * G).unwrap();
    let h2 = d.map_new(s.dev, va + 2 * G as u64, 2 * G).unwrap();
    let data: Vec<u8> = (0..3 * G as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let at = va + 777;
    d.htod(at, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    d.dtoh(&mut back, at).unwrap();
    assert!(back == data, "bytes differ after a round trip");
    // Device to device, memsets of each width.
    d.dtod(va + 3 * G as u64, at, 4096).unwrap();
    let mut part = vec![0u8; 4096];
    d.dtoh(&mut part, va + 3 * G as u64).unwrap();
    assert_eq!(part, data[..4096]);
    d.memset_d8(va, 0xAB, 3).unwrap();
    d.memset_d16(va + 4, 0x1234, 2).unwrap();
    d.memset_d32(va + 8, 0xDEADBEEF, 1).unwrap();
    let mut head = [0u8; 12];
    d.dtoh(&mut head, va).unwrap();
    assert_eq!(
        head,
        [0xAB, 0xAB, 0xAB, 0, 0x34, 0x12, 0x34, 0x12, 0xEF, 0xBE, 0xAD, 0xDE]
    );
    // Unaligned 32-bit memset, copies outside the mappings, freeing with mappings.
    assert_eq!(code(d.memset_d32(va + 2, 0, 1)), 1);
    assert_eq!(code(d.htod(va + 4 * G as u64 - 2, &[1, 2, 3, 4])), 1);
    assert_eq!(code(d.free_reservation(va, 4 * G)), 1);
    d.unmap_release(va, 2 * G, h1).unwrap();
    assert_eq!(code(d.htod(va, &[1])), 1);
    d.unmap_release(va + 2 * G as u64, 2 * G, h2).unwrap();
    d.free_reservation(va, 4 * G).unwrap();
    assert_eq!(code(d.free_reservation(va, 4 * G)), 1);
}

#[test]
fn physical_memory_is_limited_to_the_device() {
    let (_g, s) = sim();
    let d = &s.d;
    let va = d.reserve(1024 * G, 0).unwrap();
    // More than GPUFUSE_SIM_MEM at once.
    assert_eq!(code(d.map_new(s.dev, va, 1024 * G)), 2);
    let h = d.map_new(s.dev, va, 256 * G).unwrap();
    assert_eq!(code(d.map_new(s.dev, va + 256 * G as u64, 300 * G)), 2);
    d.unmap_release(va, 256 * G, h).unwrap();
    // Freed memory can be had again.
    let h = d.map_new(s.dev, va, 400 * G).unwrap();
    d.unmap_release(va, 400 * G, h).unwrap();
    d.free_reservation(va, 1024 * G).unwrap();
}

#[test]
fn modules_functions_parameters_and_globals() {
    let (_g, s) = sim();
    let d = &s.d;
    let m = d.load_module(&ptx_image(PTX)).unwrap();
    let mixed = d.function(m, "mixed").unwrap();
    assert_eq!(d.param_layout(mixed).unwrap(), [(0, 1), (8, 12), (24, 8)]);
    let add = d.function(m, "sim_add_u32").unwrap();
    assert_eq!(d.param_layout(add).unwrap(), [(0, 8), (8, 4), (12, 4)]);
    assert!(d
        .param_layout(d.function(m, "quick").unwrap())
        .unwrap()
        .is_empty());
    assert_eq!(d.function_attribute(mixed, 0).unwrap(), 256);
    assert_eq!(d.function_attribute(mixed, 1).unwrap(), 4096);
    assert_eq!(d.function_attribute(add, 0).unwrap(), 1024);
    assert_eq!(d.function_attribute(add, 5).unwrap(), 80);
    assert_eq!(d.function_attribute(add, 6).unwrap(), 90);
    assert_eq!(d.function_attribute(add, 8).unwrap(), 49152);
    assert_eq!(code(d.function_attribute(add, 16)), 1);
    d.set_function_attribute(add, 8, 100_000).unwrap();
    assert_eq!(d.function_attribute(add, 8).unwrap(), 100_000);
    assert_eq!(code(d.set_function_attribute(add, 8, 300_000)), 1);
    assert_eq!(code(d.set_function_attribute(add, 0, 1)), 1);
    assert_eq!(d.occupancy(add, 256, 0, 0).unwrap(), 8);
    assert_eq!(d.occupancy(add, 32, 0, 0).unwrap(), 32);
    assert_eq!(d.occupancy(mixed, 512, 0, 0).unwrap(), 0, "over .maxntid");
    assert_eq!(code(d.occupancy(add, 0, 0, 0)), 1);
    // Globals, with their initializers, in device memory.
    let (magic, size) = d.global(m, "magic").unwrap();
    assert_eq!(size, 4);
    let mut w = [0u8; 4];
    d.dtoh(&mut w, magic).unwrap();
    assert_eq!(u32::from_le_bytes(w), 0xC0FFEE);
    let (coeffs, size) = d.global(m, "coeffs").unwrap();
    let mut c = [0u8; 8];
    d.dtoh(&mut c, coeffs).unwrap();
    assert_eq!((size, words(&c)), (8, vec![3, 4]));
    let (table, size) = d.global(m, "table").unwrap();
    assert_eq!(size, 64);
    d.htod(table, &[9; 64]).unwrap();
    assert_eq!(code(d.global(m, "nothing")), 500);
    assert_eq!(code(d.function(m, "nothing")), 500);
    // Not PTX; PTX it cannot read; PTX for a newer GPU; a newer PTX ISA.
    assert_eq!(code(d.load_module(b"\x7fELF\x02\x01\x01\0")), 200);
    assert_eq!(code(d.load_module(b"just text\0")), 200);
    assert_eq!(
        code(d.load_module(&ptx_image(".version 8.0\n.entry k(.param .u32 a, {}"))),
        218
    );
    assert_eq!(
        code(d.load_module(&ptx_image(".version 8.0\n.target sm_100\n.entry k() {}"))),
        218
    );
    assert_eq!(
        code(d.load_module(&ptx_image(".version 9.9\n.entry k() {}"))),
        222
    );
    assert_eq!(
        code(d.load_module(&ptx_image(
            ".version 8.0\n.entry sim_add_u32_bad(.param .u32 a) {}"
        ))),
        218
    );
    // Unloading takes its functions and globals.
    d.unload_module(m).unwrap();
    assert_eq!(code(d.function_attribute(add, 0)), 400);
    assert_eq!(code(d.function(m, "quick")), 400);
    assert_eq!(code(d.unload_module(m)), 400);
    assert_eq!(code(d.htod(table, &[1])), 1);
}

#[test]
fn host_registrations() {
    let (_g, s) = sim();
    let d = &s.d;
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: `buf` outlives every use of the spans below.
    let all = unsafe { gpufuse_cuda_driver::HostSpan::new(buf.as_mut_ptr(), buf.len()) };
    let half = all.sub(1 << 15, 1 << 15).unwrap();
    let inner = all.sub(100, 1000).unwrap();
    d.host_register(half).unwrap();
    assert_eq!(code(d.host_register(half)), 712);
    assert_eq!(code(d.host_register(all)), 712);
    assert_eq!(code(d.host_unregister(inner)), 713);
    d.host_register(inner).unwrap();
    d.host_unregister(half).unwrap();
    d.host_unregister(inner).unwrap();
    assert_eq!(code(d.host_unregister(inner)), 713);
}

#[test]
fn bad_handles_and_launch_arguments() {
    let (_g, s) = sim();
    let d = &s.d;
    let st = d.stream_create(0, 0).unwrap();
    d.stream_destroy(st).unwrap();
    assert_eq!(code(d.stream_destroy(st)), 400);
    assert_eq!(code(d.stream_synchronize(st)), 400);
    assert_eq!(code(d.stream_query(st)), 400);
    let e = d.event_create(0).unwrap();
    d.event_destroy(e).unwrap();
    assert_eq!(code(d.event_record(e, Stream::NULL)), 400);
    assert_eq!(code(d.event_query(e)), 400);
    assert_eq!(code(d.event_synchronize(e)), 400);
    assert_eq!(code(d.event_create(0x8)), 1);
    assert_eq!(
        code(d.event_create(0x4)),
        1,
        "interprocess needs timing disabled"
    );
    assert_eq!(code(d.stream_create(0x2, 0)), 1);
    let quick = function(s, "quick");
    let add = function(s, "sim_add_u32");
    let mixed = function(s, "mixed");
    let launch = |f, grid, block, shared, params: &[u8]| {
        d.launch(f, grid, block, shared, Stream::NULL, params)
    };
    launch(quick, [1, 1, 1], [1024, 1, 1], 0, &[]).unwrap();
    assert_eq!(code(launch(quick, [0, 1, 1], [1, 1, 1], 0, &[])), 1);
    assert_eq!(code(launch(quick, [1, 1, 1], [2048, 1, 1], 0, &[])), 1);
    assert_eq!(code(launch(quick, [1, 1, 1], [32, 32, 2], 0, &[])), 1);
    assert_eq!(code(launch(quick, [1, 1, 1], [1, 1, 65], 0, &[])), 1);
    assert_eq!(code(launch(quick, [1, 70000, 1], [1, 1, 1], 0, &[])), 1);
    assert_eq!(code(launch(quick, [1, 1, 1], [32, 1, 1], 60_000, &[])), 1);
    assert_eq!(
        code(launch(mixed, [1, 1, 1], [512, 1, 1], 0, &[0; 32])),
        1,
        ".maxntid 256"
    );
    assert_eq!(
        code(launch(add, [1, 1, 1], [1, 1, 1], 0, &[0; 12])),
        1,
        "buffer too small"
    );
    // A cooperative grid larger than what is resident at once.
    let layout = d.param_layout(quick).unwrap();
    d.launch_cooperative(
        quick,
        [132 * 8, 1, 1],
        [256, 1, 1],
        0,
        Stream::NULL,
        &[],
        &layout,
    )
    .unwrap();
    let big = d.launch_cooperative(
        quick,
        [132 * 8 + 1, 1, 1],
        [256, 1, 1],
        0,
        Stream::NULL,
        &[],
        &layout,
    );
    assert_eq!(code(big), 720);
    // Unknown handles of every kind.
    let bogus = gpufuse_cuda_driver::Function::NULL;
    assert_eq!(code(launch(bogus, [1, 1, 1], [1, 1, 1], 0, &[])), 400);
    assert_eq!(
        code(d.graph_launch(gpufuse_cuda_driver::GraphExec::NULL, Stream::NULL)),
        400
    );
    assert_eq!(
        code(d.graph_destroy(gpufuse_cuda_driver::GraphExec::NULL)),
        400
    );
    d.synchronize().unwrap();
}

#[test]
fn launch_parameters_by_kernel_params_and_by_extra() {
    let (_g, s) = sim();
    let d = &s.d;
    let mem = DevMem::new(s, 4096);
    d.memset_d32(mem.va, 1, 8).unwrap();
    let add = function(s, "sim_add_u32");
    // The `extra` form (the wrapper's), then `kernelParams` (cooperative).
    d.launch(
        add,
        [1, 1, 1],
        [32, 1, 1],
        0,
        Stream::NULL,
        &add_params(mem.va, 8, 10),
    )
    .unwrap();
    let layout = d.param_layout(add).unwrap();
    d.launch_cooperative(
        add,
        [1, 1, 1],
        [32, 1, 1],
        0,
        Stream::NULL,
        &add_params(mem.va, 4, 100),
        &layout,
    )
    .unwrap();
    let mut out = [0u8; 32];
    d.dtoh(&mut out, mem.va).unwrap();
    assert_eq!(words(&out), [111, 111, 111, 111, 11, 11, 11, 11]);
    // Both forms at once, or neither for a kernel with parameters.
    type Launch = unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> i32;
    let raw: Launch = sym(s, "cuLaunchKernel");
    let f: *mut c_void = {
        let get: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> i32 =
            sym(s, "cuModuleGetFunction");
        let mut f = null_mut();
        let module: *mut c_void = {
            let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32 =
                sym(s, "cuModuleLoadData");
            let mut m = null_mut();
            let img = ptx_image(PTX);
            // SAFETY: valid out-pointer and NUL-terminated image.
            assert_eq!(unsafe { load(&mut m, img.as_ptr().cast()) }, 0);
            m
        };
        // SAFETY: valid out-pointer, module and name.
        assert_eq!(unsafe { get(&mut f, module, c"sim_add_u32".as_ptr()) }, 0);
        f
    };
    let mut p = [0u8; 16];
    let mut args: Vec<*mut c_void> = vec![p.as_mut_ptr().cast(); 3];
    let mut extra = [null_mut::<c_void>()];
    // SAFETY: well-formed arrays; the simulated driver refuses the combination.
    let r = unsafe {
        raw(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
            extra.as_mut_ptr(),
        )
    };
    assert_eq!(r, 1);
    // SAFETY: no parameters at all for a kernel that has some.
    let r = unsafe { raw(f, 1, 1, 1, 1, 1, 1, 0, null_mut(), null_mut(), null_mut()) };
    assert_eq!(r, 1);
    args[1] = null_mut();
    // SAFETY: a NULL parameter pointer, which the simulated driver refuses.
    let r = unsafe {
        raw(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(r, 1);
}

#[test]
fn no_export_crashes_on_null_pointers() {
    let (_g, s) = sim();
    type Out<T> = unsafe extern "C" fn(*mut T) -> i32;
    type OutDev<T> = unsafe extern "C" fn(*mut T, c_int) -> i32;
    // SAFETY: every call below passes NULL where the API takes a pointer (the simulated
    // driver must answer CUDA_ERROR_INVALID_VALUE without touching it), or valid pointers.
    unsafe {
        assert_eq!(sym::<Out<c_int>>(s, "cuDriverGetVersion")(null_mut()), 1);
        assert_eq!(sym::<Out<c_int>>(s, "cuDeviceGetCount")(null_mut()), 1);
        assert_eq!(sym::<OutDev<c_int>>(s, "cuDeviceGet")(null_mut(), 0), 1);
        assert_eq!(
            sym::<OutDev<usize>>(s, "cuDeviceTotalMem_v2")(null_mut(), 0),
            1
        );
        assert_eq!(
            sym::<OutDev<c_void>>(s, "cuDeviceGetUuid_v2")(null_mut(), 0),
            1
        );
        assert_eq!(
            sym::<OutDev<*mut c_void>>(s, "cuDevicePrimaryCtxRetain")(null_mut(), 0),
            1
        );
        let name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> i32 =
            sym(s, "cuDeviceGetName");
        assert_eq!(name(null_mut(), 64, 0), 1);
        let mut small = [1 as c_char; 4];
        assert_eq!(name(small.as_mut_ptr(), 4, 0), 0);
        assert_eq!(small, [b'g' as c_char, b'p' as c_char, b'u' as c_char, 0]);
        let attr: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> i32 =
            sym(s, "cuDeviceGetAttribute");
        assert_eq!(attr(null_mut(), 1, 0), 1);
        let err: unsafe extern "C" fn(i32, *mut *const c_char) -> i32 = sym(s, "cuGetErrorName");
        assert_eq!(err(0, null_mut()), 1);
        let mut p: *const c_char = std::ptr::null();
        assert_eq!(err(712, &mut p), 0);
        assert_eq!(
            std::ffi::CStr::from_ptr(p).to_str().unwrap(),
            "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
        );
        assert_eq!(err(123456, &mut p), 1);
        assert!(p.is_null());
        let limit: unsafe extern "C" fn(*mut usize, c_int) -> i32 = sym(s, "cuCtxGetLimit");
        assert_eq!(limit(null_mut(), 0), 1);
        let gran: unsafe extern "C" fn(*mut usize, *const c_void, c_int) -> i32 =
            sym(s, "cuMemGetAllocationGranularity");
        let mut g = 0usize;
        assert_eq!(gran(null_mut(), null_mut(), 0), 1);
        assert_eq!(gran(&mut g, null_mut(), 0), 1);
        let reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32 =
            sym(s, "cuMemAddressReserve");
        assert_eq!(reserve(null_mut(), G, 0, 0, 0), 1);
        let create: unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> i32 =
            sym(s, "cuMemCreate");
        let mut h = 0u64;
        assert_eq!(create(null_mut(), G, null_mut(), 0), 1);
        assert_eq!(create(&mut h, G, null_mut(), 0), 1);
        let access: unsafe extern "C" fn(u64, usize, *const c_void, usize) -> i32 =
            sym(s, "cuMemSetAccess");
        assert_eq!(access(0x7f00_0000_0000, G, null_mut(), 1), 1);
        let htod: unsafe extern "C" fn(u64, *const c_void, usize) -> i32 =
            sym(s, "cuMemcpyHtoD_v2");
        let mem = DevMem::new(s, G);
        assert_eq!(htod(mem.va, null_mut(), 16), 1);
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> i32 = sym(s, "cuMemcpyDtoH_v2");
        assert_eq!(dtoh(null_mut(), mem.va, 16), 1);
        let dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, *mut c_void) -> i32 =
            sym(s, "cuMemcpyDtoHAsync_v2");
        assert_eq!(dtoh_async(null_mut(), mem.va, 16, null_mut()), 1);
        let register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> i32 =
            sym(s, "cuMemHostRegister_v2");
        assert_eq!(register(null_mut(), 4096, 0), 1);
        let unregister: unsafe extern "C" fn(*mut c_void) -> i32 = sym(s, "cuMemHostUnregister");
        assert_eq!(unregister(null_mut()), 1);
        let load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32 =
            sym(s, "cuModuleLoadData");
        let mut m = null_mut();
        assert_eq!(load(null_mut(), PTX.as_ptr().cast()), 1);
        assert_eq!(load(&mut m, null_mut()), 1);
        let get_fn: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> i32 =
            sym(s, "cuModuleGetFunction");
        assert_eq!(get_fn(null_mut(), null_mut(), c"quick".as_ptr()), 1);
        let img = ptx_image(PTX);
        assert_eq!(load(&mut m, img.as_ptr().cast()), 0);
        let mut f = null_mut();
        assert_eq!(get_fn(&mut f, m, std::ptr::null()), 1);
        assert_eq!(get_fn(&mut f, m, c"mixed".as_ptr()), 0);
        let global: unsafe extern "C" fn(*mut u64, *mut usize, *mut c_void, *const c_char) -> i32 =
            sym(s, "cuModuleGetGlobal_v2");
        assert_eq!(global(null_mut(), null_mut(), m, std::ptr::null()), 1);
        assert_eq!(
            global(null_mut(), null_mut(), m, c"magic".as_ptr()),
            0,
            "both out-pointers are optional"
        );
        let fattr: unsafe extern "C" fn(*mut c_int, c_int, *mut c_void) -> i32 =
            sym(s, "cuFuncGetAttribute");
        assert_eq!(fattr(null_mut(), 0, f), 1);
        let pinfo: unsafe extern "C" fn(*mut c_void, usize, *mut usize, *mut usize) -> i32 =
            sym(s, "cuFuncGetParamInfo");
        let mut off = 0usize;
        assert_eq!(pinfo(f, 0, null_mut(), null_mut()), 1);
        assert_eq!(pinfo(f, 1, &mut off, null_mut()), 0);
        assert_eq!(off, 8);
        assert_eq!(pinfo(f, 3, &mut off, null_mut()), 1);
        let occ: unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, usize, c_uint) -> i32 =
            sym(s, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
        assert_eq!(occ(null_mut(), f, 128, 0, 0), 1);
        let sc: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> i32 =
            sym(s, "cuStreamCreateWithPriority");
        assert_eq!(sc(null_mut(), 0, 0), 1);
        let ec: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> i32 = sym(s, "cuEventCreate");
        assert_eq!(ec(null_mut(), 0), 1);
        let el: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> i32 =
            sym(s, "cuEventElapsedTime");
        assert_eq!(el(null_mut(), null_mut(), null_mut()), 1);
        let end: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> i32 =
            sym(s, "cuStreamEndCapture");
        assert_eq!(end(null_mut(), null_mut()), 1);
        let inst: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> i32 =
            sym(s, "cuGraphInstantiateWithFlags");
        assert_eq!(inst(null_mut(), null_mut(), 0), 1);
        let range: unsafe extern "C" fn(*mut c_int, *mut c_int) -> i32 =
            sym(s, "cuCtxGetStreamPriorityRange");
        assert_eq!(
            range(null_mut(), null_mut()),
            0,
            "both out-pointers are optional"
        );
        let unload: unsafe extern "C" fn(*mut c_void) -> i32 = sym(s, "cuModuleUnload");
        assert_eq!(unload(m), 0);
    }
}

#[test]
fn calls_need_a_current_context_and_a_fresh_library_needs_cu_init() {
    let (_g, s) = sim();
    // Another thread has no current context.
    std::thread::scope(|t| {
        t.spawn(|| {
            assert_eq!(code(s.d.stream_create(0, 0)), 201);
            assert_eq!(code(s.d.synchronize()), 201);
            assert_eq!(code(s.d.event_create(0)), 201);
            assert_eq!(code(s.d.load_module(&ptx_image(PTX))), 201);
            assert_eq!(code(s.d.htod(0x7f00_0000_0000, &[1])), 201);
            assert_eq!(code(s.d.limit(0)), 201);
            let set: unsafe extern "C" fn(*mut c_void) -> i32 = sym(s, "cuCtxSetCurrent");
            // SAFETY: a handle the driver never gave out: it must be refused.
            let r = unsafe { set(std::ptr::without_provenance_mut(0x1234)) };
            assert_eq!(r, 201);
            // Device queries need none.
            assert_eq!(s.d.device_count().unwrap(), 2);
        });
    });
    // A second copy of the library is a second driver, not yet initialized.
    let copy = std::env::temp_dir().join(format!("gpufuse-cuda-sim-{}.so", std::process::id()));
    std::fs::copy(&s.path, &copy).unwrap();
    // SAFETY: loading the simulated driver runs no initializers of consequence.
    let lib = unsafe { libloading::Library::new(&copy) }.unwrap();
    let _ = std::fs::remove_file(&copy);
    // SAFETY: the exports' C signatures.
    unsafe {
        let count = lib
            .get::<unsafe extern "C" fn(*mut c_int) -> i32>(b"cuDeviceGetCount\0")
            .unwrap();
        let init = lib
            .get::<unsafe extern "C" fn(c_uint) -> i32>(b"cuInit\0")
            .unwrap();
        let version = lib
            .get::<unsafe extern "C" fn(*mut c_int) -> i32>(b"cuDriverGetVersion\0")
            .unwrap();
        let mut n = 0;
        assert_eq!(count(&mut n), 3, "CUDA_ERROR_NOT_INITIALIZED before cuInit");
        assert_eq!(version(&mut n), 0, "the version needs no cuInit");
        assert_eq!(init(1), 1, "cuInit takes no flags");
        assert_eq!(init(0), 0);
        assert_eq!(count(&mut n), 0);
        assert_eq!(n, 2);
    }
}

#[test]
fn vmm_event_and_graph_argument_errors() {
    use gpufuse_cuda_types::structs::{CUmemAccessDesc, CUmemAllocationProp, CUmemLocation};
    let (_g, s) = sim();
    let d = &s.d;
    // SAFETY: an all-zero C struct of integers and a NULL pointer is a valid value.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.r#type = 1;
    prop.location = CUmemLocation { r#type: 1, id: 0 };
    let g = G as u64;
    type Gran = unsafe extern "C" fn(*mut usize, *const CUmemAllocationProp, c_int) -> i32;
    type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32;
    type Create = unsafe extern "C" fn(*mut u64, usize, *const CUmemAllocationProp, u64) -> i32;
    type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> i32;
    type Range = unsafe extern "C" fn(u64, usize) -> i32;
    type Access = unsafe extern "C" fn(u64, usize, *const CUmemAccessDesc, usize) -> i32;
    let (gran, reserve, create) = (
        sym::<Gran>(s, "cuMemGetAllocationGranularity"),
        sym::<Reserve>(s, "cuMemAddressReserve"),
        sym::<Create>(s, "cuMemCreate"),
    );
    let (map, unmap, access) = (
        sym::<Map>(s, "cuMemMap"),
        sym::<Range>(s, "cuMemUnmap"),
        sym::<Access>(s, "cuMemSetAccess"),
    );
    let release: unsafe extern "C" fn(u64) -> i32 = sym(s, "cuMemRelease");
    let free: Range = sym(s, "cuMemAddressFree");
    let rw = CUmemAccessDesc {
        location: CUmemLocation { r#type: 1, id: 0 },
        flags: 3,
    };
    // SAFETY: every pointer below is valid or NULL; the values are what is being refused.
    unsafe {
        let mut n = 0usize;
        assert_eq!(gran(&mut n, &prop, 2), 1, "option");
        let mut bad = prop;
        bad.r#type = 2;
        assert_eq!(gran(&mut n, &bad, 0), 1, "allocation type");
        bad = prop;
        bad.location.id = 7;
        assert_eq!(gran(&mut n, &bad, 0), 101, "device");
        let mut va = 0u64;
        assert_eq!(reserve(&mut va, G + 4096, 0, 0, 0), 1, "size");
        assert_eq!(reserve(&mut va, G, 3 << 21, 0, 0), 1, "alignment");
        assert_eq!(reserve(&mut va, G, 0, 0, 1), 1, "flags");
        assert_eq!(reserve(&mut va, 4 * G, 0, 0, 0), 0);
        let mut h = 0u64;
        assert_eq!(create(&mut h, G / 2, &prop, 0), 1, "size");
        assert_eq!(create(&mut h, G, &prop, 1), 1, "flags");
        assert_eq!(create(&mut h, G, &bad, 0), 101, "device");
        assert_eq!(create(&mut h, 2 * G, &prop, 0), 0);
        assert_eq!(map(va, 2 * G, 4096, h, 0), 1, "offset");
        assert_eq!(map(va, 2 * G, G, h, 0), 1, "past the allocation");
        assert_eq!(map(va, 2 * G, 0, h + 1000, 0), 1, "handle");
        assert_eq!(map(va + 3 * g, 2 * G, 0, h, 0), 1, "past the reservation");
        assert_eq!(map(va, 2 * G, 0, h, 1), 1, "flags");
        assert_eq!(access(va, G, &rw, 1), 1, "nothing mapped");
        assert_eq!(map(va, 2 * G, 0, h, 0), 0);
        assert_eq!(map(va + g, G, 0, h, 0), 1, "over a mapping");
        let mut bad_rw = rw;
        bad_rw.flags = 2;
        assert_eq!(access(va, 2 * G, &bad_rw, 1), 1, "access flags");
        bad_rw = rw;
        bad_rw.location.r#type = 2;
        assert_eq!(access(va, 2 * G, &bad_rw, 1), 1, "location type");
        assert_eq!(access(va, 3 * G, &rw, 1), 1, "past the mapping");
        assert_eq!(access(va, 2 * G, &rw, 1), 0);
        assert_eq!(unmap(va, G), 1, "part of a mapping");
        assert_eq!(unmap(va + 2 * g, G), 1, "nothing mapped");
        assert_eq!(release(h + 1000), 1, "handle");
        assert_eq!(
            release(h),
            0,
            "released while mapped: freed with the mapping"
        );
        assert_eq!(release(h), 1, "twice");
        assert_eq!(free(va, 4 * G), 1, "still mapped");
        assert_eq!(unmap(va, 2 * G), 0);
        assert_eq!(free(va, 2 * G), 1, "not the reservation's size");
        assert_eq!(free(va, 4 * G), 0);
    }
    // Events, streams, graphs.
    let st = d.stream_create(1, 0).unwrap();
    let e = d.event_create(0).unwrap();
    let wait: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint) -> i32 =
        sym(s, "cuStreamWaitEvent");
    let create_stream: unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> i32 =
        sym(s, "cuStreamCreateWithPriority");
    let create_event: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> i32 =
        sym(s, "cuEventCreate");
    let (mut hs, mut he) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers, then live handles with flags that are refused.
    unsafe {
        assert_eq!(create_stream(&mut hs, 0, 0), 0);
        assert_eq!(create_event(&mut he, 0), 0);
        assert_eq!(wait(hs, he, 2), 1);
        assert_eq!(wait(hs, he, 0), 0, "never recorded: nothing to wait for");
    }
    // An event recorded outside a capture, waited for inside one.
    d.event_record(e, st).unwrap();
    let other = d.stream_create(1, 0).unwrap();
    d.begin_capture(other).unwrap();
    assert_eq!(code(d.stream_wait_event(other, e)), 905);
    assert_eq!(code(d.end_capture(other)), 901);
    // A capture's event, waited for outside it.
    d.begin_capture(other).unwrap();
    d.event_record(e, other).unwrap();
    assert_eq!(code(d.stream_wait_event(st, e)), 905);
    let exec = d.end_capture(other).unwrap();
    let inst: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> i32 =
        sym(s, "cuGraphInstantiateWithFlags");
    let mut x = null_mut();
    // SAFETY: a valid out-pointer; a handle never given out.
    let r = unsafe { inst(&mut x, std::ptr::without_provenance_mut(0x77), 0) };
    assert_eq!(r, 400);
    let name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> i32 = sym(s, "cuDeviceGetName");
    let mut buf = [0 as c_char; 8];
    // SAFETY: a valid buffer, a length that is refused.
    assert_eq!(unsafe { name(buf.as_mut_ptr(), 0, 0) }, 1);
    d.graph_destroy(exec).unwrap();
    // Work on a destroyed stream.
    d.stream_destroy(other).unwrap();
    let mem = DevMem::new(s, G);
    let mut host = [0u8; 16];
    // SAFETY: `host` outlives the call, which is refused.
    let span = unsafe { gpufuse_cuda_driver::HostSpan::new(host.as_mut_ptr(), 16) };
    assert_eq!(code(d.htod_async(mem.va, span, other)), 400);
    assert_eq!(code(d.memset_async(mem.va, 0, 4, 4, other)), 400);
    assert_eq!(code(d.begin_capture(other)), 400);
    d.event_destroy(e).unwrap();
    d.stream_destroy(st).unwrap();
}
