//! The simulated driver's timeline, through `gpufuse_cuda_driver::Driver`: kernels take their
//! time on one compute engine, copies overlap them on copy engines, streams, the legacy
//! stream, events, stream capture and graphs, and the test double's counters.
//!
//! Copy rates are set low here (`GPUFUSE_SIM_PINNED_GBPS=4`, `GPUFUSE_SIM_PAGEABLE_GBPS=1`),
//! so that small buffers take milliseconds. Checks with wall-clock bounds run in [`timed`]
//! (up to three attempts).

mod common;

use std::time::{Duration, Instant};

use common::*;
use gpufuse_cuda_driver::{Driver, Event, HostSpan, Stream};

fn sim() -> (std::sync::MutexGuard<'static, ()>, &'static Sim) {
    sim_with(&[
        ("GPUFUSE_SIM_PINNED_GBPS", "4"),
        ("GPUFUSE_SIM_PAGEABLE_GBPS", "1"),
    ])
}

const ONE: [u32; 3] = [1, 1, 1];
const WARP: [u32; 3] = [32, 1, 1];

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn elapsed(s: &Sim, a: Event, b: Event) -> f64 {
    s.d.event_elapsed_ms(a, b).unwrap() as f64
}

fn events<const N: usize>(s: &Sim, flags: u32) -> [Event; N] {
    [(); N].map(|()| s.d.event_create(flags).unwrap())
}

fn span(v: &mut [u8]) -> HostSpan {
    // SAFETY: the tests keep the buffer alive and untouched until the copies using the span
    // have completed.
    unsafe { HostSpan::new(v.as_mut_ptr(), v.len()) }
}

#[test]
fn queued_kernels_take_their_time_while_enqueueing_is_quick() {
    let (_g, s) = sim();
    let d = &s.d;
    let st = d.stream_create(1, 0).unwrap();
    let spin = function(s, "spin_us20");
    const N: u32 = 200;
    let expected = Duration::from_micros(N as u64 * 20);
    timed("200 queued spin_us20", || {
        d.synchronize().unwrap();
        reset_stats(s);
        let t0 = Instant::now();
        for _ in 0..N {
            d.launch(spin, ONE, WARP, 0, st, &[]).unwrap();
        }
        let enqueued = t0.elapsed();
        let busy = !d.stream_query(st).unwrap();
        d.stream_synchronize(st).unwrap();
        let total = t0.elapsed();
        ensure!(busy, "no work remained after enqueueing");
        ensure!(
            total >= expected * 9 / 10 && total <= expected * 3 / 2,
            "{N} kernels of 20 us took {total:?}"
        );
        ensure!(
            enqueued < expected / 2,
            "enqueueing took {enqueued:?} of {total:?}"
        );
        let c = stats(s);
        ensure!(c.max_queued_ops >= 100, "{c:?}");
        Ok(())
    });
    assert!(d.stream_query(st).unwrap());
    let c = stats(s);
    assert_eq!((c.kernel_launches, c.kernels_run), (N as u64, N as u64));
    assert_eq!(c.compute_busy_ns, N as u64 * 20_000);
    assert_eq!((c.stream_synchronizes, c.stream_queries), (1, 2));
    assert!(c.driver_calls >= N as u64 + 3);
    assert!(c.host_blocked_ns > 0);
    d.stream_destroy(st).unwrap();
}

#[test]
fn kernels_serialize_on_the_compute_engine_and_copies_overlap_them() {
    let (_g, s) = sim();
    let d = &s.d;
    let (a, b) = (
        d.stream_create(1, 0).unwrap(),
        d.stream_create(1, 0).unwrap(),
    );
    let k = function(s, "spin_us1000");
    let [e0, ea, eb] = events(s, 0);
    let mem = DevMem::new(s, 4 << 20);
    let mut host = Pinned::new(s, 4 << 20, 7);
    timed("serialized kernels, overlapping copy", || {
        d.synchronize().unwrap();
        // Two streams' kernels: one at a time.
        d.event_record(e0, a).unwrap();
        d.launch(k, ONE, WARP, 0, a, &[]).unwrap();
        d.launch(k, ONE, WARP, 0, b, &[]).unwrap();
        d.event_record(ea, a).unwrap();
        d.event_record(eb, b).unwrap();
        d.synchronize().unwrap();
        let (ta, tb) = (elapsed(s, e0, ea), elapsed(s, e0, eb));
        ensure!((0.99..1.3).contains(&ta), "a's kernel: {ta} ms");
        ensure!(
            (1.99..2.5).contains(&tb),
            "b's kernel ran after a's: {tb} ms"
        );
        // A host-to-device copy (4 MiB at 4 GB/s: 1.05 ms) beside a 1 ms kernel, on the
        // timeline (the wall time also holds the host's cost of moving the bytes).
        let t = Instant::now();
        d.event_record(e0, a).unwrap();
        d.launch(k, ONE, WARP, 0, a, &[]).unwrap();
        d.htod_async(mem.va, host.span(), b).unwrap();
        d.event_record(ea, a).unwrap();
        d.event_record(eb, b).unwrap();
        d.synchronize().unwrap();
        let wall = t.elapsed();
        let (ta, tb) = (elapsed(s, e0, ea), elapsed(s, e0, eb));
        ensure!((0.99..1.3).contains(&ta), "the kernel: {ta} ms");
        ensure!((1.04..1.4).contains(&tb), "the copy overlapped it: {tb} ms");
        ensure!(ms(wall) >= 1.04, "{wall:?}");
        Ok(())
    });
    let mut back = vec![0u8; 4 << 20];
    d.dtoh(&mut back, mem.va).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    drop(host);
    for st in [a, b] {
        d.stream_destroy(st).unwrap();
    }
}

#[test]
fn events_record_query_synchronize_and_time() {
    let (_g, s) = sim();
    let d = &s.d;
    let st = d.stream_create(1, 0).unwrap();
    let k = function(s, "spin_us1000");
    let [e0, e1, never] = events(s, 0);
    reset_stats(s);
    timed("a 1 ms kernel between events", || {
        d.synchronize().unwrap();
        d.event_record(e0, st).unwrap();
        d.launch(k, ONE, WARP, 0, st, &[]).unwrap();
        d.event_record(e1, st).unwrap();
        let pending = d.event_query(e1).unwrap();
        let early = d.event_elapsed_ms(e0, e1).map_err(|e| Driver::status(&e));
        d.event_synchronize(e1).unwrap();
        assert!(d.event_query(e1).unwrap());
        let t = elapsed(s, e0, e1);
        assert!(t >= 0.99 && t == -elapsed(s, e1, e0), "{t}");
        ensure!(!pending, "complete at once");
        ensure!(
            early == Err(600),
            "elapsed time before completion: {early:?}"
        );
        ensure!((0.99..1.2).contains(&t), "a 1 ms kernel took {t} ms");
        Ok(())
    });
    // Never recorded: complete for queries, no time for timing.
    assert!(d.event_query(never).unwrap());
    d.event_synchronize(never).unwrap();
    assert_eq!(code(d.event_elapsed_ms(never, e1)), 400);
    assert_eq!(code(d.event_elapsed_ms(e0, never)), 400);
    // Timing disabled.
    let [untimed] = events(s, 2);
    d.event_record(untimed, st).unwrap();
    d.event_synchronize(untimed).unwrap();
    assert_eq!(code(d.event_elapsed_ms(e0, untimed)), 400);
    let c = stats(s);
    assert!(c.event_queries >= 3 && c.event_synchronizes >= 3, "{c:?}");
    for e in [e0, e1, never, untimed] {
        d.event_destroy(e).unwrap();
    }
    d.stream_destroy(st).unwrap();
}

#[test]
fn stream_wait_event_orders_work_across_streams_and_pinned_reads_are_stale_until_waited() {
    let (_g, s) = sim();
    let d = &s.d;
    let [a, b, c] = [(); 3].map(|()| d.stream_create(1, 0).unwrap());
    let mem = DevMem::new(s, 4096);
    let add = function(s, "sim_add_u32");
    let slow = function(s, "spin_us2000");
    let (mut hb, mut hc) = (Pinned::new(s, 64, 0), Pinned::new(s, 64, 0));
    let [ev] = events(s, 2);
    timed("ordering across streams", || {
        d.synchronize().unwrap();
        d.memset_d32(mem.va, 0, 16).unwrap();
        hb.buf.fill(0xAA);
        hc.buf.fill(0xAA);
        d.launch(slow, ONE, WARP, 0, a, &[]).unwrap();
        d.launch(add, ONE, WARP, 0, a, &add_params(mem.va, 16, 5))
            .unwrap();
        d.event_record(ev, a).unwrap();
        d.stream_wait_event(b, ev).unwrap();
        d.dtoh_async(hb.span(), mem.va, b).unwrap();
        d.dtoh_async(hc.span(), mem.va, c).unwrap();
        // Before any wait: page-locked memory has not been written.
        let early = hb.read();
        // c did not wait: it copied before a's kernels completed.
        d.stream_synchronize(c).unwrap();
        let (hc_now, hb_now) = (hc.read(), hb.read());
        d.stream_synchronize(b).unwrap();
        let hb_after = hb.read();
        ensure!(early == [0xAA; 64], "written before any wait: {early:?}");
        ensure!(hc_now == [0; 64], "c did not wait: {hc_now:?}");
        ensure!(hb_now == [0xAA; 64], "b waits for a: {hb_now:?}");
        ensure!(words(&hb_after) == [5; 16], "{hb_after:?}");
        Ok(())
    });
    // A copy after the kernel on its own stream sees its result.
    d.launch(add, ONE, WARP, 0, a, &add_params(mem.va, 16, 1))
        .unwrap();
    d.dtoh_async(hc.span(), mem.va, a).unwrap();
    d.stream_synchronize(a).unwrap();
    assert_eq!(words(&hc.read()), [6; 16]);
    // Polling an event: once it reports complete, the copy before it has landed.
    d.launch(slow, ONE, WARP, 0, a, &[]).unwrap();
    d.launch(add, ONE, WARP, 0, a, &add_params(mem.va, 16, 1))
        .unwrap();
    d.dtoh_async(hc.span(), mem.va, a).unwrap();
    d.event_record(ev, a).unwrap();
    let mut polls = 0;
    while !d.event_query(ev).unwrap() {
        polls += 1;
    }
    assert_eq!(words(&hc.read()), [7; 16], "after {polls} polls");
    d.event_destroy(ev).unwrap();
    for st in [a, b, c] {
        d.stream_destroy(st).unwrap();
    }
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams_but_not_non_blocking_ones() {
    let (_g, s) = sim();
    let d = &s.d;
    let blocking = d.stream_create(0, 0).unwrap();
    let nonblocking = d.stream_create(1, 0).unwrap();
    let k = function(s, "spin_us3000");
    let mem = DevMem::new(s, 4096);
    let small = [1u8; 256];
    // A synchronous copy (the legacy stream) after a blocking stream's kernel waits for it...
    d.launch(k, ONE, WARP, 0, blocking, &[]).unwrap();
    let t = Instant::now();
    d.htod(mem.va, &small).unwrap();
    assert!(ms(t.elapsed()) >= 2.9, "{:?}", t.elapsed());
    // Synchronizing the legacy stream waits for the blocking streams.
    d.launch(function(s, "spin_us2000"), ONE, WARP, 0, blocking, &[])
        .unwrap();
    let t = Instant::now();
    d.stream_synchronize(Stream::NULL).unwrap();
    assert!(ms(t.elapsed()) >= 1.9, "{:?}", t.elapsed());
    let mut host = Pinned::new(s, 128, 0);
    let [e0, eb, en] = events(s, 0);
    timed("the legacy stream and the others", || {
        d.synchronize().unwrap();
        // ...not for a non-blocking stream's.
        d.launch(k, ONE, WARP, 0, nonblocking, &[]).unwrap();
        let t = Instant::now();
        d.htod(mem.va, &small).unwrap();
        let quick = t.elapsed();
        d.synchronize().unwrap();
        ensure!(ms(quick) < 1.5, "{quick:?}");
        // A blocking stream's later work waits for the legacy stream's; a non-blocking one's
        // does not.
        d.event_record(e0, Stream::NULL).unwrap();
        d.launch(k, ONE, WARP, 0, Stream::NULL, &[]).unwrap();
        let span = host.span();
        d.dtoh_async(span.sub(0, 64).unwrap(), mem.va, blocking)
            .unwrap();
        d.event_record(eb, blocking).unwrap();
        d.dtoh_async(span.sub(64, 64).unwrap(), mem.va, nonblocking)
            .unwrap();
        d.event_record(en, nonblocking).unwrap();
        d.synchronize().unwrap();
        let (tb, tn) = (elapsed(s, e0, eb), elapsed(s, e0, en));
        ensure!(tb >= 3.0, "the blocking stream waited: {tb} ms");
        ensure!(tn < 1.0, "the non-blocking stream did not: {tn} ms");
        Ok(())
    });
    for st in [blocking, nonblocking] {
        d.stream_destroy(st).unwrap();
    }
}

#[test]
fn page_locked_and_pageable_copies_at_their_rates_and_counted() {
    let (_g, s) = sim();
    let d = &s.d;
    const N: usize = 4 << 20;
    const MIB: usize = 1 << 20;
    let st = d.stream_create(1, 0).unwrap();
    let mem = DevMem::new(s, N);
    let mut pinned = Pinned::new(s, N, 3);
    let mut pageable = vec![5u8; N];
    let mut mib = vec![8u8; MIB];
    let mut back = vec![0u8; N];
    let [e0, e1] = events(s, 0);
    let spin = function(s, "spin_us10000");
    let c = timed("copy rates", || {
        d.synchronize().unwrap();
        reset_stats(s);
        // Page-locked: DMA at 4 GB/s; the call returns at once.
        d.event_record(e0, st).unwrap();
        let t = Instant::now();
        d.htod_async(mem.va, pinned.span(), st).unwrap();
        let call = t.elapsed();
        d.event_record(e1, st).unwrap();
        d.stream_synchronize(st).unwrap();
        let dma = elapsed(s, e0, e1);
        ensure!((1.04..1.3).contains(&dma), "4 MiB page-locked: {dma} ms");
        ensure!(ms(call) < 0.5, "the page-locked call took {call:?}");
        // Pageable: 1 GB/s, and the call returns only after its source was read.
        pageable.fill(5);
        d.event_record(e0, st).unwrap();
        let t = Instant::now();
        d.htod_async(mem.va, span(&mut pageable), st).unwrap();
        let call = t.elapsed();
        d.event_record(e1, st).unwrap();
        pageable.fill(9); // The driver has read it: changing it now changes nothing.
        d.stream_synchronize(st).unwrap();
        let slow = elapsed(s, e0, e1);
        assert!(ms(call) >= 4.19, "{call:?}");
        ensure!(
            slow >= 4.19 && slow <= ms(call) + 0.5,
            "4 MiB pageable: {slow} ms, the call {call:?}"
        );
        d.dtoh(&mut back, mem.va).unwrap();
        assert!(back.iter().all(|&b| b == 5));
        // Pageable after a kernel: the call takes the transfer time, not the kernel's.
        d.launch(spin, ONE, WARP, 0, st, &[]).unwrap();
        let t = Instant::now();
        d.htod_async(mem.va, span(&mut mib), st).unwrap();
        let call = t.elapsed();
        ensure!(
            ms(call) >= 1.04 && ms(call) < 6.0,
            "1 MiB pageable behind a 10 ms kernel: {call:?}"
        );
        // Device to pageable memory: complete when the call returns, after the kernel.
        let t = Instant::now();
        d.dtoh_async(span(&mut back[..MIB]), mem.va, st).unwrap();
        assert!(ms(t.elapsed()) >= 5.0, "{:?}", t.elapsed());
        assert!(back[..MIB].iter().all(|&b| b == 8));
        // Device to page-locked memory: returns at once, written when complete.
        pinned.buf.fill(3);
        let t = Instant::now();
        d.dtoh_async(pinned.span(), mem.va, st).unwrap();
        let call = t.elapsed();
        let early = pinned.read()[0];
        d.stream_synchronize(st).unwrap();
        assert_eq!(pinned.read()[0], 8);
        ensure!(ms(call) < 0.5, "page-locked device to host: {call:?}");
        ensure!(early == 3, "written before the copy completed");
        Ok(stats(s))
    });
    assert_eq!(c.htod_dma_bytes, N as u64);
    assert_eq!(c.htod_pageable_bytes, (N + MIB) as u64);
    assert_eq!(c.dtoh_dma_bytes, N as u64);
    assert_eq!(c.dtoh_pageable_bytes, (N + MIB) as u64, "{c:?}");
    assert!(c.host_blocked_ns >= 4_100_000);
    d.stream_destroy(st).unwrap();
}

#[test]
fn capture_instantiate_and_one_graph_launch_run_every_node() {
    let (_g, s) = sim();
    let d = &s.d;
    let st = d.stream_create(1, 0).unwrap();
    let mem = DevMem::new(s, 4096);
    d.memset_d32(mem.va, 0, 1024).unwrap();
    let add = function(s, "sim_add_u32");
    let [ev] = events(s, 0);
    d.begin_capture(st).unwrap();
    d.memset_async(mem.va, 10, 4, 16, st).unwrap();
    d.launch(add, ONE, WARP, 0, st, &add_params(mem.va, 16, 1))
        .unwrap();
    d.launch(add, ONE, WARP, 0, st, &add_params(mem.va, 16, 2))
        .unwrap();
    d.dtod_async(mem.va + 1024, mem.va, 64, st).unwrap();
    d.event_record(ev, st).unwrap();
    assert_eq!(
        code(d.event_query(ev)),
        900,
        "a captured event is no point in time"
    );
    let exec = d.end_capture(st).unwrap();
    // Nothing ran while capturing.
    let mut out = vec![0u8; 2048];
    d.dtoh(&mut out, mem.va).unwrap();
    assert!(out.iter().all(|&b| b == 0));
    reset_stats(s);
    d.graph_launch(exec, st).unwrap();
    let c = stats(s);
    assert_eq!((c.driver_calls, c.graph_launches), (1, 1), "one call");
    assert_eq!(
        (c.kernels_run, c.kernel_launches, c.ops_enqueued),
        (2, 0, 4)
    );
    d.stream_synchronize(st).unwrap();
    d.event_synchronize(ev).unwrap();
    d.dtoh(&mut out, mem.va).unwrap();
    let w = words(&out);
    assert_eq!(w[..16], [13; 16]);
    assert_eq!(w[256..272], [13; 16]);
    // Again: the memset node resets, so the result is the same.
    d.graph_launch(exec, st).unwrap();
    d.graph_launch(exec, st).unwrap();
    d.stream_synchronize(st).unwrap();
    d.dtoh(&mut out, mem.va).unwrap();
    assert_eq!(words(&out)[..16], [13; 16]);
    assert_eq!(stats(s).graph_launches, 3);
    d.graph_destroy(exec).unwrap();
    assert_eq!(code(d.graph_launch(exec, st)), 400);
    d.event_destroy(ev).unwrap();
    d.stream_destroy(st).unwrap();
}

#[test]
fn capture_errors() {
    let (_g, s) = sim();
    let d = &s.d;
    let st = d.stream_create(1, 0).unwrap();
    let blocking = d.stream_create(0, 0).unwrap();
    let mem = DevMem::new(s, 4096);
    assert_eq!(code(d.begin_capture(Stream::NULL)), 900);
    // Synchronizing a capturing stream is refused and breaks the capture.
    d.begin_capture(st).unwrap();
    assert_eq!(code(d.begin_capture(st)), 401);
    assert_eq!(code(d.stream_synchronize(st)), 900);
    assert_eq!(code(d.end_capture(st)), 901);
    d.begin_capture(st).unwrap();
    assert_eq!(code(d.stream_query(st)), 900);
    assert_eq!(
        code(d.memset_async(mem.va, 0, 1, 1, st)),
        901,
        "an invalidated capture"
    );
    assert_eq!(code(d.end_capture(st)), 901);
    assert_eq!(code(d.end_capture(st)), 401, "no capture");
    // Legacy-stream work while a blocking stream captures.
    d.begin_capture(blocking).unwrap();
    assert_eq!(code(d.htod(mem.va, &[1])), 906);
    assert_eq!(code(d.end_capture(blocking)), 901);
    // A thread-local capture (the wrapper's mode) forbids cuCtxSynchronize on its thread...
    d.begin_capture(st).unwrap();
    assert_eq!(code(d.synchronize()), 900);
    assert_eq!(code(d.end_capture(st)), 901);
    // ...not on another thread, which may not end it either.
    d.begin_capture(st).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| {
            d.primary_context(s.dev).unwrap();
            d.synchronize().unwrap();
            assert_eq!(code(d.end_capture(st)), 908);
        });
    });
    let exec = d.end_capture(st).unwrap();
    d.graph_destroy(exec).unwrap();
    for x in [st, blocking] {
        d.stream_destroy(x).unwrap();
    }
}

#[test]
fn a_kernel_on_unmapped_memory_is_an_asynchronous_error() {
    let (_g, s) = sim();
    let d = &s.d;
    let add = function(s, "sim_add_u32");
    reset_stats(s);
    d.launch(add, ONE, WARP, 0, Stream::NULL, &add_params(0x1000, 4, 1))
        .unwrap();
    assert_eq!(code(d.synchronize()), 700);
    d.synchronize().unwrap();
    assert_eq!(stats(s).faults, 1);
}

#[test]
fn context_synchronize_waits_for_every_stream() {
    let (_g, s) = sim();
    let d = &s.d;
    let streams = [(); 3].map(|()| d.stream_create(1, 0).unwrap());
    let k = function(s, "spin_us1000");
    reset_stats(s);
    let t = Instant::now();
    for st in streams {
        d.launch(k, ONE, WARP, 0, st, &[]).unwrap();
    }
    d.synchronize().unwrap();
    assert!(ms(t.elapsed()) >= 2.95, "{:?}", t.elapsed());
    for st in streams {
        assert!(d.stream_query(st).unwrap());
        d.stream_destroy(st).unwrap();
    }
    let c = stats(s);
    assert_eq!(
        (c.ctx_synchronizes, c.stream_queries, c.kernels_run),
        (1, 3, 3)
    );
}
