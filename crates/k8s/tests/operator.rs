//! The operator against an in-process fake API server, driven by its watches, reconciling
//! into a controller's ledger: GPUPool and GPUQuota status written back, a claim over quota
//! refused with an Event (and then refused by the plugin), usage released when a claim goes,
//! and a standalone `Cuda` hello to the same controller refused over the quota the claims
//! hold. Not run against a real API server.

mod support;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use gpufuse_k8s::fake_api::FakeApiServer;
use gpufuse_k8s::inventory::Gpu;
use gpufuse_k8s::operator::{self, ControllerPool, Operator};
use gpufuse_k8s::prepare::{ClaimRef, Preparer};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams};
use serde_json::{json, Value};
use support::*;

const POOLS: &str = "gpufuse.dev/v1alpha1/gpupools";
const QUOTAS: &str = "gpufuse.dev/v1alpha1/gpuquotas";
const EVENTS: &str = "events.k8s.io/v1/events";

fn gpu() -> Gpu {
    Gpu {
        index: 0,
        name: "gpu-0".into(),
        model: "gpufuse emulated B200".into(),
        uuid: "GPU-00112233-4455-6677-8899-aabbccddeeff".into(),
        compute_capability: (10, 0),
        memory_bytes: 16 << 30,
        emulated: true,
    }
}

fn node(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
}

/// A controller that listens nowhere, and the operator's backend over it.
fn controller_pool() -> ControllerPool {
    let c = gpufuse_controller::Controller::new(gpufuse_controller::ControllerConfig::new(vec![]));
    ControllerPool::new(c)
}

/// Polls `f` until it holds (5 s at most).
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pools_and_quotas_get_status_and_a_claim_over_quota_is_refused_with_an_event() {
    let api = FakeApiServer::start().await.unwrap();
    api.insert(
        "v1/nodes",
        "",
        node("node-a", json!({"gpufuse.dev/pool": "a"})),
    );
    api.insert("v1/nodes", "", node("node-b", json!({})));
    let s = gpufuse_k8s::slice::resource_slice("node-a", &[gpu()], 1);
    api.insert(SLICES, "", serde_json::to_value(&s).unwrap());
    api.insert(
        POOLS,
        "",
        json!({
            "apiVersion": "gpufuse.dev/v1alpha1", "kind": "GPUPool",
            "metadata": {"name": "a"},
            "spec": {"nodeSelector": {"gpufuse.dev/pool": "a"}, "placement": "Pack",
                     "oversubscription": {"memoryPercent": 150, "computePercent": 100}}
        }),
    );
    api.insert(
        QUOTAS,
        "team-a",
        json!({
            "apiVersion": "gpufuse.dev/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "gpus", "namespace": "team-a"},
            "spec": {"total": {"memory": "6Gi", "compute": 80}, "perClaim": {"compute": 50}}
        }),
    );
    api.insert(
        CLAIMS,
        "team-a",
        claim("team-a", "first", "node-a", "4Gi", "30"),
    );
    api.set_status(
        CLAIMS,
        "team-a",
        "first",
        allocation("node-a", "4Gi", "30", "s1"),
    );

    let op = Operator {
        client: api.client(),
        backend: controller_pool(),
        instance: "test".into(),
    };
    let task = tokio::spawn(operator::run(
        op,
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));

    // Status written back: the quota's use, the pool's capacity (oversubscribed 150%) and use.
    eventually("the GPUQuota's status", || {
        api.get(QUOTAS, "team-a", "gpus")
            .is_some_and(|q| q["status"]["used"]["memory"] == "4Gi")
    })
    .await;
    let q = api.get(QUOTAS, "team-a", "gpus").unwrap();
    assert_eq!(q["status"]["used"]["compute"], 30);
    assert_eq!(q["status"]["used"]["claims"], 1);
    assert_eq!(q["status"]["available"]["memory"], "2Gi");
    assert_eq!(q["status"]["available"]["compute"], 50);
    eventually("the GPUPool's status", || {
        api.get(POOLS, "", "a")
            .is_some_and(|p| p["status"]["used"]["memory"] == "4Gi")
    })
    .await;
    let p = api.get(POOLS, "", "a").unwrap();
    assert_eq!(p["status"]["nodes"], 1);
    assert_eq!(p["status"]["devices"], 1);
    assert_eq!(p["status"]["capacity"]["memory"], "24Gi");
    assert_eq!(p["status"]["available"]["memory"], "20Gi");
    assert_eq!(p["status"]["capacity"]["compute"], 100);
    assert_eq!(p["status"]["available"]["compute"], 70);

    // A second claim the scheduler allocated, over the namespace's 6Gi: refused, with an Event.
    api.insert(
        CLAIMS,
        "team-a",
        claim("team-a", "second", "node-a", "4Gi", "20"),
    );
    let second = api.set_status(
        CLAIMS,
        "team-a",
        "second",
        allocation("node-a", "4Gi", "20", "s2"),
    );
    eventually("the refusal", || {
        api.get(CLAIMS, "team-a", "second")
            .is_some_and(|c| c["metadata"]["annotations"]["gpufuse.dev/quota-refused"].is_string())
    })
    .await;
    let reason = api.get(CLAIMS, "team-a", "second").unwrap()["metadata"]["annotations"]
        ["gpufuse.dev/quota-refused"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains("\"team-a\" would exceed its VRAM quota (vram = 6 GiB): 4 GiB is held"),
        "{reason}"
    );
    let events = api.list(EVENTS);
    let e = events
        .iter()
        .find(|e| e["regarding"]["name"] == "second")
        .expect("an Event on the refused claim");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["reason"], "OverQuota");
    assert_eq!(e["regarding"]["kind"], "ResourceClaim");
    assert!(e["note"].as_str().unwrap().contains("6 GiB"));
    eventually("the refusal counted", || {
        api.get(QUOTAS, "team-a", "gpus")
            .is_some_and(|q| q["status"]["refused"] == 1)
    })
    .await;

    // The plugin will not prepare it.
    let dir = TempDir::new("quota");
    let preparer = Preparer {
        node_name: "node-a".into(),
        client: api.client(),
        gpus: Arc::new(RwLock::new(vec![gpu()])),
        layout: gpufuse_k8s::cdi::Layout {
            host_lib_dir: "/l".into(),
            container_lib_dir: "/l".into(),
            host_server: "tcp:127.0.0.1:1".parse().unwrap(),
            container_server: "tcp:127.0.0.1:1".parse().unwrap(),
        },
        cdi_dir: dir.path().into(),
        secret: SECRET.to_vec(),
    };
    let err = preparer
        .prepare(&ClaimRef {
            namespace: "team-a".into(),
            name: "second".into(),
            uid: second["metadata"]["uid"].as_str().unwrap().into(),
        })
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("over its namespace's GPUQuota"),
        "{err}"
    );

    // The first claim goes: its use is released.
    let claims: Api<ResourceClaim> = Api::namespaced(api.client(), "team-a");
    claims
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the release", || {
        api.get(QUOTAS, "team-a", "gpus")
            .is_some_and(|q| q["status"]["used"]["claims"] == 0)
    })
    .await;
    assert_eq!(
        api.get(POOLS, "", "a").unwrap()["status"]["used"]["memory"],
        "0"
    );
    task.abort();
}

#[tokio::test]
async fn per_claim_maxima_refuse_a_claim_alone() {
    let backend = controller_pool();
    use gpufuse_k8s::operator::{ClaimUsage, PoolBackend, TenantQuota};
    backend.set_tenant_quota(
        "ns",
        Some(TenantQuota {
            claim_memory: Some(1 << 30),
            claim_compute: Some(50),
            ..Default::default()
        }),
    );
    let c = |uid: &str, memory: u64, compute: u64| ClaimUsage {
        uid: uid.into(),
        tenant: "ns".into(),
        name: uid.into(),
        node: "n".into(),
        memory,
        compute,
    };
    assert!(backend.admit_claim(&c("a", 1 << 30, 50)).is_ok());
    let e = backend.admit_claim(&c("b", 2 << 30, 10)).unwrap_err();
    assert!(e.contains("at most 1 GiB of VRAM per session"), "{e}");
    let e = backend.admit_claim(&c("c", 1 << 20, 60)).unwrap_err();
    assert!(e.contains("at most 50% compute"), "{e}");
    assert_eq!(backend.tenant_usage("ns").claims, 1);
    // The GPUQuota gone: its limits go with it.
    backend.set_tenant_quota("ns", None);
    assert!(backend.admit_claim(&c("b", 2 << 30, 10)).is_ok());
    assert_eq!(backend.tenant_usage("ns").claims, 2);
}

/// A `Cuda` hello from a standalone client (`gpufuse run --tenant team-a --vram 3GiB`), over
/// the unix socket of a controller whose ledger the operator fills: `GPUQuota` team-a allows
/// 6Gi and a claim holds 4Gi, so the session is refused with the scheduler's message, while a
/// `Check` for 2 GiB passes; the claim gone, 3 GiB passes too.
#[tokio::test]
async fn a_gpuquota_in_the_controllers_ledger_refuses_a_standalone_session_over_it() {
    let api = FakeApiServer::start().await.unwrap();
    api.insert("v1/nodes", "", node("node-a", json!({})));
    let s = gpufuse_k8s::slice::resource_slice("node-a", &[gpu()], 1);
    api.insert(SLICES, "", serde_json::to_value(&s).unwrap());
    api.insert(
        QUOTAS,
        "team-a",
        json!({
            "apiVersion": "gpufuse.dev/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "gpus", "namespace": "team-a"},
            "spec": {"total": {"memory": "6Gi"}, "perClaim": {}}
        }),
    );
    api.insert(
        CLAIMS,
        "team-a",
        claim("team-a", "first", "node-a", "4Gi", "30"),
    );
    api.set_status(
        CLAIMS,
        "team-a",
        "first",
        allocation("node-a", "4Gi", "30", "s1"),
    );

    let dir = TempDir::new("ledger");
    let sock: gpufuse_transport::Address = format!("unix:{}", dir.path().join("c.sock").display())
        .parse()
        .unwrap();
    let controller =
        gpufuse_controller::Controller::new(gpufuse_controller::ControllerConfig::new(vec![
            sock.clone()
        ]));
    let serving = controller.clone();
    std::thread::spawn(move || serving.serve());
    let op = Operator {
        client: api.client(),
        backend: ControllerPool::new(controller.clone()),
        instance: "test".into(),
    };
    let task = tokio::spawn(operator::run(
        op,
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    eventually("the claim in the controller's ledger", || {
        controller.tenant_usage("team-a").vram == 4 << 30
    })
    .await;

    let hello = |kind, gib: u64| {
        let token = gpufuse_controller::PlacementAsk {
            tenant: Some("team-a".into()),
            ..Default::default()
        }
        .encode()
        .unwrap();
        gpufuse_client::Connection::hello(
            kind,
            token,
            gpufuse_proto::ResourceRequest {
                vram_bytes: Some(gib << 30),
                compute_percent: None,
                tflops: None,
                qos: Default::default(),
            },
        )
    };
    let ask = |kind, gib| {
        let (sock, h) = (sock.clone(), hello(kind, gib));
        tokio::task::spawn_blocking(move || {
            gpufuse_client::Connection::one_shot(&sock, &h).unwrap()
        })
    };
    use gpufuse_proto::{ServerHello, SessionKind};
    match ask(SessionKind::Cuda, 3).await.unwrap() {
        ServerHello::Refused { reason } => assert!(
            reason.contains(
                "tenant \"team-a\" would exceed its VRAM quota (vram = 6 GiB): 4 GiB is held and 3 GiB was asked for"
            ),
            "{reason}"
        ),
        other => panic!("a session over the GPUQuota was not refused: {other:?}"),
    }
    assert!(matches!(
        ask(SessionKind::Check, 2).await.unwrap(),
        ServerHello::Admissible { .. }
    ));

    // The claim goes: the operator releases it, and 3 GiB fits the quota.
    let claims: Api<ResourceClaim> = Api::namespaced(api.client(), "team-a");
    claims
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the release", || {
        controller.tenant_usage("team-a").vram == 0
    })
    .await;
    assert!(matches!(
        ask(SessionKind::Check, 3).await.unwrap(),
        ServerHello::Admissible { .. }
    ));
    task.abort();
}

/// A GPUPool's placement places the controller's sessions on its nodes: a controller whose
/// own policy is binpack, with two gpufuse nodes named after their Kubernetes nodes; the
/// GPUPool `inference` (nodes labelled `gpufuse.dev/pool=inference`: node-a) spreads. Two
/// sessions on node-a go to its two GPUs, two on node-b share one; the GPUPool deleted,
/// node-a packs again.
#[tokio::test]
async fn a_gpupools_placement_places_the_controllers_sessions_on_its_nodes() {
    use gpufuse_proto::{NodeReport, PoolDeviceReport};
    let api = FakeApiServer::start().await.unwrap();
    api.insert(
        "v1/nodes",
        "",
        node("node-a", json!({"gpufuse.dev/pool": "inference"})),
    );
    api.insert("v1/nodes", "", node("node-b", json!({})));
    api.insert(
        POOLS,
        "",
        json!({
            "apiVersion": "gpufuse.dev/v1alpha1", "kind": "GPUPool",
            "metadata": {"name": "inference"},
            "spec": {"nodeSelector": {"gpufuse.dev/pool": "inference"}, "placement": "Spread"}
        }),
    );

    let mut config = gpufuse_controller::ControllerConfig::new(vec![]);
    config.policy = gpufuse_scheduler::Policy::Binpack;
    let controller = gpufuse_controller::Controller::new(config);
    // The gpufuse nodes register under their Kubernetes nodes' names (in process here; over
    // a link from `gpufuse node --name "$NODE_NAME"` in a cluster).
    for (name, zone) in [("node-a", "a"), ("node-b", "b")] {
        controller.report_local(&NodeReport {
            name: name.into(),
            address: format!("unix:/run/{name}.sock"),
            labels: [("zone".to_string(), zone.to_string())].into(),
            devices: (0..2)
                .map(|index| PoolDeviceReport {
                    index,
                    model: "gpufuse emulated B200".into(),
                    memory_total_bytes: 16 << 30,
                    memory_used_bytes: 0,
                    memory_promised_bytes: 0,
                    compute_capability: (10, 0),
                    capacity_mtflops: 80_000,
                    utilization_percent: 0,
                    uuid: [index as u8 + 1; 16],
                })
                .collect(),
            sessions: vec![],
        });
    }
    let op = Operator {
        client: api.client(),
        backend: ControllerPool::new(controller.clone()),
        instance: "test".into(),
    };
    let task = tokio::spawn(operator::run(
        op,
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    eventually("the GPUPool's policy in the scheduler", || {
        controller.policy_of("node-a") == gpufuse_scheduler::Policy::Spread
    })
    .await;
    assert_eq!(
        controller.policy_of("node-b"),
        gpufuse_scheduler::Policy::Binpack
    );
    let groups = controller.node_groups();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].0, "inference");
    assert_eq!(groups[0].1.nodes, ["node-a".to_string()].into());

    // `gpufuse run --server CONTROLLER --selector zone=Z --vram 2GiB`, placed as the
    // controller places every `Cuda` hello.
    let place = |zone: &str| {
        let token = gpufuse_controller::PlacementAsk {
            selector: [("zone".to_string(), zone.to_string())].into(),
            ..Default::default()
        }
        .encode()
        .unwrap();
        let hello = gpufuse_client::Connection::hello(
            gpufuse_proto::SessionKind::Cuda,
            token,
            gpufuse_proto::ResourceRequest {
                vram_bytes: Some(2 << 30),
                compute_percent: None,
                tflops: None,
                qos: Default::default(),
            },
        );
        let g = controller.place_local(&hello, &mut || false).unwrap();
        (g.node, g.device)
    };
    let (a1, a2) = (place("a"), place("a"));
    assert_eq!((a1.0.as_str(), a2.0.as_str()), ("node-a", "node-a"));
    assert_ne!(a1.1, a2.1, "the GPUPool spreads: {a1:?} {a2:?}");
    let (b1, b2) = (place("b"), place("b"));
    assert_eq!(b1, b2, "outside the GPUPool the controller packs");

    // The GPUPool deleted: its nodes go back to the controller's policy.
    let pools: Api<gpufuse_k8s::crd::GPUPool> = Api::all(api.client());
    pools
        .delete("inference", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the GPUPool's policy removed", || {
        controller.node_groups().is_empty()
    })
    .await;
    assert_eq!(
        controller.policy_of("node-a"),
        gpufuse_scheduler::Policy::Binpack
    );
    assert_eq!(place("a"), place("a"), "node-a packs again");
    task.abort();
}
