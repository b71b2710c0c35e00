//! The client core against real workers: each test starts a small node (a unix listener whose
//! connections are served by `gpufuse_worker::serve` on an emulated GPU, each in a thread) and
//! drives a `Session` through the core's API, as the shim's exports do.

mod common;

use common::Node;

use std::sync::mpsc;
use std::time::Duration;

use gpufuse_client::copy::Side2D;
use gpufuse_client::lanes::StreamRef;
use gpufuse_client::launch::{pack_params, KernelLaunch, LaunchConfig};
use gpufuse_client::state::{self, Session};
use gpufuse_client::work::SyncScope;
use gpufuse_client::ClientError;

const INVALID_VALUE: i32 = 1;
const INVALID_CONTEXT: i32 = 201;
const INVALID_HANDLE: i32 = 400;
const NOT_SUPPORTED: i32 = 801;
const ILLEGAL_ADDRESS: i32 = 700;

/// `fill(u32 *out, u32 base, u32 n)`: `out[i] = base + i` for every thread `i < n`.
const FILL_PTX: &str = "\
.version 7.0
.target sm_80
.address_size 64

.visible .entry fill(
\t.param .u64 fill_param_0,
\t.param .u32 fill_param_1,
\t.param .u32 fill_param_2
)
{
\t.reg .pred %p<2>;
\t.reg .b32 %r<8>;
\t.reg .b64 %rd<5>;

\tld.param.u64 %rd1, [fill_param_0];
\tld.param.u32 %r1, [fill_param_1];
\tld.param.u32 %r2, [fill_param_2];
\tmov.u32 %r3, %ctaid.x;
\tmov.u32 %r4, %ntid.x;
\tmov.u32 %r5, %tid.x;
\tmad.lo.s32 %r6, %r3, %r4, %r5;
\tsetp.ge.u32 %p1, %r6, %r2;
\t@%p1 bra $L__END;
\tcvta.to.global.u64 %rd2, %rd1;
\tmul.wide.u32 %rd3, %r6, 4;
\tadd.s64 %rd4, %rd2, %rd3;
\tadd.s32 %r7, %r1, %r6;
\tst.global.u32 [%rd4], %r7;
$L__END:
\tret;
}
\0";

fn status<T>(r: Result<T, ClientError>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.status(),
    }
}

/// A session with device 0's primary context current on this thread.
fn session(node: &Node) -> Session {
    let s = node.connect();
    let ctx = s.lock().retain_primary(0).unwrap();
    s.lock().set_current(ctx).unwrap();
    s
}

fn launch_fill(s: &Session, f: u64, out: u64, base: u32, n: u32, stream: u64) {
    let mut g = s.lock();
    let (function, layout) = g.launch_layout(f).unwrap();
    let (ptr, base_b, n_b) = (out.to_le_bytes(), base.to_le_bytes(), n.to_le_bytes());
    let args: [&[u8]; 3] = [&ptr, &base_b, &n_b];
    let params = pack_params(&layout, |i, size| {
        assert_eq!(args[i].len(), size);
        Ok(args[i])
    })
    .unwrap();
    let config = LaunchConfig {
        grid: [n.div_ceil(64), 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        stream,
        attributes: Vec::new(),
    };
    config.check().unwrap();
    g.launch(function, config, params).unwrap();
}

fn read_u32s(s: &Session, ptr: u64, n: usize) -> Vec<u32> {
    let mut bytes = vec![0u8; n * 4];
    s.lock().copy_from_device(&mut bytes, ptr, 0).unwrap();
    bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn memory_round_trips_and_frees_everything_at_the_end() {
    let node = Node::start();
    let s = session(&node);
    {
        let mut g = s.lock();
        let p = g.alloc(1 << 20).unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        g.copy_to_device(p, &data, 0).unwrap();
        let q = g.alloc(1 << 20).unwrap();
        g.copy_on_device(q, p, 1 << 20, 0).unwrap();
        g.memset(q, 7, 1, 16, 0).unwrap();
        let mut back = vec![0u8; 1 << 20];
        g.copy_from_device(&mut back, q, 0).unwrap();
        assert_eq!(&back[..16], &[7; 16]);
        assert_eq!(&back[16..], &data[16..]);
        // Outside any allocation: refused locally, nothing sent.
        assert_eq!(
            status(g.copy_to_device(q + (1 << 20) - 2, &[0; 4], 0)),
            INVALID_VALUE
        );
        assert_eq!(status(g.free(q + 1)), INVALID_VALUE);
        assert_eq!(status(g.free(0)), 0);
        g.free(p).unwrap();
        assert_eq!(status(g.free(p)), INVALID_VALUE);
        // q stays allocated: the worker frees it when the session ends.
    }
    drop(s);
    assert_eq!(node.ended_with(), 0);
}

/// 2-D copies in every direction through the core: rows packed on the way to the device,
/// unpacked into a host pitch on the way back, device to device and host to host at their
/// pitches; what does not fit the pitch or the allocation, or overflows, is refused locally.
#[test]
fn two_dimensional_copies_keep_each_sides_pitch() {
    let node = Node::start();
    let s = session(&node);
    let dev = |ptr, pitch| Side2D {
        device: true,
        ptr,
        pitch,
    };
    let host = |buf: &[u8], pitch| Side2D {
        device: false,
        ptr: buf.as_ptr() as u64,
        pitch,
    };
    let (w, h) = (5u64, 3u64);
    // A host image of 3 rows, 8 bytes apart; the device's rows 16 bytes apart.
    let src: Vec<u8> = (0..24).collect();
    let mut g = s.lock();
    let a = g.alloc(48).unwrap();
    g.memset(a, 0xee, 1, 48, 0).unwrap();
    // SAFETY: `src` holds 3 rows of 8 bytes; the device side is checked by the core.
    unsafe { g.copy_2d(host(&src, 8), dev(a, 16), w, h, 0, true) }.unwrap();
    let mut flat = vec![0u8; 48];
    g.copy_from_device(&mut flat, a, 0).unwrap();
    for r in 0..3 {
        assert_eq!(&flat[r * 16..r * 16 + 5], &src[r * 8..r * 8 + 5], "row {r}");
        assert!(flat[r * 16 + 5..r * 16 + 16].iter().all(|&b| b == 0xee));
    }
    // Device to device, into rows 8 bytes apart.
    let b = g.alloc(24).unwrap();
    g.memset(b, 0, 1, 24, 0).unwrap();
    // SAFETY: no host side.
    unsafe { g.copy_2d(dev(a, 16), dev(b, 8), w, h, 0, true) }.unwrap();
    // Back to the host into rows 6 bytes apart: the gaps are left alone.
    let mut back = vec![0xaau8; 18];
    let out = Side2D {
        device: false,
        ptr: back.as_mut_ptr() as u64,
        pitch: 6,
    };
    // SAFETY: `back` holds 3 rows of 6 bytes, written during the call only.
    unsafe { g.copy_2d(dev(b, 8), out, w, h, 0, true) }.unwrap();
    for r in 0..3 {
        assert_eq!(&back[r * 6..r * 6 + 5], &src[r * 8..r * 8 + 5], "row {r}");
        assert_eq!(back[r * 6 + 5], 0xaa);
    }
    // Host to host.
    let mut copy = vec![0u8; 15];
    let packed = Side2D {
        device: false,
        ptr: copy.as_mut_ptr() as u64,
        pitch: 5,
    };
    // SAFETY: both host buffers are valid for the rows the copy names.
    unsafe { g.copy_2d(host(&src, 8), packed, w, h, 0, true) }.unwrap();
    assert_eq!(&copy[5..10], &src[8..13]);
    // Refused: a device pitch narrower than a row, rows past the allocation, a span that
    // overflows, a NULL host side; nothing at all for an empty copy.
    // SAFETY: the host sides are `src`, or NULL and refused before any access.
    unsafe {
        assert_eq!(
            status(g.copy_2d(host(&src, 8), dev(a, 4), w, h, 0, true)),
            INVALID_VALUE
        );
        assert_eq!(
            status(g.copy_2d(host(&src, 8), dev(a, 16), w, 4, 0, true)),
            INVALID_VALUE
        );
        assert_eq!(
            status(g.copy_2d(dev(a, u64::MAX / 2), dev(b, 8), w, h, 0, true)),
            INVALID_VALUE
        );
        assert_eq!(
            status(g.copy_2d(dev(a, 16), dev(b, 8), u64::MAX, h, 0, true)),
            INVALID_VALUE
        );
        let null = Side2D {
            device: false,
            ptr: 0,
            pitch: 8,
        };
        assert_eq!(
            status(g.copy_2d(null, dev(a, 16), w, h, 0, true)),
            INVALID_VALUE
        );
        g.copy_2d(null, dev(a, 16), 0, h, 0, true).unwrap();
    }
    // Larger than one frame: refused, as before.
    let big = g.alloc(65 << 20).unwrap();
    let mut sink = vec![0u8; 65 << 20];
    let all = Side2D {
        device: false,
        ptr: sink.as_mut_ptr() as u64,
        pitch: 1 << 20,
    };
    // SAFETY: `sink` holds the 65 rows of 1 MiB the copy names.
    let too_big = unsafe { g.copy_2d(dev(big, 1 << 20), all, 1 << 20, 65, 0, true) };
    assert_eq!(status(too_big), NOT_SUPPORTED);
    drop(g);
    drop(s);
    assert_eq!(node.ended_with(), 0);
}

/// 2-D memsets: rows of elements at a pitch, the gaps untouched; checked sizes; under stream
/// capture one memset node per row, run by each launch of the graph.
#[test]
fn two_dimensional_memsets_fill_rows_and_are_captured_row_by_row() {
    let node = Node::start();
    let s = session(&node);
    let p = s.lock().alloc(64).unwrap();
    s.lock().memset(p, 0, 1, 64, 0).unwrap();
    // 3 rows of 2 u32 elements, 16 bytes apart.
    s.lock().memset_2d(p, 16, 0x0102_0304, 4, 2, 3, 0).unwrap();
    let words = read_u32s(&s, p, 16);
    for r in 0..4 {
        let want: &[u32] = if r < 3 { &[0x0102_0304; 2] } else { &[0; 2] };
        assert_eq!(&words[r * 4..r * 4 + 2], want, "row {r}");
        assert_eq!(&words[r * 4 + 2..r * 4 + 4], &[0, 0], "gap {r}");
    }
    let mut g = s.lock();
    assert_eq!(status(g.memset_2d(p, 4, 1, 4, 2, 3, 0)), INVALID_VALUE);
    assert_eq!(status(g.memset_2d(p, 16, 1, 4, 2, 5, 0)), INVALID_VALUE);
    assert_eq!(
        status(g.memset_2d(p, 16, 1, 4, u64::MAX / 2, 1, 0)),
        INVALID_VALUE
    );
    assert_eq!(
        status(g.memset_2d(p, u64::MAX / 2, 1, 1, 1, 3, 0)),
        INVALID_VALUE
    );
    g.memset_2d(p, 16, 1, 4, 0, 3, 0).unwrap();
    // Captured: one node per row, nothing runs until the graph does.
    let st = g.create_stream(0, 0).unwrap();
    g.begin_capture(st).unwrap();
    g.memset_2d(p, 16, 7, 1, 3, 2, st).unwrap();
    let graph = g.end_capture(st).unwrap();
    assert_eq!(g.graph_len(graph).unwrap(), 2);
    drop(g);
    assert_eq!(read_u32s(&s, p, 1)[0], 0x0102_0304);
    let exec = s.lock().instantiate(graph).unwrap();
    // SAFETY: the graph names no host memory or host functions.
    unsafe { s.lock().launch_graph(exec, st) }.unwrap();
    s.lock().synchronize_stream(st).unwrap();
    let mut bytes = vec![0u8; 32];
    s.lock().copy_from_device(&mut bytes, p, 0).unwrap();
    assert_eq!(&bytes[..4], &[7, 7, 7, 0x01]);
    assert_eq!(&bytes[16..20], &[7, 7, 7, 0x01]);
    drop(s);
    assert_eq!(node.ended_with(), 0);
}

/// `cuCtxGetLimit`/`cuCtxSetLimit` answer from the session: the driver's defaults, what the
/// application set, the persisting L2 size capped at the device's maximum, unknown limits
/// refused.
#[test]
fn limits_are_the_sessions_and_the_persisting_l2_size_is_capped() {
    let node = Node::start();
    let s = session(&node);
    assert_eq!(s.limit(0).unwrap(), 1024, "stack size");
    assert_eq!(s.limit(2).unwrap(), 8 << 20, "malloc heap size");
    s.set_limit(0, 4096).unwrap();
    assert_eq!(s.limit(0).unwrap(), 4096);
    let max = s.attribute(0, 108).unwrap() as usize;
    s.set_limit(6, usize::MAX).unwrap();
    assert_eq!(s.limit(6).unwrap(), max);
    s.set_limit(6, 0).unwrap();
    assert_eq!(s.limit(6).unwrap(), 0);
    for bad in [-1, 11, i32::MAX] {
        assert_eq!(status(s.limit(bad)), INVALID_VALUE);
        assert_eq!(status(s.set_limit(bad, 1)), INVALID_VALUE);
    }
    // As NVIDIA's driver 580 answers on an H200 (tests/conformance/fixtures): the stack size is
    // kept in 16-byte units; the context's shared memory is what a block may opt into and
    // cannot be set; the sync depth is unsupported from compute capability 9.0 on (the emulated
    // default model is 10.0); a limit newer than the driver is unknown.
    s.set_limit(0, 1000).unwrap();
    assert_eq!(s.limit(0).unwrap(), 1008);
    assert_eq!(s.limit(7).unwrap() as i32, s.attribute(0, 97).unwrap());
    assert_eq!(status(s.set_limit(7, 1)), 800);
    assert_eq!(s.limit(8).unwrap(), 0, "not a CIG context");
    assert_eq!(status(s.limit(3)), 215);
    assert_eq!(status(s.limit(9)), 215);
    assert_eq!(status(s.limit(10)), INVALID_VALUE);
    // Another session starts from the defaults.
    assert_eq!(session(&node).limit(0).unwrap(), 1024);
}

#[test]
fn contexts_primary_created_current_and_stack() {
    let node = Node::start();
    let s = node.connect();
    let mut g = s.lock();
    // No context yet: work that needs one says so.
    assert_eq!(status(g.alloc(64)), INVALID_CONTEXT);
    assert_eq!(
        status(g.synchronize(SyncScope::Context(0))),
        INVALID_CONTEXT
    );
    let primary = g.retain_primary(0).unwrap();
    assert_eq!(g.retain_primary(0).unwrap(), primary);
    assert!(g.primary_state(0).unwrap().1);
    assert_eq!(status(g.retain_primary(1)), 101);
    g.set_current(primary).unwrap();
    assert_eq!(g.current().unwrap(), (primary, 0));
    let created = g.create_context(0, 0).unwrap();
    assert_eq!(state::current_context(), created);
    g.alloc(64).unwrap();
    g.synchronize(SyncScope::Context(0)).unwrap();
    assert_eq!(status(g.destroy_context(primary)), INVALID_CONTEXT);
    g.destroy_context(created).unwrap();
    assert_eq!(status(g.destroy_context(created)), INVALID_CONTEXT);
    assert_eq!(state::current_context(), primary);
    g.release_primary(0).unwrap();
    g.release_primary(0).unwrap();
    assert_eq!(status(g.release_primary(0)), INVALID_CONTEXT);
}

#[test]
fn managed_memory_moves_at_device_work_and_synchronize() {
    let node = Node::start();
    // Over the socket itself: moved managed memory (on the rings it is shared: below).
    let s = socket_session(&node);
    let p = s.lock().alloc_managed(4096).unwrap();
    assert!(s.lock().allocation(p).unwrap().is_moved_managed());
    // SAFETY: `p` is the managed allocation's host mapping, 4096 bytes; no device work is
    // outstanding while the host touches it.
    let host = unsafe { std::slice::from_raw_parts_mut(p as usize as *mut u8, 4096) };
    host.fill(3);
    // Device work: the device gets the host's bytes first, then the memset runs.
    s.lock().memset(p, 9, 1, 8, 0).unwrap();
    s.lock().synchronize(SyncScope::Context(0)).unwrap();
    assert_eq!(&host[..8], &[9; 8]);
    assert!(host[8..].iter().all(|&b| b == 3));
    // A synchronous copy from the device also brings managed memory back.
    host[100] = 42;
    let other = s.lock().alloc(16).unwrap();
    s.lock().copy_on_device(other, p + 96, 16, 0).unwrap();
    let mut back = [0u8; 16];
    s.lock().copy_from_device(&mut back, other, 0).unwrap();
    assert_eq!(back[4], 42);
    assert!(s.lock().is_managed_range(p, 4096));
    assert!(!s.lock().is_managed_range(other, 16));
    s.lock().free(p).unwrap();
    drop(s);
    assert_eq!(node.ended_with(), 0);
}

#[test]
fn launches_pack_parameters_and_report_faults_at_the_next_synchronize() {
    let node = Node::start();
    let s = session(&node);
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let f = s.lock().function(m, "fill").unwrap();
    assert_eq!(s.lock().function(m, "fill").unwrap(), f, "cached");
    assert_eq!(status(s.lock().function(m, "nope")), 500);
    let out = s.lock().alloc(1000 * 4).unwrap();
    launch_fill(&s, f, out, 100, 1000, 0);
    let v = read_u32s(&s, out, 1000);
    assert!(v.iter().enumerate().all(|(i, &x)| x == 100 + i as u32));
    // A kernel writing outside the session's memory: the launch is quiet, the fault comes back
    // with the next synchronizing call, once.
    launch_fill(&s, f, 0x10, 0, 1, 0);
    assert_eq!(
        status(s.lock().synchronize(SyncScope::Context(0))),
        ILLEGAL_ADDRESS
    );
    // Bad launch shapes and handles.
    let zero = LaunchConfig {
        grid: [0, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        stream: 0,
        attributes: Vec::new(),
    };
    assert_eq!(status(zero.check()), INVALID_VALUE);
    assert_eq!(status(s.lock().launch_layout(12345)), INVALID_HANDLE);
}

#[test]
fn streams_and_events_order_time_and_check_handles() {
    let node = Node::start();
    let s = session(&node);
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let f = s.lock().function(m, "fill").unwrap();
    let out = s.lock().alloc(256 * 4).unwrap();
    let (st, start, end) = {
        let mut g = s.lock();
        (
            g.create_stream(0, -9).unwrap(),
            g.create_event(0).unwrap(),
            g.create_event(0).unwrap(),
        )
    };
    assert_eq!(
        s.lock().stream(st).unwrap().unwrap().priority,
        -5,
        "clamped"
    );
    s.lock().record_event(start, st).unwrap();
    launch_fill(&s, f, out, 1, 256, st);
    s.lock().record_event(end, st).unwrap();
    s.lock().synchronize_event(end).unwrap();
    s.lock().query_event(end).unwrap();
    s.lock().query_stream(st).unwrap();
    assert!(s.lock().elapsed(start, end).unwrap() >= 0.0);
    // A stream waits for an event recorded on another.
    let st2 = s.lock().create_stream(0, 0).unwrap();
    s.lock().stream_wait_event(st2, end).unwrap();
    s.lock().synchronize_stream(st2).unwrap();
    assert_eq!(read_u32s(&s, out, 256)[255], 256);
    // Pinned memory is filled by an asynchronous copy at the next synchronization.
    let pinned = s.lock().host_alloc(1024, 0).unwrap();
    // SAFETY: `pinned` stays allocated until the synchronize below has filled it.
    unsafe { s.lock().copy_from_device_async(pinned, out, 1024, st) }.unwrap();
    s.lock().synchronize_stream(st).unwrap();
    // SAFETY: page-locked memory of 1024 bytes handed out above.
    let got = unsafe { std::slice::from_raw_parts(pinned, 1024) };
    assert_eq!(&got[..4], &1u32.to_le_bytes());
    s.lock().host_free(pinned as usize).unwrap();
    // Timing-disabled events, destroyed handles.
    let untimed = s.lock().create_event(0x2).unwrap();
    s.lock().record_event(untimed, 0).unwrap();
    assert_eq!(status(s.lock().elapsed(start, untimed)), INVALID_HANDLE);
    s.lock().destroy_stream(st).unwrap();
    assert_eq!(status(s.lock().destroy_stream(st)), INVALID_HANDLE);
    assert_eq!(status(s.lock().synchronize_stream(st)), INVALID_HANDLE);
    s.lock().destroy_event(end).unwrap();
    assert_eq!(status(s.lock().record_event(end, 0)), INVALID_HANDLE);
}

#[test]
fn device_reset_frees_memory_and_loads_libraries_again() {
    let node = Node::start();
    let s = session(&node);
    let lib = s.lock().load_library(FILL_PTX.as_bytes().to_vec()).unwrap();
    let k = s.lock().library_kernel(lib, "fill").unwrap();
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let p = s.lock().alloc(64).unwrap();
    let gone = s.lock().reset_device(0).unwrap();
    assert!(gone.contains(&state::current_context()));
    // Memory and modules are gone; the library and its kernel work again once the primary
    // context is current again.
    assert_eq!(status(s.lock().free(p)), INVALID_VALUE);
    assert_eq!(status(s.lock().function(m, "fill")), INVALID_HANDLE);
    let ctx = state::current_context();
    s.lock().set_current(ctx).unwrap();
    let out = s.lock().alloc(64 * 4).unwrap();
    launch_fill(&s, k, out, 5, 64, 0);
    assert_eq!(read_u32s(&s, out, 64)[63], 68);
    s.lock().unload_library(lib).unwrap();
    assert_eq!(status(s.lock().launch_layout(k)), INVALID_HANDLE);
}

#[test]
fn stream_ordered_allocation_charges_pools() {
    let node = Node::start();
    let s = session(&node);
    let mut g = s.lock();
    let pool = g.create_pool(0, 4096, None);
    let a = g.alloc_async(4096, pool, 0).unwrap();
    assert_eq!(g.pool_stats(pool).unwrap().used, 4096);
    assert_eq!(status(g.alloc_async(1, pool, 0)), 2, "over the pool's size");
    assert_eq!(g.allocation(a).unwrap().pool(), Some(pool));
    g.free_async(a, 0).unwrap();
    assert_eq!(g.pool_stats(pool).unwrap().used, 0);
    assert_eq!(g.pool_stats(pool).unwrap().high, 4096);
    let dflt = g.current_pool(0);
    g.alloc_async(100, dflt, 0).unwrap();
    g.destroy_pool(pool).unwrap();
    assert_eq!(status(g.destroy_pool(pool)), INVALID_VALUE);
}

/// A session over the unix socket itself: no host arena, so managed memory moves
/// (`MemoryKind::Managed`) rather than being shared with the device.
fn socket_session(node: &Node) -> Session {
    let hello = gpufuse_client::Connection::hello(
        gpufuse_proto::SessionKind::Cuda,
        String::new(),
        Default::default(),
    );
    let (conn, accepted) = gpufuse_client::Connection::open_with(
        &node.address,
        &hello,
        gpufuse_client::Transport::Socket,
    )
    .unwrap();
    let s = Session::over(conn, accepted, hello);
    let ctx = s.lock().retain_primary(0).unwrap();
    s.lock().set_current(ctx).unwrap();
    s
}

#[test]
fn a_session_moves_to_another_worker_with_its_memory_modules_and_streams() {
    let from = Node::start();
    let to = Node::start();
    // Moved managed memory goes with the session (shared managed memory cannot: below).
    let s = socket_session(&from);
    assert_eq!(s.attribute(0, 89), Some(0), "no concurrent managed access");
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let f = s.lock().function(m, "fill").unwrap();
    let lib = s.lock().load_library(FILL_PTX.as_bytes().to_vec()).unwrap();
    let k = s.lock().library_kernel(lib, "fill").unwrap();
    let out = s.lock().alloc(512 * 4).unwrap();
    let managed = s.lock().alloc_managed(64).unwrap();
    let st = s.lock().create_stream(0, 0).unwrap();
    let ev = s.lock().create_event(0).unwrap();
    launch_fill(&s, f, out, 1000, 512, st);
    launch_fill(&s, f, managed, 7, 16, 0);
    let old_id = s.session_id();

    s.reconnect(&to.address).unwrap();
    // The old worker's session ended and freed everything it held.
    assert_eq!(from.ended_with(), 0);
    let _ = old_id;
    // Same addresses, same contents, same handles.
    assert_eq!(read_u32s(&s, out, 512)[511], 1511);
    // SAFETY: the managed allocation's host mapping, 64 bytes; no device work outstanding.
    let host = unsafe { std::slice::from_raw_parts(managed as usize as *const u32, 16) };
    assert_eq!(host[15], 22);
    launch_fill(&s, f, out, 1, 512, st);
    s.lock().record_event(ev, st).unwrap();
    s.lock().synchronize_event(ev).unwrap();
    assert_eq!(read_u32s(&s, out, 512)[0], 1);
    launch_fill(&s, k, out, 50, 1, 0);
    assert_eq!(read_u32s(&s, out, 1)[0], 50);
    drop(s);
    assert_eq!(to.ended_with(), 0);
}

/// Managed memory shared with the device (a session on the rings, with its host arena): the
/// device reports concurrent managed access, kernels write the host's pages with no copy, and
/// a reconnect is refused with the reason while such memory exists (the new worker could not
/// map it), leaving the session where it was; once freed, the session moves.
#[test]
fn shared_managed_memory_is_used_at_once_and_keeps_its_session_in_place() {
    let from = Node::start();
    let to = Node::start();
    let s = session(&from);
    assert_eq!(
        s.attribute(0, 89),
        Some(1),
        "concurrent managed access on the rings"
    );
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let f = s.lock().function(m, "fill").unwrap();
    let managed = s.lock().alloc_managed(64).unwrap();
    assert!(s.lock().allocation(managed).unwrap().is_shared_managed());
    launch_fill(&s, f, managed, 7, 16, 0);
    s.lock().synchronize(SyncScope::Context(0)).unwrap();
    // SAFETY: the allocation's host mapping, 64 bytes, alive until it is freed below.
    let host = unsafe { std::slice::from_raw_parts(managed as usize as *const u32, 16) };
    assert_eq!(host[15], 22);
    let moved = s.reconnect(&to.address);
    assert!(
        matches!(moved, Err(ClientError::Reconnect(ref why)) if why.contains("shared with the device")),
        "{moved:?}"
    );
    assert_eq!(
        to.ended_with(),
        0,
        "the new worker's half-made session is dropped"
    );
    // Still on the first worker, the memory still shared.
    launch_fill(&s, f, managed, 100, 16, 0);
    s.lock().synchronize(SyncScope::Context(0)).unwrap();
    assert_eq!(host[0], 100);
    s.lock().free(managed).unwrap();
    assert_eq!(status(s.lock().free(managed)), INVALID_VALUE);
    s.reconnect(&to.address).unwrap();
    assert_eq!(from.ended_with(), 0, "the old worker freed everything");
    drop(s);
    assert_eq!(to.ended_with(), 0);
}

#[test]
fn a_reconnect_that_cannot_keep_addresses_leaves_the_session_where_it_was() {
    let from = Node::start();
    let to = Node::start();
    let s = session(&from);
    let a = s.lock().alloc(4096).unwrap();
    let b = s.lock().alloc(4096).unwrap();
    s.lock().copy_to_device(b, &[5; 4096], 0).unwrap();
    // Freed in between: a fresh worker would place `b` where `a` was.
    s.lock().free(a).unwrap();
    let moved = s.reconnect(&to.address);
    assert!(
        matches!(moved, Err(ClientError::Reconnect(ref why)) if why.contains("placed at")),
        "{moved:?}"
    );
    // The new worker's half-made session is dropped; the old one goes on.
    assert_eq!(to.ended_with(), 0);
    let mut back = [0u8; 16];
    s.lock().copy_from_device(&mut back, b, 0).unwrap();
    assert_eq!(back, [5; 16]);
}

#[test]
fn captured_work_replays_on_each_graph_launch() {
    let node = Node::start();
    let s = session(&node);
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let f = s.lock().function(m, "fill").unwrap();
    let out = s.lock().alloc(64 * 4).unwrap();
    let st = s.lock().create_stream(0, 0).unwrap();
    s.lock().begin_capture(st).unwrap();
    assert_eq!(status(s.lock().begin_capture(st)), 900, "already capturing");
    assert!(s.lock().capture_info(st).unwrap().is_some());
    // Captured, not run: the memory stays zero; synchronous work is refused.
    s.lock().memset(out, 0, 4, 64, st).unwrap();
    launch_fill(&s, f, out, 10, 64, st);
    let mut probe = [0u8; 4];
    assert_eq!(status(s.lock().copy_from_device(&mut probe, out, st)), 900);
    let graph = s.lock().end_capture(st).unwrap();
    assert_eq!(s.lock().graph_len(graph).unwrap(), 2);
    assert_eq!(read_u32s(&s, out, 1)[0], 0);
    let exec = s.lock().instantiate(graph).unwrap();
    for _ in 0..2 {
        s.lock().memset(out, 0, 4, 64, 0).unwrap();
        // SAFETY: the graph names no host memory or host functions.
        unsafe { s.lock().launch_graph(exec, st) }.unwrap();
        s.lock().synchronize_stream(st).unwrap();
        assert_eq!(read_u32s(&s, out, 64)[63], 73);
    }
    s.lock().destroy_graph(graph).unwrap();
    s.lock().destroy_exec(exec).unwrap();
    // SAFETY: as above.
    let gone = unsafe { s.lock().launch_graph(exec, st) };
    assert_eq!(status(gone), INVALID_HANDLE);
}

#[test]
fn virtual_memory_maps_physical_memory_and_a_reconnect_refuses_it() {
    let from = Node::start();
    let to = Node::start();
    let s = session(&from);
    let granule = 2 << 20;
    let h = s.lock().create_physical(0, granule).unwrap();
    let va = s.lock().reserve_address(granule, 0).unwrap();
    assert_eq!(
        status(s.lock().map(va, granule / 2, 0, h)),
        801,
        "part of it"
    );
    s.lock().map(va, granule, 0, h).unwrap();
    s.lock().all_mapped(va, granule).unwrap();
    assert_eq!(s.lock().mapping_handle(va), Some(h));
    s.lock().copy_to_device(va + 8, &[1, 2, 3], 0).unwrap();
    let mut back = [0u8; 3];
    s.lock().copy_from_device(&mut back, va + 8, 0).unwrap();
    assert_eq!(back, [1, 2, 3]);
    // Mapped memory is not freed with cuMemFree.
    assert_eq!(status(s.lock().free(va)), INVALID_VALUE);
    let moved = s.reconnect(&to.address);
    assert!(matches!(moved, Err(ClientError::Reconnect(_))), "{moved:?}");
    assert_eq!(to.ended_with(), 0);
    s.lock().unmap(va, granule).unwrap();
    assert_eq!(status(s.lock().all_mapped(va, 1)), INVALID_VALUE);
    s.lock().release_physical(h).unwrap();
    s.lock().free_address(va, granule).unwrap();
    drop(s);
    assert_eq!(from.ended_with(), 0);
}

/// `probe(u64, f32, .align 8 .b8[24], u8)`: parameters at offsets 0, 8, 16 and 40.
const PROBE_PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64

.visible .entry probe(
\t.param .u64 probe_param_0,
\t.param .f32 probe_param_1,
\t.param .align 8 .b8 probe_param_2[24],
\t.param .u8 probe_param_3
)
{
\tret;
}
\0";

#[test]
fn the_worker_receives_the_exact_packed_parameters() {
    let node = Node::start();
    let s = session(&node);
    assert_eq!(s.devices.len(), 1);
    assert_eq!(status(s.lock().alloc(1 << 50)), 2, "impossible allocation");
    let m = s.lock().load_module(PROBE_PTX.as_bytes().to_vec()).unwrap();
    let f = s.lock().function(m, "probe").unwrap();
    let (function, layout) = s.lock().launch_layout(f).unwrap();
    let slots: Vec<(u32, u32)> = layout.iter().map(|p| (p.offset, p.size)).collect();
    assert_eq!(slots, [(0, 8), (8, 4), (16, 24), (40, 1)]);
    let (p0, p1, p2, p3) = (
        0x1122_3344_5566_7788u64.to_le_bytes(),
        1.5f32.to_le_bytes(),
        std::array::from_fn::<u8, 24, _>(|i| i as u8 + 1),
        [0xABu8],
    );
    let args: [&[u8]; 4] = [&p0, &p1, &p2, &p3];
    let params = pack_params(&layout, |i, _| Ok(args[i])).unwrap();
    let mut expected = vec![0u8; 41];
    expected[0..8].copy_from_slice(&p0);
    expected[8..12].copy_from_slice(&p1);
    expected[16..40].copy_from_slice(&p2);
    expected[40] = 0xAB;
    assert_eq!(params, expected);
    // A value of the wrong size is refused, not packed.
    assert_eq!(
        status(pack_params(&layout, |i, _| Ok(if i == 1 {
            &p0[..]
        } else {
            args[i]
        }))),
        INVALID_VALUE
    );
    let config = LaunchConfig {
        grid: [2, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        stream: 0,
        attributes: Vec::new(),
    };
    s.lock().launch(function, config, params).unwrap();
    s.lock().synchronize(SyncScope::Context(0)).unwrap();
    let log = s.lock().launch_log(16).unwrap();
    let last = log.last().unwrap();
    assert_eq!(last.function_name, "probe");
    assert_eq!((last.grid, last.block), ([2, 1, 1], [32, 1, 1]));
    assert_eq!(last.params, expected);
}

/// `inc(u32 *dst, const u32 *src, u32 n)`: `dst[i] = src[i] + 1` for every thread `i < n`.
const INC_PTX: &str = "\
.version 7.0
.target sm_80
.address_size 64

.visible .entry inc(
\t.param .u64 inc_param_0,
\t.param .u64 inc_param_1,
\t.param .u32 inc_param_2
)
{
\t.reg .pred %p<2>;
\t.reg .b32 %r<8>;
\t.reg .b64 %rd<8>;

\tld.param.u64 %rd1, [inc_param_0];
\tld.param.u64 %rd2, [inc_param_1];
\tld.param.u32 %r2, [inc_param_2];
\tmov.u32 %r3, %ctaid.x;
\tmov.u32 %r4, %ntid.x;
\tmov.u32 %r5, %tid.x;
\tmad.lo.s32 %r6, %r3, %r4, %r5;
\tsetp.ge.u32 %p1, %r6, %r2;
\t@%p1 bra $L__END;
\tcvta.to.global.u64 %rd3, %rd1;
\tcvta.to.global.u64 %rd4, %rd2;
\tmul.wide.u32 %rd5, %r6, 4;
\tadd.s64 %rd6, %rd3, %rd5;
\tadd.s64 %rd7, %rd4, %rd5;
\tld.global.u32 %r7, [%rd7];
\tadd.s32 %r7, %r7, 1;
\tst.global.u32 [%rd6], %r7;
$L__END:
\tret;
}
\0";

/// A launch as the shim makes it (`Session::launch_kernel`: the stream's lane once granted).
fn launch_args(s: &Session, f: u64, args: &[&[u8]], n: u32, stream: StreamRef) {
    let l = KernelLaunch {
        function: f,
        grid: [n.div_ceil(64), 1, 1],
        block: [64, 1, 1],
        shared_mem: 0,
        stream,
        attributes: Vec::new(),
    };
    s.launch_kernel(l, &mut |layout| {
        pack_params(layout, |i, size| {
            assert_eq!(args[i].len(), size);
            Ok(args[i])
        })
    })
    .unwrap();
}

fn fill_on(s: &Session, fill: u64, out: u64, base: u32, n: u32, stream: StreamRef) {
    let (p, b, c) = (out.to_le_bytes(), base.to_le_bytes(), n.to_le_bytes());
    launch_args(s, fill, &[&p, &b, &c], n, stream);
}

fn inc_on(s: &Session, inc: u64, dst: u64, src: u64, n: u32, stream: StreamRef) {
    let (d, r, c) = (dst.to_le_bytes(), src.to_le_bytes(), n.to_le_bytes());
    launch_args(s, inc, &[&d, &r, &c], n, stream);
}

/// `fill(a, base)`, then `rounds` increments bouncing between `a` and `b` (each reads what the
/// one before wrote, so any reordering within the stream shows), ending in `a`: every element
/// is `base + i + rounds`.
fn chain(
    s: &Session,
    fns: (u64, u64),
    bufs: (u64, u64),
    base: u32,
    n: u32,
    rounds: u32,
    st: StreamRef,
) {
    let (fill, inc) = fns;
    let (a, b) = bufs;
    fill_on(s, fill, a, base, n, st);
    for r in 0..rounds {
        if r % 2 == 0 {
            inc_on(s, inc, b, a, n, st);
        } else {
            inc_on(s, inc, a, b, n, st);
        }
    }
}

fn expect_chain(got: &[u32], base: u32, rounds: u32) {
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, base + i as u32 + rounds, "element {i}");
    }
}

const PER_THREAD_DEFAULT: StreamRef = StreamRef {
    handle: 0,
    per_thread_default: true,
};

#[test]
fn threads_on_their_own_streams_keep_each_streams_order_through_their_lanes() {
    let node = Node::start();
    let s = std::sync::Arc::new(session(&node));
    let ctx = state::current_context();
    let inc_m = s.lock().load_module(INC_PTX.as_bytes().to_vec()).unwrap();
    let fill_m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let inc = s.lock().function(inc_m, "inc").unwrap();
    let fill = s.lock().function(fill_m, "fill").unwrap();
    const N: u32 = 256;
    const ROUNDS: u32 = 300; // over 64 KiB of frames per stream: lanes fill and drain
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                state::set_current_context(ctx);
                let mut bufs = Vec::new();
                for _ in 0..4 {
                    bufs.push(s.lock().alloc(u64::from(N) * 4).unwrap());
                }
                let st = s.lock().create_stream(1, 0).unwrap();
                let own = StreamRef::legacy(st);
                // Interleaved: this thread's stream and its per-thread default stream.
                for k in 0..3u32 {
                    let base = 1000 * (t * 10 + k);
                    chain(&s, (fill, inc), (bufs[0], bufs[1]), base, N, ROUNDS, own);
                    chain(
                        &s,
                        (fill, inc),
                        (bufs[2], bufs[3]),
                        base + 7,
                        N,
                        ROUNDS,
                        PER_THREAD_DEFAULT,
                    );
                    s.lock().synchronize_stream(st).unwrap();
                    s.lock().synchronize_stream(2).unwrap(); // CU_STREAM_PER_THREAD
                    expect_chain(&read_u32s(&s, bufs[0], N as usize), base, ROUNDS);
                    expect_chain(&read_u32s(&s, bufs[2], N as usize), base + 7, ROUNDS);
                }
                // A launch on the stream after it is destroyed is refused, lane or not.
                s.lock().destroy_stream(st).unwrap();
                let l = KernelLaunch {
                    function: fill,
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    shared_mem: 0,
                    stream: own,
                    attributes: Vec::new(),
                };
                let r = s.launch_kernel(l, &mut |_| Ok(vec![0; 16]));
                assert_eq!(status(r), INVALID_HANDLE);
            })
        })
        .collect();
    // Meanwhile this thread synchronizes the whole context, again and again.
    for _ in 0..20 {
        s.lock().synchronize(SyncScope::Context(0)).unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
    s.lock().synchronize(SyncScope::Context(0)).unwrap();
    drop(s);
    assert_eq!(node.ended_with(), 0);
}

#[test]
fn an_event_recorded_on_one_thread_orders_a_stream_waiting_on_another() {
    let node = Node::start();
    let s = std::sync::Arc::new(session(&node));
    let ctx = state::current_context();
    let inc_m = s.lock().load_module(INC_PTX.as_bytes().to_vec()).unwrap();
    let fill_m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let inc = s.lock().function(inc_m, "inc").unwrap();
    let fill = s.lock().function(fill_m, "fill").unwrap();
    const N: u32 = 1024;
    let (x, scratch, y) = {
        let mut g = s.lock();
        (
            g.alloc(u64::from(N) * 4).unwrap(),
            g.alloc(u64::from(N) * 4).unwrap(),
            g.alloc(u64::from(N) * 4).unwrap(),
        )
    };
    let (tx, rx) = mpsc::channel::<u64>();
    let producer = {
        let s = s.clone();
        std::thread::spawn(move || {
            state::set_current_context(ctx);
            let st = s.lock().create_stream(1, 0).unwrap();
            for round in 0..5u32 {
                let ev = s.lock().create_event(0).unwrap();
                // Launches through the lane (granted by the first), then the event.
                chain(
                    &s,
                    (fill, inc),
                    (x, scratch),
                    round * 100_000,
                    N,
                    40,
                    StreamRef::legacy(st),
                );
                s.lock().record_event(ev, st).unwrap();
                tx.send(ev).unwrap();
                // Nothing more on x until the consumer is done with this round.
                s.lock().synchronize_event(ev).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let consumer = {
        let s = s.clone();
        std::thread::spawn(move || {
            state::set_current_context(ctx);
            let st = s.lock().create_stream(1, 0).unwrap();
            for round in 0..5u32 {
                let ev = rx.recv_timeout(Duration::from_secs(30)).unwrap();
                s.lock().stream_wait_event(st, ev).unwrap();
                inc_on(&s, inc, y, x, N, StreamRef::legacy(st));
                s.lock().synchronize_stream(st).unwrap();
                expect_chain(&read_u32s(&s, y, N as usize), round * 100_000, 41);
            }
        })
    };
    producer.join().unwrap();
    consumer.join().unwrap();
    assert!(s.lanes().registered() >= 1);
}

#[test]
fn a_stream_that_starts_capturing_stops_using_its_lane() {
    let node = Node::start();
    let s = session(&node);
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let fill = s.lock().function(m, "fill").unwrap();
    let out = s.lock().alloc(64 * 4).unwrap();
    let st = s.lock().create_stream(1, 0).unwrap();
    let own = StreamRef::legacy(st);
    fill_on(&s, fill, out, 1, 64, own); // grants the lane
    fill_on(&s, fill, out, 2, 64, own); // through the lane
    s.lock().synchronize_stream(st).unwrap();
    assert_eq!(read_u32s(&s, out, 64)[0], 2);
    s.lock().begin_capture(st).unwrap();
    fill_on(&s, fill, out, 3, 64, own); // recorded, not run
    let graph = s.lock().end_capture(st).unwrap();
    assert_eq!(s.lock().graph_len(graph).unwrap(), 1);
    s.lock().synchronize_stream(st).unwrap();
    assert_eq!(
        read_u32s(&s, out, 64)[0],
        2,
        "a captured launch does not run"
    );
    let exec = s.lock().instantiate(graph).unwrap();
    // SAFETY: the graph names no host memory or host functions.
    unsafe { s.lock().launch_graph(exec, st) }.unwrap();
    s.lock().synchronize_stream(st).unwrap();
    assert_eq!(read_u32s(&s, out, 64)[0], 3, "it runs with its graph");
    // After the capture the stream gets its lane again.
    fill_on(&s, fill, out, 4, 64, own);
    fill_on(&s, fill, out, 5, 64, own);
    s.lock().synchronize_stream(st).unwrap();
    assert_eq!(read_u32s(&s, out, 64)[63], 5 + 63);
}

#[test]
fn a_fault_of_a_launch_through_a_lane_is_reported_by_the_next_synchronize() {
    let node = Node::start();
    let s = session(&node);
    let m = s.lock().load_module(FILL_PTX.as_bytes().to_vec()).unwrap();
    let fill = s.lock().function(m, "fill").unwrap();
    let out = s.lock().alloc(64 * 4).unwrap();
    let st = s.lock().create_stream(1, 0).unwrap();
    let own = StreamRef::legacy(st);
    fill_on(&s, fill, out, 1, 64, own); // grants the lane
    fill_on(&s, fill, 0x10, 1, 64, own); // through the lane, to an address nobody has
    assert_eq!(status(s.lock().synchronize_stream(st)), ILLEGAL_ADDRESS);
}
