//! `gpufuse simulate`: trace replay against a simulated pool (`gpufuse_scheduler::sim`).

use gpufuse_scheduler::sim::{self, PoolShape, TraceShape};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Mix {
    /// Most sessions a quarter of a GPU or less, one in ten a whole GPU (PAI-like).
    Pai,
    /// Small slices only: 1/16 to 1/2 of a GPU.
    Small,
}

#[derive(clap::Args)]
pub struct SimulateArgs {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// GPU memory (e.g. 80GiB).
    #[arg(long, default_value = "80GiB", value_parser = gpu_memory)]
    gpu_memory: u64,
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    #[arg(long, value_enum, default_value = "pai")]
    mix: Mix,
    /// Every session stays to the end of the trace (all of it resident at once).
    #[arg(long)]
    resident: bool,
    /// Mean arrivals per simulated second.
    #[arg(long)]
    arrivals_per_s: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn gpu_memory(s: &str) -> Result<u64, String> {
    gpufuse_scheduler::parse_size(s)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

pub fn simulate(a: SimulateArgs) -> anyhow::Result<()> {
    let mut shape = match a.mix {
        Mix::Pai => TraceShape::pai_like(a.sessions),
        Mix::Small => TraceShape::small_slices(a.sessions),
    };
    if let Some(r) = a.arrivals_per_s {
        anyhow::ensure!(
            r > 0.0 && r.is_finite(),
            "--arrivals-per-s must be positive"
        );
        shape.arrivals_per_s = r;
    }
    if a.resident {
        shape = shape.resident();
    }
    let trace = shape.generate(a.gpu_memory, a.seed);
    let pool = PoolShape {
        nodes: a.nodes,
        gpus_per_node: a.gpus,
        gpu_memory: a.gpu_memory,
    };
    println!(
        "trace: {} sessions, {:?} mix, {} arrivals/s, {}; pool: {} nodes x {} GPUs of {} GiB (seed {})\n",
        a.sessions,
        a.mix,
        shape.arrivals_per_s,
        if a.resident {
            "all resident".to_string()
        } else {
            format!(
                "log-normal durations (median {} s, sigma {})",
                shape.duration_median_s, shape.duration_sigma
            )
        },
        a.nodes,
        a.gpus,
        a.gpu_memory >> 30,
        a.seed
    );
    let reports = sim::compare(&trace, pool, thread_cpu_time);
    print!("{}", sim::table(&reports));
    println!("\nLatency and scheduler time are this thread's CPU time (other processes on the machine do not count).");
    if let Some(base) = reports.last() {
        // One GPU per session needs as many GPUs as sessions are there at once, whether
        // the pool has them or not.
        let need = base.sessions_peak.max(1);
        for r in &reports[..reports.len() - 1] {
            println!(
                "{}: {} GPUs at peak for {} sessions; one GPU per session needs {need}: {:.2}x fewer{}",
                r.name,
                r.gpus_in_use_peak,
                r.sessions_peak,
                need as f64 / r.gpus_in_use_peak.max(1) as f64,
                if r.never_placed > 0 {
                    format!(" ({} never placed)", r.never_placed)
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return gpufuse_scheduler::sim::wall_clock();
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
