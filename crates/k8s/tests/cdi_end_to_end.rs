//! End to end without a cluster: a claim (in the fake API server) prepared by the plugin over
//! its gRPC socket yields a CDI spec; a real CUDA client (cuda-python) started with only that
//! spec's environment, no `gpufuse run`, reaches a real `gpufuse serve` (two emulated GPUs,
//! tokens required) and gets exactly the claimed slice on the allocated device: it sees the
//! slice's memory, the node shows its share, tenant and device, and an allocation past the
//! slice fails. Unpreparing the claim ends the session a second client has open, and the
//! claim's token opens nothing after that. The same again with the node a member of a pool
//! (`gpufuse node --controller`, as the Helm chart runs it): the client still goes straight
//! to its node with the claim's token, no grant, and the controller's pool view shows the
//! session once, on the claim's device, with the claim's UID.
//!
//! Real-client tier: needs the release binaries and .deps (cuda-python); run by
//! scripts/run-real-clients.sh (`cargo test --release -p gpufuse-k8s --test cdi_end_to_end
//! -- --ignored`). Not run against a real kubelet, container runtime or API server: the
//! runtime's part (applying the spec's mounts and environment) is done here by the test.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpufuse_k8s::cdi;
use gpufuse_k8s::fake_api::FakeApiServer;
use gpufuse_k8s::grpc::dra::dra_plugin_client::DraPluginClient;
use gpufuse_k8s::grpc::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use gpufuse_k8s::plugin::{self, Sockets};
use gpufuse_k8s::prepare::Preparer;
use support::*;

fn release_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("release")
}

struct Node(std::process::Child);

impl Drop for Node {
    fn drop(&mut self) {
        // SIGTERM: the node removes its socket and ends its workers.
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-client tier: needs release binaries and .deps (cuda-python); scripts/run-real-clients.sh runs it"]
async fn a_prepared_claim_runs_a_cuda_client_in_its_slice() {
    claim_runs_a_cuda_client(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real-client tier: needs release binaries and .deps (cuda-python); scripts/run-real-clients.sh runs it"]
async fn a_prepared_claim_runs_a_cuda_client_on_a_pool_node() {
    claim_runs_a_cuda_client(true).await;
}

/// The pool's sessions, as its controller at `ctrl` shows them.
fn pool_sessions(
    ctrl: &gpufuse_transport::Address,
    token: &str,
) -> Vec<gpufuse_proto::PoolSessionView> {
    let hello = gpufuse_client::Connection::hello(
        gpufuse_proto::SessionKind::Status,
        token.to_string(),
        Default::default(),
    );
    match gpufuse_client::Connection::one_shot(ctrl, &hello).unwrap() {
        gpufuse_proto::ServerHello::PoolStatus(p) => p.sessions,
        other => panic!("not a pool's status: {other:?}"),
    }
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The test, with the node standalone (`gpufuse serve`) or in a pool (`gpufuse node
/// --controller`, the controller a process too).
async fn claim_runs_a_cuda_client(pool: bool) {
    let bin = release_dir();
    let gpufuse = bin.join("gpufuse");
    let python = std::env::var("GPUFUSE_PY").expect("GPUFUSE_PY (source .deps/env.sh)");
    assert!(
        gpufuse.exists(),
        "{} is missing: cargo build --release",
        gpufuse.display()
    );
    let dir = TempDir::new("e2e");

    // The host's shim directory, as the DaemonSet's init container lays it out.
    let lib = dir.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    for (name, file) in [
        ("libcuda.so.1", "libcuda.so"),
        ("libcuda.so", "libcuda.so"),
        ("libnvidia-ml.so.1", "libnvidia_ml.so"),
    ] {
        let from = bin.join(file);
        assert!(from.exists(), "{} is missing", from.display());
        std::os::unix::fs::symlink(&from, lib.join(name)).unwrap();
    }

    // The node, requiring tokens.
    let secret_file = dir.path().join("secret");
    let st = Command::new(&gpufuse)
        .args(["token", "secret"])
        .arg(&secret_file)
        .output()
        .unwrap();
    assert!(st.status.success(), "{st:?}");
    let secret_hex = std::fs::read_to_string(&secret_file).unwrap();
    let secret: Vec<u8> = (0..secret_hex.trim().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&secret_hex[i..i + 2], 16).unwrap())
        .collect();
    let socket = dir.path().join("node.sock");
    let address = format!("unix:{}", socket.display());
    let ctrl_socket = dir.path().join("controller.sock");
    let ctrl = format!("unix:{}", ctrl_socket.display());
    let _controller = pool.then(|| {
        Node(
            Command::new(&gpufuse)
                .args(["controller", "--listen", &ctrl, "--heartbeat-ms", "100"])
                .arg("--token-secret-file")
                .arg(&secret_file)
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    });
    let mut node = Command::new(&gpufuse);
    if pool {
        // As the chart runs it, named after its Kubernetes node (`--kubernetes` reads the
        // name from NODE_NAME and the labels from the API: crates/cli/tests/k8s_pool.rs).
        node.args(["node", "--controller", &ctrl, "--name", "node-a"]);
    } else {
        node.arg("serve");
    }
    let _node = Node(
        node.args(["--listen", &address, "--devices", "emu:2:2GiB"])
            .arg("--image-cache")
            .arg(dir.path().join("images"))
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .arg("--token-secret-file")
            .arg(&secret_file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while !socket.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the node did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let server: gpufuse_transport::Address = address.parse().unwrap();
    let admin_token = gpufuse_auth::issue(
        &secret,
        &gpufuse_auth::Claims {
            subject: "admin".into(),
            expires: None,
            max_vram_bytes: None,
            max_compute_percent: None,
            ..Default::default()
        },
    )
    .unwrap();
    let gpus = gpufuse_k8s::inventory::query(&server, &admin_token).unwrap();
    assert_eq!(gpus.len(), 2);

    // The claim as the scheduler allocated it: 256 MiB and 40% of gpu-1.
    let api = FakeApiServer::start().await.unwrap();
    api.insert(
        CLAIMS,
        "team-a",
        claim("team-a", "train", "node-a", "256Mi", "40"),
    );
    let claimed = api.set_status(
        CLAIMS,
        "team-a",
        "train",
        allocation_on("node-a", "gpu-1", "256Mi", "40", "s1"),
    );
    let uid = claimed["metadata"]["uid"].as_str().unwrap().to_string();

    // The plugin, prepared through its socket as the kubelet would. Host and container paths
    // are the same here: no container runtime moves them.
    let preparer = Arc::new(Preparer {
        node_name: "node-a".into(),
        client: api.client(),
        gpus: Arc::new(RwLock::new(gpus)),
        layout: cdi::Layout {
            host_lib_dir: lib.clone(),
            container_lib_dir: lib.clone(),
            host_server: server.clone(),
            container_server: server.clone(),
        },
        cdi_dir: dir.path().join("cdi"),
        secret: secret.clone(),
    });
    let sockets = Sockets::under(&dir.path().join("k"));
    let _running = plugin::serve(preparer, sockets.clone(), std::future::pending()).unwrap();
    let mut dra = DraPluginClient::new(channel(&sockets.dra).await);
    let resp = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![Claim {
                namespace: "team-a".into(),
                uid: uid.clone(),
                name: "train".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let prepared = &resp.claims[&uid];
    assert_eq!(prepared.error, "");
    let cdi_id = &prepared.devices[0].cdi_device_ids[0];

    // The runtime's part: the spec's environment for the device, on a plain process start.
    let spec: cdi::Spec = serde_json::from_slice(
        &std::fs::read(cdi::spec_path(&dir.path().join("cdi"), &uid)).unwrap(),
    )
    .unwrap();
    let env = cdi::environment(&spec, cdi_id.split_once('=').unwrap().1).unwrap();
    let (mut client, mut out, lines) = start_client(&python, &env).unwrap();
    assert!(
        lines.contains(&format!("total={}", 256u64 << 20)),
        "{lines:?}"
    );

    // The node sees the session with the claim's slice, share and tenant, on the allocated
    // device (gpu-1, although gpu-0 is as free).
    let claim_session = || {
        gpufuse_client::Connection::query_status(&server, admin_token.clone())
            .unwrap()
            .sessions
            .into_iter()
            .find(|s| s.subject.as_deref() == Some("team-a/train"))
    };
    let session = claim_session().expect("no session of team-a/train");
    assert_eq!(session.limit_bytes, Some(256 << 20));
    assert_eq!(session.compute_percent, Some(40));
    assert_eq!(session.device, 1);
    // In a pool, the controller was not asked, and it shows the session once, as the claim's.
    let ctrl: gpufuse_transport::Address = ctrl.parse().unwrap();
    if pool {
        // The session and its claim arrive with the node's reports: wait for the claim too (a
        // report sent between the session's admission and its claim's record shows none yet).
        eventually("the pool shows the claim's session", || {
            pool_sessions(&ctrl, &admin_token)
                .iter()
                .any(|s| s.claim.is_some())
        });
        let sessions = pool_sessions(&ctrl, &admin_token);
        assert_eq!(sessions.len(), 1, "{sessions:?}");
        let s = &sessions[0];
        assert_eq!(s.claim.as_deref(), Some(uid.as_str()), "{s:?}");
        assert_eq!(
            (s.node.as_deref(), s.device),
            (Some("node-a"), Some(1)),
            "{s:?}"
        );
        assert_eq!(s.tenant, "team-a/train");
        assert_eq!(s.vram_limit_bytes, Some(256 << 20));
    }

    // Past the slice: refused.
    client.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let st = client.wait().unwrap();
    assert!(st.success(), "{rest}");
    assert!(rest.contains("over=CUDA_ERROR_OUT_OF_MEMORY"), "{rest}");

    // Unprepare while a second client of the claim is open: the node ends its session, and
    // the claim's token opens nothing any more.
    let (mut second, _out, _) = start_client(&python, &env).unwrap();
    assert!(claim_session().is_some());
    let un = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![Claim {
                namespace: "team-a".into(),
                uid: uid.clone(),
                name: "train".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[&uid].error, "");
    assert!(
        claim_session().is_none(),
        "the claim's session outlived its unprepare"
    );
    if pool {
        eventually("the pool forgets the claim's sessions", || {
            pool_sessions(&ctrl, &admin_token).is_empty()
        });
    }
    let _ = second.kill();
    let _ = second.wait();
    let Err(err) = start_client(&python, &env) else {
        panic!("a client of an unprepared claim started");
    };
    assert!(err.contains("is not prepared on this node"), "{err}");
}

/// Starts `cdi_client.py` with `env` (nothing else of the test's environment) and reads its
/// lines up to `ready`; the client's stderr when it ends before that.
fn start_client(
    python: &str,
    env: &[(String, String)],
) -> Result<
    (
        std::process::Child,
        BufReader<std::process::ChildStdout>,
        Vec<String>,
    ),
    String,
> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cdi_client.py");
    let mut client = Command::new(python)
        .arg(&script)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !line.starts_with("ready") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 || Instant::now() > deadline {
            let _ = client.kill();
            let mut err = String::new();
            std::io::Read::read_to_string(&mut client.stderr.take().unwrap(), &mut err).unwrap();
            let _ = client.wait();
            return Err(format!("the client ended early: {lines:?}\n{err}"));
        }
        lines.push(line.trim().to_string());
    }
    Ok((client, out, lines))
}
