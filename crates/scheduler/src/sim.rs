//! Trace replay: a workload of arrivals, slices and durations played against a pool of
//! `nodes x gpus` on a simulated clock, once per policy and once with one whole GPU per
//! session (the baseline a pool is measured against). `gpufuse simulate` prints the table.
//!
//! The trace's own time is simulated. Placement latency is measured with a clock the caller
//! passes ([`Clock`]): `gpufuse simulate` passes the thread's CPU time, so that a busy
//! machine (other processes taking the cores) does not inflate the scheduler's own cost;
//! [`wall_clock`] is the plain alternative.
//!
//! # Synthetic traces
//! [`TraceShape`] generates traces shaped like the public GPU-cluster traces (Alibaba PAI
//! 2020, "MLaaS in the Wild", NSDI '22; Microsoft Philly, ATC '19): Poisson arrivals; most
//! tasks ask for a fraction of a GPU (the mix is a parameter: [`TraceShape::pai_like`] and
//! [`TraceShape::small_slices`] below); heavy-tailed (log-normal) durations, median minutes
//! and a tail of hours; a minority of low-priority (preemptible) work. The parameters are
//! this generator's, chosen to match those traces' qualitative shape, not fitted to them.

use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

/// A clock for measuring decisions: any monotonic reading.
pub type Clock = fn() -> Duration;

/// Wall time since the first call.
pub fn wall_clock() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

use rand::{Rng, SeedableRng};

use crate::{
    Decision, DeviceSpec, Millis, NodeSpec, Policy, Pool, Qos, QuotaFile, Request, SessionId,
};

/// One session of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub arrival: Millis,
    pub duration: Millis,
    pub request: Request,
}

/// The parameters of a synthetic trace.
#[derive(Clone, Debug)]
pub struct TraceShape {
    pub sessions: usize,
    /// Mean arrivals per simulated second (Poisson).
    pub arrivals_per_s: f64,
    /// Median session length, seconds (log-normal).
    pub duration_median_s: f64,
    /// Log-normal sigma of the length (1.5: a tail of hours behind a median of minutes).
    pub duration_sigma: f64,
    /// `(fraction of a GPU, weight)`: each session asks for that fraction of one GPU's VRAM
    /// and the same percentage of its compute.
    pub mix: Vec<(f64, f64)>,
    /// Fraction of sessions with QoS `low`.
    pub low_fraction: f64,
}

impl TraceShape {
    /// The PAI-like mix: most sessions a quarter of a GPU or less, one in ten a whole GPU.
    pub fn pai_like(sessions: usize) -> Self {
        Self {
            sessions,
            arrivals_per_s: 2.0,
            duration_median_s: 600.0,
            duration_sigma: 1.5,
            mix: vec![
                (1.0 / 16.0, 0.20),
                (1.0 / 8.0, 0.25),
                (1.0 / 4.0, 0.30),
                (1.0 / 2.0, 0.15),
                (1.0, 0.10),
            ],
            low_fraction: 0.2,
        }
    }

    /// Small slices only (inference services, notebooks): at most half a GPU.
    pub fn small_slices(sessions: usize) -> Self {
        Self {
            mix: vec![
                (1.0 / 16.0, 0.30),
                (1.0 / 8.0, 0.30),
                (1.0 / 4.0, 0.30),
                (1.0 / 2.0, 0.10),
            ],
            ..Self::pai_like(sessions)
        }
    }

    /// Every session stays to the end: the whole trace is resident at once (the scale test).
    pub fn resident(mut self) -> Self {
        self.duration_median_s = 1e9;
        self.duration_sigma = 0.0;
        self
    }

    /// The trace for GPUs of `gpu_memory` bytes, reproducibly from `seed`.
    pub fn generate(&self, gpu_memory: u64, seed: u64) -> Vec<TraceEvent> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let total: f64 = self.mix.iter().map(|m| m.1).sum();
        let mut t = 0.0f64;
        (0..self.sessions)
            .map(|i| {
                // Exponential inter-arrival times: a Poisson process.
                let u: f64 = rng.gen_range(f64::EPSILON..1.0);
                t += -u.ln() / self.arrivals_per_s;
                // Log-normal duration (Box-Muller for the normal deviate).
                let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let dur = self.duration_median_s * (self.duration_sigma * z).exp();
                let mut pick = rng.gen::<f64>() * total;
                let frac = self
                    .mix
                    .iter()
                    .find(|(_, w)| {
                        pick -= w;
                        pick <= 0.0
                    })
                    .map_or(1.0, |m| m.0);
                let low = rng.gen::<f64>() < self.low_fraction;
                TraceEvent {
                    arrival: (t * 1000.0) as Millis,
                    duration: (dur * 1000.0).clamp(1000.0, 1e15) as Millis,
                    request: Request {
                        tenant: format!("tenant-{}", i % 8),
                        vram_bytes: Some(((gpu_memory as f64) * frac) as u64),
                        compute_percent: Some(((frac * 100.0).ceil() as u32).clamp(1, 100)),
                        qos: if low { Qos::Low } else { Qos::Medium },
                        ..Default::default()
                    },
                }
            })
            .collect()
    }
}

/// The pool a trace is replayed against.
#[derive(Clone, Copy, Debug)]
pub struct PoolShape {
    pub nodes: usize,
    pub gpus_per_node: usize,
    pub gpu_memory: u64,
}

impl PoolShape {
    pub fn build(&self, policy: Policy) -> Pool {
        let mut pool = Pool::new(policy, QuotaFile::default());
        for n in 0..self.nodes {
            let spec = NodeSpec {
                name: format!("node-{n:04}"),
                address: format!("tcp:10.0.{}.{}:7070", n / 250, n % 250),
                labels: BTreeMap::new(),
                devices: (0..self.gpus_per_node as u32)
                    .map(|index| DeviceSpec {
                        index,
                        model: "simulated 80 GiB GPU".into(),
                        memory_total: self.gpu_memory,
                        compute_capability: (9, 0),
                        capacity_mtflops: 60_000,
                        uuid: String::new(),
                    })
                    .collect(),
            };
            pool.register_node(spec, &[], &[], 0);
        }
        pool
    }
}

/// What one replay measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// `binpack`, `spread`, `balanced`, or `one-gpu-per-session`.
    pub name: String,
    pub sessions: usize,
    /// Sessions placed at some point (at arrival or from the queue).
    pub placed: usize,
    /// Sessions still waiting when the trace ended.
    pub never_placed: usize,
    /// Most sessions waiting at once.
    pub pending_peak: usize,
    /// Wall time of one placement decision (`submit`), microseconds.
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    /// Wall time of every decision of the replay (submits and queue retries), milliseconds.
    pub scheduler_ms: f64,
    /// Most GPUs holding at least one session at once.
    pub gpus_in_use_peak: usize,
    /// Most sessions placed or waiting at once: the GPUs one GPU per session would need.
    pub sessions_peak: usize,
    /// Mean over samples of the VRAM charged on GPUs in use, as a share of their memory.
    pub vram_utilization: f64,
    /// The same for compute shares.
    pub compute_utilization: f64,
    /// Mean over samples of the free memory on GPUs in use that lies in pieces smaller than
    /// the trace's median slice (memory no typical session can use), as a share of those
    /// GPUs' memory.
    pub fragmentation: f64,
}

/// Replays `trace` against a fresh pool of `shape` under `policy`. With `whole_gpus`, every
/// session asks for a whole GPU instead (the one-GPU-per-session baseline).
pub fn replay(
    trace: &[TraceEvent],
    shape: PoolShape,
    policy: Policy,
    whole_gpus: bool,
    clock: Clock,
) -> ReplayReport {
    let mut pool = shape.build(policy);
    let median_slice = {
        let mut v: Vec<u64> = trace.iter().filter_map(|e| e.request.vram_bytes).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(1)
    };
    // Departures: (Reverse(end time), session).
    let mut ends: BinaryHeap<std::cmp::Reverse<(Millis, SessionId)>> = BinaryHeap::new();
    let mut durations: BTreeMap<SessionId, Millis> = BTreeMap::new();
    let mut latencies = Vec::with_capacity(trace.len());
    let mut report = ReplayReport {
        name: if whole_gpus {
            "one-gpu-per-session".into()
        } else {
            policy.name().into()
        },
        sessions: trace.len(),
        ..Default::default()
    };
    let mut total = Duration::ZERO;
    let (mut samples, mut vram_sum, mut comp_sum, mut frag_sum) = (0usize, 0.0, 0.0, 0.0);
    let sample_every = (trace.len() / 200).max(1);
    let placed_at = |ends: &mut BinaryHeap<std::cmp::Reverse<(Millis, SessionId)>>,
                     durations: &mut BTreeMap<SessionId, Millis>,
                     id: SessionId,
                     now: Millis| {
        if let Some(d) = durations.remove(&id) {
            ends.push(std::cmp::Reverse((now.saturating_add(d), id)));
        }
    };
    for (i, ev) in trace.iter().enumerate() {
        // Sessions that ended before this arrival leave, and the queue is retried.
        let mut freed = false;
        while let Some(std::cmp::Reverse((end, id))) = ends.peek().copied() {
            if end > ev.arrival {
                break;
            }
            ends.pop();
            pool.end_session(id);
            freed = true;
        }
        if freed && !pool.pending().is_empty() {
            let t = clock();
            let placed = pool.retry_pending(ev.arrival);
            total += clock().saturating_sub(t);
            for p in placed {
                report.placed += 1;
                placed_at(&mut ends, &mut durations, p.session, ev.arrival);
            }
        }
        let mut req = ev.request.clone();
        if whole_gpus {
            req.vram_bytes = Some(shape.gpu_memory);
            req.compute_percent = Some(100);
        }
        // Preemption is not simulated: everyone waits alike.
        req.qos = Qos::Medium;
        let t = clock();
        let decision = pool.submit(&req, ev.arrival);
        let took = clock().saturating_sub(t);
        total += took;
        latencies.push(took.as_secs_f64() * 1e6);
        match decision {
            Ok(Decision::Placed(p)) => {
                report.placed += 1;
                durations.insert(p.session, ev.duration);
                placed_at(&mut ends, &mut durations, p.session, ev.arrival);
            }
            Ok(Decision::Pending { id, .. }) => {
                durations.insert(id, ev.duration);
            }
            Ok(Decision::Preempt(_)) | Err(_) => {}
        }
        report.pending_peak = report.pending_peak.max(pool.pending().len());
        if i % sample_every == 0 || i + 1 == trace.len() {
            let mut used = 0usize;
            let (mut total_mem, mut charged, mut comp, mut free, mut stranded) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            for n in pool.nodes() {
                for d in n.devices.iter().filter(|d| !d.sessions.is_empty()) {
                    used += 1;
                    total_mem += d.spec.memory_total;
                    charged += d.charged_memory;
                    comp += u64::from(d.charged_compute);
                    let f = d.free_memory();
                    free += f;
                    if f < median_slice {
                        stranded += f;
                    }
                }
            }
            report.gpus_in_use_peak = report.gpus_in_use_peak.max(used);
            report.sessions_peak = report
                .sessions_peak
                .max(pool.sessions().count() + pool.pending().len());
            if used > 0 {
                samples += 1;
                vram_sum += charged as f64 / total_mem as f64;
                comp_sum += comp as f64 / (used as f64 * 100.0);
                let _ = free;
                frag_sum += stranded as f64 / total_mem as f64;
            }
        }
    }
    report.never_placed = pool.pending().len();
    report.scheduler_ms = total.as_secs_f64() * 1e3;
    latencies.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    report.latency_p50_us = pct(0.50);
    report.latency_p99_us = pct(0.99);
    if samples > 0 {
        report.vram_utilization = vram_sum / samples as f64;
        report.compute_utilization = comp_sum / samples as f64;
        report.fragmentation = frag_sum / samples as f64;
    }
    report
}

/// Replays `trace` under every policy and the one-GPU-per-session baseline.
pub fn compare(trace: &[TraceEvent], shape: PoolShape, clock: Clock) -> Vec<ReplayReport> {
    let mut v: Vec<ReplayReport> = Policy::ALL
        .iter()
        .map(|&p| replay(trace, shape, p, false, clock))
        .collect();
    v.push(replay(trace, shape, Policy::Binpack, true, clock));
    v
}

/// The table `gpufuse simulate` prints (markdown).
pub fn table(reports: &[ReplayReport]) -> String {
    let mut s = String::from(
        "| placement | placed | pending peak | never placed | p50 us | p99 us | scheduler ms | sessions (peak) | GPUs in use (peak) | VRAM util | compute util | fragmentation |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        s += &format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {:.0}% | {:.0}% | {:.1}% |\n",
            r.name,
            r.placed,
            r.pending_peak,
            r.never_placed,
            r.latency_p50_us,
            r.latency_p99_us,
            r.scheduler_ms,
            r.sessions_peak,
            r.gpus_in_use_peak,
            r.vram_utilization * 100.0,
            r.compute_utilization * 100.0,
            r.fragmentation * 100.0
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_reproducible_and_follows_its_mix() {
        let shape = TraceShape::small_slices(2000);
        let a = shape.generate(80 << 30, 7);
        assert_eq!(a, shape.generate(80 << 30, 7));
        assert!(a.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        assert!(a.iter().all(|e| e.request.vram_bytes.unwrap() <= 40 << 30));
        let eighths = a
            .iter()
            .filter(|e| e.request.vram_bytes == Some(10 << 30))
            .count();
        assert!((450..750).contains(&eighths), "{eighths} of 2000 at 1/8");
    }

    #[test]
    fn packing_small_slices_uses_fewer_gpus_than_one_gpu_each() {
        let shape = PoolShape {
            nodes: 20,
            gpus_per_node: 8,
            gpu_memory: 80 << 30,
        };
        let trace = TraceShape::small_slices(300)
            .resident()
            .generate(80 << 30, 1);
        let packed = replay(&trace, shape, Policy::Binpack, false, wall_clock);
        let whole = replay(&trace, shape, Policy::Binpack, true, wall_clock);
        assert_eq!((packed.placed, whole.placed), (300, 160));
        assert_eq!(whole.gpus_in_use_peak, 160);
        assert!(
            packed.gpus_in_use_peak * 3 <= 300,
            "{} GPUs for 300 small sessions",
            packed.gpus_in_use_peak
        );
    }
}
