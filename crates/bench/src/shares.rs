//! `gpufuse-bench shares`: compute shares and QoS on the emulated GPU, measured.
//!
//! Every figure comes from a real `gpufuse serve` with real sessions (client core, worker
//! processes, the node's launch queue) running a spin kernel whose length is calibrated first:
//! - two tenants limited to 30% and 70% saturate the device; their shares of the measured
//!   device time over a 10-second window (target: 30:70 within 5 points), under the elastic and
//!   the hard policy;
//! - a lone tenant limited to 30% saturates: the fraction of the window it ran (hard: 30 +- 5;
//!   elastic: it uses the idle capacity);
//! - a high-QoS tenant runs short kernels, alone and then against three low-QoS tenants that
//!   saturate the device: the p50/p99 queueing delay of its kernels at the launch queue (from
//!   the node) and its launch-to-completion latency (from the client). The same tenant at low
//!   QoS under the same load is the comparison. Target: p99 under load within one low-QoS
//!   kernel plus a quantum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpufuse_client::Connection;
use gpufuse_proto::{
    ComputePolicy, Launch, NodeStatus, Qos, ReplyBody, Request, ResourceRequest, SessionKind,
};
use gpufuse_transport::Address;

use crate::Server;

/// One thread spinning `n` times: the kernel's length is linear in `n`.
const SPIN_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\n.visible .entry spin(\n\t.param .u32 spin_param_0\n)\n{\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\n\tld.param.u32 %r1, [spin_param_0];\n\tmov.u32 %r2, 0;\n$L__BB0_1:\n\tsetp.ge.u32 %p1, %r2, %r1;\n\t@%p1 bra $L__BB0_2;\n\tadd.s32 %r2, %r2, 1;\n\tbra.uni $L__BB0_1;\n$L__BB0_2:\n\tret;\n}\n\0";

/// Kernels a saturating tenant queues between two synchronizations: a tenant that waits for
/// its client between short batches leaves the device idle, and an elastic queue rightly gives
/// that time to others.
const BATCH: usize = 16;

/// A session with the spin kernel loaded.
struct Tenant {
    conn: Connection,
    id: u64,
}

impl Tenant {
    fn open(addr: &Address, compute: Option<u32>, qos: Qos) -> Result<Self> {
        let hello = Connection::hello(
            SessionKind::Cuda,
            String::new(),
            ResourceRequest {
                compute_percent: compute,
                qos,
                ..Default::default()
            },
        );
        let (mut conn, accepted) = Connection::open(addr, &hello).context("open a session")?;
        conn.quiet(&Request::CtxCreate {
            ctx: 1,
            device: 0,
            flags: 0,
        })?;
        let image = SPIN_PTX.as_bytes();
        let hash: [u8; 32] =
            sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
        conn.call(&Request::ModuleLoad {
            module: 2,
            device: 0,
            hash,
            image: Some(image),
        })?;
        let ReplyBody::Function(_) = conn.call(&Request::ModuleGetFunction {
            module: 2,
            name: "spin",
            function: 3,
        })?
        else {
            bail!("no function info for spin");
        };
        Ok(Self {
            conn,
            id: accepted.session_id,
        })
    }

    fn launch(&mut self, n: u32) -> Result<()> {
        let params = n.to_le_bytes();
        self.conn.quiet(&Request::LaunchKernel(Launch {
            function: 3,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
            stream: 0,
            params: &params,
            attributes: Vec::new(),
        }))?;
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.conn.call(&Request::CtxSynchronize { ctx: 1 })?;
        if let Some(e) = self.conn.take_async_error() {
            bail!("a launch failed with CUresult {e}");
        }
        Ok(())
    }
}

/// Tenants that keep the device busy on their own threads until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<()>>>,
    ids: Vec<u64>,
}

impl Load {
    /// Each tenant queues [`BATCH`] kernels of `n` spins, synchronizes, and again.
    fn start(addr: &Address, tenants: &[(Option<u32>, Qos)], n: u32) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut ids = Vec::new();
        for &(compute, qos) in tenants {
            let mut t = Tenant::open(addr, compute, qos)?;
            ids.push(t.id);
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..BATCH {
                        t.launch(n)?;
                    }
                    t.sync()?;
                }
                Ok(())
            }));
        }
        Ok(Self { stop, threads, ids })
    }

    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        }
        Ok(())
    }
}

fn status(addr: &Address) -> Result<NodeStatus> {
    Ok(Connection::query_status(addr, String::new())?)
}

fn device_time(st: &NodeStatus, id: u64) -> u64 {
    st.sessions
        .iter()
        .find(|s| s.id == id)
        .map_or(0, |s| s.device_time_us)
}

/// Device time each session ran during `window`, after `warmup`.
fn measure(addr: &Address, ids: &[u64], warmup: Duration, window: Duration) -> Result<Vec<u64>> {
    std::thread::sleep(warmup);
    let a = status(addr)?;
    let t = Instant::now();
    std::thread::sleep(window);
    let b = status(addr)?;
    let scale = window.as_secs_f64() / t.elapsed().as_secs_f64();
    Ok(ids
        .iter()
        .map(|&id| ((device_time(&b, id) - device_time(&a, id)) as f64 * scale) as u64)
        .collect())
}

/// Spins per millisecond of device time, from a lone session.
fn calibrate(addr: &Address) -> Result<f64> {
    let mut t = Tenant::open(addr, None, Qos::Medium)?;
    let n = 20_000;
    t.launch(n)?;
    t.sync()?;
    let before = device_time(&status(addr)?, t.id);
    for _ in 0..5 {
        t.launch(n)?;
    }
    t.sync()?;
    let us = device_time(&status(addr)?, t.id) - before;
    if us == 0 {
        bail!("the calibration kernels took no measurable device time");
    }
    Ok(5.0 * n as f64 / (us as f64 / 1000.0))
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISSED"
    }
}

fn split(addr: &Address, policy: ComputePolicy, n: u32, window: Duration) -> Result<()> {
    let load = Load::start(addr, &[(Some(30), Qos::Medium), (Some(70), Qos::Medium)], n)?;
    let used = measure(addr, &load.ids, Duration::from_secs(1), window)?;
    load.stop()?;
    let total = used[0] + used[1];
    let a = pct(used[0], total);
    println!(
        "{:<8} 30%/70% saturating: {a:5.1}% : {:5.1}%  (target 30:70 +- 5 pts) {}  device busy {:5.1}%",
        policy.name(),
        100.0 - a,
        verdict((a - 30.0).abs() <= 5.0),
        pct(total, window.as_micros() as u64),
    );
    Ok(())
}

fn lone(addr: &Address, policy: ComputePolicy, n: u32, window: Duration) -> Result<()> {
    let load = Load::start(addr, &[(Some(30), Qos::Medium)], n)?;
    let used = measure(addr, &load.ids, Duration::from_secs(1), window)?;
    load.stop()?;
    let share = pct(used[0], window.as_micros() as u64);
    let (target, ok) = match policy {
        ComputePolicy::Hard => ("30 +- 5", (share - 30.0).abs() <= 5.0),
        ComputePolicy::Elastic => ("> 30: idle capacity", share > 50.0),
    };
    println!(
        "{:<8} lone 30% tenant:   {share:5.1}% of the device  (target {target}) {}",
        policy.name(),
        verdict(ok)
    );
    Ok(())
}

/// Runs `count` short kernels one at a time, `gap` apart: (queue p50, queue p99) from the
/// node and (p50, p99) launch-to-completion from the client, in microseconds.
fn probe(addr: &Address, qos: Qos, n: u32, count: usize) -> Result<((u64, u64), (u64, u64))> {
    let mut t = Tenant::open(addr, None, qos)?;
    let mut lat = Vec::with_capacity(count);
    for _ in 0..count {
        let s = Instant::now();
        t.launch(n)?;
        t.sync()?;
        lat.push(s.elapsed().as_micros() as u64);
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = status(addr)?;
    let me = st
        .sessions
        .iter()
        .find(|s| s.id == t.id)
        .context("the probe session is not in the status")?;
    lat.sort_unstable();
    let at = |p: usize| lat[(lat.len() - 1) * p / 100];
    Ok(((me.queue_p50_us, me.queue_p99_us), (at(50), at(99))))
}

fn qos(addr: &Address, spins_per_ms: f64, quick: bool) -> Result<()> {
    let short = (spins_per_ms * 0.1) as u32;
    let long_ms = 2.0;
    let long = (spins_per_ms * long_ms) as u32;
    let count = if quick { 60 } else { 300 };
    let line = |what: &str, ((q50, q99), (l50, l99)): ((u64, u64), (u64, u64))| {
        println!(
            "  {what:<34} queue p50 {q50:6} us  p99 {q99:6} us   launch-to-done p50 {l50:6} us  p99 {l99:6} us"
        );
    };
    println!(
        "QoS: short kernels (~0.1 ms) every 5 ms; load = 3 low-QoS tenants with ~{long_ms} ms kernels"
    );
    let idle = probe(addr, Qos::High, short, count)?;
    line("high QoS, no load", idle);
    let load = Load::start(addr, &[(None, Qos::Low); 3], long)?;
    std::thread::sleep(Duration::from_millis(500));
    let high = probe(addr, Qos::High, short, count)?;
    let low = probe(addr, Qos::Low, short, count)?;
    load.stop()?;
    line("high QoS, under load", high);
    line("low QoS (no priority), under load", low);
    let bound = (long_ms * 1000.0) as u64 + gpufuse_node_quantum_us();
    println!(
        "  target: high-QoS p99 queueing delay under load <= one low kernel + a quantum ({bound} us): {}",
        verdict(high.0 .1 <= bound)
    );
    Ok(())
}

/// The launch queue's quantum (the node's `QUANTUM_US`; the bench does not link the node).
fn gpufuse_node_quantum_us() -> u64 {
    1_000
}

pub fn run(quick: bool) -> Result<()> {
    let window = Duration::from_secs(if quick { 3 } else { 10 });
    println!(
        "gpufuse compute shares and QoS on the emulated GPU ({}; windows of {} s)",
        if quick { "quick" } else { "full" },
        window.as_secs()
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "host: {} CPUs, load average {} (the emulated GPU runs on these CPUs: other load shows up as noise)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let (elastic, addr_e) = Server::start_with(&["--compute-policy", "elastic"])?;
    let spins_per_ms = calibrate(&addr_e)?;
    let n = (spins_per_ms * 2.0).max(1.0) as u32;
    println!("spin kernel: {spins_per_ms:.0} spins per ms of device time; load kernels ~2 ms\n");
    split(&addr_e, ComputePolicy::Elastic, n, window)?;
    lone(&addr_e, ComputePolicy::Elastic, n, window)?;
    let (hard, addr_h) = Server::start_with(&["--compute-policy", "hard"])?;
    split(&addr_h, ComputePolicy::Hard, n, window)?;
    lone(&addr_h, ComputePolicy::Hard, n, window)?;
    drop(hard);
    println!();
    qos(&addr_e, spins_per_ms, quick)?;
    drop(elastic);
    Ok(())
}
