//! The shim's exports driven directly (as a C caller would) against a real server on the
//! emulated GPU. One test function: the shim's session is process-wide.

mod common;

use std::ffi::{c_void, CString};

use cuda::api::{context, copy, device, init, launch, memory, module};

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry probe(
	.param .u64 probe_param_0,
	.param .f32 probe_param_1,
	.param .align 8 .b8 probe_param_2[24],
	.param .u8 probe_param_3
)
{
	ret;
}
"#;

fn ok(r: i32, what: &str) {
    assert_eq!(r, 0, "{what} returned {r}");
}

fn launch_log() -> Vec<gpufuse_proto::LaunchRecord> {
    let s = cuda::global::session().unwrap();
    let mut g = s.lock();
    g.launch_log(16).unwrap()
}

#[test]
fn driver_api_against_a_real_server() {
    let server = common::start("emu:1:1GiB");
    std::env::set_var("GPUFUSE_SERVER", &server.address);
    // SAFETY: every call gets valid pointers to locals, as a C caller would.
    unsafe {
        ok(init::cuInit(0), "cuInit");
        let mut version = 0;
        ok(init::cuDriverGetVersion(&mut version), "version");
        assert!(version >= 12000);
        let mut count = 0;
        ok(device::cuDeviceGetCount(&mut count), "count");
        assert_eq!(count, 1);
        let mut major = 0;
        ok(device::cuDeviceGetAttribute(&mut major, 75, 0), "cc major");
        assert!(major >= 8);

        let mut ctx = std::ptr::null_mut();
        ok(context::cuDevicePrimaryCtxRetain(&mut ctx, 0), "retain");
        ok(context::cuCtxSetCurrent(ctx), "set current");

        // Memory: round trip, bogus free, impossible allocation.
        let mut d = 0u64;
        ok(memory::cuMemAlloc_v2(&mut d, 4096), "alloc");
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        ok(
            copy::cuMemcpyHtoD_v2(d, src.as_ptr().cast(), src.len()),
            "htod",
        );
        let mut back = vec![0u8; 4096];
        ok(
            copy::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), d, back.len()),
            "dtoh",
        );
        assert_eq!(back, src);
        assert_ne!(
            memory::cuMemFree_v2(d + 12345),
            0,
            "freeing a bogus pointer must fail"
        );
        let mut huge = 0u64;
        assert_eq!(
            memory::cuMemAlloc_v2(&mut huge, 1 << 50),
            2,
            "impossible allocation"
        );
        ok(memory::cuMemFree_v2(d), "free");

        // 2-D copies and memsets through the exports (the client core packs and unpacks the
        // rows): 3 host rows of 10 bytes into device rows 64 bytes apart, a 2-D memset beside
        // them, and back into packed rows; a device pitch narrower than a row is refused.
        let mut d2 = 0u64;
        ok(memory::cuMemAlloc_v2(&mut d2, 256), "alloc 2d");
        ok(copy::cuMemsetD8_v2(d2, 0, 256), "clear 2d");
        let rows: Vec<u8> = (1..=30).collect();
        let mut p: copy::Memcpy2D = std::mem::zeroed();
        p.src_memory_type = 1;
        p.src_host = rows.as_ptr().cast();
        p.src_pitch = 10;
        p.dst_memory_type = 2;
        p.dst_device = d2;
        p.dst_pitch = 64;
        p.width_in_bytes = 8;
        p.height = 3;
        ok(copy::cuMemcpy2D_v2(&p), "2d htod");
        ok(copy::cuMemsetD2D8_v2(d2 + 8, 64, 0xff, 2, 3), "memset 2d");
        let mut packed_rows = vec![0u8; 30];
        let mut q: copy::Memcpy2D = std::mem::zeroed();
        q.src_memory_type = 2;
        q.src_device = d2;
        q.src_pitch = 64;
        q.dst_memory_type = 1;
        q.dst_host = packed_rows.as_mut_ptr().cast();
        q.dst_pitch = 10;
        q.width_in_bytes = 10;
        q.height = 3;
        ok(copy::cuMemcpy2D_v2(&q), "2d dtoh");
        for r in 0..3 {
            assert_eq!(&packed_rows[r * 10..r * 10 + 8], &rows[r * 10..r * 10 + 8]);
            assert_eq!(&packed_rows[r * 10 + 8..r * 10 + 10], &[0xff, 0xff]);
        }
        q.src_pitch = 4;
        assert_eq!(copy::cuMemcpy2D_v2(&q), 1, "a pitch narrower than a row");
        ok(memory::cuMemFree_v2(d2), "free 2d");

        // Limits are the session's: defaults, set, unknown refused.
        let mut value = 0usize;
        ok(context::cuCtxGetLimit(&mut value, 0), "get limit");
        assert_eq!(value, 1024);
        ok(context::cuCtxSetLimit(0, 2048), "set limit");
        ok(context::cuCtxGetLimit(&mut value, 0), "get limit again");
        assert_eq!(value, 2048);
        assert_eq!(context::cuCtxGetLimit(&mut value, 99), 1);

        // Module and launches: the worker must receive the exact argument bytes.
        let ptx = CString::new(PTX).unwrap();
        let mut m = std::ptr::null_mut();
        ok(
            module::cuModuleLoadData(&mut m, ptx.as_ptr().cast()),
            "load",
        );
        let mut f = std::ptr::null_mut();
        let name = CString::new("probe").unwrap();
        ok(
            module::cuModuleGetFunction(&mut f, m, name.as_ptr()),
            "get function",
        );
        let mut off = 0usize;
        let mut size = 0usize;
        ok(
            module::cuFuncGetParamInfo(f, 2, &mut off, &mut size),
            "param info",
        );
        assert_eq!((off, size), (16, 24));

        let p0: u64 = 0x1122_3344_5566_7788;
        let p1: f32 = 1.5;
        let p2: [u8; 24] = std::array::from_fn(|i| i as u8 + 1);
        let p3: u8 = 0xAB;
        let args: [*const c_void; 4] = [
            (&p0 as *const u64).cast(),
            (&p1 as *const f32).cast(),
            p2.as_ptr().cast(),
            (&p3 as *const u8).cast(),
        ];
        ok(
            launch::cuLaunchKernel(
                f,
                2,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args.as_ptr(),
                std::ptr::null(),
            ),
            "launch",
        );
        // Offsets 0, 8, 16 (aligned to 8), 40; the gap after the f32 stays zero.
        let mut expected = Vec::new();
        expected.extend_from_slice(&p0.to_le_bytes());
        expected.extend_from_slice(&p1.to_le_bytes());
        expected.extend_from_slice(&[0; 4]);
        expected.extend_from_slice(&p2);
        expected.push(p3);

        // The same bytes through `extra`.
        let mut packed = expected.clone();
        let mut packed_len = packed.len();
        let extra: [*const c_void; 5] = [
            std::ptr::dangling::<c_void>(),
            packed.as_mut_ptr().cast(),
            2 as *const c_void,
            (&mut packed_len as *mut usize).cast(),
            std::ptr::null(),
        ];
        ok(
            launch::cuLaunchKernel(
                f,
                1,
                1,
                1,
                64,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null(),
                extra.as_ptr(),
            ),
            "launch extra",
        );
        // Both forms at once is an error.
        assert_eq!(
            launch::cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args.as_ptr(),
                extra.as_ptr()
            ),
            1
        );
        ok(context::cuCtxSynchronize(), "sync");

        let log = launch_log();
        let n = log.len();
        assert!(n >= 2, "launch log {log:?}");
        let (a, b) = (&log[n - 2], &log[n - 1]);
        assert_eq!(a.function_name, "probe");
        assert_eq!(a.grid, [2, 1, 1]);
        assert_eq!(a.block, [32, 1, 1]);
        assert_eq!(a.params, expected);
        assert_eq!(b.block, [64, 1, 1]);
        assert_eq!(b.params, expected);
    }
    drop(server);
}
