//! A Kubernetes node in the pool, started as the Helm chart starts it, against the in-process
//! fake API server (no cluster can run here): `gpufuse controller --kubernetes` (the operator
//! inside) and `gpufuse node --kubernetes --controller ... --cdi-dir` (named `$NODE_NAME`,
//! labelled from its Node object, registering with a token it signs with the shared secret),
//! processes on unix sockets. The DRA plugin's preparer (in this process) prepares a claim; a
//! client (the client core, in this process) opens a session straight on the node with the
//! claim's token, without a grant. The controller's pool view shows the session once, on the
//! claim's device and with the claim's UID; the namespace's GPUQuota counts the claim once;
//! draining the node leaves the session where it is (bound to its device) and it keeps
//! working; unpreparing the claim ends it and the pool forgets it.

mod moving;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};

use gpufuse_client::Connection;
use gpufuse_k8s::fake_api::FakeApiServer;
use gpufuse_k8s::prepare::{ClaimRef, Preparer};
use gpufuse_proto::{ResourceRequest, ServerHello, SessionKind};
use gpufuse_transport::Address;
use serde_json::{json, Value};

use moving::{bump, check_big, session_with_token, wait_until};

const SECRET: [u8; 32] = [9; 32];
const NODE: &str = "k8s-node-1";
const OTHER: &str = "k8s-node-2";
const QUOTAS: &str = "gpufuse.dev/v1alpha1/gpuquotas";
const CLAIMS: &str = "resource.k8s.io/v1/resourceclaims";
const SLICES: &str = "resource.k8s.io/v1/resourceslices";
const MIB: u64 = 1 << 20;

/// The controller and the node, ended (and their directory removed) when it drops.
struct Processes {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn logs() -> Stdio {
    if std::env::var_os("GPUFUSE_TEST_LOGS").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

fn token(subject: &str) -> String {
    gpufuse_auth::issue(
        &SECRET,
        &gpufuse_auth::Claims {
            subject: subject.into(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// A kubeconfig naming the fake API server (plain HTTP, no credentials).
fn kubeconfig(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n\
         users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
         current-context: fake\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `gpufuse ARGS` with the Kubernetes connection of the test, not the host's.
fn gpufuse(kubeconfig: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpufuse"));
    c.env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("GPUFUSE_TOKEN")
        .stderr(logs());
    c
}

/// `gpufuse ARGS --server CONTROLLER` as the pool's admin.
fn admin(ctrl: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(args)
        .args(["--server", ctrl])
        .env("GPUFUSE_TOKEN", token("admin"))
        .output()
        .unwrap()
}

fn pool_status(ctrl: &str) -> Value {
    let o = admin(ctrl, &["status", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn sessions(status: &Value) -> Vec<Value> {
    status["sessions"].as_array().cloned().unwrap_or_default()
}

/// The value of `GPUFUSE_TOKEN` in a CDI spec's container edits.
fn cdi_token(spec: &Value) -> String {
    spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| {
            d["containerEdits"]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find_map(|e| {
            e.as_str()?
                .strip_prefix("GPUFUSE_TOKEN=")
                .map(str::to_string)
        })
        .expect("the CDI spec sets GPUFUSE_TOKEN")
}

fn quota_used(api: &FakeApiServer) -> Value {
    api.get(QUOTAS, "team-a", "gpus")
        .map(|q| q["status"]["used"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn a_claims_session_on_a_pool_node_is_counted_once_and_stays_through_a_drain() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let api = rt.block_on(FakeApiServer::start()).unwrap();
    let dir = std::env::temp_dir().join(format!("gpufuse-k8s-pool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join(format!("{NODE}-cdi"))).unwrap();
    let mut procs = Processes {
        dir: dir.clone(),
        children: Vec::new(),
    };
    let secret = dir.join("secret");
    std::fs::write(
        &secret,
        SECRET
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
    )
    .unwrap();
    let kubeconfig = kubeconfig(&dir, &api.url());

    api.insert(
        "v1/nodes",
        "",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {
            "gpufuse.dev/pool": "training",
            "topology.kubernetes.io/zone": "z1",
        }}}),
    );
    api.insert(
        "v1/nodes",
        "",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER}}),
    );
    api.insert(
        QUOTAS,
        "team-a",
        json!({
            "apiVersion": "gpufuse.dev/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "gpus", "namespace": "team-a"},
            "spec": {"total": {"memory": "1Gi"}, "perClaim": {}}
        }),
    );

    // As the chart runs them (deploy/helm/gpufuse/templates/{controller,node}.yaml).
    let ctrl = format!("unix:{}", dir.join("c.sock").display());
    procs.children.push(
        gpufuse(&kubeconfig)
            .args(["controller", "--listen", &ctrl, "--heartbeat-ms", "100"])
            .arg("--token-secret-file")
            .arg(&secret)
            .args(["--kubernetes", "--kubernetes-interval", "1"])
            .spawn()
            .unwrap(),
    );
    wait_until("the controller listens", || {
        UnixStream::connect(dir.join("c.sock")).is_ok()
    });
    let start_node = |name: &str, devices: &str| {
        let sock = dir.join(format!("{name}.sock"));
        let child = gpufuse(&kubeconfig)
            .env("NODE_NAME", name)
            .args(["node", "--kubernetes", "--controller", &ctrl])
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .args(["--devices", devices])
            .arg("--token-secret-file")
            .arg(&secret)
            .arg("--cdi-dir")
            .arg(dir.join(format!("{name}-cdi")))
            .arg("--image-cache")
            .arg(dir.join(format!("{name}-images")))
            .spawn()
            .unwrap();
        wait_until(
            &format!("{name} joins the pool under its Kubernetes name"),
            || {
                pool_status(&ctrl)["nodes"]
                    .as_array()
                    .is_some_and(|n| n.iter().any(|n| n["name"] == name && n["state"] == "ready"))
            },
        );
        (child, sock)
    };
    let (child, node_sock) = start_node(NODE, "emu:2:1GiB");
    procs.children.push(child);
    // Another node with room, where a drain would move a session that may move.
    let (child, _) = start_node(OTHER, "emu:1:1GiB");
    procs.children.push(child);
    let st = pool_status(&ctrl);
    let node_view = |st: &Value, name: &str| {
        st["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["name"] == name).cloned())
            .unwrap_or(Value::Null)
    };
    let labels = &node_view(&st, NODE)["labels"];
    assert_eq!(labels["gpufuse.dev/pool"], "training", "{st}");
    assert_eq!(labels["topology.kubernetes.io/zone"], "z1", "{st}");

    // The DRA plugin's part: the node's GPUs in a ResourceSlice, then a claim the scheduler
    // allocated on gpu-1, 256 MiB and 30% of it.
    let node_addr = Address::Unix(node_sock.clone());
    let gpus = gpufuse_k8s::inventory::query(&node_addr, &token("admin")).unwrap();
    assert_eq!(gpus.len(), 2);
    let slice = gpufuse_k8s::slice::resource_slice(NODE, &gpus, 1);
    api.insert(SLICES, "", serde_json::to_value(&slice).unwrap());
    let claim = api.insert(
        CLAIMS,
        "team-a",
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.gpufuse.dev", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": "256Mi", "compute": "30"}}
            }}]}},
        }),
    );
    api.set_status(
        CLAIMS,
        "team-a",
        "train",
        json!({
            "allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.gpufuse.dev", "pool": NODE, "device": "gpu-1",
                "shareID": "s1", "consumedCapacity": {"memory": "256Mi", "compute": "30"}
            }]}},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "7d2c33b4-0000-4000-8000-000000000001"}]
        }),
    );
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    wait_until(
        "the operator charges the claim to team-a's GPUQuota",
        || quota_used(&api)["memory"] == "256Mi",
    );
    let preparer = Preparer {
        node_name: NODE.into(),
        // kube's client starts its tasks on the runtime it is made in.
        client: {
            let _in = rt.enter();
            api.client()
        },
        gpus: Arc::new(RwLock::new(gpus.clone())),
        layout: gpufuse_k8s::cdi::Layout {
            host_lib_dir: dir.join("lib"),
            container_lib_dir: "/usr/local/gpufuse/lib".into(),
            host_server: node_addr.clone(),
            container_server: node_addr.clone(),
        },
        cdi_dir: dir.join(format!("{NODE}-cdi")),
        secret: SECRET.to_vec(),
    };
    let claim_ref = ClaimRef {
        namespace: "team-a".into(),
        name: "train".into(),
        uid: uid.clone(),
    };
    rt.block_on(preparer.prepare(&claim_ref)).unwrap();
    let spec_path = gpufuse_auth::claim_spec_path(&dir.join(format!("{NODE}-cdi")), &uid).unwrap();
    let spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();

    // The pod's client goes straight to its node with the claim's token: no controller, no
    // grant. It asks for nothing and gets the claim's slice, on the claim's device.
    let (mut c, _, big, counter) =
        session_with_token(&node_addr, cdi_token(&spec), ResourceRequest::default());
    assert_eq!(bump(&mut c, counter), 1);
    wait_until("the pool shows the claim's session", || {
        sessions(&pool_status(&ctrl))
            .iter()
            .any(|s| s["state"] == "running")
    });
    let st = pool_status(&ctrl);
    let all = sessions(&st);
    assert_eq!(all.len(), 1, "one session, counted once: {st}");
    let s = &all[0];
    assert_eq!(s["node"], NODE, "{s}");
    assert_eq!(s["device"], 1, "{s}");
    assert_eq!(s["tenant"], "team-a/train", "{s}");
    assert_eq!(s["claim"], uid.as_str(), "{s}");
    assert_eq!(s["vram_limit_bytes"], 256 * MIB, "{s}");
    assert_eq!(s["compute_percent"], 30, "{s}");
    let devices = &node_view(&st, NODE)["devices"];
    assert_eq!(devices[1]["memory_promised_bytes"], 256 * MIB, "{st}");
    assert_eq!(devices[1]["compute_promised_percent"], 30, "{st}");
    assert_eq!(devices[0]["memory_promised_bytes"], 0, "{st}");

    // team-a's quota (1 GiB) holds the claim once: 768 MiB more fits, 769 MiB does not.
    let check = |mib: u64| {
        let hello = Connection::hello(
            SessionKind::Check,
            token("team-a"),
            ResourceRequest {
                vram_bytes: Some(mib * MIB),
                ..Default::default()
            },
        );
        Connection::one_shot(&ctrl.parse().unwrap(), &hello).unwrap()
    };
    assert!(
        matches!(check(768), ServerHello::Admissible { .. }),
        "{:?}",
        check(768)
    );
    match check(769) {
        ServerHello::Refused { reason } => {
            assert!(reason.contains("256 MiB is held"), "{reason}")
        }
        other => panic!("769 MiB more should be over team-a's quota: {other:?}"),
    }
    // Operator passes with the session running (one a second) still count the claim once.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let used = quota_used(&api);
    assert_eq!(used["memory"], "256Mi", "{used}");
    assert_eq!(used["claims"], 1, "{used}");

    // A drain cordons the node and leaves the claim's session on its device.
    let out = admin(&ctrl, &["node", "drain", NODE]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !out.status.success(),
        "a session stays, so drain exits 1: {stdout}"
    );
    let id = s["id"].as_u64().unwrap();
    assert!(
        stdout.contains(&format!("session {id} stays on {NODE}"))
            && stdout.contains("bound to its device"),
        "{stdout}"
    );
    assert!(
        stdout.contains("0 session(s) moved off it, 1 stay"),
        "{stdout}"
    );
    check_big(&mut c, big);
    assert_eq!(bump(&mut c, counter), 2);
    let st = pool_status(&ctrl);
    assert_eq!(node_view(&st, NODE)["cordoned"], true, "{st}");
    let all = sessions(&st);
    assert_eq!(all.len(), 1, "{st}");
    assert_eq!(
        (&all[0]["device"], &all[0]["state"]),
        (&json!(1), &json!("running"))
    );

    // Unprepared: the node ends the claim's session, and the pool forgets it.
    preparer.unprepare(&claim_ref).unwrap();
    assert!(
        c.call(&gpufuse_proto::Request::Ping).is_err(),
        "the ended session answered"
    );
    wait_until("the pool forgets the claim's session", || {
        sessions(&pool_status(&ctrl)).is_empty()
    });
    drop(procs);
}
