//! `gpufuse serve --http` as a process: its metrics agree with `gpufuse status`, every query
//! of the Grafana dashboard names a series it exposes, a refused session is shown with its
//! reason and a waiting one as pending, `gpufuse report` bills the session, and JSON logs
//! carry the session's span. `gpufuse top --server CONTROLLER` shows the pool, read off a
//! pseudo-terminal.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_client::Connection;
use gpufuse_proto::{ContextHandle, DevicePtr, FunctionHandle, ModuleHandle, StreamHandle};
use gpufuse_proto::{Qos, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

struct Server {
    child: Child,
    dir: std::path::PathBuf,
    addr: Address,
    http: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(name: &str, extra: &[&str], stderr: Stdio) -> Server {
    let dir = std::env::temp_dir().join(format!("gpufuse-observe-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let http = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(["--devices", "emu:1:1GiB", "--http", &http])
        .args(["--image-cache", &dir.join("images").display().to_string()])
        .args(extra)
        .env_remove("GPUFUSE_LOG_FORMAT")
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&sock).is_err() || std::net::TcpStream::connect(&http).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        dir,
        addr: Address::Unix(sock),
        http,
    }
}

fn get(s: &Server, path: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .get(&format!("http://{}{path}", s.http))
        .call()
        .unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// One thread spinning `n` times.
const SPIN_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\n.visible .entry spin(\n\t.param .u32 spin_param_0\n)\n{\n\t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\n\tld.param.u32 %r1, [spin_param_0];\n\tmov.u32 %r2, 0;\n$L__BB0_1:\n\tsetp.ge.u32 %p1, %r2, %r1;\n\t@%p1 bra $L__BB0_2;\n\tadd.s32 %r2, %r2, 1;\n\tbra.uni $L__BB0_1;\n$L__BB0_2:\n\tret;\n}\n\0";

fn session(s: &Server, compute: Option<u32>, vram: Option<u64>) -> Result<Connection, String> {
    let hello = Connection::hello(
        SessionKind::Cuda,
        String::new(),
        ResourceRequest {
            compute_percent: compute,
            vram_bytes: vram,
            qos: Qos::High,
            ..Default::default()
        },
    );
    let (mut c, _) = Connection::open(&s.addr, &hello).map_err(|e| e.to_string())?;
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    let image = SPIN_PTX.as_bytes();
    let hash: [u8; 32] =
        sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
    c.call(&Request::ModuleLoad {
        module: ModuleHandle(2),
        device: 0,
        hash,
        image: Some(image),
    })
    .unwrap();
    c.call(&Request::ModuleGetFunction {
        module: ModuleHandle(2),
        name: "spin",
        function: FunctionHandle(3),
    })
    .unwrap();
    Ok(c)
}

fn spin(c: &mut Connection, n: u32) {
    let params = n.to_le_bytes();
    c.quiet(&Request::LaunchKernel(gpufuse_proto::Launch {
        function: FunctionHandle(3),
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem: 0,
        stream: StreamHandle(0),
        params: &params,
        attributes: Vec::new(),
    }))
    .unwrap();
    c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(1),
    })
    .unwrap();
}

/// The value of the first sample `name{...}` whose line contains every one of `with`.
fn sample(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && with.iter().all(|w| l.contains(w)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} with {with:?}:\n{text}"))
}

/// The families a scrape declares (`# TYPE name kind`), with their kinds.
fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect()
}

/// Whether series `name` (as a query writes it) is exposed by one of `families`.
fn exposed(name: &str, families: &[(String, String)]) -> bool {
    families.iter().any(|(f, kind)| match kind.as_str() {
        "counter" => name == format!("{f}_total"),
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name == format!("{f}{s}")),
        _ => name == f,
    })
}

/// Every `gpufuse_*` identifier in a PromQL expression.
fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("gpufuse_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every query string in a Grafana dashboard: panel targets' `expr` and templating queries.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => queries(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

#[test]
fn metrics_agree_with_status_and_every_dashboard_query_names_an_exposed_series() {
    let s = start("metrics", &[], Stdio::null());
    let mut c = session(&s, Some(40), Some(256 << 20)).unwrap();
    match c
        .call(&Request::MemAlloc {
            device: 0,
            size: 16 << 20,
        })
        .unwrap()
    {
        ReplyBody::Ptr(DevicePtr(_)) => {}
        other => panic!("{other:?}"),
    }
    for _ in 0..20 {
        spin(&mut c, 20_000);
    }
    // A session asking for more compute than is left is refused, and shown with its reason.
    let refused = session(&s, Some(80), None).unwrap_err();
    assert!(
        refused.contains("no device has 80% compute free"),
        "{refused}"
    );

    let before = Connection::query_status(&s.addr, String::new()).unwrap();
    let (code, text) = get(&s, "/metrics");
    let after = Connection::query_status(&s.addr, String::new()).unwrap();
    assert_eq!(code, 200);
    let d = &before.devices[0];
    let x = &before.sessions[0];
    let id = format!("session=\"{}\"", x.id);
    assert_eq!(
        sample(&text, "gpufuse_device_memory_total_bytes", &["gpu=\"0\""]),
        d.total_bytes as f64
    );
    assert_eq!(
        sample(&text, "gpufuse_device_memory_used_bytes", &["gpu=\"0\""]),
        d.used_bytes as f64
    );
    assert_eq!(
        sample(
            &text,
            "gpufuse_device_memory_promised_bytes",
            &["gpu=\"0\""]
        ),
        (256u64 << 20) as f64
    );
    assert_eq!(
        sample(&text, "gpufuse_device_sessions", &["gpu=\"0\""]),
        1.0
    );
    assert_eq!(
        sample(&text, "gpufuse_session_memory_used_bytes", &[&id]),
        x.used_bytes as f64
    );
    assert_eq!(
        sample(
            &text,
            "gpufuse_session_memory_limit_bytes",
            &[&id, "qos=\"high\"", "tenant=\"default\""]
        ),
        x.limit_bytes.unwrap() as f64
    );
    assert_eq!(
        sample(&text, "gpufuse_session_compute_share_ratio", &[&id]),
        0.4
    );
    let secs = sample(&text, "gpufuse_session_device_seconds_total", &[&id]);
    assert!(secs > 0.0, "{text}");
    assert!(
        secs >= x.device_time_us as f64 / 1e6
            && secs <= after.sessions[0].device_time_us as f64 / 1e6,
        "{secs} s not between two status answers: {} and {} us",
        x.device_time_us,
        after.sessions[0].device_time_us
    );
    assert!(sample(&text, "gpufuse_session_queue_wait_seconds_count", &[&id]) >= 20.0);
    assert_eq!(
        sample(&text, "gpufuse_session_throttled_seconds_total", &[&id]),
        0.0,
        "elastic policy never throttles"
    );
    assert_eq!(
        sample(&text, "gpufuse_pool_sessions", &["state=\"running\""]),
        1.0
    );
    assert_eq!(
        sample(&text, "gpufuse_pool_placement_seconds_count", &[]),
        2.0
    );
    assert_eq!(sample(&text, "gpufuse_nodes", &["state=\"ready\""]), 1.0);

    // The Grafana dashboard asks only for series this server exposes.
    let fams = families(&text);
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/gpufuse-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut qs = Vec::new();
    queries(&dashboard, &mut qs);
    assert!(qs.len() >= 20, "{qs:?}");
    let mut checked = 0;
    for q in &qs {
        let names = series_in(q);
        assert!(!names.is_empty(), "a query without a gpufuse series: {q}");
        for n in names {
            assert!(
                exposed(&n, &fams),
                "{q}: {n} is not exposed; families: {fams:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= qs.len());

    let (_, snap) = get(&s, "/api/v1/snapshot");
    let snap: serde_json::Value = serde_json::from_str(&snap).unwrap();
    let pending = &snap["pending"][0];
    assert_eq!(pending["state"], "refused", "{snap}");
    assert!(
        pending["reason"]
            .as_str()
            .unwrap()
            .contains("no device has 80% compute free"),
        "{snap}"
    );
    assert_eq!(get(&s, "/readyz").0, 200);

    // The ledger is sampled once a second: the report bills the session's device time.
    std::thread::sleep(Duration::from_millis(2200));
    let out = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["report", "--http", &s.http, "--since", "5m", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &r["tenants"][0];
    assert_eq!(t["tenant"], "default", "{r}");
    assert_eq!(t["sessions"], 1, "{r}");
    let used = t["device_hours_used"].as_f64().unwrap() * 3600.0;
    assert!(
        (used - secs).abs() < 0.05 * secs + 1e-3,
        "{used} s billed, {secs} s run: {r}"
    );
    assert!(t["device_hours_promised"].as_f64().unwrap() > 0.0, "{r}");
    assert!(t["cost"].as_f64().unwrap() > 0.0, "{r}");
    let csv = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["report", "--http", &s.http, "--csv"])
        .output()
        .unwrap();
    let csv = String::from_utf8(csv.stdout).unwrap();
    assert!(
        csv.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("default,1,")),
        "{csv}"
    );
}

#[test]
fn json_logs_carry_the_session_span_in_node_and_worker() {
    let mut s = start("logs", &["--log-format", "json"], Stdio::piped());
    let stderr = s.child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut c = session(&s, None, None).unwrap();
    spin(&mut c, 10);
    let id = Connection::query_status(&s.addr, String::new())
        .unwrap()
        .sessions[0]
        .id;
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    let mut ended = false;
    while Instant::now() < deadline && !ended {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            ended = l.contains("ended");
            lines.push(l);
        }
    }
    let with_span: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|v| v["span"]["name"] == "session")
        .collect();
    assert!(
        !with_span.is_empty(),
        "no line in a session span: {lines:#?}"
    );
    for v in &with_span {
        assert_eq!(v["span"]["id"], id.get(), "{v}");
        // A session without a token is charged to the pool's default tenant.
        assert_eq!(v["span"]["tenant"], "default", "{v}");
        assert_eq!(v["span"]["device"], 0, "{v}");
        assert!(
            v["span"]["node"].as_str().is_some_and(|n| !n.is_empty()),
            "{v}"
        );
    }
    assert!(
        with_span.iter().any(|v| v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ended"))),
        "{lines:#?}"
    );
}

/// The first sample of `name` whose line contains every one of `with`, if there is one.
fn sample_now(s: &Server, name: &str, with: &[&str]) -> Option<f64> {
    let (_, text) = get(s, "/metrics");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && with.iter().all(|w| l.contains(w)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn eventually_sample(s: &Server, name: &str, with: &[&str], want: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = sample_now(s, name, with);
        if v == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{with:?} is {v:?}, not {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A session (`token` may ask to wait) with a VRAM slice of `vram` bytes.
fn sliced(addr: &Address, token: &str, vram: u64) -> Result<Connection, String> {
    let hello = Connection::hello(
        SessionKind::Cuda,
        token.into(),
        ResourceRequest {
            vram_bytes: Some(vram),
            ..Default::default()
        },
    );
    let (mut c, _) = Connection::open(addr, &hello).map_err(|e| e.to_string())?;
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .map_err(|e| e.to_string())?;
    Ok(c)
}

#[test]
fn a_session_waiting_in_serves_queue_is_pending_in_metrics_and_the_snapshot() {
    let s = start("pending", &[], Stdio::null());
    let first = sliced(&s.addr, "", 768 << 20).unwrap();
    eventually_sample(&s, "gpufuse_pool_sessions", &["state=\"running\""], 1.0);
    assert_eq!(
        sample_now(&s, "gpufuse_pool_sessions", &["state=\"pending\""]),
        Some(0.0)
    );
    // 512 MiB fits nowhere while the first holds 768 MiB of the 1 GiB: it waits, visibly.
    let addr = s.addr.clone();
    let waiter =
        std::thread::spawn(move || sliced(&addr, "gfp1;wait=20;token=", 512 << 20).map(|_| ()));
    eventually_sample(&s, "gpufuse_pool_sessions", &["state=\"pending\""], 1.0);
    let (_, snap) = get(&s, "/api/v1/snapshot");
    let snap: serde_json::Value = serde_json::from_str(&snap).unwrap();
    let waiting: Vec<&serde_json::Value> = snap["pending"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "pending")
        .collect();
    assert_eq!(waiting.len(), 1, "{snap}");
    assert!(
        waiting[0]["what"]
            .as_str()
            .is_some_and(|w| w.starts_with("session ")),
        "{snap}"
    );
    assert!(
        waiting[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("512 MiB")),
        "{snap}"
    );
    // The same queue `gpufuse status` shows.
    let status = Connection::query_status(&s.addr, String::new()).unwrap();
    assert_eq!(status.pending.len(), 1);
    assert_eq!(waiting[0]["reason"], status.pending[0].reason.as_str());
    // Placed once the first leaves: no longer pending.
    drop(first);
    waiter.join().unwrap().expect("placed once capacity freed");
    eventually_sample(&s, "gpufuse_pool_sessions", &["state=\"pending\""], 0.0);
}

/// A pseudo-terminal of `rows` x `cols`: (its controller side, a file of its terminal side).
fn pty(rows: u16, cols: u16) -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: posix_openpt returns a new descriptor this function owns (checked), which the
    // calls below use and the File then owns; ptsname_r writes at most `name.len()` bytes.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = std::fs::File::from_raw_fd(m);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        assert_eq!(libc::ioctl(m, libc::TIOCSWINSZ, &size), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_string();
        let terminal = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(path)
            .unwrap();
        (master, terminal)
    }
}

/// What a terminal program wrote, its escape sequences (cursor moves, styles) each read as
/// one space and runs of spaces as one.
fn screen_text(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut it = String::from_utf8_lossy(bytes)
        .chars()
        .collect::<Vec<_>>()
        .into_iter();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            match it.next() {
                Some('[') => {
                    for c in it.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    for c in it.by_ref() {
                        if c == '\u{7}' {
                            break;
                        }
                    }
                }
                _ => {}
            }
            out.push(' ');
        } else if c.is_control() {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn top_over_a_controller_shows_the_pools_nodes_devices_and_sessions() {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("gpufuse-observe-top-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ctrl = format!("unix:{}", dir.join("c.sock").display());
    let node_sock = dir.join("n.sock");
    /// The controller and the node, ended (and the directory removed) however the test ends.
    struct Reap(Vec<Child>, std::path::PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let mut reap = Reap(Vec::new(), dir.clone());
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    reap.0.push(spawn(&[
        "controller",
        "--listen",
        &ctrl,
        "--heartbeat-ms",
        "100",
    ]));
    let node_listen = format!("unix:{}", node_sock.display());
    let images = dir.join("images").display().to_string();
    reap.0.push(spawn(&[
        "node",
        "--controller",
        &ctrl,
        "--listen",
        &node_listen,
        "--devices",
        "emu:1:1GiB",
        "--name",
        "gpu-a",
        "--image-cache",
        &images,
    ]));
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&node_sock).is_err() {
        assert!(Instant::now() < deadline, "the node did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Asked of the controller, placed on the node (the client follows the redirect).
    let ctrl_addr: Address = ctrl.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let _session = loop {
        match sliced(&ctrl_addr, "", 256 << 20) {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no session placed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };

    // Once the controller has heard of the session, top's first screen shows it whole.
    let hello = Connection::hello(SessionKind::Status, String::new(), Default::default());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let placed = match Connection::one_shot(&ctrl_addr, &hello).unwrap() {
            gpufuse_proto::ServerHello::PoolStatus(p) => {
                p.sessions.iter().any(|s| s.state == "running")
            }
            other => panic!("a controller answered {other:?}"),
        };
        if placed {
            break;
        }
        assert!(Instant::now() < deadline, "the session never ran");
        std::thread::sleep(Duration::from_millis(50));
    }

    let (mut master, terminal) = pty(40, 160);
    let mut top = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["top", "--server", &ctrl, "--interval", "0.2"])
        .stdin(terminal.try_clone().unwrap())
        .stdout(terminal.try_clone().unwrap())
        .stderr(terminal)
        .spawn()
        .unwrap();
    let written = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut reader = master.try_clone().unwrap();
    let sink = written.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let wanted = [
        "nodes: gpu-a ready",
        "devices 1 sessions 1",
        "gpu-a/0",
        "gpufuse emulated GPU",
        "#1 default - gpu-a/0",
    ];
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = screen_text(&written.lock().unwrap());
        if wanted.iter().all(|w| text.contains(w)) {
            break text;
        }
        if let Some(status) = top.try_wait().unwrap() {
            panic!("gpufuse top exited ({status}): {text}");
        }
        assert!(
            Instant::now() < deadline,
            "the screen lacks one of {wanted:?}: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.matches("gpu-a/0").count() >= 2, "{text}");
    master.write_all(b"q").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = top.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "gpufuse top did not quit on q");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    drop(reap);
}
