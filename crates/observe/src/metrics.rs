//! `/metrics`: a snapshot in the Prometheus (OpenMetrics) text format, through
//! `prometheus-client`'s collector interface, so each scrape reads the figures as they are
//! instead of mirroring them into long-lived metric objects.
//!
//! The names and labels are a contract (dashboards and alerts are built on them); they are
//! listed once, in [`METRIC_NAMES`], and a test checks that every one is exposed.
//! Labels follow DCGM's exporter where they mean the same (`gpu`, `UUID`, `modelName`,
//! `Hostname`), plus `node`, `session`, `tenant`, `qos`, `state`; only `session` takes
//! unbounded values.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::snapshot::{Histogram, PoolSnapshot};

/// Every series name `/metrics` exposes (counters with their `_total`). The contract.
pub const METRIC_NAMES: &[&str] = &[
    "gpufuse_device_memory_total_bytes",
    "gpufuse_device_memory_used_bytes",
    "gpufuse_device_memory_promised_bytes",
    "gpufuse_device_busy_ratio",
    "gpufuse_device_sessions",
    "gpufuse_session_memory_used_bytes",
    "gpufuse_session_memory_limit_bytes",
    "gpufuse_session_compute_share_ratio",
    "gpufuse_session_device_seconds_total",
    "gpufuse_session_queue_wait_seconds",
    "gpufuse_session_throttled_seconds_total",
    "gpufuse_session_swapped_bytes",
    "gpufuse_session_resident_bytes",
    "gpufuse_session_state",
    "gpufuse_pool_sessions",
    "gpufuse_pool_placement_seconds",
    "gpufuse_nodes",
    "gpufuse_image_cache_entries",
    "gpufuse_image_cache_bytes",
    "gpufuse_image_cache_limit_bytes",
    "gpufuse_image_cache_received_total",
    "gpufuse_image_cache_received_bytes_total",
    "gpufuse_image_cache_hits_total",
    "gpufuse_image_cache_hit_bytes_total",
    "gpufuse_image_cache_corrupt_total",
];

type Labels = Vec<(&'static str, String)>;

/// The snapshot as a collector: encoded once, at the scrape that made it.
#[derive(Debug)]
struct SnapshotCollector(PoolSnapshot);

/// The text `/metrics` serves for `snap`.
pub fn render(snap: &PoolSnapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(snap.clone())));
    let mut out = String::new();
    // Writing to a String cannot fail; the collector itself returns only the writer's errors.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

enum Value {
    Gauge(f64),
    Counter(f64),
    Histogram(Histogram),
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, value) in &self.samples {
            let mut m = metric.encode_family(labels)?;
            match value {
                Value::Gauge(v) => m.encode_gauge(v)?,
                Value::Counter(v) => m.encode_counter::<Labels, f64, f64>(v, None)?,
                Value::Histogram(h) => m.encode_histogram::<Labels>(
                    h.sum,
                    h.count,
                    &h.buckets,
                    None::<&std::collections::HashMap<usize, Exemplar<Labels, f64>>>,
                )?,
            }
        }
        Ok(())
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in families(&self.0) {
            family.encode(&mut encoder)?;
        }
        Ok(())
    }
}

fn families(s: &PoolSnapshot) -> Vec<Family> {
    use MetricType::{Counter, Gauge, Histogram as Hist};
    let mut dev_total = Family::new(
        "gpufuse_device_memory_total_bytes",
        "Device memory in bytes.",
        Gauge,
    );
    let mut dev_used = Family::new(
        "gpufuse_device_memory_used_bytes",
        "Device memory allocated by sessions, in bytes.",
        Gauge,
    );
    let mut dev_promised = Family::new(
        "gpufuse_device_memory_promised_bytes",
        "Device memory promised to sessions' slices, in bytes.",
        Gauge,
    );
    let mut dev_busy = Family::new(
        "gpufuse_device_busy_ratio",
        "Measured kernel time over the last second, 0 to 1.",
        Gauge,
    );
    let mut dev_sessions = Family::new(
        "gpufuse_device_sessions",
        "Sessions placed on the device.",
        Gauge,
    );
    for d in &s.devices {
        let labels = || -> Labels {
            vec![
                ("gpu", d.index.to_string()),
                ("UUID", d.uuid.clone()),
                ("modelName", d.model.clone()),
                ("Hostname", d.node.clone()),
                ("node", d.node.clone()),
            ]
        };
        dev_total
            .samples
            .push((labels(), Value::Gauge(d.memory_total_bytes as f64)));
        dev_used
            .samples
            .push((labels(), Value::Gauge(d.memory_used_bytes as f64)));
        dev_promised
            .samples
            .push((labels(), Value::Gauge(d.memory_promised_bytes as f64)));
        dev_busy
            .samples
            .push((labels(), Value::Gauge(d.busy_ratio)));
        dev_sessions
            .samples
            .push((labels(), Value::Gauge(d.sessions as f64)));
    }

    let mut ses_used = Family::new(
        "gpufuse_session_memory_used_bytes",
        "Device memory the session has allocated, in bytes.",
        Gauge,
    );
    let mut ses_limit = Family::new(
        "gpufuse_session_memory_limit_bytes",
        "The session's memory slice, in bytes (sessions with a slice only).",
        Gauge,
    );
    let mut ses_share = Family::new(
        "gpufuse_session_compute_share_ratio",
        "The session's promised compute share, 0 to 1 (sessions with a share only).",
        Gauge,
    );
    let mut ses_seconds = Family::new(
        "gpufuse_session_device_seconds",
        "Measured kernel time the session has run, in seconds.",
        Counter,
    );
    let mut ses_wait = Family::new(
        "gpufuse_session_queue_wait_seconds",
        "How long the session's device leases waited in the launch queue, in seconds.",
        Hist,
    );
    let mut ses_throttled = Family::new(
        "gpufuse_session_throttled_seconds",
        "Time the session waited because its hard compute share was used up, in seconds.",
        Counter,
    );
    let mut ses_swapped = Family::new(
        "gpufuse_session_swapped_bytes",
        "Session memory swapped out of the device, in bytes (elastic sessions).",
        Gauge,
    );
    let mut ses_resident = Family::new(
        "gpufuse_session_resident_bytes",
        "Session memory resident on the device, in bytes (elastic sessions).",
        Gauge,
    );
    let mut ses_state = Family::new(
        "gpufuse_session_state",
        "1 for the session's current state.",
        Gauge,
    );
    for x in &s.sessions {
        let labels = || -> Labels {
            vec![
                ("node", x.node.clone()),
                ("gpu", x.device.to_string()),
                ("session", x.id.to_string()),
                ("tenant", x.tenant.clone()),
                ("qos", x.qos.clone()),
            ]
        };
        ses_used
            .samples
            .push((labels(), Value::Gauge(x.memory_used_bytes as f64)));
        if let Some(l) = x.memory_limit_bytes {
            ses_limit.samples.push((labels(), Value::Gauge(l as f64)));
        }
        if let Some(c) = x.compute_share {
            ses_share.samples.push((labels(), Value::Gauge(c)));
        }
        ses_seconds
            .samples
            .push((labels(), Value::Counter(x.device_seconds)));
        ses_wait
            .samples
            .push((labels(), Value::Histogram(x.queue_wait.clone())));
        ses_throttled
            .samples
            .push((labels(), Value::Counter(x.throttled_seconds)));
        if let Some(b) = x.swapped_bytes {
            ses_swapped.samples.push((labels(), Value::Gauge(b as f64)));
        }
        if let Some(b) = x.resident_bytes {
            ses_resident
                .samples
                .push((labels(), Value::Gauge(b as f64)));
        }
        let mut l = labels();
        l.push(("state", x.state.clone()));
        ses_state.samples.push((l, Value::Gauge(1.0)));
    }

    let mut families = vec![
        dev_total,
        dev_used,
        dev_promised,
        dev_busy,
        dev_sessions,
        ses_used,
        ses_limit,
        ses_share,
        ses_seconds,
        ses_wait,
        ses_throttled,
        ses_swapped,
        ses_resident,
        ses_state,
    ];

    if let Some(c) = &s.controller {
        let mut pool = Family::new(
            "gpufuse_pool_sessions",
            "The pool's sessions by state.",
            Gauge,
        );
        for (state, n) in &c.sessions_by_state {
            pool.samples
                .push((vec![("state", state.clone())], Value::Gauge(*n as f64)));
        }
        let mut placement = Family::new(
            "gpufuse_pool_placement_seconds",
            "How long placing a session took, in seconds.",
            Hist,
        );
        placement
            .samples
            .push((Vec::new(), Value::Histogram(c.placement.clone())));
        let mut nodes = Family::new("gpufuse_nodes", "The pool's nodes by state.", Gauge);
        let mut by_state: std::collections::BTreeMap<&str, u64> = Default::default();
        for state in crate::snapshot::NODE_STATES {
            by_state.insert(state, 0);
        }
        for n in &c.nodes {
            *by_state.entry(n.state.as_str()).or_default() += 1;
        }
        for (state, n) in by_state {
            nodes
                .samples
                .push((vec![("state", state.to_string())], Value::Gauge(n as f64)));
        }
        families.extend([pool, placement, nodes]);
    }
    if let Some(c) = &s.image_cache {
        let one = |name, help, kind, v: u64| {
            let mut f = Family::new(name, help, kind);
            let value = match kind {
                Counter => Value::Counter(v as f64),
                _ => Value::Gauge(v as f64),
            };
            f.samples.push((vec![("node", s.host.clone())], value));
            f
        };
        families.extend([
            one(
                "gpufuse_image_cache_entries",
                "Module images in the node's image cache.",
                Gauge,
                c.entries,
            ),
            one(
                "gpufuse_image_cache_bytes",
                "Bytes of module images in the node's image cache.",
                Gauge,
                c.bytes,
            ),
            one(
                "gpufuse_image_cache_limit_bytes",
                "The image cache's size limit (--image-cache-size).",
                Gauge,
                c.limit_bytes,
            ),
            one(
                "gpufuse_image_cache_received",
                "Module images clients sent in full (not in the cache).",
                Counter,
                c.received,
            ),
            one(
                "gpufuse_image_cache_received_bytes",
                "Bytes of module images clients sent in full.",
                Counter,
                c.received_bytes,
            ),
            one(
                "gpufuse_image_cache_hits",
                "Module images found in the cache (only their hash was sent).",
                Counter,
                c.hits,
            ),
            one(
                "gpufuse_image_cache_hit_bytes",
                "Bytes of module images found in the cache.",
                Counter,
                c.hit_bytes,
            ),
            one(
                "gpufuse_image_cache_corrupt",
                "Cache entries found corrupt on read (dropped, sent again).",
                Counter,
                c.corrupt,
            ),
        ]);
    }
    families
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{ControllerSnapshot, NodeSnapshot};

    #[test]
    fn nodes_are_counted_in_the_controllers_states() {
        let node = |name: &str, state: &str| NodeSnapshot {
            name: name.into(),
            state: state.into(),
            address: String::new(),
        };
        let snap = PoolSnapshot {
            controller: Some(ControllerSnapshot {
                nodes: vec![node("a", "ready"), node("b", "lost"), node("c", "ready")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = render(&snap);
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpufuse_nodes{"))
            .collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                "gpufuse_nodes{state=\"lost\"} 1.0",
                "gpufuse_nodes{state=\"ready\"} 2.0"
            ]
        );
    }
}
