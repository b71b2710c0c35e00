//! `gpufuse-bench launches [--n N] [--rounds R]`: quiet launches of an empty 1-thread kernel
//! on the shared-memory transport, issued and until synchronized (the worker's pace), each
//! round printed and the medians; what the main run's "quiet launches" line measures, alone,
//! for profiling the worker's launch path.

use anyhow::{bail, Context, Result};
use gpufuse_transport::Address;

/// `gpufuse-bench launches`.
pub fn run(args: &[String]) -> Result<()> {
    let (mut n, mut rounds) = (1_000_000usize, 5usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = |what: &str| -> Result<usize> {
            it.next()
                .with_context(|| format!("{what} needs a number"))?
                .parse()
                .with_context(|| what.to_string())
        };
        match a.as_str() {
            "--n" => n = number("--n")?.max(1),
            "--rounds" => rounds = number("--rounds")?.max(1),
            other => bail!("unknown option {other} (expected --n N or --rounds R)"),
        }
    }
    let (_server, unix) = crate::Server::start_with(&[])?;
    let Address::Unix(path) = &unix else {
        unreachable!("start_with listens on a unix socket")
    };
    let addr = Address::Shm(path.clone());
    let mut s = crate::remote::Session::open(&addr, gpufuse_client::Transport::Shm)?;
    println!("{n} quiet launches of an empty 1-thread kernel (shm), {rounds} rounds");
    let (mut issued, mut drained) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (i, d) = s.quiet_launch_rate(n)?;
        println!("round {round}: {i:10.0} /s issued, {d:10.0} /s until synchronized");
        issued.push(i);
        drained.push(d);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median: {:10.0} /s issued, {:10.0} /s until synchronized (target >= 2,000,000 /s sustained)",
        median(&mut issued),
        median(&mut drained)
    );
    Ok(())
}
