//! `gpufuse-bench http`: what `--http` (metrics, dashboard, the once-a-second history sampler)
//! costs the launch path, against a baseline measured in the same run.
//!
//! Two `gpufuse serve` processes on one emulated GPU each, one with `--http` and a thread
//! scraping its `/metrics` every 100 ms (a Prometheus scrape is every 15 s or so), one
//! without. Rounds alternate between them (and alternate which goes first), each round a
//! fresh session measuring quiet launches and the synchronous round trip; the medians are
//! compared. Alternating rounds is what makes the ratio mean something on a shared machine,
//! where two runs minutes apart differ by more than the effect looked for.
//!
//! Sessions use the shared-memory rings (the default for a local client);
//! `GPUFUSE_TRANSPORT=socket` measures over the unix socket instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::{free_tcp_port, remote, scrape_forever, Server};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(a) = args.iter().find(|a| a.as_str() != "--quick") {
        bail!("unknown option {a} (expected --quick)");
    }
    let (rounds, launches, pings) = if quick {
        (5, 200_000, 2_000)
    } else {
        (9, 1_000_000, 20_000)
    };
    let transport = gpufuse_client::Transport::from_env()?;
    let http = format!("127.0.0.1:{}", free_tcp_port()?);
    let (_plain, plain_addr) = Server::start_with(&[])?;
    let (_observed, observed_addr) = Server::start_with(&["--http", &http])?;
    let scrapes = Arc::new(AtomicU64::new(0));
    scrape_forever(http.clone(), scrapes.clone());
    let (mut launch, mut rt) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut over = None;
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let addr = if which == 0 {
                &plain_addr
            } else {
                &observed_addr
            };
            let mut s = remote::Session::open(addr, transport)?;
            if over.is_none() {
                over = Some(s.transport());
                println!(
                    "gpufuse --http cost ({}): {rounds} alternating rounds over {}, /metrics scraped every 100 ms",
                    if quick { "quick" } else { "full" },
                    s.transport()
                );
            }
            if over != Some(s.transport()) {
                bail!(
                    "sessions on different transports: {over:?} and {}",
                    s.transport()
                );
            }
            rt[which].push(s.round_trip_us(pings)?);
            launch[which].push(s.quiet_launch_rate(launches)?.0);
        }
    }
    let (l0, l1) = (median(&mut launch[0]), median(&mut launch[1]));
    let (r0, r1) = (median(&mut rt[0]), median(&mut rt[1]));
    println!(
        "quiet launches:   {l1:10.0} /s with --http, {l0:10.0} /s without   ratio {:.3} (target >= 0.95)",
        l1 / l0
    );
    println!(
        "round trip:       {r1:10.2} us with --http, {r0:10.2} us without   ratio {:.3} (target <= 1.05)",
        r1 / r0
    );
    let n = scrapes.load(Ordering::Relaxed);
    println!("/metrics scraped {n} times during the run");
    if n == 0 {
        bail!("--http: no scrape succeeded");
    }
    Ok(())
}
