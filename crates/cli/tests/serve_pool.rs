//! `gpufuse serve` is a node and its own controller in one process: its sessions are placed
//! by the pool's scheduler (policies, quotas, the pending queue, preemption) with no
//! configuration and no redirect. Clients are the client core the shim runs, in this process.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::{ContextHandle, DevicePtr};
use gpufuse_proto::{Qos, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

const GIB: u64 = 1 << 30;

struct Serve {
    dir: PathBuf,
    child: Child,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Serve {
    fn start(name: &str, args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("gfserve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(["serve", "--listen", &format!("unix:{}", sock.display())])
            .args(args)
            .args(["--image-cache", &dir.join("images").display().to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < deadline, "gpufuse serve did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Serve { dir, child }
    }

    fn addr(&self) -> Address {
        format!("unix:{}", self.dir.join("s.sock").display())
            .parse()
            .unwrap()
    }

    fn status(&self) -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(["status", "--json", "--server", &self.addr().to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn eventually(&self, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
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
}

/// A CUDA session (`token` may carry a tenant or a wait) holding `hold` bytes on its device.
fn open(
    addr: &Address,
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
    let (mut c, _) = Connection::open(addr, &hello)?;
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

fn devices_of_sessions(s: &serde_json::Value) -> Vec<u64> {
    let mut v: Vec<(u64, u64)> = s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["id"].as_u64().unwrap(), x["device"].as_u64().unwrap()))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, d)| d).collect()
}

fn placed(policy: &str) -> Vec<u64> {
    let serve = Serve::start(policy, &["--devices", "emu:2:4GiB", "--policy", policy]);
    let held: Vec<Connection> = (0..2)
        .map(|_| open(&serve.addr(), "", Some(GIB), Qos::Medium, 0).unwrap())
        .collect();
    let s = serve.eventually("two sessions", |s| {
        s["sessions"].as_array().unwrap().len() == 2
    });
    drop(held);
    devices_of_sessions(&s)
}

#[test]
fn serve_places_sessions_by_its_policy() {
    let b = placed("binpack");
    assert_eq!(b[0], b[1], "binpack fills one GPU first: {b:?}");
    let s = placed("balanced");
    assert_ne!(
        s[0], s[1],
        "balanced spreads a node's sessions over its GPUs: {s:?}"
    );
}

#[test]
fn serve_applies_quotas_naming_the_limit() {
    let dir = std::env::temp_dir().join(format!("gfserve-quotafile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quotas = dir.join("quotas.toml");
    std::fs::write(&quotas, "[tenants.alice]\nsessions = 1\n").unwrap();
    let serve = Serve::start(
        "quota",
        &[
            "--devices",
            "emu:1:4GiB",
            "--quota-file",
            quotas.to_str().unwrap(),
        ],
    );
    let _first = open(
        &serve.addr(),
        "gfp1;tenant=alice;token=",
        None,
        Qos::Medium,
        0,
    )
    .unwrap();
    let Err(e) = open(
        &serve.addr(),
        "gfp1;tenant=alice;token=",
        None,
        Qos::Medium,
        0,
    ) else {
        panic!("a second session over the quota was admitted")
    };
    assert!(
        e.to_string().contains("session quota (sessions = 1)"),
        "{e}"
    );
    // Another tenant is not limited.
    let _bob = open(
        &serve.addr(),
        "gfp1;tenant=bob;token=",
        None,
        Qos::Medium,
        0,
    )
    .unwrap();
    let s = serve.status();
    let tenants: Vec<&str> = s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["tenant"].as_str().unwrap_or_default())
        .collect();
    assert!(
        tenants.contains(&"alice") && tenants.contains(&"bob"),
        "{s:#}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_queues_a_session_that_fits_nowhere_and_shows_why() {
    let serve = Serve::start("pending", &["--devices", "emu:1:4GiB"]);
    let first = open(&serve.addr(), "", Some(3 * GIB), Qos::Medium, GIB).unwrap();
    // With no wait asked for (and serve's default of none), the refusal is at once, with why.
    let t = Instant::now();
    let Err(e) = open(&serve.addr(), "", Some(2 * GIB), Qos::Medium, 0) else {
        panic!("a session that fits nowhere was admitted")
    };
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(e.to_string().contains("2 GiB"), "{e}");
    // A client that waits is queued, visibly, and placed when capacity frees.
    let addr = serve.addr();
    let waiter = std::thread::spawn(move || {
        open(&addr, "gfp1;wait=20;token=", Some(2 * GIB), Qos::Medium, 0).map(|_| ())
    });
    let s = serve.eventually("a pending session", |s| {
        s["pending"].as_array().is_some_and(|p| p.len() == 1)
    });
    let reason = s["pending"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("2 GiB"), "{reason}");
    drop(first);
    waiter.join().unwrap().expect("placed once capacity freed");
    serve.eventually("the queue drained", |s| {
        s["pending"].as_array().is_some_and(|p| p.is_empty())
    });
}

#[test]
fn serve_lets_a_high_session_preempt_a_low_one() {
    let serve = Serve::start("preempt", &["--devices", "emu:1:4GiB"]);
    let mut low = open(&serve.addr(), "", Some(3 * GIB), Qos::Low, GIB).unwrap();
    let mut high = open(&serve.addr(), "", Some(2 * GIB), Qos::High, GIB / 2).unwrap();
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
    let s = serve.eventually("one session", |s| {
        s["sessions"].as_array().unwrap().len() == 1
    });
    assert_eq!(s["sessions"][0]["qos"], "high", "{s:#}");
}

#[test]
fn serve_places_tflops_requests_on_the_device_that_has_them() {
    let serve = Serve::start("tflops", &["--devices", "emu:1:4GiB"]);
    let hello = |tflops| {
        Connection::hello(
            SessionKind::Cuda,
            String::new(),
            ResourceRequest {
                tflops: Some(tflops),
                ..Default::default()
            },
        )
    };
    let (_c, _) = Connection::open(&serve.addr(), &hello(1)).unwrap();
    let s = serve.eventually("one session", |s| {
        s["sessions"].as_array().unwrap().len() == 1
    });
    let share = s["sessions"][0]["compute_percent"].as_u64().unwrap();
    assert!((1..=100).contains(&share), "{s:#}");
    let e = Connection::open(&serve.addr(), &hello(1_000_000))
        .err()
        .unwrap();
    assert!(e.to_string().contains("TFLOPS"), "{e}");
}
