//! What a new user meets, with the real `gpufuse` binary on unix sockets in a temporary
//! directory: the admission check of `gpufuse run`, `--vram` errors, `gpufuse sessions` and
//! `gpufuse kill`, the node's log (no colour codes in a file, sessions told in words, a warning
//! for an unauthenticated TCP listener), completions, the man page and `--version`.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::{ContextHandle, DevicePtr};
use gpufuse_proto::{ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

const BIN: &str = env!("CARGO_BIN_EXE_gpufuse");

struct Server {
    child: Child,
    dir: PathBuf,
    addr: Address,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    fn sock(&self) -> String {
        self.addr.to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufuse-newuser-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `gpufuse serve` with its log (stderr) going to a file, as an operator would run it.
fn start(name: &str, extra: &[&str]) -> Server {
    let dir = temp_dir(name);
    let sock = dir.join("s.sock");
    let log = dir.join("server.log");
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(["--devices", "emu:1:1GiB"])
        .args(extra)
        // The default image cache, but under the test's directory rather than ~/.cache.
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env_remove("NO_COLOR")
        .env_remove("GPUFUSE_LOG")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        dir,
        addr: Address::Unix(sock),
        log,
    }
}

fn gpufuse(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("GPUFUSE_SERVER")
        .env_remove("GPUFUSE_TOKEN")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn status_json(s: &Server) -> serde_json::Value {
    let o = gpufuse(&["status", "--server", &s.sock(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A CUDA session opened in this process, holding `bytes` of device memory.
fn session_holding(s: &Server, token: &str, bytes: u64) -> Connection {
    let hello = Connection::hello(SessionKind::Cuda, token.into(), ResourceRequest::default());
    let (mut c, _) = Connection::open(&s.addr, &hello).unwrap();
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    match c.call(&Request::MemAlloc {
        device: 0,
        size: bytes,
    }) {
        Ok(ReplyBody::Ptr(DevicePtr(_))) => {}
        other => panic!("{other:?}"),
    }
    c
}

/// Polls until `f` holds (the node reaps workers asynchronously).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A program that leaves a mark when it starts.
fn marker_program(dir: &Path) -> (Vec<String>, PathBuf) {
    let marker = dir.join("started");
    let argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        format!("touch '{}'", marker.display()),
    ];
    (argv, marker)
}

#[test]
fn run_refuses_an_oversized_slice_before_the_program_starts() {
    let s = start("admission", &[]);
    let (argv, marker) = marker_program(&s.dir);
    let sock = s.sock();
    let mut args = vec!["run", "--server", &sock, "--vram", "2GiB", "--"];
    args.extend(argv.iter().map(String::as_str));
    let o = gpufuse(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused the session: cannot grant 2 GiB of VRAM on device 0"),
        "{err}"
    );
    assert!(err.contains("/bin/sh was not started"), "{err}");
    assert!(!marker.exists(), "the program started");
    // The check kept nothing, and a session that fits starts as before.
    let st = status_json(&s);
    assert_eq!(st["sessions"].as_array().unwrap().len(), 0);
    assert_eq!(st["devices"][0]["used_bytes"], 0);
    let mut args = vec!["run", "--server", &sock, "--vram", "0.5GiB", "--"];
    args.extend(argv.iter().map(String::as_str));
    let o = gpufuse(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(marker.exists(), "the admitted program did not run");
    // The probe took no session id: the first real session is 1.
    let c = session_holding(&s, "", 1 << 20);
    assert_eq!(status_json(&s)["sessions"][0]["id"], 1);
    drop(c);
}

#[test]
fn run_refuses_a_bad_token_before_the_program_starts() {
    let dir = temp_dir("badtoken-secret");
    let secret = dir.join("secret");
    let o = gpufuse(&["token", "secret", secret.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = start(
        "badtoken",
        &["--token-secret-file", secret.to_str().unwrap()],
    );
    let (argv, marker) = marker_program(&s.dir);
    let sock = s.sock();
    let mut args = vec!["run", "--server", &sock, "--token", "not-a-token", "--"];
    args.extend(argv.iter().map(String::as_str));
    let o = gpufuse(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused the session: authentication failed"),
        "{err}"
    );
    assert!(!marker.exists(), "the program started");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_says_which_sizes_vram_accepts() {
    for bad in ["abc", "1.5 parsecs", "0"] {
        let o = gpufuse(&[
            "run",
            "--server",
            "unix:/nonexistent",
            "--vram",
            bad,
            "--",
            "true",
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("invalid value '{bad}' for '--vram <SIZE>'")),
            "{err}"
        );
        assert!(err.contains("e.g. 4GiB, 1.5GiB, 512MiB"), "{err}");
    }
}

#[test]
fn serve_names_a_missing_token_secret_file() {
    let o = gpufuse(&[
        "serve",
        "--listen",
        "unix:/nonexistent/dir/s.sock",
        "--devices",
        "emu:1:1GiB",
        "--token-secret-file",
        "/nonexistent/gpufuse-secret",
    ]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("cannot read the token secret file /nonexistent/gpufuse-secret"),
        "{err}"
    );
}

#[test]
fn kill_ends_a_session_frees_its_memory_and_the_client_gets_a_cuda_error() {
    let s = start("kill", &[]);
    let mut c = session_holding(&s, "", 256 << 20);
    let st = status_json(&s);
    assert_eq!(st["devices"][0]["used_bytes"], 256 << 20);
    let id = st["sessions"][0]["id"].as_u64().unwrap();

    // `gpufuse sessions` lists it, in text and JSON.
    let o = gpufuse(&["sessions", "--server", &s.sock()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(&id.to_string())
                && l.contains(&std::process::id().to_string())
                && l.contains("256.0")),
        "{text}"
    );
    let o = gpufuse(&["sessions", "--server", &s.sock(), "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list[0]["id"], id);
    assert_eq!(list[0]["used_bytes"], 256 << 20);

    let o = gpufuse(&["kill", "--server", &s.sock(), &id.to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("session {id} ended")));
    // `kill` returns once the session is released.
    let st = status_json(&s);
    assert_eq!(st["sessions"].as_array().unwrap().len(), 0, "{st}");
    assert_eq!(st["devices"][0]["used_bytes"], 0, "{st}");
    // The client's next call fails with a CUDA error (CUDA_ERROR_DEVICE_UNAVAILABLE, 46).
    let e = c.call(&Request::Ping).unwrap_err();
    assert!(matches!(e, ClientError::Lost(_)), "{e:?}");
    assert_eq!(e.status(), 46);

    // Ending a session that is not there says so.
    let o = gpufuse(&["kill", "--server", &s.sock(), &id.to_string()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!("there is no session {id}")),
        "{}",
        stderr(&o)
    );

    // The log tells the session's life in words, without colour codes.
    let log = s.log();
    assert!(!log.contains('\x1b'), "colour codes in a log file:\n{log}");
    assert!(!log.contains("ExitStatus"), "{log}");
    let pid = std::process::id();
    assert!(
        log.contains(&format!("session {id} started: program "))
            && log.contains(&format!("(pid {pid})")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "session {id} ended: worker killed by signal 9 (SIGKILL)"
        )),
        "{log}"
    );
    assert!(log.contains("held 256 MiB at the end"), "{log}");
}

#[test]
fn kill_on_a_token_node_ends_only_the_tenants_own_sessions() {
    let dir = temp_dir("tenants-secret");
    let secret = dir.join("secret");
    let secret = secret.to_str().unwrap();
    assert!(gpufuse(&["token", "secret", secret]).status.success());
    let token = |who: &str| {
        let o = gpufuse(&["token", "issue", "--secret-file", secret, "--subject", who]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o).trim().to_string()
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let s = start("tenants", &["--token-secret-file", secret]);
    let c = session_holding(&s, &alice, 1 << 20);
    let list = {
        let o = gpufuse(&["sessions", "--server", &s.sock(), "--token", &bob, "--json"]);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    assert_eq!(list[0]["tenant"], "alice");
    let id = list[0]["id"].as_u64().unwrap().to_string();
    let o = gpufuse(&["kill", "--server", &s.sock(), "--token", &bob, &id]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("belongs to another tenant"),
        "{}",
        stderr(&o)
    );
    let st = status_json_with(&s, &alice);
    assert_eq!(st["sessions"].as_array().unwrap().len(), 1, "{st}");
    assert_eq!(st["sessions"][0]["tenant"], "alice");
    let o = gpufuse(&["kill", "--server", &s.sock(), "--token", &alice, &id]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(s.log().contains("tenant alice"), "{}", s.log());
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

fn status_json_with(s: &Server, token: &str) -> serde_json::Value {
    let o = gpufuse(&["status", "--server", &s.sock(), "--token", token, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn an_unauthenticated_tcp_listener_is_warned_about() {
    let s = start("tcpwarn", &["--listen", "tcp:127.0.0.1:0"]);
    eventually("the warning is logged", || {
        s.log().contains("accepts sessions without authentication")
    });
    let log = s.log();
    // The bound address, not the one asked for.
    let warning = log
        .lines()
        .find(|l| l.contains("accepts sessions without authentication"))
        .unwrap();
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(warning.contains("tcp:127.0.0.1:"), "{warning}");
    assert!(!warning.contains("tcp:127.0.0.1:0 "), "{warning}");
    // A unix socket alone gets no warning.
    let quiet = start("tcpwarn-unix", &[]);
    let _ = status_json(&quiet);
    assert!(
        !quiet.log().contains("without authentication"),
        "{}",
        quiet.log()
    );
}

#[test]
fn completions_and_man_pages_are_printed() {
    for shell in ["bash", "zsh", "fish"] {
        let o = gpufuse(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let text = stdout(&o);
        for word in ["sessions", "kill", "vram", "listen", "token-secret-file"] {
            assert!(text.contains(word), "{shell} completions lack {word}");
        }
    }
    let o = gpufuse(&["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(
        page.starts_with(".ie") || page.contains(".TH gpufuse 1"),
        "{page}"
    );
    assert!(page.contains("gpufuse\\-serve(1)"), "{page}");
    assert!(page.contains("GPUFUSE_LOG"), "{page}");
    let o = gpufuse(&["man", "run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.contains(".TH gpufuse-run 1"), "{page}");
    assert!(page.contains("\\-\\-vram"), "{page}");
    let o = gpufuse(&["man", "nope"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no subcommand \"nope\""));
}

#[test]
fn help_says_how_to_set_the_log_level() {
    for args in [&["--help"][..], &["serve", "--help"]] {
        let o = gpufuse(args);
        assert!(stdout(&o).contains("GPUFUSE_LOG=debug"), "{}", stdout(&o));
    }
}

#[test]
fn version_names_the_commit() {
    let o = gpufuse(&["--version"]);
    assert!(o.status.success());
    let v = stdout(&o);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let commit = head.unwrap_or_else(|| "unknown".into());
    assert_eq!(
        v.trim(),
        format!("gpufuse {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );
}
