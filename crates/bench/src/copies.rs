//! Copies between page-locked host memory and the device on the shared-memory transport,
//! against an in-process memcpy of the same size measured in the same rounds: `cuMemHostAlloc`
//! memory (a block of the host arena, named by offset: [`crate::remote::Session::pinned_gib_s`])
//! and `cuMemHostRegister`ed memory (the application's own buffer, its whole pages moved into
//! the arena in place), through the client core as the shim drives it, with the bytes that
//! crossed the rings meanwhile; and pageable memory (a plain heap buffer), whose bytes cross
//! the rings, also through the client core.
//!
//! `gpufuse-bench copies [--rounds N]` runs only these lines.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use gpufuse_client::{Session, SessionConfig};
use gpufuse_transport::Address;

use crate::baseline;

/// Registered-memory figures: GiB/s host to device and device to host, and the bytes that
/// crossed the rings per copy.
pub struct Registered {
    pub h2d: f64,
    pub d2h: f64,
    pub ring_bytes_per_copy: u64,
}

/// `size`-byte copies to and from a heap buffer (as an application's `malloc` gives: its
/// first and last pages partial), `cuMemHostRegister`ed if `register`, `reps` each way, each
/// as the shim's synchronous `cuMemcpyHtoD`/`cuMemcpyDtoH` makes it.
pub fn registered_gib_s(
    addr: &Address,
    size: usize,
    reps: usize,
    register: bool,
) -> Result<Registered> {
    let s = Session::connect(&SessionConfig {
        address: addr.clone(),
        token: String::new(),
        resources: Default::default(),
    })
    .context("open session")?;
    let ctx = s.lock().retain_primary(0)?;
    s.lock().set_current(ctx)?;
    let mut buf = vec![7u8; size];
    let p = buf.as_ptr() as usize;
    if register {
        s.lock().host_register(p, size, 0)?;
    }
    let dev = s.lock().alloc(size as u64)?;
    let ring = |s: &Session| -> Result<u64> {
        match s.lock().ring_bytes()? {
            Some((sent, received)) => Ok(sent + received),
            None => bail!("the session is not on the shared-memory transport"),
        }
    };
    // One of each first (pages touched), then the timed ones.
    s.lock().copy_to_device(dev, &buf, 0)?;
    s.lock().copy_from_device(&mut buf, dev, 0)?;
    let before = ring(&s)?;
    let t = Instant::now();
    for _ in 0..reps {
        s.lock().copy_to_device(dev, &buf, 0)?;
    }
    let h2d = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..reps {
        s.lock().copy_from_device(&mut buf, dev, 0)?;
    }
    let d2h = t.elapsed().as_secs_f64();
    let moved = ring(&s)? - before;
    if register {
        s.lock().host_unregister(p)?;
    }
    s.lock().free(dev)?;
    let gib = (size * reps) as f64 / (1u64 << 30) as f64;
    Ok(Registered {
        h2d: gib / h2d,
        d2h: gib / d2h,
        ring_bytes_per_copy: moved / (2 * reps as u64),
    })
}

/// Prints the pinned (arena block) and registered lines for 64 MiB copies, each the best of
/// `rounds` against the best in-process memcpy of those rounds.
pub fn print_lines(
    addr: &Address,
    pinned: &mut crate::remote::Session,
    rounds: usize,
) -> Result<()> {
    const SIZE: usize = 64 << 20;
    let (mut ph2d, mut pd2h, mut base) = (0f64, 0f64, 0f64);
    let (mut rh2d, mut rd2h, mut ring_bytes) = (0f64, 0f64, 0u64);
    let (mut gh2d, mut gd2h) = (0f64, 0f64);
    for _ in 0..rounds {
        base = base.max(baseline::memcpy_gib_s(SIZE));
        if let Some((h, d)) = pinned.pinned_gib_s(SIZE, 8)? {
            ph2d = ph2d.max(h);
            pd2h = pd2h.max(d);
        }
        let r = registered_gib_s(addr, SIZE, 8, true)?;
        rh2d = rh2d.max(r.h2d);
        rd2h = rd2h.max(r.d2h);
        ring_bytes = ring_bytes.max(r.ring_bytes_per_copy);
        let g = registered_gib_s(addr, SIZE, 8, false)?;
        gh2d = gh2d.max(g.h2d);
        gd2h = gd2h.max(g.d2h);
    }
    println!(
        "pinned host->device (host arena, 64 MiB): {ph2d:8.2} GiB/s = {:.2}x of memcpy ({base:.2} GiB/s) (target >= 0.8x)",
        ph2d / base
    );
    println!(
        "pinned device->host (host arena, 64 MiB): {pd2h:8.2} GiB/s = {:.2}x of memcpy (target >= 0.8x)",
        pd2h / base
    );
    println!(
        "registered host->device (cuMemHostRegister, 64 MiB): {rh2d:8.2} GiB/s = {:.2}x of memcpy (target >= 0.8x)",
        rh2d / base
    );
    println!(
        "registered device->host (cuMemHostRegister, 64 MiB): {rd2h:8.2} GiB/s = {:.2}x of memcpy (target >= 0.8x); {ring_bytes} bytes through the rings per copy\n",
        rd2h / base
    );
    println!(
        "pageable host->device (client core, rings, 64 MiB): {gh2d:8.2} GiB/s = {:.2}x of memcpy",
        gh2d / base
    );
    println!(
        "pageable device->host (client core, rings, 64 MiB): {gd2h:8.2} GiB/s = {:.2}x of memcpy\n",
        gd2h / base
    );
    Ok(())
}

/// `gpufuse-bench copies [--rounds N]`.
pub fn run(args: &[String]) -> Result<()> {
    let mut rounds = 3usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = it
                    .next()
                    .context("--rounds needs a number")?
                    .parse()
                    .context("--rounds")?;
            }
            other => bail!("unknown option {other} (expected --rounds N)"),
        }
    }
    let (_server, unix) = crate::Server::start_with(&[])?;
    let Address::Unix(path) = &unix else {
        unreachable!("start_with listens on a unix socket")
    };
    let addr = Address::Shm(path.clone());
    let mut pinned = crate::remote::Session::open(&addr, gpufuse_client::Transport::Shm)?;
    println!("page-locked copies on the shared-memory transport, best of {rounds} rounds");
    print_lines(&addr, &mut pinned, rounds.max(1))
}
