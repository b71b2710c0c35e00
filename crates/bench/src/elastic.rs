//! `gpufuse-bench elastic [--sizes 256MiB,1GiB,4GiB] [--only warm-up|migration]`: scale to
//! zero and migration, measured
//! through a real `gpufuse serve` on emulated GPUs.
//!
//! - Warm-up: a session holding N bytes idles past `--idle-ttl` (its memory goes to host
//!   memory) or `--idle-disk-ttl` (to disk); the next call brings it back. Its time is set
//!   against a plain copy of the same bytes in this process (a fresh buffer: `to_vec`), and for
//!   disk against reading a file of the same size from the same directory, both measured in
//!   the same run. Target: from host within 1.5x of the copy + under 50 ms.
//! - Migration: the same session moves to the node's other device (`gpufuse migrate`'s
//!   request, with pre-copy) while a steady stream of kernels writes a small working buffer
//!   (the large one stays untouched, as a model's weights do); total time, stop time, rounds
//!   and the bytes copied in the stop as the node reports them, the longest stall the client
//!   saw on its kernels meanwhile, and a plain copy of the session's bytes in the same run.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpufuse_client::Connection;
use gpufuse_proto::{ReplyBody, Request, ResourceRequest, ServerHello, SessionKind};
use gpufuse_transport::Address;

use crate::Server;
use gpufuse_proto::SessionId;
use gpufuse_proto::{ContextHandle, DevicePtr, FunctionHandle, ModuleHandle, StreamHandle};

/// A kernel that adds one to a word: the steady load during a move.
const BUMP_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\
    .visible .entry bump(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
    ld.param.u64 %rd1, [p];\nld.global.u32 %r1, [%rd1];\nadd.u32 %r1, %r1, 1;\n\
    st.global.u32 [%rd1], %r1;\nret;\n}\n\0";

pub fn run(args: &[String]) -> Result<()> {
    let mut sizes: Vec<u64> = vec![256 << 20, 1 << 30, 4 << 30];
    if let Some(i) = args.iter().position(|a| a == "--sizes") {
        let list = args.get(i + 1).context("--sizes needs a list")?;
        sizes = list
            .split(',')
            .map(|s| parse_size(s).with_context(|| format!("bad size {s:?}")))
            .collect::<Result<_>>()?;
    }
    let only = match args.iter().position(|a| a == "--only") {
        None => None,
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some(p @ ("warm-up" | "migration")) => Some(p),
            other => bail!("--only takes warm-up or migration, not {other:?}"),
        },
    };
    let swap = std::env::temp_dir().join(format!("gpufuse-bench-swap-{}", std::process::id()));
    std::fs::create_dir_all(&swap)?;
    let _cleanup = Cleanup(swap.clone());
    let swap_arg = swap.to_string_lossy().to_string();
    println!("gpufuse elastic benchmark (timings on a shared machine: compare within a row)\n");
    println!("== scale to zero: warm-up of an idle session ==");
    for &size in sizes.iter().filter(|_| only != Some("migration")) {
        let copy = copy_time(size);
        let (_host_server, host) =
            Server::start_with(&["--devices", "emu:2:8GiB", "--idle-ttl", "300ms"])?;
        let warm_host = warm_up(&host, size, false)?;
        drop(_host_server);
        let (_disk_server, disk) = Server::start_with(&[
            "--devices",
            "emu:2:8GiB",
            "--idle-disk-ttl",
            "300ms",
            "--swap-dir",
            &swap_arg,
        ])?;
        let read = file_read_time(&swap, size)?;
        let warm_disk = warm_up(&disk, size, true)?;
        drop(_disk_server);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:>8}: from host {:8.1} ms, plain copy {:8.1} ms, ratio {:4.2}x, over 1.5x copy {:+7.1} ms (target <= +50 ms)",
            human(size),
            ms(warm_host),
            ms(copy),
            ms(warm_host) / ms(copy),
            ms(warm_host) - 1.5 * ms(copy)
        );
        println!(
            "{:>8}  from disk {:8.1} ms, file read  {:8.1} ms, ratio {:4.2}x",
            "",
            ms(warm_disk),
            ms(read),
            ms(warm_disk) / ms(read)
        );
    }
    println!("\n== migration between the two devices of a node, with pre-copy, under a steady kernel load ==");
    for &size in sizes.iter().filter(|_| only != Some("warm-up")) {
        let copy = copy_time(size);
        let (_server, addr) = Server::start_with(&["--devices", "emu:2:8GiB"])?;
        let m = migrate_under_load(&addr, size, None)?;
        print_move(size, &m, copy);
    }
    println!(
        "\n== migration to another node (two gpufuse serve on unix sockets of this host), with \
         pre-copy, under a steady kernel load =="
    );
    for &size in sizes.iter().filter(|_| only != Some("warm-up")) {
        let copy = copy_time(size);
        let (_a, a) = Server::start_with(&["--devices", "emu:1:8GiB"])?;
        let (_b, b) = Server::start_with(&["--devices", "emu:1:8GiB"])?;
        let m = migrate_under_load(&a, size, Some(&b))?;
        print_move(size, &m, copy);
    }
    Ok(())
}

/// One row of a migration table.
fn print_move(size: u64, m: &MoveSeen, copy: Duration) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{:>8}: total {:8.1} ms ({:4.2}x the plain copy {:8.1} ms), stop {:7.1} ms \
         copying {:6.1} KiB after {} round(s), longest kernel stall seen by the client {:7.1} ms",
        human(size),
        ms(m.total),
        ms(m.total) / ms(copy),
        ms(copy),
        m.figures.stop_us as f64 / 1e3,
        m.figures.stop_bytes as f64 / 1024.0,
        m.figures.rounds,
        ms(m.stall)
    );
}

struct Cleanup(std::path::PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (n, mult) = if let Some(n) = s.strip_suffix("GiB") {
        (n, 1u64 << 30)
    } else if let Some(n) = s.strip_suffix("MiB") {
        (n, 1 << 20)
    } else {
        (s, 1)
    };
    n.parse::<u64>().ok().map(|n| n * mult)
}

fn human(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{} GiB", b >> 30)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// A plain copy of `size` bytes into a fresh buffer (best of two).
fn copy_time(size: u64) -> Duration {
    let src = vec![7u8; size as usize];
    let mut best = Duration::MAX;
    for _ in 0..2 {
        let t = Instant::now();
        let dst = src.to_vec();
        best = best.min(t.elapsed());
        std::hint::black_box(&dst);
    }
    best
}

/// Reading a file of `size` bytes from `dir` (written first, so from the page cache as the
/// swap file is).
fn file_read_time(dir: &std::path::Path, size: u64) -> Result<Duration> {
    let path = dir.join("baseline.bin");
    std::fs::write(&path, vec![3u8; size as usize])?;
    let t = Instant::now();
    let back = std::fs::read(&path)?;
    let took = t.elapsed();
    std::hint::black_box(&back);
    drop(back);
    std::fs::remove_file(&path)?;
    Ok(took)
}

fn open(addr: &Address) -> Result<(Connection, u64)> {
    let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
    let (conn, accepted) = Connection::open(addr, &hello).context("open session")?;
    Ok((conn, accepted.session_id))
}

/// A session holding `size` bytes (filled in 64 MiB copies).
fn fill(conn: &mut Connection, size: u64) -> Result<u64> {
    let ReplyBody::Ptr(DevicePtr(ptr)) = conn.call(&Request::MemAlloc { device: 0, size })? else {
        bail!("alloc");
    };
    let chunk = vec![0x5au8; (64u64 << 20).min(size) as usize];
    let mut off = 0;
    while off < size {
        let n = chunk.len().min((size - off) as usize);
        conn.quiet_with_tail(
            &Request::MemcpyHtoD {
                dst: DevicePtr(ptr + off),
                stream: StreamHandle(0),
                data: &[],
            },
            &chunk[..n],
        )?;
        off += n as u64;
    }
    conn.call(&Request::CtxSynchronize {
        ctx: ContextHandle(0),
    })?;
    Ok(ptr)
}

fn status(addr: &Address) -> Result<gpufuse_proto::NodeStatus> {
    Ok(Connection::query_status(addr, String::new())?)
}

/// Fills a session, waits until its memory is in host memory (or on disk), then times the
/// call that brings it back.
fn warm_up(addr: &Address, size: u64, disk: bool) -> Result<Duration> {
    let (mut conn, _) = open(addr)?;
    let ptr = fill(&mut conn, size)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let st = status(addr)?;
        let s = st.sessions.first().context("no session")?;
        let away = if disk {
            s.swapped_disk_bytes
        } else {
            s.swapped_host_bytes
        };
        if away >= size {
            break;
        }
        if Instant::now() > deadline {
            bail!("the session was not swapped out in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    let back = conn.call(&Request::MemcpyDtoH {
        src: DevicePtr(ptr + size - 4),
        size: 4,
        stream: StreamHandle(0),
    })?;
    let took = t.elapsed();
    match back {
        ReplyBody::Data(d) if d == [0x5a; 4] => Ok(took),
        other => bail!("the session's data did not come back: {other:?}"),
    }
}

/// A move's figures as the bench saw them.
struct MoveSeen {
    total: Duration,
    figures: gpufuse_proto::MoveFigures,
    /// The longest gap between the client's kernel completions.
    stall: Duration,
}

/// Moves a filled session between the node's devices (or, with `to_node`, to device 0 of that
/// node) while a thread launches kernels that write a small working buffer.
fn migrate_under_load(addr: &Address, size: u64, to_node: Option<&Address>) -> Result<MoveSeen> {
    let (mut conn, id) = open(addr)?;
    let big = fill(&mut conn, size)?;
    let ReplyBody::Ptr(DevicePtr(ptr)) = conn.call(&Request::MemAlloc {
        device: 0,
        size: 4096,
    })?
    else {
        bail!("alloc");
    };
    conn.call(&Request::MemcpyHtoD {
        dst: DevicePtr(ptr),
        stream: StreamHandle(0),
        data: &[0x5a; 4],
    })?;
    let image = BUMP_PTX.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    conn.call(&Request::ModuleLoad {
        module: ModuleHandle(1),
        device: 0,
        hash,
        image: Some(image),
    })?;
    conn.call(&Request::ModuleGetFunction {
        module: ModuleHandle(1),
        name: "bump",
        function: FunctionHandle(1),
    })?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Result<(Duration, Connection)> {
            let mut longest = Duration::ZERO;
            let mut last = Instant::now();
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                conn.quiet(&Request::LaunchKernel(gpufuse_proto::Launch {
                    function: FunctionHandle(1),
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    shared_mem: 0,
                    stream: StreamHandle(0),
                    params: &ptr.to_le_bytes(),
                    attributes: Vec::new(),
                }))?;
                conn.call(&Request::CtxSynchronize {
                    ctx: ContextHandle(0),
                })?;
                n += 1;
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
            let ReplyBody::Data(d) = conn.call(&Request::MemcpyDtoH {
                src: DevicePtr(ptr),
                size: 4,
                stream: StreamHandle(0),
            })?
            else {
                bail!("read back");
            };
            let got = u32::from_le_bytes(d.try_into().map_err(|_| anyhow::anyhow!("4 bytes"))?);
            let want = u32::from_le_bytes([0x5a; 4]).wrapping_add(n);
            if got != want {
                bail!("after the move the counter is {got:#x}, want {want:#x}");
            }
            Ok((longest, conn))
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let device = status(addr)?
        .sessions
        .iter()
        .find(|s| s.id == SessionId(id))
        .map(|s| s.device)
        .context("no session")?;
    let kind = match to_node {
        None => SessionKind::Migrate {
            session: SessionId(id),
            device: 1 - device,
        },
        Some(node) => SessionKind::MigrateTo {
            session: SessionId(id),
            node: node.to_string(),
            device: 0,
            token: String::new(),
        },
    };
    let hello = Connection::hello(kind, String::new(), ResourceRequest::default());
    let t = Instant::now();
    let answer = Connection::one_shot_within(addr, &hello, Duration::from_secs(330))?;
    let total = t.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (stall, mut conn) = load
        .join()
        .map_err(|_| anyhow::anyhow!("load thread panicked"))??;
    let ReplyBody::Data(d) = conn.call(&Request::MemcpyDtoH {
        src: DevicePtr(big + size - 4),
        size: 4,
        stream: StreamHandle(0),
    })?
    else {
        bail!("read back");
    };
    if d != [0x5a; 4] {
        bail!("the untouched buffer changed across the move");
    }
    match answer {
        ServerHello::MigratedWith { figures, .. } | ServerHello::MovedToNode { figures, .. } => {
            Ok(MoveSeen {
                total,
                figures,
                stall,
            })
        }
        ServerHello::Refused { reason } => bail!("the move was refused: {reason}"),
        _ => bail!("unexpected answer to the move"),
    }
}
