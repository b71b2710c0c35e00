//! `gpufuse-bench`: what remoting costs, measured against baselines taken in the same run.
//!
//! For each transport (unix socket, the shared-memory rings, TCP on loopback, TCP with TLS on
//! loopback: certificates from `gpufuse certs`) it starts a real `gpufuse serve` on an
//! emulated GPU and prints:
//! - the synchronous round trip of a gpufuse call against a raw ping-pong of the same frame
//!   size over the same kind of socket (target: <= 1.5x); for the rings, against a raw
//!   ping-pong over a pair of the transport's own ring streams (target: <= 1.3x) and against
//!   the unix socket's round trip (target: <= 0.1x);
//! - the issue rate of quiet kernel launches (target: >= 1,000,000 per second);
//! - host-to-device and device-to-host bandwidth of 64 MiB copies against an in-process memcpy
//!   of the same size and against raw socket throughput (target on a unix socket: >= 50% of raw).
//!
//! Then the aggregate rate of quiet launches from 1, 2 and 4 threads of one client process,
//! each on its own stream, through the client core as the shim drives it (per-stream lanes),
//! against every launch under the session lock (`threads.rs`; `gpufuse-bench threads` runs
//! only these, in alternating rounds, with each path's CPU time per launch, on-CPU share and
//! context switches, which tell contention from waiting for a core).
//!
//! TLS is measured against the same raw TCP baselines as plain TCP, so its rows show what
//! encryption and the node's TLS relay add.
//!
//! On the rings also 64 MiB copies of page-locked memory (`copies.rs`: `cuMemHostAlloc`'s arena
//! blocks and `cuMemHostRegister`ed memory, with the bytes that crossed the rings;
//! `gpufuse-bench copies` runs only those); `gpufuse-bench launches` runs only the quiet-launch
//! line on the rings, round by round: the worker's sustained pace for empty launches.
//!
//! `gpufuse-bench shares` measures compute shares (five client launch patterns x kernels of
//! 0.1, 2 and 25 ms x both compute policies) and QoS queueing delay instead (see `shares.rs`);
//! `gpufuse-bench elastic` scale-to-zero warm-up and migration (see `elastic.rs`);
//! `gpufuse-bench sim` the real-GPU backend's data path on the simulated driver against that
//! driver driven directly (see `sim.rs`);
//! `gpufuse-bench http` what `--http` costs the launch path, in alternating rounds against a
//! server without it (see `http_cost.rs`).
//!
//! `--http`: the node also serves `--http` (metrics, dashboard, its once-a-second history
//! sampler) and a thread scrapes `/metrics` every 100 ms throughout (a Prometheus scrape is
//! every 15 s or so): the figures must not move.
//!
//! Usage: `cargo run --release -p gpufuse-bench [-- [shares] [--quick] [--http]]`.

// One system call without a safe wrapper in std (`threads.rs`: a thread's CPU time), and the
// simulated driver's native baseline handing its buffers to the driver (`sim.rs`).
#![deny(unsafe_code)]

mod baseline;
mod copies;
mod elastic;
mod http_cost;
mod launches;
mod remote;
mod shares;
mod sim;
mod threads;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpufuse_transport::Address;

struct Server {
    child: Child,
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gpufuse_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let p = exe.parent().context("exe dir")?.join("gpufuse");
    if !p.exists() {
        bail!(
            "{} not found: build it with `cargo build --release`",
            p.display()
        );
    }
    Ok(p)
}

fn free_tcp_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Server {
    /// A `gpufuse serve` on one emulated GPU with `args` added, listening on a unix socket.
    fn start_with(args: &[&str]) -> Result<(Server, Address)> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("gpufuse-bench-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let unix = Address::Unix(dir.join("gpufuse.sock"));
        let child = Command::new(gpufuse_binary()?)
            .args(["serve", "--listen", &unix.to_string()])
            .args(if args.contains(&"--devices") {
                &[][..]
            } else {
                &["--devices", "emu:1:16GiB"][..]
            })
            .args(args)
            .stdout(Stdio::null())
            .stderr(match std::env::var_os("GPUFUSE_BENCH_SERVER_LOG") {
                Some(_) => Stdio::inherit(),
                None => Stdio::null(),
            })
            .spawn()?;
        let server = Server {
            child,
            _dir: TempDir(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while unix.connect().is_err() {
            if Instant::now() > deadline {
                bail!("gpufuse serve did not start listening");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok((server, unix))
    }
}

/// Scrapes `http://addr/metrics` every 100 ms until the process ends; counts the scrapes.
fn scrape_forever(addr: String, count: std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    std::thread::spawn(move || loop {
        if let Ok(mut r) = agent.get(&format!("http://{addr}/metrics")).call() {
            if r.body_mut().read_to_string().is_ok() {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    });
}

fn start_server(http: Option<&str>) -> Result<(Server, Address, Address, Address)> {
    let dir = std::env::temp_dir().join(format!("gpufuse-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let unix = Address::Unix(dir.join("gpufuse.sock"));
    let tcp = Address::Tcp(format!("127.0.0.1:{}", free_tcp_port()?));
    let tls = Address::TcpTls(format!("127.0.0.1:{}", free_tcp_port()?));
    let pki = dir.join("pki");
    let made = Command::new(gpufuse_binary()?)
        .args(["certs", "--dir"])
        .arg(&pki)
        .stdout(Stdio::null())
        .status()?;
    if !made.success() {
        bail!("gpufuse certs failed");
    }
    // The client side of every tcp+tls connection in this process trusts that CA.
    std::env::set_var("GPUFUSE_TLS_CA", pki.join("ca.pem"));
    let child = Command::new(gpufuse_binary()?)
        .args([
            "serve",
            "--listen",
            &unix.to_string(),
            "--listen",
            &tcp.to_string(),
            "--listen",
            &tls.to_string(),
            "--devices",
            "emu:1:16GiB",
        ])
        .arg("--tls-cert")
        .arg(pki.join("server.pem"))
        .arg("--tls-key")
        .arg(pki.join("server-key.pem"))
        .args(http.map(|a| ["--http", a]).into_iter().flatten())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server {
        child,
        _dir: TempDir(dir),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while unix.connect().is_err() || tcp.connect().is_err() || tls.connect().is_err() {
        if Instant::now() > deadline {
            bail!("gpufuse serve did not start listening");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((server, unix, tcp, tls))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "shares") {
        return shares::run(&shares::Options::parse(&args[1..])?);
    }
    if args.first().is_some_and(|a| a == "elastic") {
        return elastic::run(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "http") {
        return http_cost::run(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "threads") {
        return threads::run(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "copies") {
        return copies::run(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "sim") {
        return sim::run(&args[1..], sim::Driven::Simulated);
    }
    if args.first().is_some_and(|a| a == "gpu") {
        return sim::run(&args[1..], sim::Driven::Gpu);
    }
    if args.first().is_some_and(|a| a == "launches") {
        return launches::run(&args[1..]);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };
    let http = args
        .iter()
        .any(|a| a == "--http")
        .then(|| free_tcp_port().map(|p| format!("127.0.0.1:{p}")))
        .transpose()?;
    if let Some(a) = args
        .iter()
        .find(|a| !["--quick", "--http"].contains(&a.as_str()))
    {
        bail!("unknown option {a} (expected shares, --quick or --http)");
    }
    let (_server, unix, tcp, tls) = start_server(http.as_deref())?;
    let scrapes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    if let Some(a) = &http {
        scrape_forever(a.clone(), scrapes.clone());
    }
    println!(
        "gpufuse remoting benchmark ({}{})",
        if quick { "quick" } else { "full" },
        if http.is_some() {
            ", --http on, /metrics scraped every 100 ms"
        } else {
            ""
        }
    );
    let memcpy = baseline::memcpy_gib_s(64 << 20);
    println!("in-process memcpy of 64 MiB: {memcpy:.2} GiB/s\n");
    let socket = gpufuse_client::Transport::Socket;
    let mut unix_rt = None;
    let Address::Unix(path) = &unix else {
        unreachable!("start_server listens on a unix socket")
    };
    let shm_addr = Address::Shm(path.clone());
    for (name, addr, kind, transport) in [
        ("unix", unix.clone(), baseline::Kind::Unix, socket),
        (
            "shm (shared-memory rings; unix socket for set-up and liveness)",
            unix,
            baseline::Kind::Shm,
            gpufuse_client::Transport::Shm,
        ),
        ("tcp", tcp, baseline::Kind::Tcp, socket),
        (
            "tcp+tls (against raw TCP)",
            tls,
            baseline::Kind::Tcp,
            socket,
        ),
    ] {
        println!("== transport: {name} ==");
        let shm = matches!(kind, baseline::Kind::Shm);
        let raw_rt = baseline::ping_pong_us(kind, 20_000 / scale)?;
        let mut s = remote::Session::open(&addr, transport)?;
        let rt = s.round_trip_us(20_000 / scale)?;
        let target = if shm { 1.3 } else { 1.5 };
        println!("round trip:        {rt:8.2} us   raw ping-pong {raw_rt:8.2} us   ratio {:.2}x (target <= {target}x)", rt / raw_rt);
        match (shm, unix_rt) {
            (false, None) => unix_rt = Some(rt),
            (true, Some(u)) => println!(
                "round trip vs unix socket: {:.3}x of {u:.2} us (target <= 0.1x)",
                rt / u
            ),
            _ => {}
        }
        let (issue, drained) = s.quiet_launch_rate(1_000_000 / scale)?;
        let target = if shm { "2,000,000" } else { "1,000,000" };
        println!("quiet launches:    {issue:10.0} /s issued, {drained:10.0} /s until synchronized (target >= {target} /s issued)");
        // Bandwidth is noisy on a shared machine: the raw socket and gpufuse are measured in
        // turns, three rounds, and each reports its best round.
        let (mut raw_bw, mut h2d, mut d2h) = (0f64, 0f64, 0f64);
        for _ in 0..3 {
            raw_bw = raw_bw.max(baseline::stream_gib_s(kind, 64 << 20, 8)?);
            h2d = h2d.max(s.h2d_gib_s(64 << 20, 8)?);
            d2h = d2h.max(s.d2h_gib_s(64 << 20, 8)?);
        }
        println!(
            "host->device:      {h2d:8.2} GiB/s  = {:5.1}% of raw socket ({raw_bw:.2} GiB/s), {:5.1}% of memcpy",
            100.0 * h2d / raw_bw,
            100.0 * h2d / memcpy
        );
        println!(
            "device->host:      {d2h:8.2} GiB/s  = {:5.1}% of raw socket, {:5.1}% of memcpy\n",
            100.0 * d2h / raw_bw,
            100.0 * d2h / memcpy
        );
        if shm {
            // Page-locked memory in the host arena (cuMemHostAlloc's blocks, and registered
            // memory moved there): the worker copies in place. Against an in-process memcpy of
            // the same size measured in the same rounds.
            copies::print_lines(&shm_addr, &mut s, 3)?;
        }
    }
    println!(
        "== client threads, each issuing quiet launches on its own stream (one session, shm) =="
    );
    threads::print_lines(&shm_addr)?;
    println!();
    if http.is_some() {
        let n = scrapes.load(std::sync::atomic::Ordering::Relaxed);
        println!("/metrics scraped {n} times during the run");
        if n == 0 {
            bail!("--http: no scrape succeeded");
        }
    }
    Ok(())
}
