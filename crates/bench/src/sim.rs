//! `gpufuse-bench sim [--quick]` (and `gpufuse-bench gpu [--quick]`, the same on a real GPU:
//! the GPU lane's step): the real-GPU backend's data path on the simulated driver
//! (`gpufuse-cuda-sim`, a test double with a wall-time timeline of streams, engines and
//! events; no GPU): a `gpufuse serve --devices cuda` whose workers load the simulated driver,
//! against the same simulated driver driven directly in this process (the "native" baseline),
//! in the same run. Every figure is a ratio gpufuse/native:
//!
//! - a pipeline of 20 us kernels on one stream, then a stream synchronize (the GPU kept busy);
//! - 2,000 tiny (1 us) launches, then a synchronize;
//! - one 5 us kernel and a synchronize, repeated (the added latency, in us);
//! - 64 MiB copies from and to page-locked memory (the session's host arena) and from
//!   pageable memory;
//! - the device time the node charged the session for the pipeline, against the kernels' sum;
//! - a graph of 50 tiny kernels launched and synchronized, repeated (natively: captured into a
//!   driver graph; through gpufuse: defined once with `GraphDefine`, then one `GraphLaunch`).
//!
//! What the simulated GPU cannot say: anything about a real GPU's speed. The ratios show the
//! control flow's cost: what gpufuse adds between the application and the driver.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpufuse_client::{Connection, Transport};
use gpufuse_cuda_driver::{Driver, Function, HostSpan, Stream};
use gpufuse_proto::{ContextHandle, DevicePtr, FunctionHandle, ModuleHandle, StreamHandle};
use gpufuse_proto::{Launch, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

/// Kernels that spin for the microseconds their names say: on a GPU by `%globaltimer`; the
/// simulated driver runs no code and reads the duration from the name.
const PTX: &str = concat!(
    ".version 8.0\n.target sm_90\n.address_size 64\n",
    spin!("spin_us20", 20000),
    spin!("spin_us1", 1000),
    spin!("spin_us5", 5000),
);
const KERNELS: [&str; 3] = ["spin_us20", "spin_us1", "spin_us5"];

/// A kernel `$name` that returns once `%globaltimer` has advanced `$ns` nanoseconds.
macro_rules! spin {
    ($name:literal, $ns:literal) => {
        concat!(
            ".visible .entry ",
            $name,
            "()\n{\n",
            "  .reg .u64 %t<3>;\n  .reg .pred %p;\n",
            "  mov.u64 %t0, %globaltimer;\n",
            "WAIT:\n  mov.u64 %t1, %globaltimer;\n  sub.u64 %t2, %t1, %t0;\n",
            "  setp.lt.u64 %p, %t2, ",
            stringify!($ns),
            ";\n  @%p bra WAIT;\n  ret;\n}\n"
        )
    };
}
use spin;

/// The simulated driver beside the gpufuse binary (built with the workspace).
fn sim_path() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let p = exe
        .parent()
        .context("exe dir")?
        .join("libgpufuse_cuda_sim.so");
    if !p.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p gpufuse-cuda-sim`",
            p.display()
        );
    }
    Ok(p)
}

/// Which driver the run measures.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// The simulated driver (`gpufuse-bench sim`).
    Simulated,
    /// NVIDIA's driver on this machine's GPU 0 (`gpufuse-bench gpu`): the GPU lane.
    Gpu,
}

/// `gpufuse-bench sim` and `gpufuse-bench gpu`.
pub fn run(args: &[String], driven: Driven) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(a) = args.iter().find(|a| *a != "--quick") {
        bail!("unknown option {a} (expected --quick)");
    }
    if driven == Driven::Simulated {
        std::env::set_var("GPUFUSE_CUDA_DRIVER", sim_path()?);
    }
    let (_server, unix) = crate::Server::start_with(&["--devices", "cuda"])?;
    let Address::Unix(path) = &unix else {
        unreachable!("start_with listens on a unix socket")
    };
    let mut native = Native::new()?;
    let mut remote = Remote::open(&Address::Shm(path.clone()))?;
    let n = if quick { 500 } else { 2_000 };
    let rounds = if quick { 3 } else { 5 };
    println!(
        "the real-GPU backend on the simulated driver (no GPU): gpufuse / native, best of {rounds}"
    );

    let best = |f: &mut dyn FnMut() -> Result<Duration>| -> Result<Duration> {
        let mut b = Duration::MAX;
        for _ in 0..rounds {
            b = b.min(f()?);
        }
        Ok(b)
    };
    let ideal = Duration::from_micros(20 * n as u64);
    let before = remote.charged(&unix)?;
    let g = best(&mut || remote.kernels(0, n))?;
    let charged = remote.charged(&unix)? - before;
    let nat = best(&mut || native.kernels(0, n))?;
    line(&format!("{n} x 20 us kernels on a stream"), g, nat);
    let expected = ideal * rounds as u32;
    println!(
        "  device time charged {:.1} ms for {:.1} ms of kernels ({:.2}x)",
        charged.as_secs_f64() * 1e3,
        expected.as_secs_f64() * 1e3,
        charged.as_secs_f64() / expected.as_secs_f64()
    );
    let g = best(&mut || remote.kernels(1, 2_000))?;
    let nat = best(&mut || native.kernels(1, 2_000))?;
    line("2,000 tiny (1 us) launches", g, nat);
    let reps = 200;
    let g = best(&mut || remote.op_sync(reps))?;
    let nat = best(&mut || native.op_sync(reps))?;
    println!(
        "{:<44} {:>9.1} us {:>9.1} us   +{:.1} us",
        "a 5 us kernel + synchronize",
        g.as_secs_f64() * 1e6 / reps as f64,
        nat.as_secs_f64() * 1e6 / reps as f64,
        (g.as_secs_f64() - nat.as_secs_f64()) * 1e6 / reps as f64
    );
    let g = best(&mut || remote.pings(reps))?;
    println!(
        "{:<44} {:>9.1} us   (the transport's own round trip)",
        "a Ping round trip",
        g.as_secs_f64() * 1e6 / reps as f64
    );
    let size = 64 << 20;
    for (what, pinned, up) in [
        ("64 MiB host to device, pinned", true, true),
        ("64 MiB device to host, pinned", true, false),
        ("64 MiB host to device, pageable", false, true),
    ] {
        let g = best(&mut || remote.copy(size, pinned, up))?;
        let nat = best(&mut || native.copy(size, pinned, up))?;
        let rate = |d: Duration| size as f64 / d.as_secs_f64() / 1e9;
        println!(
            "{what:<44} {:>8.1} GB/s {:>8.1} GB/s   {:.2}x",
            rate(g),
            rate(nat),
            rate(g) / rate(nat)
        );
    }
    let reps = 50;
    let g = best(&mut || remote.graph(reps))?;
    let nat = best(&mut || native.graph(reps))?;
    println!(
        "{:<44} {:>9.1} us {:>9.1} us   {:.3}x  (+{:.1} us)",
        "graph of 50 x 1 us kernels + synchronize",
        g.as_secs_f64() * 1e6 / reps as f64,
        nat.as_secs_f64() * 1e6 / reps as f64,
        g.as_secs_f64() / nat.as_secs_f64(),
        (g.as_secs_f64() - nat.as_secs_f64()) * 1e6 / reps as f64
    );
    Ok(())
}

fn line(what: &str, g: Duration, native: Duration) {
    println!(
        "{what:<44} {:>9.2} ms {:>9.2} ms   {:.3}x",
        g.as_secs_f64() * 1e3,
        native.as_secs_f64() * 1e3,
        g.as_secs_f64() / native.as_secs_f64()
    );
}

/// The simulated driver in this process.
struct Native {
    d: Driver,
    stream: Stream,
    functions: Vec<Function>,
    dev_mem: u64,
    pinned: Vec<u8>,
    pageable: Vec<u8>,
    graph: Option<gpufuse_cuda_driver::GraphExec>,
}

// The native baseline hands its own buffers to the driver as `HostSpan`s (raw pointers).
#[allow(unsafe_code)]
impl Native {
    fn new() -> Result<Self> {
        let d = Driver::load().context("the simulated driver")?;
        let dev = d.device(0)?;
        d.primary_context(dev)?;
        let m = d.load_module(format!("{PTX}\0").as_bytes())?;
        let functions = KERNELS
            .iter()
            .map(|k| d.function(m, k))
            .collect::<Result<Vec<_>, _>>()?;
        let stream = d.stream_create(1, 0)?;
        let size = 64 << 20;
        let granularity = d.granularity(dev)?;
        let dev_mem = d.reserve(size.max(granularity), 0)?;
        d.map_new(dev, dev_mem, size)?;
        let mut pinned = vec![7u8; size];
        // SAFETY: `pinned` lives as long as `self`, and is unregistered never (the process
        // ends first).
        d.host_register(unsafe { HostSpan::new(pinned.as_mut_ptr(), size) })?;
        Ok(Self {
            d,
            stream,
            functions,
            dev_mem,
            pinned,
            pageable: vec![7u8; size],
            graph: None,
        })
    }

    fn kernels(&mut self, which: usize, n: usize) -> Result<Duration> {
        let t = Instant::now();
        for _ in 0..n {
            self.d.launch(
                self.functions[which],
                [1; 3],
                [32, 1, 1],
                0,
                self.stream,
                &[],
            )?;
        }
        self.d.stream_synchronize(self.stream)?;
        Ok(t.elapsed())
    }

    fn graph(&mut self, reps: usize) -> Result<Duration> {
        let g = match self.graph {
            Some(g) => g,
            None => {
                self.d.begin_capture(self.stream)?;
                for _ in 0..50 {
                    self.d
                        .launch(self.functions[1], [1; 3], [32, 1, 1], 0, self.stream, &[])?;
                }
                let g = self.d.end_capture(self.stream)?;
                self.graph = Some(g);
                g
            }
        };
        let t = Instant::now();
        for _ in 0..reps {
            self.d.graph_launch(g, self.stream)?;
            self.d.stream_synchronize(self.stream)?;
        }
        Ok(t.elapsed())
    }

    fn op_sync(&mut self, reps: usize) -> Result<Duration> {
        let t = Instant::now();
        for _ in 0..reps {
            self.d
                .launch(self.functions[2], [1; 3], [32, 1, 1], 0, Stream::NULL, &[])?;
            self.d.synchronize()?;
        }
        Ok(t.elapsed())
    }

    fn copy(&mut self, size: usize, pinned: bool, up: bool) -> Result<Duration> {
        let buf = if pinned {
            &mut self.pinned
        } else {
            &mut self.pageable
        };
        // SAFETY: `buf` outlives the copy, which is synchronized before this returns.
        let span = unsafe { HostSpan::new(buf.as_mut_ptr(), size) };
        let t = Instant::now();
        match up {
            true => self.d.htod_async(self.dev_mem, span, Stream::NULL)?,
            false => self.d.dtoh_async(span, self.dev_mem, Stream::NULL)?,
        }
        self.d.synchronize()?;
        Ok(t.elapsed())
    }
}

/// A session of `gpufuse serve --devices cuda` on the shared-memory transport.
struct Remote {
    conn: Connection,
    dev_mem: u64,
    pageable: Vec<u8>,
    graph_defined: bool,
}

const STREAM: u64 = 0x51;

impl Remote {
    fn open(addr: &Address) -> Result<Self> {
        let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
        let (mut conn, _) =
            Connection::open_with(addr, &hello, Transport::Shm).context("open session")?;
        if conn.host_arena().is_none() {
            bail!("the session has no host arena (not on the shared-memory transport)");
        }
        conn.quiet(&Request::CtxCreate {
            ctx: ContextHandle(1),
            device: 0,
            flags: 0,
        })?;
        let image = format!("{PTX}\0");
        let hash: [u8; 32] = sha2::Digest::finalize(
            <sha2::Sha256 as sha2::Digest>::new_with_prefix(image.as_bytes()),
        )
        .into();
        conn.call(&Request::ModuleLoad {
            module: ModuleHandle(2),
            device: 0,
            hash,
            image: Some(image.as_bytes()),
        })?;
        for (i, name) in KERNELS.iter().enumerate() {
            conn.call(&Request::ModuleGetFunction {
                module: ModuleHandle(2),
                name,
                function: FunctionHandle(10 + i as u64),
            })?;
        }
        conn.quiet(&Request::StreamCreate {
            stream: StreamHandle(STREAM),
            flags: 1,
            priority: 0,
        })?;
        let size = 64u64 << 20;
        let ReplyBody::Ptr(DevicePtr(dev_mem)) =
            conn.call(&Request::MemAlloc { device: 0, size })?
        else {
            bail!("alloc");
        };
        Ok(Self {
            conn,
            dev_mem,
            pageable: vec![7u8; size as usize],
            graph_defined: false,
        })
    }

    fn launch(&mut self, which: usize, stream: u64) -> Result<()> {
        self.conn.quiet(&Request::LaunchKernel(Launch {
            function: FunctionHandle(10 + which as u64),
            grid: [1; 3],
            block: [32, 1, 1],
            shared_mem: 0,
            stream: StreamHandle(stream),
            params: &[],
            attributes: Vec::new(),
        }))?;
        Ok(())
    }

    fn kernels(&mut self, which: usize, n: usize) -> Result<Duration> {
        let t = Instant::now();
        for _ in 0..n {
            self.launch(which, STREAM)?;
        }
        self.conn.call(&Request::StreamSynchronize {
            stream: StreamHandle(STREAM),
        })?;
        Ok(t.elapsed())
    }

    fn graph(&mut self, reps: usize) -> Result<Duration> {
        const GRAPH: u64 = 0x6a;
        if !self.graph_defined {
            let nodes = (0..50)
                .map(|_| gpufuse_proto::GraphNode::Launch {
                    function: FunctionHandle(11),
                    grid: [1; 3],
                    block: [32, 1, 1],
                    shared_mem: 0,
                    params: Vec::new(),
                    cooperative: false,
                })
                .collect();
            self.conn.quiet(&Request::GraphDefine {
                graph: GRAPH,
                nodes,
            })?;
            self.graph_defined = true;
        }
        let t = Instant::now();
        for _ in 0..reps {
            self.conn.quiet(&Request::GraphLaunch {
                graph: GRAPH,
                stream: StreamHandle(STREAM),
            })?;
            self.conn.call(&Request::StreamSynchronize {
                stream: StreamHandle(STREAM),
            })?;
        }
        Ok(t.elapsed())
    }

    fn op_sync(&mut self, reps: usize) -> Result<Duration> {
        let t = Instant::now();
        for _ in 0..reps {
            self.launch(2, 0)?;
            self.conn.call(&Request::CtxSynchronize {
                ctx: ContextHandle(1),
            })?;
        }
        Ok(t.elapsed())
    }

    fn pings(&mut self, reps: usize) -> Result<Duration> {
        let t = Instant::now();
        for _ in 0..reps {
            self.conn.call(&Request::Ping)?;
        }
        Ok(t.elapsed())
    }

    fn copy(&mut self, size: usize, pinned: bool, up: bool) -> Result<Duration> {
        let dst = DevicePtr(self.dev_mem);
        if !pinned {
            let t = Instant::now();
            for (i, chunk) in self.pageable[..size]
                .chunks(gpufuse_proto::MAX_COPY_CHUNK)
                .enumerate()
            {
                let req = Request::MemcpyHtoD {
                    dst: DevicePtr(dst.0 + (i * gpufuse_proto::MAX_COPY_CHUNK) as u64),
                    stream: StreamHandle(0),
                    data: &[],
                };
                self.conn.quiet_with_tail(&req, chunk)?;
            }
            self.conn.call(&Request::Ping)?;
            return Ok(t.elapsed());
        }
        let arena = self.conn.host_arena().cloned().context("host arena")?;
        let host = arena.alloc(size).context("room in the host arena")?;
        let offset = arena.offset_of(host as usize, size).context("offset")?;
        arena.write(offset, &vec![7u8; size]);
        let req = match up {
            true => Request::MemcpyHtoDHost {
                dst,
                stream: StreamHandle(0),
                offset,
                size: size as u64,
            },
            false => Request::MemcpyDtoHHost {
                src: dst,
                stream: StreamHandle(0),
                offset,
                size: size as u64,
            },
        };
        // The first copy page-locks the block's pages; timed from the second.
        self.conn.quiet(&req)?;
        self.conn.call(&Request::Ping)?;
        let t = Instant::now();
        self.conn.quiet(&req)?;
        self.conn.call(&Request::Ping)?;
        let took = t.elapsed();
        arena.free(host, size);
        Ok(took)
    }

    /// The device time the node has charged this session so far.
    fn charged(&mut self, node: &Address) -> Result<Duration> {
        // The worker reports a lease's time when the lease ends: after the session's last
        // request has run.
        std::thread::sleep(Duration::from_millis(20));
        let st = Connection::query_status(node, String::new())?;
        let us = st.sessions.iter().map(|s| s.device_time_us).sum::<u64>();
        Ok(Duration::from_micros(us))
    }
}
