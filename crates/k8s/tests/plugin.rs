//! The DRA plugin as the kubelet sees it: registration over the registration socket, then
//! NodePrepareResources/NodeUnprepareResources over the socket registration named, with
//! claims read from an in-process fake API server; and the ResourceSlice it publishes there.
//! Not run against a real kubelet or API server.

mod support;

use std::sync::{Arc, RwLock};

use gpufuse_k8s::cdi;
use gpufuse_k8s::fake_api::FakeApiServer;
use gpufuse_k8s::grpc::dra::dra_plugin_client::DraPluginClient;
use gpufuse_k8s::grpc::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use gpufuse_k8s::grpc::registration::registration_client::RegistrationClient;
use gpufuse_k8s::grpc::registration::{InfoRequest, RegistrationStatus};
use gpufuse_k8s::inventory::Gpu;
use gpufuse_k8s::plugin::{self, Sockets};
use gpufuse_k8s::prepare::Preparer;
use gpufuse_k8s::slice;
use support::*;

fn gpu(memory: u64) -> Gpu {
    Gpu {
        index: 0,
        name: "gpu-0".into(),
        model: "gpufuse emulated B200".into(),
        uuid: "GPU-00112233-4455-6677-8899-aabbccddeeff".into(),
        compute_capability: (10, 0),
        memory_bytes: memory,
        emulated: true,
    }
}

#[tokio::test]
async fn kubelet_registers_the_plugin_then_prepares_and_unprepares_a_claim() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = TempDir::new("plugin");
    api.insert(
        CLAIMS,
        "team-a",
        claim("team-a", "train", "node-a", "4Gi", "30"),
    );
    let created = api.set_status(
        CLAIMS,
        "team-a",
        "train",
        allocation(
            "node-a",
            "4Gi",
            "30",
            "0b0e5c1e-aaaa-4bbb-8ccc-000000000001",
        ),
    );
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();

    let preparer = Arc::new(Preparer {
        node_name: "node-a".into(),
        client: api.client(),
        gpus: Arc::new(RwLock::new(vec![gpu(16 << 30)])),
        layout: cdi::Layout {
            host_lib_dir: dir.path().join("lib"),
            container_lib_dir: "/usr/local/gpufuse/lib".into(),
            host_server: format!("unix:{}/node.sock", dir.path().display())
                .parse()
                .unwrap(),
            container_server: "unix:/var/run/gpufuse/node.sock".parse().unwrap(),
        },
        cdi_dir: dir.path().join("cdi"),
        secret: SECRET.to_vec(),
    });
    let sockets = Sockets::under(&dir.path().join("kubelet"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut running = plugin::serve(preparer, sockets.clone(), async {
        let _ = stopped.await;
    })
    .unwrap();

    // The kubelet's plugin watcher: GetInfo, then NotifyRegistrationStatus.
    let mut reg = RegistrationClient::new(channel(&sockets.registration).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.gpufuse.dev");
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin".to_string()]);
    assert_eq!(std::path::Path::new(&info.endpoint), sockets.dra);
    reg.notify_registration_status(RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    running.registered.wait_for(|r| r.is_some()).await.unwrap();
    assert_eq!(*running.registered.borrow(), Some(Ok(())));

    // NodePrepareResources: the claim, one with a stale uid, one that does not exist.
    let mut dra = DraPluginClient::new(channel(std::path::Path::new(&info.endpoint)).await);
    let claims = vec![
        Claim {
            namespace: "team-a".into(),
            uid: uid.clone(),
            name: "train".into(),
        },
        Claim {
            namespace: "team-a".into(),
            uid: "stale".into(),
            name: "train".into(),
        },
        Claim {
            namespace: "team-a".into(),
            uid: "u-missing".into(),
            name: "missing".into(),
        },
    ];
    let resp = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 3, "every claim gets an answer");
    let ok = &resp.claims[&uid];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 1);
    let d = &ok.devices[0];
    assert_eq!(d.pool_name, "node-a");
    assert_eq!(d.device_name, "gpu-0");
    assert_eq!(d.request_names, vec!["gpu".to_string()]);
    assert_eq!(
        d.share_id.as_deref(),
        Some("0b0e5c1e-aaaa-4bbb-8ccc-000000000001")
    );
    let cdi_id = &d.cdi_device_ids[0];
    assert!(cdi_id.starts_with("gpufuse.dev/gpu=claim-"), "{cdi_id}");
    assert!(
        resp.claims["stale"].error.contains("made anew"),
        "{}",
        resp.claims["stale"].error
    );
    assert!(resp.claims["u-missing"].error.contains("does not exist"));

    // The CDI spec: the slice, a token bounded to it, the shims and the node.
    let spec_path = cdi::spec_path(&dir.path().join("cdi"), &uid);
    let spec: cdi::Spec = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    let device = cdi_id.split_once('=').unwrap().1;
    let env = cdi::environment(&spec, device).unwrap();
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(get("GPUFUSE_VRAM"), (4u64 << 30).to_string());
    assert_eq!(get("GPUFUSE_COMPUTE"), "30");
    assert_eq!(get("GPUFUSE_SERVER"), "unix:/var/run/gpufuse/node.sock");
    let token = gpufuse_auth::verify(SECRET, &get("GPUFUSE_TOKEN"), 0).unwrap();
    assert_eq!(token.subject, "team-a/train");
    assert_eq!(token.max_vram_bytes, Some(4 << 30));
    assert_eq!(token.max_compute_percent, Some(30));
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(raw["cdiVersion"], "0.6.0");
    assert_eq!(raw["kind"], "gpufuse.dev/gpu");
    assert_eq!(
        raw["containerEdits"]["mounts"][1]["containerPath"],
        "/var/run/gpufuse"
    );

    // Preparing again (the kubelet retries) gives the same devices.
    let again = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims[..1].to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims[&uid].devices, ok.devices);

    // NodeUnprepareResources removes the spec; again is not an error.
    for _ in 0..2 {
        let un = dra
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: claims[..1].to_vec(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(un.claims[&uid].error, "");
        assert!(!spec_path.exists());
    }
    let bad = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![Claim {
                namespace: String::new(),
                uid: "x".into(),
                name: String::new(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        bad.claims["x"].error.contains("namespace, name"),
        "{}",
        bad.claims["x"].error
    );

    stop.send(()).unwrap();
    (&mut running.task).await.unwrap().unwrap();
    assert!(
        !sockets.registration.exists(),
        "the registration socket goes with the plugin"
    );
}

#[tokio::test]
async fn a_claim_not_allocated_or_allocated_beyond_the_device_is_refused() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = TempDir::new("refuse");
    let pending = api.insert(CLAIMS, "ns", claim("ns", "pending", "node-a", "1Gi", "10"));
    api.insert(CLAIMS, "ns", claim("ns", "huge", "node-a", "64Gi", "10"));
    let huge = api.set_status(
        CLAIMS,
        "ns",
        "huge",
        allocation("node-a", "64Gi", "10", "s"),
    );
    let preparer = Preparer {
        node_name: "node-a".into(),
        client: api.client(),
        gpus: Arc::new(RwLock::new(vec![gpu(16 << 30)])),
        layout: cdi::Layout {
            host_lib_dir: "/l".into(),
            container_lib_dir: "/l".into(),
            host_server: "tcp:127.0.0.1:1".parse().unwrap(),
            container_server: "tcp:127.0.0.1:1".parse().unwrap(),
        },
        cdi_dir: dir.path().into(),
        secret: SECRET.to_vec(),
    };
    let r = |v: &serde_json::Value, name: &str| gpufuse_k8s::prepare::ClaimRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: v["metadata"]["uid"].as_str().unwrap().into(),
    };
    let e = preparer.prepare(&r(&pending, "pending")).await.unwrap_err();
    assert!(e.to_string().contains("not allocated"), "{e}");
    let e = preparer.prepare(&r(&huge, "huge")).await.unwrap_err();
    assert!(e.to_string().contains("more than device gpu-0 has"), "{e}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no spec for a refused claim"
    );
}

#[tokio::test]
async fn the_slice_is_published_once_and_replaced_when_the_devices_change() {
    let api = FakeApiServer::start().await.unwrap();
    let client = api.client();
    let s = slice::resource_slice("node-a", &[gpu(16 << 30)], 1);
    assert!(slice::publish(&client, &s).await.unwrap());
    assert!(
        !slice::publish(&client, &s).await.unwrap(),
        "an unchanged slice is not rewritten"
    );
    let name = slice::slice_name("node-a");
    let stored = api.get(SLICES, "", &name).unwrap();
    assert_eq!(stored["spec"]["driver"], "gpu.gpufuse.dev");
    assert_eq!(
        stored["spec"]["devices"][0]["allowMultipleAllocations"],
        true
    );
    assert_eq!(
        stored["spec"]["devices"][0]["capacity"]["memory"]["value"],
        "16Gi"
    );
    assert_eq!(stored["spec"]["pool"]["generation"], 1);

    let bigger = slice::resource_slice("node-a", &[gpu(32 << 30)], 1);
    assert!(slice::publish(&client, &bigger).await.unwrap());
    let stored = api.get(SLICES, "", &name).unwrap();
    assert_eq!(
        stored["spec"]["devices"][0]["capacity"]["memory"]["value"],
        "32Gi"
    );
    assert_eq!(
        stored["spec"]["pool"]["generation"], 2,
        "a change is a new pool generation"
    );
}

/// A claim shaped like the one kube-scheduler makes for an extended-resource request
/// (`resources.limits: {gpufuse.dev/gpu: 1}` through the DeviceClass's
/// `extendedResourceName`, KEP-5004): named `<pod>-extended-resources-<suffix>`, annotated
/// `resource.kubernetes.io/extended-resource-claim`, owned by the pod, one request per
/// container (`container-0-request-0`) with no capacity asked, and an allocation with no
/// consumedCapacity and no shareID. It gets the whole device: all of its memory (in the
/// slice's 1 MiB steps) and 100% of its compute, in the CDI spec, the token and the
/// operator's charge.
#[tokio::test]
async fn an_extended_resource_claim_without_consumed_capacity_gets_the_whole_device() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = TempDir::new("extended");
    let name = "trainer-extended-resources-x7k2p";
    api.insert(
        CLAIMS,
        "team-a",
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "generateName": "trainer-extended-resources-",
                "namespace": "team-a",
                "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": "trainer",
                    "uid": "7d2c33b4-0000-4000-8000-000000000001",
                    "controller": true, "blockOwnerDeletion": true
                }]
            },
            "spec": {"devices": {"requests": [{
                "name": "container-0-request-0",
                "exactly": {
                    "deviceClassName": "gpu.gpufuse.dev",
                    "allocationMode": "ExactCount",
                    "count": 1
                }
            }]}},
        }),
    );
    let created = api.set_status(
        CLAIMS,
        "team-a",
        name,
        serde_json::json!({
            "allocation": {
                "devices": {"results": [{
                    "request": "container-0-request-0",
                    "driver": "gpu.gpufuse.dev",
                    "pool": "node-a",
                    "device": "gpu-0"
                }]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                ]}]}
            },
            "reservedFor": [{"resource": "pods", "name": "trainer",
                             "uid": "7d2c33b4-0000-4000-8000-000000000001"}]
        }),
    );
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    // 16 GiB and a little: the whole device is its memory in whole MiB.
    let memory = (16u64 << 30) + 123;
    let whole = 16u64 << 30;
    let preparer = Preparer {
        node_name: "node-a".into(),
        client: api.client(),
        gpus: Arc::new(RwLock::new(vec![gpu(memory)])),
        layout: cdi::Layout {
            host_lib_dir: dir.path().join("lib"),
            container_lib_dir: "/usr/local/gpufuse/lib".into(),
            host_server: "unix:/var/run/gpufuse/node.sock".parse().unwrap(),
            container_server: "unix:/var/run/gpufuse/node.sock".parse().unwrap(),
        },
        cdi_dir: dir.path().join("cdi"),
        secret: SECRET.to_vec(),
    };
    let devices = preparer
        .prepare(&gpufuse_k8s::prepare::ClaimRef {
            namespace: "team-a".into(),
            name: name.into(),
            uid: uid.clone(),
        })
        .await
        .unwrap();
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    assert_eq!(d.request, "container-0-request-0");
    assert_eq!((d.pool.as_str(), d.device.as_str()), ("node-a", "gpu-0"));
    assert_eq!(d.share_id, None);

    let spec_path = cdi::spec_path(&dir.path().join("cdi"), &uid);
    let spec: cdi::Spec = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    let env = cdi::environment(&spec, d.cdi_id.split_once('=').unwrap().1).unwrap();
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k} in {env:?}"))
    };
    assert_eq!(get("GPUFUSE_VRAM"), whole.to_string());
    assert_eq!(get("GPUFUSE_COMPUTE"), "100");
    assert_eq!(
        get("GPUFUSE_VISIBLE_DEVICES"),
        "GPU-00112233-4455-6677-8899-aabbccddeeff"
    );
    let token = gpufuse_auth::verify(SECRET, &get("GPUFUSE_TOKEN"), 0).unwrap();
    assert_eq!(token.subject, format!("team-a/{name}"));
    assert_eq!(token.max_vram_bytes, Some(whole));
    assert_eq!(token.max_compute_percent, Some(100));

    // The operator charges the namespace the same whole device.
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(api.get(CLAIMS, "team-a", name).unwrap()).unwrap();
    let gpus = std::collections::BTreeMap::from([("node-a".to_string(), vec![gpu(memory)])]);
    let usage = gpufuse_k8s::operator::claim_usage(&claim, &gpus).unwrap();
    assert_eq!((usage.memory, usage.compute), (whole, 100));
    assert_eq!(
        (usage.tenant.as_str(), usage.node.as_str()),
        ("team-a", "node-a")
    );
}
