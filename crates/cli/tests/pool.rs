//! The pool as processes: a `gpufuse controller` and several `gpufuse node`s (emulated GPUs)
//! on unix sockets, with clients that ask the controller and are redirected to their node
//! (the client core the shim runs, in this process). Placement per policy, quotas, the
//! pending queue, preemption, node loss and return, controller restart. Heartbeats are fast
//! (100 ms, nodes lost after 1.5 s) so each test takes seconds.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::{ContextHandle, DevicePtr};
use gpufuse_proto::{Qos, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

const GIB: u64 = 1 << 30;

struct Pool {
    dir: PathBuf,
    controller: Option<Child>,
    controller_args: Vec<String>,
    nodes: HashMap<String, Child>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        for (_, mut c) in self
            .nodes
            .drain()
            .chain(self.controller.take().map(|c| (String::new(), c)))
        {
            // A stopped node must be continued to die cleanly with its workers.
            // SAFETY: kill(2) with a pid we started; it touches no memory.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for_socket(p: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(p).is_err() {
        assert!(Instant::now() < deadline, "{} did not start", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Pool {
    fn new(name: &str, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("gfpool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut args: Vec<String> = vec![
            "controller".into(),
            "--listen".into(),
            format!("unix:{}", dir.join("c.sock").display()),
            "--heartbeat-ms".into(),
            "100".into(),
            "--node-timeout-ms".into(),
            "1500".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = Pool {
            dir,
            controller: None,
            controller_args: args,
            nodes: HashMap::new(),
        };
        p.start_controller();
        p
    }

    fn start_controller(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(&self.controller_args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.controller = Some(child);
        wait_for_socket(&self.dir.join("c.sock"));
    }

    fn ctrl(&self) -> String {
        format!("unix:{}", self.dir.join("c.sock").display())
    }

    fn addr(&self) -> Address {
        self.ctrl().parse().unwrap()
    }

    fn node(&mut self, name: &str, devices: &str, labels: &[&str]) {
        let sock = self.dir.join(format!("{name}.sock"));
        let mut args: Vec<String> = vec![
            "node".into(),
            "--controller".into(),
            self.ctrl(),
            "--listen".into(),
            format!("unix:{}", sock.display()),
            "--devices".into(),
            devices.into(),
            "--name".into(),
            name.into(),
        ];
        for l in labels {
            args.push("--label".into());
            args.push(l.to_string());
        }
        let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(&args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.nodes.insert(name.into(), child);
        wait_for_socket(&sock);
        let name = name.to_string();
        self.eventually(&format!("node {name} registered"), |s| {
            node_state(s, &name).as_deref() == Some("ready")
        });
    }

    fn status(&self) -> serde_json::Value {
        let o = gpufuse(&["status", "--server", &self.ctrl(), "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn eventually(
        &self,
        what: &str,
        mut f: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let s = self.status();
            if f(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what}\n{s:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, node: &str, sig: i32) {
        let pid = self.nodes[node].id() as i32;
        // SAFETY: kill(2) with a pid we started; it touches no memory.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }
}

fn gpufuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(args)
        .output()
        .unwrap()
}

fn node_state(s: &serde_json::Value, name: &str) -> Option<String> {
    s["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)
        .map(|n| n["state"].as_str().unwrap_or_default().to_string())
}

fn session(s: &serde_json::Value, id: u64) -> Option<&serde_json::Value> {
    s["sessions"].as_array()?.iter().find(|x| x["id"] == id)
}

/// A CUDA session asked of the controller (`token` may carry a placement request), holding
/// `hold` bytes of device memory on the device it was given.
fn open(
    pool: &Pool,
    token: &str,
    vram: Option<u64>,
    qos: Qos,
    hold: u64,
) -> Result<Connection, ClientError> {
    let hello = Connection::hello(
        SessionKind::Cuda,
        token.into(),
        ResourceRequest {
            vram_bytes: vram,
            qos,
            ..Default::default()
        },
    );
    let (mut c, _) = Connection::open(&pool.addr(), &hello)?;
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })?;
    if hold > 0 {
        match c.call(&Request::MemAlloc {
            device: 0,
            size: hold,
        })? {
            ReplyBody::Ptr(DevicePtr(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    Ok(c)
}

/// The (node, device) of every running session, waiting until `n` are running.
fn running(pool: &Pool, n: usize) -> Vec<(String, u64, u64)> {
    let s = pool.eventually(&format!("{n} running sessions"), |s| {
        s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["state"] == "running")
            .count()
            == n
    });
    let mut v: Vec<(String, u64, u64)> = s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["node"].as_str().unwrap().to_string(),
                x["device"].as_u64().unwrap(),
                x["id"].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort_by_key(|x| x.2);
    v
}

fn placements(policy: &str) -> Vec<(String, u64)> {
    let mut pool = Pool::new(&format!("policy-{policy}"), &["--policy", policy]);
    pool.node("a", "emu:2:4GiB", &[]);
    pool.node("b", "emu:2:4GiB", &[]);
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(open(&pool, "", Some(GIB), Qos::Medium, 0).unwrap());
        running(&pool, i + 1);
    }
    running(&pool, 3)
        .into_iter()
        .map(|(n, d, _)| (n, d))
        .collect()
}

#[test]
fn each_policy_places_as_it_says() {
    // binpack: one device until it is full.
    let b = placements("binpack");
    assert!(b.iter().all(|p| *p == b[0]), "binpack: {b:?}");
    // spread: three devices.
    let s = placements("spread");
    let mut distinct = s.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "spread: {s:?}");
    // balanced: one node, its devices in turn.
    let l = placements("balanced");
    assert!(l.iter().all(|p| p.0 == l[0].0), "balanced: {l:?}");
    assert_ne!(l[0].1, l[1].1, "balanced: {l:?}");
}

#[test]
fn selectors_and_models_pick_nodes_and_a_node_refuses_sessions_without_a_grant() {
    let mut pool = Pool::new("selectors", &[]);
    pool.node("a", "emu:1:4GiB:sm_100", &["zone=x"]);
    pool.node("b", "emu:1:4GiB:sm_90", &["zone=y"]);
    let _a = open(
        &pool,
        "gfp1;selector=zone=y;token=",
        Some(GIB),
        Qos::Medium,
        0,
    )
    .unwrap();
    assert_eq!(running(&pool, 1)[0].0, "b");
    let _b = open(
        &pool,
        "gfp1;gpu_model=b200;token=",
        Some(GIB),
        Qos::Medium,
        0,
    )
    .unwrap();
    let r = running(&pool, 2);
    assert_eq!(r[1].0, "a", "{r:?}");
    // Straight to a node, past the controller: refused, naming the controller.
    let node: Address = format!("unix:{}", pool.dir.join("a.sock").display())
        .parse()
        .unwrap();
    let hello = Connection::hello(SessionKind::Cuda, String::new(), Default::default());
    match Connection::open(&node, &hello) {
        Err(ClientError::Refused(r)) => assert!(r.contains("controller"), "{r}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A selector nobody matches waits, then gives up with the reason.
    let e = open(
        &pool,
        "gfp1;selector=zone=q;wait=1;token=",
        Some(GIB),
        Qos::Medium,
        0,
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("zone=q"), "{e}");
}

#[test]
fn quotas_refuse_naming_the_limit_and_run_does_not_start_the_program() {
    let dir = std::env::temp_dir().join(format!("gfpool-quota-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quota = dir.join("quota.toml");
    std::fs::write(
        &quota,
        "[tenants.alice]\nsessions = 1\nmax_session_vram = \"2GiB\"\n",
    )
    .unwrap();
    let mut pool = Pool::new("quota", &["--quota-file", quota.to_str().unwrap()]);
    pool.node("a", "emu:2:4GiB", &[]);
    let _held = open(&pool, "gfp1;tenant=alice;token=", None, Qos::Medium, 0).unwrap();
    let s = running(&pool, 1);
    let status = pool.status();
    let first = session(&status, s[0].2).unwrap();
    assert_eq!(first["tenant"], "alice");
    // No slice asked: the per-session maximum is the slice.
    assert_eq!(first["vram_limit_bytes"], 2 * GIB);
    let e = open(&pool, "gfp1;tenant=alice;token=", None, Qos::Medium, 0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("sessions = 1"), "{e}");
    let marker = dir.join("started");
    let o = gpufuse(&[
        "run",
        "--server",
        &pool.ctrl(),
        "--tenant",
        "alice",
        "--",
        "/bin/sh",
        "-c",
        &format!("touch '{}'", marker.display()),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("sessions = 1") && err.contains("was not started"),
        "{err}"
    );
    assert!(!marker.exists());
    let o = gpufuse(&[
        "run",
        "--server",
        &pool.ctrl(),
        "--tenant",
        "bob",
        "--vram",
        "3GiB",
        "--",
        "/bin/true",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_session_that_fits_nowhere_waits_visibly_and_starts_when_capacity_frees() {
    let mut pool = Pool::new("pending", &[]);
    pool.node("a", "emu:1:4GiB", &[]);
    let first = open(&pool, "", Some(3 * GIB), Qos::Medium, GIB).unwrap();
    running(&pool, 1);
    let addr = pool.ctrl();
    let waiter = std::thread::spawn(move || {
        let pool_addr: Address = addr.parse().unwrap();
        let hello = Connection::hello(
            SessionKind::Cuda,
            "gfp1;wait=20;token=".into(),
            ResourceRequest {
                vram_bytes: Some(2 * GIB),
                ..Default::default()
            },
        );
        let t = Instant::now();
        Connection::open(&pool_addr, &hello).map(|c| (c, t.elapsed()))
    });
    let s = pool.eventually("a pending session", |s| {
        s["pending"].as_array().unwrap().len() == 1
    });
    let reason = s["pending"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("2 GiB"), "{reason}");
    assert!(s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["state"] == "pending"));
    std::thread::sleep(Duration::from_millis(500));
    drop(first);
    let (_second, waited) = waiter.join().unwrap().expect("placed once capacity freed");
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    pool.eventually("the queue drained", |s| {
        s["pending"].as_array().unwrap().is_empty()
    });
    // A short wait ends with the reason.
    let _hold = open(&pool, "", Some(3 * GIB), Qos::Medium, 0);
    let e = open(&pool, "gfp1;wait=1;token=", Some(3 * GIB), Qos::Medium, 0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("no capacity within 1 s"), "{e}");
}

#[test]
fn a_high_session_preempts_a_low_one_whose_client_sees_a_cuda_error() {
    let mut pool = Pool::new("preempt", &[]);
    pool.node("a", "emu:1:4GiB", &[]);
    let mut low = open(&pool, "", Some(3 * GIB), Qos::Low, GIB).unwrap();
    running(&pool, 1);
    // A medium session waits; a high one preempts.
    assert!(open(&pool, "gfp1;wait=1;token=", Some(2 * GIB), Qos::Medium, 0).is_err());
    let mut high = open(&pool, "", Some(2 * GIB), Qos::High, GIB / 2).unwrap();
    let e = low
        .call(&Request::MemAlloc {
            device: 0,
            size: 1 << 20,
        })
        .expect_err("the preempted session fails");
    assert_ne!(e.status(), 0, "{e}");
    assert!(matches!(
        high.call(&Request::MemAlloc {
            device: 0,
            size: 1 << 20
        }),
        Ok(ReplyBody::Ptr(DevicePtr(_)))
    ));
    // The victim's node may report it once more before its end is reported: wait for that.
    pool.eventually("the high session runs alone", |s| {
        let running: Vec<&serde_json::Value> = s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["state"] == "running")
            .collect();
        running.len() == 1 && running[0]["qos"] == "high"
    });
}

#[test]
fn a_silent_node_is_lost_its_sessions_shown_lost_and_it_returns_with_them() {
    let mut pool = Pool::new("loss", &[]);
    pool.node("a", "emu:1:4GiB", &["zone=x"]);
    pool.node("b", "emu:1:4GiB", &["zone=y"]);
    let mut on_a = open(
        &pool,
        "gfp1;selector=zone=x;token=",
        Some(GIB),
        Qos::Medium,
        GIB / 2,
    )
    .unwrap();
    let id = running(&pool, 1)[0].2;
    pool.signal("a", libc::SIGSTOP);
    let lost_at = Instant::now();
    let s = pool.eventually("node a lost", |s| {
        node_state(s, "a").as_deref() == Some("lost")
    });
    assert!(lost_at.elapsed() < Duration::from_secs(5));
    assert_eq!(session(&s, id).unwrap()["state"], "lost");
    // New sessions go elsewhere.
    let _on_b = open(&pool, "", Some(GIB), Qos::Medium, 0).unwrap();
    let s = pool.eventually("a session on b", |s| {
        s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["node"] == "b" && x["state"] == "running")
    });
    assert!(s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["node"] != "a" || x["id"] == id));
    pool.signal("a", libc::SIGCONT);
    let s = pool.eventually("node a back", |s| {
        node_state(s, "a").as_deref() == Some("ready")
            && session(s, id).is_some_and(|x| x["state"] == "running")
    });
    assert_eq!(session(&s, id).unwrap()["node"], "a");
    // The session never noticed.
    assert!(matches!(
        on_a.call(&Request::MemAlloc {
            device: 0,
            size: 1 << 20
        }),
        Ok(ReplyBody::Ptr(DevicePtr(_)))
    ));
}

#[test]
fn a_controller_restart_loses_no_session() {
    let mut pool = Pool::new("restart", &[]);
    pool.node("a", "emu:2:4GiB", &[]);
    let mut held = open(
        &pool,
        "gfp1;tenant=carol;token=",
        Some(GIB),
        Qos::High,
        GIB / 2,
    )
    .unwrap();
    let id = running(&pool, 1)[0].2;
    let mut c = pool.controller.take().unwrap();
    c.kill().unwrap();
    c.wait().unwrap();
    // The session runs on without its controller.
    assert!(matches!(
        held.call(&Request::MemAlloc {
            device: 0,
            size: 1 << 20
        }),
        Ok(ReplyBody::Ptr(DevicePtr(_)))
    ));
    pool.start_controller();
    let s = pool.eventually("the session reported again", |s| {
        session(s, id).is_some_and(|x| x["state"] == "running")
    });
    let x = session(&s, id).unwrap();
    assert_eq!(
        (x["tenant"].as_str(), x["qos"].as_str()),
        (Some("carol"), Some("high"))
    );
    assert_eq!(x["vram_limit_bytes"], GIB);
    // New placements work and count what was already there.
    let _more = open(&pool, "", Some(GIB), Qos::Medium, 0).unwrap();
    let r = running(&pool, 2);
    assert!(r.iter().any(|x| x.2 == id) && r.iter().any(|x| x.2 != id));
    // `gpufuse kill` at the controller ends a pool session through its node.
    let o = gpufuse(&["kill", "--server", &pool.ctrl(), &id.to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(held
        .call(&Request::MemAlloc {
            device: 0,
            size: 1 << 20
        })
        .is_err());
    let s = pool.status();
    assert!(session(&s, id).is_none(), "{s:#}");
}

#[test]
fn a_controller_with_http_serves_the_pools_metrics() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = format!("127.0.0.1:{port}");
    let mut pool = Pool::new("http", &["--http", &http]);
    pool.node("a", "emu:2:4GiB", &[]);
    let _held = open(&pool, "", Some(GIB), Qos::High, 0).unwrap();
    running(&pool, 1);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let get = |path: &str| {
        let mut r = agent.get(&format!("http://{http}{path}")).call().unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    assert_eq!(get("/healthz").0, 200);
    // The node's report reaches the controller with its heartbeat.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (code, text) = get("/metrics");
        assert_eq!(code, 200);
        if text.contains("gpufuse_session_memory_limit_bytes{") {
            break text;
        }
        assert!(Instant::now() < deadline, "no session in:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let sample = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in:\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(sample("gpufuse_nodes{state=\"ready\"}"), 1.0);
    assert_eq!(sample("gpufuse_pool_sessions{state=\"running\"}"), 1.0);
    assert_eq!(
        sample("gpufuse_device_memory_total_bytes{") as u64,
        4 * GIB,
        "{text}"
    );
    assert_eq!(
        sample("gpufuse_session_memory_limit_bytes{") as u64,
        GIB,
        "{text}"
    );
    assert!(text.contains("qos=\"high\""), "{text}");
    assert!(
        sample("gpufuse_pool_placement_seconds_count") >= 1.0,
        "{text}"
    );
}
