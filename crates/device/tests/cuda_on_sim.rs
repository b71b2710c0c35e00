//! The real-GPU backend (`gpufuse_device::cuda`) against the simulated driver
//! (`gpufuse-cuda-sim`, a test double that keeps a wall-time timeline of streams, engines and
//! events): the asynchronous device layer's control flow, checked without a GPU.
//!
//! - queued kernels keep the GPU busy: N launches of 20 us kernels take about N x 20 us, and
//!   enqueueing them takes far less;
//! - device time is the GPU's own measure of the work, not the host's;
//! - streams, events and the legacy stream order work as CUDA orders it;
//! - copies from the client's host arena are DMA once its pages are locked, marked in its pin
//!   map first, and none are locked without a pin map;
//! - a fault of work in flight is reported by the next wait.

use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use gpufuse_cuda_driver::{Driver, HostSpan};
use gpufuse_cuda_sim::SimStats;
use gpufuse_device::cuda::CudaDevice;
use gpufuse_device::{status, Device, KernelLaunch, ModuleId};

const PTX: &str = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry sim_add_u32(.param .u64 p, .param .u32 n, .param .u32 v) { ret; }
.visible .entry spin_us20() { ret; }
.visible .entry spin_us2000() { ret; }
.visible .entry spin_us100() { ret; }
";

/// The simulated driver cargo built beside this test (`deps/` from `cargo test`, or the
/// profile directory from `cargo build`): the newer.
fn sim_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps directory");
    [
        Some(deps.to_path_buf()),
        deps.parent().map(|p| p.to_path_buf()),
    ]
    .into_iter()
    .flatten()
    .map(|d| d.join("libgpufuse_cuda_sim.so"))
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max_by_key(|(t, _)| *t)
    .map(|(_, p)| p)
    .expect("libgpufuse_cuda_sim.so beside the test (cargo builds it with the tests)")
}

struct Sim {
    lib: libloading::Library,
}

static SIM: OnceLock<Sim> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());
static NEXT_WINDOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A fresh session's device on the simulated GPU, one test at a time (one machine).
fn device() -> (MutexGuard<'static, ()>, CudaDevice, &'static Sim) {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let sim = SIM.get_or_init(|| {
        let path = sim_path();
        std::env::set_var("GPUFUSE_CUDA_DRIVER", &path);
        // SAFETY: the simulated driver's initializers have no preconditions.
        let lib = unsafe { libloading::Library::new(&path) }.expect("load the simulated driver");
        Sim { lib }
    });
    let driver = Driver::load().expect("the simulated driver loads through GPUFUSE_CUDA_DRIVER");
    let n = NEXT_WINDOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = 0x2000_0000_0000 + n * (1 << 40);
    let d = CudaDevice::new(driver, 0, base, 16 << 30).expect("a session's device");
    (guard, d, sim)
}

impl Sim {
    fn stats(&self) -> SimStats {
        // SAFETY: the test double's export, with this signature (its crate docs).
        let f = unsafe {
            self.lib
                .get::<unsafe extern "C" fn(*mut SimStats) -> i32>(b"gpufuse_sim_stats\0")
        }
        .expect("gpufuse_sim_stats");
        let mut s = SimStats::default();
        // SAFETY: `s` is a writable SimStats.
        assert_eq!(unsafe { f(&mut s) }, 0);
        s
    }

    fn reset(&self) {
        // SAFETY: as above.
        let f = unsafe {
            self.lib
                .get::<unsafe extern "C" fn() -> i32>(b"gpufuse_sim_reset_stats\0")
        }
        .expect("gpufuse_sim_reset_stats");
        // SAFETY: no arguments.
        assert_eq!(unsafe { f() }, 0);
    }
}

fn module(d: &mut CudaDevice) -> ModuleId {
    d.load_module(format!("{PTX}\0").as_bytes())
        .expect("PTX loads")
}

fn launch(
    d: &mut CudaDevice,
    m: ModuleId,
    name: &str,
    params: &[u8],
    stream: u64,
) -> Result<(), gpufuse_device::DeviceError> {
    d.launch(&KernelLaunch {
        module: m,
        function: name,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        params,
        stream,
        cooperative: false,
        cancel: None,
    })
}

/// `sim_add_u32(ptr, n, value)`'s parameter bytes.
fn add(ptr: u64, n: u32, value: u32) -> Vec<u8> {
    let mut p = ptr.to_le_bytes().to_vec();
    p.extend_from_slice(&n.to_le_bytes());
    p.extend_from_slice(&value.to_le_bytes());
    p
}

/// Wall-clock checks on a shared 2-core machine: up to three attempts, the last one's failure
/// reported.
fn attempts(mut f: impl FnMut() -> Result<(), String>) {
    let mut last = String::new();
    for _ in 0..3 {
        match f() {
            Ok(()) => return,
            Err(e) => last = e,
        }
    }
    panic!("{last}");
}

#[test]
fn queued_kernels_keep_the_gpu_busy_and_device_time_is_the_gpus() {
    let (_g, mut d, sim) = device();
    let m = module(&mut d);
    d.create_stream(7, 0, 0).unwrap();
    // Warm: the function handle and parameter layout are asked once.
    launch(&mut d, m, "spin_us100", &[], 7).unwrap();
    d.synchronize().unwrap();
    let n = 200u32;
    let ideal = Duration::from_micros(100 * n as u64);
    attempts(|| {
        let before = d.settle();
        sim.reset();
        let t = Instant::now();
        for _ in 0..n {
            launch(&mut d, m, "spin_us100", &[], 7).unwrap();
        }
        let enqueued = t.elapsed();
        d.sync_stream(7).unwrap();
        let total = t.elapsed();
        println!(
            "{n} x 100 us kernels: enqueued in {enqueued:?}, done in {total:?} (ideal {ideal:?})"
        );
        if total < ideal.mul_f64(0.95) || total > ideal.mul_f64(1.5) {
            return Err(format!(
                "the pipeline stays full: {total:?} for {ideal:?} of kernels"
            ));
        }
        if enqueued >= total / 2 {
            return Err(format!(
                "launches are enqueued, not waited for: {enqueued:?} of {total:?}"
            ));
        }
        let s = sim.stats();
        assert_eq!(s.kernel_launches, n as u64);
        assert_eq!(
            s.stream_synchronizes + s.ctx_synchronizes,
            1,
            "one wait, where the caller waited"
        );
        let charged = d.settle() - before;
        if charged < ideal.mul_f64(0.95) || charged > ideal.mul_f64(1.2) {
            return Err(format!(
                "device time {charged:?} is the GPU's measure of {ideal:?} of kernels"
            ));
        }
        Ok(())
    });
}

#[test]
fn streams_events_and_the_legacy_stream_order_work() {
    let (_g, mut d, _sim) = device();
    let m = module(&mut d);
    let buf = d.alloc(4096).unwrap();
    d.create_stream(1, 1, 0).unwrap(); // non-blocking
    d.create_stream(2, 1, -1).unwrap();
    d.create_event(10, 0).unwrap();
    // Stream 1: a 2 ms kernel, then +1. Stream 2 waits for the event after it, then +10.
    launch(&mut d, m, "spin_us2000", &[], 1).unwrap();
    launch(&mut d, m, "sim_add_u32", &add(buf, 4, 1), 1).unwrap();
    d.record(10, 1).unwrap();
    d.wait_event(2, 10).unwrap();
    launch(&mut d, m, "sim_add_u32", &add(buf, 4, 10), 2).unwrap();
    assert_eq!(
        d.event_done(10),
        Ok(false),
        "the 2 ms kernel is still running"
    );
    assert_eq!(d.stream_done(2), Ok(false));
    let mut out = [0u8; 16];
    d.read_on(buf, &mut out, 2).unwrap();
    let words: Vec<u32> = out
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        words, [11; 4],
        "stream 2's read waited for stream 1 through the event"
    );
    assert_eq!(d.event_done(10), Ok(true));
    // Elapsed between two records around a 2 ms kernel.
    d.create_event(11, 0).unwrap();
    d.record(10, 1).unwrap();
    launch(&mut d, m, "spin_us2000", &[], 1).unwrap();
    d.record(11, 1).unwrap();
    d.sync_event(11).unwrap();
    let ms = d.elapsed(10, 11).unwrap();
    assert!(
        (1.9..2.6).contains(&ms),
        "elapsed {ms} ms around a 2 ms kernel"
    );
    // A write on the legacy stream after work on a non-blocking stream is not ordered after
    // it; on a blocking stream it is.
    d.create_stream(3, 0, 0).unwrap();
    launch(&mut d, m, "spin_us2000", &[], 3).unwrap();
    launch(&mut d, m, "sim_add_u32", &add(buf, 1, 5), 3).unwrap();
    let mut first = [0u8; 4];
    d.read_on(buf, &mut first, 0).unwrap();
    assert_eq!(
        u32::from_le_bytes(first),
        16,
        "the legacy stream waited for stream 3"
    );
    assert_eq!(d.destroy_stream(99), Err(status::INVALID_HANDLE));
    assert_eq!(d.record(99, 1), Err(status::INVALID_HANDLE));
}

/// Page-aligned host memory of `len` bytes (an arena stand-in) and the span over it.
fn host(len: usize) -> (Vec<u8>, HostSpan) {
    let mut v = vec![0u8; len + 4096];
    let off = v.as_ptr().align_offset(4096);
    // SAFETY: `[off, off + len)` of `v`, which the test keeps alive while the span is used.
    let span = unsafe { HostSpan::new(v.as_mut_ptr().add(off), len) };
    (v, span)
}

#[test]
fn arena_copies_are_dma_once_locked_and_marked_first() {
    let (_g, mut d, sim) = device();
    let (_arena, span) = host(16 << 20);
    let (mut map, _) = (vec![0u8; 8], ());
    // SAFETY: `map` outlives the device's use (the device is dropped first, below).
    let pin_map = unsafe { HostSpan::new(map.as_mut_ptr(), map.len()) };
    d.host_arena(span, Some(pin_map)).unwrap();
    let dst = d.alloc(8 << 20).unwrap();
    let part = span.sub(4 << 20, 4 << 20).unwrap();
    part.copy_from(&vec![7u8; 4 << 20]);
    sim.reset();
    d.create_stream(1, 0, 0).unwrap();
    d.write_span(dst, part, 1).unwrap();
    d.sync_stream(1).unwrap();
    let s = sim.stats();
    assert_eq!(s.htod_dma_bytes, 4 << 20, "the copy ran as DMA");
    assert_eq!(s.htod_pageable_bytes, 0);
    assert_eq!(
        &map[..4],
        [0, 0, 1, 1],
        "chunks 2 and 3 marked before locking"
    );
    let back = span.sub(8 << 20, 4 << 20).unwrap();
    d.read_span(dst, back, 1).unwrap();
    d.sync_stream(1).unwrap();
    let mut check = vec![0u8; 4 << 20];
    back.copy_to(&mut check);
    assert!(
        check.iter().all(|&b| b == 7),
        "device to host into the arena, in place"
    );
    assert_eq!(sim.stats().dtoh_dma_bytes, 4 << 20);
    drop(d);

    // Without a pin map nothing is locked: copies are pageable.
    let (_g2, mut d, sim) = {
        drop(_g);
        device()
    };
    let (_arena, span) = host(8 << 20);
    d.host_arena(span, None).unwrap();
    let dst = d.alloc(4 << 20).unwrap();
    sim.reset();
    d.write_span(dst, span.sub(0, 4 << 20).unwrap(), 0).unwrap();
    d.synchronize().unwrap();
    let s = sim.stats();
    assert_eq!((s.htod_dma_bytes, s.htod_pageable_bytes), (0, 4 << 20));
}

#[test]
fn a_fault_in_flight_is_reported_by_the_next_wait() {
    let (_g, mut d, _sim) = device();
    let m = module(&mut d);
    // An address nothing maps: the launch is accepted, the fault comes later.
    launch(&mut d, m, "sim_add_u32", &add(0x10, 1, 1), 0).expect("enqueued");
    assert_eq!(d.synchronize(), Err(status::ILLEGAL_ADDRESS));
}

#[test]
fn a_graph_is_one_driver_graph_launched_with_one_call() {
    let (_g, mut d, sim) = device();
    let m = module(&mut d);
    let buf = d.alloc(4096).unwrap();
    let mut nodes: Vec<gpufuse_device::GraphNode> = (0..49)
        .map(|_| gpufuse_device::GraphNode::Launch {
            module: m,
            function: "spin_us20".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
            params: Vec::new(),
            cooperative: false,
        })
        .collect();
    nodes.push(gpufuse_device::GraphNode::Launch {
        module: m,
        function: "sim_add_u32".into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        params: add(buf, 4, 3),
        cooperative: false,
    });
    nodes.push(gpufuse_device::GraphNode::Copy {
        dst: buf + 1024,
        src: buf,
        len: 16,
    });
    d.define_graph(1, &nodes).unwrap();
    d.create_stream(5, 0, 0).unwrap();
    sim.reset();
    let t = Instant::now();
    d.launch_graph(1, 5).unwrap();
    d.launch_graph(1, 5).unwrap();
    let enqueued = t.elapsed();
    d.sync_stream(5).unwrap();
    let s = sim.stats();
    assert_eq!(s.graph_launches, 2, "one driver call per graph launch");
    assert_eq!(s.kernel_launches, 0, "no kernel launched one by one");
    assert_eq!(s.kernels_run, 100);
    assert!(
        enqueued < Duration::from_micros(49 * 20),
        "launches are enqueued: {enqueued:?}"
    );
    let mut out = [0u8; 16];
    d.read_on(buf + 1024, &mut out, 5).unwrap();
    assert!(
        out.chunks(4)
            .all(|c| u32::from_le_bytes(c.try_into().unwrap()) == 6),
        "the copy node ran after the second add: {out:?}"
    );
    // Defined again: replaced. Destroyed: gone.
    d.define_graph(1, &nodes[..1]).unwrap();
    d.destroy_graph(1).unwrap();
    assert_eq!(
        d.launch_graph(1, 5).map_err(|e| e.status),
        Err(status::INVALID_HANDLE)
    );
    // A node the capture cannot take fails the definition and leaves the stream usable.
    let bad = [gpufuse_device::GraphNode::Launch {
        module: m,
        function: "no_such_kernel".into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        params: Vec::new(),
        cooperative: false,
    }];
    assert!(d.define_graph(2, &bad).is_err());
    d.define_graph(3, &nodes[..2]).unwrap();
    d.launch_graph(3, 0).unwrap();
    d.synchronize().unwrap();
}
