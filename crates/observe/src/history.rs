//! Usage over time, in memory: no database to run, and nothing lost but history when the
//! process restarts.
//!
//! A sampler takes a snapshot once a second ([`History::record`], given the wall-clock time so
//! tests drive it with a fake clock) and keeps
//! - the last hour of pool figures, one point per second ([`Point`]), for the dashboard;
//! - a usage ledger in one-minute buckets for the last day, per tenant, GPU model and QoS:
//!   wall time, device time promised and used, VRAM GiB-seconds ([`Usage`]), and the pool's
//!   capacity and use, from which [`History::report`] computes costs.
//!
//! A session's device time is charged from the difference between two snapshots of its
//! counter, so the ledger is exact to the second whatever the sampling jitter; a session that
//! ends between two samples loses at most its last second.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::prices::Prices;
use crate::snapshot::PoolSnapshot;

/// Points kept: an hour at one a second.
pub const POINTS: usize = 3600;
/// Ledger buckets kept: a day of minutes.
pub const BUCKETS: u64 = 24 * 60;
/// A gap between two samples longer than this counts as this long (the process was stopped).
const MAX_STEP_S: f64 = 10.0;
const GIB: f64 = (1u64 << 30) as f64;

/// The pool at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Unix time, seconds.
    pub t: u64,
    /// Mean busy ratio over devices, 0..=1.
    pub busy: f64,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub sessions: u32,
    pub pending: u32,
    /// Device seconds per second by tenant (sums to at most the number of devices).
    pub tenants: BTreeMap<String, f64>,
}

/// What one tenant used of one GPU model at one QoS, in seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Session-seconds: what the same sessions would have held on whole GPUs.
    pub wall_s: f64,
    /// Device-seconds promised (compute share x time).
    pub promised_s: f64,
    /// Device-seconds of measured kernel time.
    pub used_s: f64,
    /// GiB-seconds of memory slice (or of memory used, for a session without a slice).
    pub vram_gib_s: f64,
}

impl Usage {
    fn add(&mut self, o: &Usage) {
        self.wall_s += o.wall_s;
        self.promised_s += o.promised_s;
        self.used_s += o.used_s;
        self.vram_gib_s += o.vram_gib_s;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    tenant: String,
    model: String,
    qos: String,
}

#[derive(Clone, Debug, Default)]
struct Bucket {
    usage: HashMap<Key, Usage>,
    sessions: HashMap<String, BTreeSet<(String, u64)>>,
    /// Device-seconds the pool had, and used.
    capacity_s: f64,
    pool_used_s: f64,
}

/// One tenant's line of the cost report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    pub tenant: String,
    pub sessions: u64,
    pub device_hours_promised: f64,
    pub device_hours_used: f64,
    pub vram_gib_hours: f64,
    /// Billed: the larger of promised and used device-hours at the model's price and the
    /// QoS multiplier, plus memory at `vram_gib_hour`.
    pub cost: f64,
    /// The sessions' wall time, each on a whole GPU of its model.
    pub whole_gpu_hours: f64,
    pub whole_gpu_cost: f64,
}

/// The cost and utilization report (`gpufuse report`, `/api/v1/report`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Unix time, seconds: the report covers `[from, to)`.
    pub from: u64,
    pub to: u64,
    pub currency: String,
    pub tenants: Vec<TenantReport>,
    /// Device-hours the pool's devices had, and ran kernels.
    pub pool_device_hours: f64,
    pub pool_device_hours_used: f64,
    /// Used over capacity, 0..=1.
    pub pool_utilization: f64,
    pub cost: f64,
    pub whole_gpu_cost: f64,
}

#[derive(Clone, Debug)]
struct Seen {
    device_seconds: f64,
}

/// The last hour of points and the last day of usage.
#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
    buckets: BTreeMap<u64, Bucket>,
    seen: HashMap<(String, u64), Seen>,
    last_t: Option<f64>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the snapshot taken at `now` (Unix seconds).
    pub fn record(&mut self, now: f64, snap: &PoolSnapshot) {
        let step = self
            .last_t
            .map_or(0.0, |t| (now - t).clamp(0.0, MAX_STEP_S));
        self.last_t = Some(now);
        let minute = (now / 60.0).floor() as u64;
        let models: HashMap<(&str, u32), &str> = snap
            .devices
            .iter()
            .map(|d| ((d.node.as_str(), d.index), d.model.as_str()))
            .collect();
        let totals: HashMap<(&str, u32), u64> = snap
            .devices
            .iter()
            .map(|d| ((d.node.as_str(), d.index), d.memory_total_bytes))
            .collect();
        let bucket = self.buckets.entry(minute).or_default();
        let mut point = Point {
            t: now as u64,
            busy: if snap.devices.is_empty() {
                0.0
            } else {
                snap.devices.iter().map(|d| d.busy_ratio).sum::<f64>() / snap.devices.len() as f64
            },
            memory_used_bytes: snap.devices.iter().map(|d| d.memory_used_bytes).sum(),
            memory_total_bytes: snap.devices.iter().map(|d| d.memory_total_bytes).sum(),
            sessions: snap.sessions.len() as u32,
            pending: snap.pending.iter().filter(|p| p.state == "pending").count() as u32,
            tenants: BTreeMap::new(),
        };
        bucket.capacity_s += step * snap.devices.len() as f64;
        let mut live = HashMap::new();
        for x in &snap.sessions {
            let key = (x.node.clone(), x.id);
            // A session first seen now ran for at most its age, and at most one step.
            let (wall, used) = match self.seen.get(&key) {
                Some(s) => (step, (x.device_seconds - s.device_seconds).max(0.0)),
                None => (x.age_seconds.clamp(0.0, step.max(1.0)), x.device_seconds),
            };
            live.insert(
                key.clone(),
                Seen {
                    device_seconds: x.device_seconds,
                },
            );
            let dev = (x.node.as_str(), x.device);
            let vram = x
                .memory_limit_bytes
                .unwrap_or(x.memory_used_bytes)
                .min(totals.get(&dev).copied().unwrap_or(u64::MAX));
            let u = Usage {
                wall_s: wall,
                promised_s: wall * x.compute_share.unwrap_or(0.0),
                used_s: used,
                vram_gib_s: wall * vram as f64 / GIB,
            };
            let k = Key {
                tenant: x.tenant.clone(),
                model: models.get(&dev).copied().unwrap_or("unknown").to_string(),
                qos: x.qos.clone(),
            };
            bucket.usage.entry(k).or_default().add(&u);
            bucket
                .sessions
                .entry(x.tenant.clone())
                .or_default()
                .insert(key);
            bucket.pool_used_s += used;
            if step > 0.0 {
                *point.tenants.entry(x.tenant.clone()).or_default() += used / step;
            }
        }
        self.seen = live;
        while self
            .buckets
            .first_key_value()
            .is_some_and(|(&m, _)| m + BUCKETS <= minute)
        {
            self.buckets.pop_first();
        }
        self.points.push_back(point);
        while self.points.len() > POINTS {
            self.points.pop_front();
        }
    }

    /// The points of the last `seconds` (at most an hour).
    pub fn points(&self, seconds: u64) -> Vec<Point> {
        let Some(last) = self.points.back() else {
            return Vec::new();
        };
        let from = last.t.saturating_sub(seconds);
        self.points.iter().filter(|p| p.t > from).cloned().collect()
    }

    /// Usage and costs since `now - since_s` (the ledger keeps a day, in whole minutes: the
    /// minute holding the start counts whole).
    pub fn report(&self, now: f64, since_s: u64, prices: &Prices) -> Report {
        let to = now as u64;
        let from = to.saturating_sub(since_s);
        let first_minute = from / 60;
        let mut by_tenant: BTreeMap<String, TenantReport> = BTreeMap::new();
        let mut sessions: HashMap<String, BTreeSet<(String, u64)>> = HashMap::new();
        let (mut capacity, mut pool_used) = (0.0, 0.0);
        for (_, b) in self.buckets.range(first_minute..) {
            capacity += b.capacity_s;
            pool_used += b.pool_used_s;
            for (t, ids) in &b.sessions {
                sessions
                    .entry(t.clone())
                    .or_default()
                    .extend(ids.iter().cloned());
            }
            for (k, u) in &b.usage {
                let r = by_tenant
                    .entry(k.tenant.clone())
                    .or_insert_with(|| TenantReport {
                        tenant: k.tenant.clone(),
                        ..Default::default()
                    });
                let price = prices.gpu_hour(&k.model);
                let billed_h = u.promised_s.max(u.used_s) / 3600.0;
                r.device_hours_promised += u.promised_s / 3600.0;
                r.device_hours_used += u.used_s / 3600.0;
                r.vram_gib_hours += u.vram_gib_s / 3600.0;
                r.cost += billed_h * price * prices.qos_multiplier(&k.qos)
                    + u.vram_gib_s / 3600.0 * prices.vram_gib_hour;
                r.whole_gpu_hours += u.wall_s / 3600.0;
                r.whole_gpu_cost += u.wall_s / 3600.0 * price;
            }
        }
        for (t, r) in by_tenant.iter_mut() {
            r.sessions = sessions.get(t).map_or(0, |s| s.len() as u64);
        }
        let tenants: Vec<TenantReport> = by_tenant.into_values().collect();
        Report {
            from,
            to,
            currency: prices.currency.clone(),
            cost: tenants.iter().fold(0.0, |a, t| a + t.cost),
            whole_gpu_cost: tenants.iter().fold(0.0, |a, t| a + t.whole_gpu_cost),
            tenants,
            pool_device_hours: capacity / 3600.0,
            pool_device_hours_used: pool_used / 3600.0,
            pool_utilization: if capacity > 0.0 {
                (pool_used / capacity).min(1.0)
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{DeviceSnapshot, SessionSnapshot};

    fn snap(sessions: Vec<SessionSnapshot>) -> PoolSnapshot {
        PoolSnapshot {
            devices: vec![DeviceSnapshot {
                node: "n".into(),
                index: 0,
                model: "NVIDIA H100".into(),
                memory_total_bytes: 80 << 30,
                busy_ratio: 0.5,
                ..Default::default()
            }],
            sessions,
            ..Default::default()
        }
    }

    fn session(id: u64, tenant: &str, share: Option<f64>, device_seconds: f64) -> SessionSnapshot {
        SessionSnapshot {
            id,
            node: "n".into(),
            tenant: tenant.into(),
            qos: "medium".into(),
            compute_share: share,
            memory_limit_bytes: Some(8 << 30),
            device_seconds,
            age_seconds: 0.0,
            ..Default::default()
        }
    }

    /// Two tenants on one H100 for an hour: one promised 25% and used 10% of it, the other
    /// best effort used 30%. Costs follow the price table; whole GPUs cost an hour each.
    #[test]
    fn an_hour_of_two_tenants_is_billed_by_promise_or_use() {
        let mut h = History::new();
        let t0 = 1_000_020.0;
        for s in 0..=3600u32 {
            let t = f64::from(s);
            h.record(
                t0 + t,
                &snap(vec![
                    session(1, "a", Some(0.25), 0.1 * t),
                    session(2, "b", None, 0.3 * t),
                ]),
            );
        }
        let r = h.report(t0 + 3600.0, 3600 + 60, &Prices::default());
        assert_eq!(r.tenants.len(), 2);
        let a = &r.tenants[0];
        let b = &r.tenants[1];
        assert_eq!((a.tenant.as_str(), a.sessions), ("a", 1));
        assert!((a.device_hours_promised - 0.25).abs() < 1e-3, "{a:?}");
        assert!((a.device_hours_used - 0.1).abs() < 1e-3, "{a:?}");
        assert!((a.cost - 0.25 * 2.5).abs() < 1e-3, "{a:?}");
        assert!((a.whole_gpu_cost - 2.5).abs() < 1e-2, "{a:?}");
        assert!((a.vram_gib_hours - 8.0).abs() < 1e-2, "{a:?}");
        assert!((b.device_hours_promised).abs() < 1e-9, "{b:?}");
        assert!((b.cost - 0.3 * 2.5).abs() < 1e-3, "{b:?}");
        assert!((r.pool_utilization - 0.4).abs() < 1e-3, "{r:?}");
        assert!((r.pool_device_hours - 1.0).abs() < 1e-3, "{r:?}");
        assert_eq!(h.points(3600).len(), 3600);
        let last = h.points(1);
        assert!((last[0].tenants["b"] - 0.3).abs() < 1e-6, "{last:?}");
    }

    #[test]
    fn a_gap_in_sampling_counts_at_most_ten_seconds_and_old_minutes_are_dropped() {
        let mut h = History::new();
        h.record(0.0, &snap(vec![session(1, "a", Some(1.0), 0.0)]));
        h.record(1000.0, &snap(vec![session(1, "a", Some(1.0), 5.0)]));
        let r = h.report(1000.0, 2000, &Prices::default());
        assert!(
            (r.tenants[0].whole_gpu_hours * 3600.0 - 10.0).abs() < 1e-6,
            "{r:?}"
        );
        assert!((r.tenants[0].device_hours_used * 3600.0 - 5.0).abs() < 1e-6);
        h.record(1000.0 + 86_400.0, &snap(vec![]));
        let r = h.report(1000.0 + 86_400.0, 200_000, &Prices::default());
        assert!(r.tenants.is_empty(), "{r:?}");
    }
}
