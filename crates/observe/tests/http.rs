//! The observer served over real HTTP from a source whose figures the test sets: every metric
//! name of the contract is exposed with its labels and values, the health checks answer, the
//! JSON API and the dashboard's files are there, and an unknown page is a 404 naming it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpufuse_observe::metrics::METRIC_NAMES;
use gpufuse_observe::{
    ControllerSnapshot, DeviceSnapshot, Histogram, ImageCacheSnapshot, NodeSnapshot, Options,
    PoolSnapshot, PoolSource, SessionSnapshot,
};

struct Fake(Mutex<PoolSnapshot>, Mutex<bool>);

impl PoolSource for Fake {
    fn snapshot(&self) -> PoolSnapshot {
        self.0.lock().unwrap().clone()
    }
    fn ready(&self) -> bool {
        *self.1.lock().unwrap()
    }
}

fn pool() -> PoolSnapshot {
    PoolSnapshot {
        role: "node".into(),
        host: "h1".into(),
        compute_policy: "hard".into(),
        devices: vec![DeviceSnapshot {
            node: "h1".into(),
            index: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
            model: "NVIDIA H100".into(),
            kind: "cuda".into(),
            memory_total_bytes: 80 << 30,
            memory_used_bytes: 3 << 30,
            memory_promised_bytes: 8 << 30,
            busy_ratio: 0.25,
            sessions: 1,
            compute_promised_percent: 30,
        }],
        sessions: vec![SessionSnapshot {
            id: 7,
            node: "h1".into(),
            device: 0,
            tenant: "team-a".into(),
            qos: "high".into(),
            program: "train.py".into(),
            pid: 4242,
            memory_used_bytes: 3 << 30,
            memory_limit_bytes: Some(8 << 30),
            compute_share: Some(0.3),
            device_seconds: 12.5,
            busy_ratio: 0.25,
            queue_wait: Histogram::from_counts(&[0.001, 0.01], &[5, 2, 1], 0.123),
            throttled_seconds: 1.5,
            state: "running".into(),
            swapped_bytes: Some(1 << 20),
            resident_bytes: Some(3 << 30),
            age_seconds: 30.0,
            ..Default::default()
        }],
        pending: vec![],
        controller: Some(ControllerSnapshot {
            sessions_by_state: vec![("running".into(), 1), ("pending".into(), 2)],
            placement: Histogram::from_counts(&[0.001], &[3, 0], 0.0015),
            nodes: vec![NodeSnapshot {
                name: "h1".into(),
                state: "ready".into(),
                address: "tcp:h1:7000".into(),
            }],
        }),
        image_cache: Some(ImageCacheSnapshot {
            entries: 3,
            bytes: 1 << 20,
            limit_bytes: 2 << 30,
            received: 3,
            received_bytes: 1 << 20,
            hits: 7,
            hit_bytes: 5 << 20,
            corrupt: 1,
        }),
    }
}

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.get(&format!("http://{addr}{path}")).call().unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap())
}

/// The value of the sample `name{labels...}` whose labels include every one of `with`.
fn sample(text: &str, name: &str, with: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && with.iter().all(|w| l.contains(w)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_health_api_and_dashboard_are_served() {
    let fake = Arc::new(Fake(Mutex::new(pool()), Mutex::new(true)));
    let obs = gpufuse_observe::serve(
        "127.0.0.1:0".parse().unwrap(),
        fake.clone(),
        Options {
            sample_every: Duration::from_millis(50),
            ..Default::default()
        },
    )
    .unwrap();
    let addr = obs.local_addr();

    let (code, text) = get(addr, "/metrics");
    assert_eq!(code, 200);
    for name in METRIC_NAMES {
        let exposed = text.lines().any(|l| {
            let n = l.split(['{', ' ']).next().unwrap_or("");
            n == *name || n == format!("{name}_bucket")
        });
        assert!(exposed, "{name} is not exposed:\n{text}");
    }
    assert_eq!(
        sample(&text, "gpufuse_image_cache_hits_total", &["node=\"h1\""]),
        Some(7.0)
    );
    let dev = [
        "gpu=\"0\"",
        "UUID=\"GPU-00000000-0000-0000-0000-000000000001\"",
        "modelName=\"NVIDIA H100\"",
        "Hostname=\"h1\"",
    ];
    assert_eq!(
        sample(&text, "gpufuse_device_memory_total_bytes", &dev),
        Some((80u64 << 30) as f64)
    );
    assert_eq!(sample(&text, "gpufuse_device_busy_ratio", &dev), Some(0.25));
    let ses = [
        "session=\"7\"",
        "tenant=\"team-a\"",
        "qos=\"high\"",
        "node=\"h1\"",
    ];
    assert_eq!(
        sample(&text, "gpufuse_session_device_seconds_total", &ses),
        Some(12.5)
    );
    assert_eq!(
        sample(&text, "gpufuse_session_compute_share_ratio", &ses),
        Some(0.3)
    );
    assert_eq!(
        sample(&text, "gpufuse_session_throttled_seconds_total", &ses),
        Some(1.5)
    );
    // Buckets are cumulative on the wire.
    assert_eq!(
        sample(
            &text,
            "gpufuse_session_queue_wait_seconds_bucket",
            &["le=\"0.01\""]
        ),
        Some(7.0)
    );
    assert_eq!(
        sample(
            &text,
            "gpufuse_session_queue_wait_seconds_bucket",
            &["le=\"+Inf\""]
        ),
        Some(8.0)
    );
    assert_eq!(
        sample(&text, "gpufuse_session_queue_wait_seconds_count", &[]),
        Some(8.0)
    );
    assert_eq!(
        sample(&text, "gpufuse_session_state", &["state=\"running\""]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "gpufuse_pool_sessions", &["state=\"pending\""]),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "gpufuse_nodes", &["state=\"ready\""]),
        Some(1.0)
    );
    // The controller's node states, each with a sample (0 included), and no others.
    assert_eq!(
        sample(&text, "gpufuse_nodes", &["state=\"lost\""]),
        Some(0.0)
    );
    let node_states: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gpufuse_nodes{"))
        .collect();
    assert_eq!(node_states.len(), 2, "{node_states:?}");

    assert_eq!(get(addr, "/healthz"), (200, "ok\n".into()));
    assert_eq!(get(addr, "/readyz").0, 200);
    *fake.1.lock().unwrap() = false;
    assert_eq!(get(addr, "/readyz").0, 503);

    let (code, json) = get(addr, "/api/v1/snapshot");
    assert_eq!(code, 200);
    let back: PoolSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, pool());

    let (code, page) = get(addr, "/");
    assert_eq!(code, 200);
    assert!(page.contains("app.js"), "{page}");
    assert_eq!(get(addr, "/app.js").0, 200);
    assert_eq!(get(addr, "/style.css").0, 200);
    let (code, body) = get(addr, "/nothing-here");
    assert_eq!(code, 404);
    assert!(body.contains("/nothing-here"), "{body}");

    // The sampler records history; the report bills the session.
    std::thread::sleep(Duration::from_millis(400));
    let (_, hist) = get(addr, "/api/v1/history?since=60");
    let points: Vec<gpufuse_observe::Point> = serde_json::from_str(&hist).unwrap();
    assert!(!points.is_empty());
    assert_eq!(points.last().unwrap().sessions, 1);
    let (_, report) = get(addr, "/api/v1/report?since=60");
    let r: gpufuse_observe::Report = serde_json::from_str(&report).unwrap();
    assert_eq!(r.tenants.len(), 1);
    assert_eq!(r.tenants[0].tenant, "team-a");
    assert!(r.tenants[0].device_hours_used > 0.0, "{r:?}");
}

#[test]
fn a_taken_port_is_an_error_naming_it() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let e = gpufuse_observe::serve(addr, Arc::new(PoolSnapshot::default), Options::default())
        .unwrap_err();
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}
