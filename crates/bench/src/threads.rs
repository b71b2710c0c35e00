//! Quiet launches from several application threads of one process, each on its own stream,
//! through the client core exactly as the shim drives it (`Session::launch_kernel`: the
//! stream's lane, without the session lock), against the same launches each made under the
//! session lock (`Session::lock()` per call, as every launch went before lanes): the aggregate
//! rate with 1, 2 and 4 threads shows whether threads serialize.
//!
//! The threads share a fixed number of launches, small enough that everything issued fits in
//! the shared-memory ring (4 MiB): the figure is what the client can issue, not how fast the
//! worker runs them (once the ring is full every path issues at the worker's pace).
//!
//! `gpufuse-bench threads [--quick] [--rounds N] [--total N]` runs only these lines, both paths
//! in alternating rounds against one `gpufuse serve`, and prints each path's median; `--total`
//! past the ring (say 160000) measures the regime where the worker's pace decides.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gpufuse_client::lanes::StreamRef;
use gpufuse_client::launch::{KernelLaunch, LaunchConfig};
use gpufuse_client::state::set_current_context;
use gpufuse_client::{Session, SessionConfig};
use gpufuse_transport::Address;

use crate::remote::EMPTY_PTX;

/// How each launch reaches the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `Session::launch_kernel`, as the shim calls it (lanes).
    Lanes,
    /// Every launch under the session lock (the client before lanes).
    Locked,
}

/// What one measurement gives.
pub struct Rates {
    /// Launches per second, all threads together, until every thread had issued its share.
    pub issued: f64,
    /// Launches per second until every stream was synchronized.
    pub drained: f64,
    /// CPU time the launching threads spent per launch, in ns (all bursts): what grows with
    /// threads when they contend (a shared lock or cache line), and stays flat when they do not.
    pub cpu_ns_per_launch: f64,
    /// The share of the issuing time the launching threads were on a CPU, on average (1.0:
    /// never waiting; below it they waited for a core or a lock).
    pub on_cpu: f64,
    /// Context switches of the launching threads per 1,000 launches: voluntary (the thread
    /// blocked: a contended lock, a full ring) and involuntary (preempted: it waited for a
    /// core), which tell the two kinds of waiting apart.
    pub blocked_per_k: f64,
    pub preempted_per_k: f64,
}

/// This thread's context switches so far: (voluntary, involuntary), from
/// `/proc/thread-self/status` (exact counts, kept at every switch).
fn thread_switches() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
    )
}

/// Nanoseconds this thread has run on a CPU (`CLOCK_THREAD_CPUTIME_ID`, which counts the
/// running slice too: `/proc/thread-self/schedstat` lags by up to a scheduler tick, as long as
/// a burst here).
#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Launches the threads share in one measurement: about 2.7 MiB of frames.
pub const TOTAL: usize = 32_000;

/// Launches per second, all threads together (`total` split between them), the median of
/// `bursts`: issued, and until every stream synchronized.
pub fn aggregate_launch_rate(
    addr: &Address,
    threads: usize,
    total: usize,
    bursts: usize,
    path: Path,
) -> Result<Rates> {
    let per_thread = total / threads;
    let session = Arc::new(
        Session::connect(&SessionConfig {
            address: addr.clone(),
            token: String::new(),
            resources: Default::default(),
        })
        .context("connect")?,
    );
    session.start_flusher(std::time::Duration::from_millis(2));
    let (f, function, streams) = {
        let mut g = session.lock();
        let ctx = g.ensure_primary(0)?;
        set_current_context(ctx);
        let module = g.load_module(EMPTY_PTX.as_bytes().to_vec())?;
        let f = g.function(module, "noop")?;
        let (function, _) = g.launch_layout(f)?;
        let mut streams = Vec::new();
        for _ in 0..threads {
            let h = g.create_stream(1, 0)?;
            streams.push((h, g.stream_id(h)?));
        }
        (f, function, streams)
    };
    // The threads issue `bursts` times; each burst starts them together and the streams are
    // synchronized (the ring emptied) before the next.
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let workers: Vec<_> = streams
        .iter()
        .map(|&(handle, stream)| {
            let (s, barrier) = (session.clone(), barrier.clone());
            std::thread::spawn(move || -> Result<(u64, u64, u64)> {
                let arg = [0u8; 12];
                let mut result = Ok(());
                let (mut cpu, mut blocked, mut preempted) = (0, 0, 0);
                for _ in 0..bursts {
                    barrier.wait();
                    let switches = thread_switches();
                    let before = thread_cpu_ns();
                    for _ in 0..per_thread {
                        if result.is_err() {
                            break;
                        }
                        result = match path {
                            Path::Lanes => {
                                let l = KernelLaunch {
                                    function: f,
                                    grid: [1, 1, 1],
                                    block: [1, 1, 1],
                                    shared_mem: 0,
                                    stream: StreamRef::legacy(handle),
                                    attributes: Vec::new(),
                                };
                                s.launch_kernel(l, &mut |_| Ok(arg.to_vec()))
                            }
                            Path::Locked => {
                                let config = LaunchConfig {
                                    grid: [1, 1, 1],
                                    block: [1, 1, 1],
                                    shared_mem: 0,
                                    stream,
                                    attributes: Vec::new(),
                                };
                                s.lock().launch(function, config, arg.to_vec())
                            }
                        };
                    }
                    cpu += thread_cpu_ns() - before;
                    let (v, n) = thread_switches();
                    blocked += v - switches.0;
                    preempted += n - switches.1;
                    barrier.wait();
                }
                result?;
                Ok((cpu, blocked, preempted))
            })
        })
        .collect();
    let n = (threads * per_thread) as f64;
    let (mut issued, mut drained) = (Vec::new(), Vec::new());
    let mut issuing = 0f64;
    for _ in 0..bursts {
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        issuing += start.elapsed().as_secs_f64();
        issued.push(n / start.elapsed().as_secs_f64());
        let mut g = session.lock();
        for &(h, _) in &streams {
            g.synchronize_stream(h)?;
        }
        drained.push(n / start.elapsed().as_secs_f64());
    }
    let (mut cpu, mut blocked, mut preempted) = (0u64, 0u64, 0u64);
    for w in workers {
        let (c, b, p) = w.join().expect("launch thread")?;
        cpu += c;
        blocked += b;
        preempted += p;
    }
    let launches = n * bursts as f64;
    Ok(Rates {
        issued: median(&mut issued),
        drained: median(&mut drained),
        cpu_ns_per_launch: cpu as f64 / launches,
        on_cpu: cpu as f64 / 1e9 / (issuing * threads as f64),
        blocked_per_k: blocked as f64 * 1000.0 / launches,
        preempted_per_k: preempted as f64 * 1000.0 / launches,
    })
}

/// The lines of the main benchmark: 1, 2 and 4 threads, lanes and locked, one round.
pub fn print_lines(addr: &Address) -> Result<()> {
    let mut one = None;
    for n in [1, 2, 4] {
        let locked = aggregate_launch_rate(addr, n, TOTAL, 5, Path::Locked)?;
        let lanes = aggregate_launch_rate(addr, n, TOTAL, 5, Path::Lanes)?;
        let base = *one.get_or_insert(lanes.issued);
        println!(
            "{n} thread(s):       {:10.0} /s issued ({:.2}x of 1 thread), {:10.0} /s until synchronized; every launch under the session lock: {:10.0} /s ({:.2}x)",
            lanes.issued,
            lanes.issued / base,
            lanes.drained,
            locked.issued,
            lanes.issued / locked.issued
        );
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `gpufuse-bench threads [--quick] [--rounds N] [--total N]`.
pub fn run(args: &[String]) -> Result<()> {
    let mut quick = false;
    let mut rounds = 9usize;
    let mut total = TOTAL;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--rounds" => {
                rounds = it
                    .next()
                    .context("--rounds needs a number")?
                    .parse()
                    .context("--rounds")?;
                if rounds == 0 {
                    bail!("--rounds must be at least 1");
                }
            }
            "--total" => {
                total = it
                    .next()
                    .context("--total needs a number")?
                    .parse()
                    .context("--total")?;
                if total < 4 {
                    bail!("--total must be at least 4");
                }
            }
            other => bail!("unknown option {other} (expected --quick, --rounds N or --total N)"),
        }
    }
    if quick {
        rounds = rounds.min(3);
    }
    let (_server, unix) = crate::Server::start_with(&[])?;
    let Address::Unix(path) = &unix else {
        unreachable!("start_with listens on a unix socket")
    };
    let addr = Address::Shm(path.clone());
    println!(
        "client threads sharing {total} quiet launches, each on its own stream (one session, shm); median of {rounds} alternating rounds of 5 bursts"
    );
    let counts = [1usize, 2, 4];
    // Per thread count and path: each round's issued rate, CPU time per launch, on-CPU share,
    // and blocking and preempting switches per 1000 launches.
    let mut got = vec![[[(); 5].map(|_| Vec::new()), [(); 5].map(|_| Vec::new())]; counts.len()];
    for _ in 0..rounds {
        for (i, &n) in counts.iter().enumerate() {
            for (j, path) in [Path::Locked, Path::Lanes].into_iter().enumerate() {
                let r = aggregate_launch_rate(&addr, n, total, 5, path)?;
                got[i][j][0].push(r.issued);
                got[i][j][1].push(r.cpu_ns_per_launch);
                got[i][j][2].push(r.on_cpu);
                got[i][j][3].push(r.blocked_per_k);
                got[i][j][4].push(r.preempted_per_k);
            }
        }
    }
    let med: Vec<[[f64; 5]; 2]> = got
        .iter_mut()
        .map(|paths| paths.each_mut().map(|v| v.each_mut().map(|v| median(v))))
        .collect();
    for (i, n) in counts.iter().enumerate() {
        let [locked, lanes] = med[i];
        println!(
            "{n} thread(s): lanes {:10.0} /s ({:.2}x of 1 thread; {:.0} ns CPU per launch, threads on a CPU {:.0}% of the time; per 1000 launches {:.2} blocked, {:.2} preempted)   under the session lock {:10.0} /s ({:.2}x; {:.0} ns, {:.0}%; {:.2} blocked, {:.2} preempted)   lanes/locked {:.2}x",
            lanes[0],
            lanes[0] / med[0][1][0],
            lanes[1],
            100.0 * lanes[2],
            lanes[3],
            lanes[4],
            locked[0],
            locked[0] / med[0][0][0],
            locked[1],
            100.0 * locked[2],
            locked[3],
            locked[4],
            lanes[0] / locked[0]
        );
    }
    Ok(())
}
