//! `gpufuse-bench shares`: compute shares and QoS on the emulated GPU, measured.
//!
//! Every figure comes from a real `gpufuse serve` with real sessions (client core, worker
//! processes, the node's launch queue) running a spin kernel whose length is calibrated first:
//! - two tenants limited to 30% and 70% both run one client pattern (batch+synchronize, two
//!   launches in flight+event wait, one launch+synchronize, four streams, graph launches) with
//!   kernels of about 0.1, 2 and 25 ms, under the elastic and the hard policy: each row prints
//!   the kernel time measured (the node's device time per completed kernel), the split of the
//!   node's device time and of the kernels the clients saw complete over a 10-second window
//!   (3 s with `--quick`), and how busy the device was (target: 30:70 within 5 points);
//! - a lone tenant limited to 30% saturates: the fraction of the window it ran (hard: 30 +- 5;
//!   elastic: it uses the idle capacity);
//! - a high-QoS tenant runs short kernels, alone and then against three low-QoS tenants that
//!   saturate the device: the p50/p99 queueing delay of its kernels at the launch queue (from
//!   the node) and its launch-to-completion latency (from the client). The same tenant at low
//!   QoS under the same load is the comparison. Target: p99 under load within one low-QoS
//!   kernel plus a quantum.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpufuse_client::graph::{Graph, Op as GraphOp};
use gpufuse_client::Connection;
use gpufuse_proto::{
    ComputePolicy, Launch, NodeStatus, Qos, ReplyBody, Request, ResourceRequest, SessionKind,
};
use gpufuse_transport::Address;

use crate::Server;
use gpufuse_proto::SessionId;
use gpufuse_proto::{ContextHandle, EventHandle, FunctionHandle, ModuleHandle, StreamHandle};

/// One thread spinning `n` times: the kernel's length is linear in `n`.
const SPIN_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\n.visible .entry spin(\n\t.param .u32 spin_param_0\n)\n{\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\n\tld.param.u32 %r1, [spin_param_0];\n\tmov.u32 %r2, 0;\n$L__BB0_1:\n\tsetp.ge.u32 %p1, %r2, %r1;\n\t@%p1 bra $L__BB0_2;\n\tadd.s32 %r2, %r2, 1;\n\tbra.uni $L__BB0_1;\n$L__BB0_2:\n\tret;\n}\n\0";

/// Kernels a saturating tenant queues between two synchronizations (the batch pattern): a
/// tenant that waits for its client between short batches leaves the device idle, and an
/// elastic queue rightly gives that time to others.
const BATCH: usize = 16;
/// Streams of the several-streams pattern, and launches per stream between synchronizations.
const STREAMS: u64 = 4;
const PER_STREAM: usize = 2;
/// Kernels in the graph of the graph pattern.
const GRAPH_KERNELS: usize = 4;
/// Kernel lengths of the split matrix, in milliseconds of device time.
const KERNEL_MS: [f64; 3] = [0.1, 2.0, 25.0];

/// How a tenant drives the device: the launch patterns clients use, as the worker sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// [`BATCH`] launches, then a context synchronize.
    Batch,
    /// Two launches in flight (double buffering): each launch records an event, and before
    /// the next launch the client waits on the event of the launch before last.
    TwoInFlight,
    /// One launch, then a context synchronize.
    OneSync,
    /// [`PER_STREAM`] launches on each of [`STREAMS`] streams, then each stream synchronized.
    Streams,
    /// A graph of [`GRAPH_KERNELS`] kernel nodes launched on a stream (defined once and
    /// launched with one request each time, as the shim's `cuGraphLaunch` does), then the
    /// stream synchronized.
    Graph,
}

impl Pattern {
    const ALL: [Pattern; 5] = [
        Pattern::Batch,
        Pattern::TwoInFlight,
        Pattern::OneSync,
        Pattern::Streams,
        Pattern::Graph,
    ];

    fn name(self) -> &'static str {
        match self {
            Pattern::Batch => "batch+sync",
            Pattern::TwoInFlight => "2-in-flight+event",
            Pattern::OneSync => "1 launch+sync",
            Pattern::Streams => "4 streams",
            Pattern::Graph => "graph launch",
        }
    }
}

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
            ctx: ContextHandle(1),
            device: 0,
            flags: 0,
        })?;
        let image = SPIN_PTX.as_bytes();
        let hash: [u8; 32] =
            sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
        conn.call(&Request::ModuleLoad {
            module: ModuleHandle(2),
            device: 0,
            hash,
            image: Some(image),
        })?;
        let ReplyBody::Function(_) = conn.call(&Request::ModuleGetFunction {
            module: ModuleHandle(2),
            name: "spin",
            function: FunctionHandle(3),
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
        self.launch_on(n, 0)
    }

    fn launch_on(&mut self, n: u32, stream: u64) -> Result<()> {
        let params = n.to_le_bytes();
        self.conn.quiet(&Request::LaunchKernel(Launch {
            function: FunctionHandle(3),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
            stream: StreamHandle(stream),
            params: &params,
            attributes: Vec::new(),
        }))?;
        Ok(())
    }

    /// Waits for `req` (a synchronizing request) and fails on a launch's error.
    fn wait(&mut self, req: &Request) -> Result<()> {
        self.conn.call(req)?;
        if let Some(e) = self.conn.take_async_error() {
            bail!("a launch failed with CUresult {e}");
        }
        Ok(())
    }

    /// Runs `pattern` with kernels of `n` spins until `stop`, counting completed kernels.
    fn drive(
        &mut self,
        pattern: Pattern,
        n: u32,
        stop: &AtomicBool,
        done: &AtomicU64,
    ) -> Result<()> {
        // Handles are the client's to mint: streams 100.., events 200.., one graph.
        let streams: Vec<u64> = (0..STREAMS).map(|i| 100 + i).collect();
        for &stream in &streams {
            self.conn.quiet(&Request::StreamCreate {
                stream: StreamHandle(stream),
                flags: 0,
                priority: 0,
            })?;
        }
        let events = [200u64, 201];
        for &event in &events {
            self.conn.quiet(&Request::EventCreate {
                event: EventHandle(event),
                flags: 0,
            })?;
        }
        let graph = Graph {
            ops: (0..GRAPH_KERNELS)
                .map(|_| GraphOp::Launch {
                    function: 3,
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    shared_mem: 0,
                    params: n.to_le_bytes().to_vec(),
                    attributes: Vec::new(),
                })
                .collect(),
            conditionals: Vec::new(),
        };
        let mut launched = 0u64;
        let mut defined = false;
        while !stop.load(Ordering::Relaxed) {
            match pattern {
                Pattern::Batch => {
                    for _ in 0..BATCH {
                        self.launch(n)?;
                    }
                    self.wait(&Request::CtxSynchronize {
                        ctx: ContextHandle(1),
                    })?;
                    done.fetch_add(BATCH as u64, Ordering::Relaxed);
                }
                Pattern::TwoInFlight => {
                    let event = events[(launched % 2) as usize];
                    if launched >= 2 {
                        // The launch before last recorded this event: wait for it.
                        self.wait(&Request::EventSynchronize {
                            event: EventHandle(event),
                        })?;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    self.launch(n)?;
                    self.conn.quiet(&Request::EventRecord {
                        event: EventHandle(event),
                        stream: StreamHandle(0),
                    })?;
                    launched += 1;
                }
                Pattern::OneSync => {
                    self.launch(n)?;
                    self.wait(&Request::CtxSynchronize {
                        ctx: ContextHandle(1),
                    })?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Pattern::Streams => {
                    for _ in 0..PER_STREAM {
                        for &stream in &streams {
                            self.launch_on(n, stream)?;
                        }
                    }
                    for &stream in &streams {
                        self.wait(&Request::StreamSynchronize {
                            stream: StreamHandle(stream),
                        })?;
                    }
                    done.fetch_add(STREAMS * PER_STREAM as u64, Ordering::Relaxed);
                }
                Pattern::Graph => {
                    // What the shim's cuGraphLaunch sends (protocol 17): the graph's device
                    // work defined once (`GraphDefine`), then one `GraphLaunch` per launch.
                    if !defined {
                        let nodes = graph
                            .ops
                            .iter()
                            .filter_map(|op| match op {
                                GraphOp::Launch { params, .. } => {
                                    Some(gpufuse_proto::GraphNode::Launch {
                                        function: FunctionHandle(3),
                                        grid: [1, 1, 1],
                                        block: [1, 1, 1],
                                        shared_mem: 0,
                                        params: params.clone(),
                                        cooperative: false,
                                    })
                                }
                                _ => None,
                            })
                            .collect();
                        self.conn
                            .quiet(&Request::GraphDefine { graph: 300, nodes })?;
                        defined = true;
                    }
                    self.conn.quiet(&Request::GraphLaunch {
                        graph: 300,
                        stream: StreamHandle(streams[0]),
                    })?;
                    self.wait(&Request::StreamSynchronize {
                        stream: StreamHandle(streams[0]),
                    })?;
                    done.fetch_add(GRAPH_KERNELS as u64, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.wait(&Request::CtxSynchronize {
            ctx: ContextHandle(1),
        })
    }
}

/// Tenants that keep the device busy on their own threads until dropped.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<()>>>,
    ids: Vec<u64>,
    /// Kernels each tenant has seen complete.
    done: Vec<Arc<AtomicU64>>,
}

impl Load {
    /// Each tenant runs kernels of `n` spins in `pattern` until stopped.
    fn start(
        addr: &Address,
        tenants: &[(Option<u32>, Qos)],
        pattern: Pattern,
        n: u32,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut ids = Vec::new();
        let mut done = Vec::new();
        for &(compute, qos) in tenants {
            let mut t = Tenant::open(addr, compute, qos)?;
            ids.push(t.id);
            let stop = stop.clone();
            let count = Arc::new(AtomicU64::new(0));
            done.push(count.clone());
            threads.push(std::thread::spawn(move || {
                t.drive(pattern, n, &stop, &count)
            }));
        }
        Ok(Self {
            stop,
            threads,
            ids,
            done,
        })
    }

    fn completed(&self) -> Vec<u64> {
        self.done
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops the tenants and waits until the node has let their sessions go (so their
    /// shares are free for the next load).
    fn stop(self, addr: &Address) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while status(addr)?
            .sessions
            .iter()
            .any(|s| self.ids.contains(&s.id.get()))
        {
            if Instant::now() > deadline {
                bail!("the node still lists the load's sessions 10 s after they ended");
            }
            std::thread::sleep(Duration::from_millis(20));
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
        .find(|s| s.id == SessionId(id))
        .map_or(0, |s| s.device_time_us)
}

/// What a load did during a measured window: each session's device time from the node, and
/// the kernels each client saw complete.
struct Measured {
    device_us: Vec<u64>,
    kernels: Vec<u64>,
    window: Duration,
}

/// Measures `load` for `window`, after `warmup`.
fn measure(addr: &Address, load: &Load, warmup: Duration, window: Duration) -> Result<Measured> {
    std::thread::sleep(warmup);
    let (a, ka) = (status(addr)?, load.completed());
    let t = Instant::now();
    std::thread::sleep(window);
    let (b, kb) = (status(addr)?, load.completed());
    Ok(Measured {
        device_us: load
            .ids
            .iter()
            .map(|&id| device_time(&b, id) - device_time(&a, id))
            .collect(),
        kernels: kb.iter().zip(&ka).map(|(b, a)| b - a).collect(),
        window: t.elapsed(),
    })
}

/// Spins per millisecond of device time, from a lone session: the fastest of five rounds of
/// ~10 ms kernels (other load on the host only ever makes a round slower).
fn calibrate(addr: &Address) -> Result<f64> {
    let mut t = Tenant::open(addr, None, Qos::Medium)?;
    let mut n = 20_000;
    t.launch(n)?;
    t.sync()?;
    let mut best = 0f64;
    for _ in 0..5 {
        let before = device_time(&status(addr)?, t.id);
        for _ in 0..5 {
            t.launch(n)?;
        }
        t.sync()?;
        let us = device_time(&status(addr)?, t.id) - before;
        if us == 0 {
            bail!("the calibration kernels took no measurable device time");
        }
        best = best.max(5.0 * n as f64 / (us as f64 / 1000.0));
        n = (best * 10.0) as u32;
    }
    Ok(best)
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

/// How busy one tenant running `pattern` alone (no share, no one else) keeps the device, in
/// percent: its demand. A tenant whose client round trips leave the device idle more than 30%
/// of the time cannot use a 70% share, so the split of a row can only reach 30:70 by leaving
/// the device idle (hard) or not at all (elastic gives the idle time to the other tenant).
fn alone(addr: &Address, pattern: Pattern, (ms, n): (f64, u32), window: Duration) -> Result<f64> {
    let load = Load::start(addr, &[(None, Qos::Medium)], pattern, n)?;
    let warmup = Duration::from_millis(200).max(Duration::from_secs_f64(ms * 10.0 / 1000.0));
    let m = measure(addr, &load, warmup, window)?;
    load.stop(addr)?;
    Ok(pct(m.device_us[0], m.window.as_micros() as u64))
}

/// One row of the split matrix: a 30% and a 70% tenant run `pattern` with kernels of `n`
/// spins. Returns whether the node's split is within 5 points of 30:70.
fn split(
    addr: &Address,
    policy: ComputePolicy,
    pattern: Pattern,
    (ms, n): (f64, u32),
    window: Duration,
    demand: f64,
) -> Result<bool> {
    let load = Load::start(
        addr,
        &[(Some(30), Qos::Medium), (Some(70), Qos::Medium)],
        pattern,
        n,
    )?;
    // Long kernels need a longer warm-up for the queue to reach its steady state.
    let warmup = Duration::from_millis(500).max(Duration::from_secs_f64(ms * 40.0 / 1000.0));
    let m = measure(addr, &load, warmup, window)?;
    load.stop(addr)?;
    let device = m.device_us[0] + m.device_us[1];
    let kernels = m.kernels[0] + m.kernels[1];
    let node = pct(m.device_us[0], device);
    let client = pct(m.kernels[0], kernels);
    let ok = (node - 30.0).abs() <= 5.0;
    println!(
        "{:<8} {:<18} {ms:>5} ms {:>7.2} ms  {node:5.1} : {:5.1}   {client:5.1} : {:5.1}  {:>6}  {:5.1}%  {demand:5.1}%  {}",
        policy.name(),
        pattern.name(),
        device as f64 / 1000.0 / kernels.max(1) as f64,
        100.0 - node,
        100.0 - client,
        kernels,
        100.0 * device as f64 / m.window.as_micros() as f64,
        verdict(ok),
    );
    Ok(ok)
}

fn lone(addr: &Address, policy: ComputePolicy, n: u32, window: Duration) -> Result<()> {
    let load = Load::start(addr, &[(Some(30), Qos::Medium)], Pattern::Batch, n)?;
    let m = measure(addr, &load, Duration::from_secs(1), window)?;
    load.stop(addr)?;
    let share = pct(m.device_us[0], m.window.as_micros() as u64);
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
        .find(|s| s.id == SessionId(t.id))
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
    let load = Load::start(addr, &[(None, Qos::Low); 3], Pattern::Batch, long)?;
    std::thread::sleep(Duration::from_millis(500));
    let high = probe(addr, Qos::High, short, count)?;
    let low = probe(addr, Qos::Low, short, count)?;
    load.stop(addr)?;
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

/// What `gpufuse-bench shares` was asked to run.
pub struct Options {
    pub quick: bool,
    /// Only these patterns, kernel lengths (ms) and policies; all when empty.
    pub patterns: Vec<Pattern>,
    pub kernel_ms: Vec<f64>,
    pub policies: Vec<ComputePolicy>,
    /// The split matrix only (no lone-tenant and QoS measurements).
    pub matrix_only: bool,
}

impl Options {
    /// Parses the arguments after `shares`; an unknown one is an error naming it.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut o = Options {
            quick: false,
            patterns: Vec::new(),
            kernel_ms: Vec::new(),
            policies: Vec::new(),
            matrix_only: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |what: &str| {
                it.next()
                    .with_context(|| format!("{a} needs a value ({what})"))
                    .cloned()
            };
            match a.as_str() {
                "--quick" => o.quick = true,
                "--matrix-only" => o.matrix_only = true,
                "--pattern" => {
                    let v = value("batch, events, one, streams or graph")?;
                    o.patterns.push(match v.as_str() {
                        "batch" => Pattern::Batch,
                        "events" => Pattern::TwoInFlight,
                        "one" => Pattern::OneSync,
                        "streams" => Pattern::Streams,
                        "graph" => Pattern::Graph,
                        _ => bail!("unknown --pattern {v:?}: batch, events, one, streams or graph"),
                    });
                }
                "--kernel-ms" => {
                    let v = value("milliseconds")?;
                    let ms: f64 = v
                        .parse()
                        .ok()
                        .filter(|m: &f64| m.is_finite() && *m > 0.0)
                        .with_context(|| format!("bad --kernel-ms {v:?}: a positive number"))?;
                    o.kernel_ms.push(ms);
                }
                "--policy" => {
                    let v = value("elastic or hard")?;
                    o.policies.push(match v.as_str() {
                        "elastic" => ComputePolicy::Elastic,
                        "hard" => ComputePolicy::Hard,
                        _ => bail!("unknown --policy {v:?}: elastic or hard"),
                    });
                }
                _ => bail!(
                    "unknown argument {a:?} to `shares`: --quick, --matrix-only, --pattern P, --kernel-ms MS, --policy P"
                ),
            }
        }
        if o.patterns.is_empty() {
            o.patterns = Pattern::ALL.to_vec();
        }
        if o.kernel_ms.is_empty() {
            o.kernel_ms = KERNEL_MS.to_vec();
        }
        if o.policies.is_empty() {
            o.policies = vec![ComputePolicy::Elastic, ComputePolicy::Hard];
        }
        Ok(o)
    }
}

pub fn run(o: &Options) -> Result<()> {
    let started = Instant::now();
    let quick = o.quick;
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
    let mut servers = Vec::new();
    for &policy in &o.policies {
        servers.push((
            policy,
            Server::start_with(&["--compute-policy", policy.name()])?,
        ));
    }
    let spins_per_ms = calibrate(&servers[0].1 .1)?;
    println!("spin kernel: {spins_per_ms:.0} spins per ms of device time\n");
    println!(
        "Split: a 30% and a 70% tenant, both running the pattern; target 30:70 +- 5 points of device time"
    );
    println!(
        "(alone: how busy one tenant running the pattern keeps the device by itself, over {} ms)",
        (window / 3).as_millis()
    );
    println!(
        "policy   pattern            kernel  measured   node split     client split  kernels  busy    alone"
    );
    let mut demand = std::collections::HashMap::new();
    let (mut rows, mut missed, mut unusable) = (0, 0, 0);
    for (policy, (_, addr)) in &servers {
        for &pattern in &o.patterns {
            for (i, &ms) in o.kernel_ms.iter().enumerate() {
                let n = (spins_per_ms * ms).max(1.0) as u32;
                let d = match demand.get(&(pattern, i)) {
                    Some(&d) => d,
                    None => {
                        let d = alone(addr, pattern, (ms, n), window / 3)?;
                        demand.insert((pattern, i), d);
                        d
                    }
                };
                rows += 1;
                if !split(addr, *policy, pattern, (ms, n), window, d)? {
                    missed += 1;
                    if d < 75.0 {
                        unusable += 1;
                    }
                }
            }
        }
    }
    println!(
        "{} of {rows} rows within 30:70 +- 5 points; of the {missed} others, {unusable} ran a pattern that alone keeps the device less than 75% busy ({} s)\n",
        rows - missed,
        started.elapsed().as_secs()
    );
    if o.matrix_only {
        return Ok(());
    }
    let n = (spins_per_ms * 2.0).max(1.0) as u32;
    println!("Lone tenant, batch pattern, ~2 ms kernels:");
    for (policy, (_, addr)) in &servers {
        lone(addr, *policy, n, window)?;
    }
    println!();
    match servers.iter().find(|(p, _)| *p == ComputePolicy::Elastic) {
        Some((_, (_, addr))) => qos(addr, spins_per_ms, quick)?,
        None => println!("(QoS measured on the elastic policy only: not asked for)"),
    }
    println!("total {} s", started.elapsed().as_secs());
    Ok(())
}
