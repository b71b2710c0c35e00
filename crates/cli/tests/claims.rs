//! Kubernetes claims' tokens on a real `gpufuse serve --cdi-dir` (no cluster, no plugin: the
//! test writes and removes the claim's CDI spec as the DRA plugin does): a claim's token opens
//! a session only while its claim is prepared, only on the device it names, and `EndClaim` with
//! that token ends the claim's sessions.

use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpufuse_auth::Claims;
use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::ContextHandle;
use gpufuse_proto::{uuid_text, Request, ServerHello, SessionKind};
use gpufuse_transport::Address;

const SECRET: [u8; 32] = [7; 32];
const UID: &str = "5b7a1c2e-0000-4000-8000-00000000000a";

struct Serve {
    child: Child,
    dir: std::path::PathBuf,
    addr: Address,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start() -> Serve {
    let dir = std::env::temp_dir().join(format!("gpufuse-claims-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("cdi")).unwrap();
    let secret = dir.join("secret");
    let hex: String = SECRET.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&secret, hex).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
        .args(["serve", "--listen", &format!("unix:{}", sock.display())])
        .args(["--devices", "emu:2:1GiB"])
        .arg("--token-secret-file")
        .arg(&secret)
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .arg("--image-cache")
        .arg(dir.join("images"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "gpufuse serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Serve {
        child,
        dir,
        addr: Address::Unix(sock),
    }
}

fn token(claims: Claims) -> String {
    gpufuse_auth::issue(&SECRET, &claims).unwrap()
}

fn claim_token(device: &str) -> String {
    token(Claims {
        subject: "team-a/train".into(),
        max_vram_bytes: Some(256 << 20),
        claim: Some(UID.into()),
        device: Some(device.into()),
        ..Default::default()
    })
}

fn open(s: &Serve, token: String) -> Result<Connection, ClientError> {
    let hello = Connection::hello(SessionKind::Cuda, token, Default::default());
    Connection::open(&s.addr, &hello).map(|(c, _)| c)
}

fn refusal(r: Result<Connection, ClientError>) -> String {
    match r {
        Err(ClientError::Refused(reason)) => reason,
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, got a session"),
    }
}

#[test]
fn a_claims_token_works_while_prepared_on_its_device_and_unprepare_ends_its_sessions() {
    let s = start();
    let admin = token(Claims {
        subject: "admin".into(),
        ..Default::default()
    });
    let st = Connection::query_status(&s.addr, admin.clone()).unwrap();
    let second = uuid_text(&st.devices[1].uuid);

    // Not prepared (no CDI spec): refused, whatever the token's signature.
    let reason = refusal(open(&s, claim_token(&second)));
    assert!(reason.contains("is not prepared on this node"), "{reason}");

    // Prepared: admitted, on the claim's device with the claim's slice.
    let spec = gpufuse_auth::claim_spec_path(&s.dir.join("cdi"), UID).unwrap();
    std::fs::write(&spec, "{}").unwrap();
    let mut c = open(&s, claim_token(&second)).unwrap();
    c.quiet(&Request::CtxCreate {
        ctx: ContextHandle(1),
        device: 0,
        flags: 0,
    })
    .unwrap();
    let st = Connection::query_status(&s.addr, admin.clone()).unwrap();
    let mine = st
        .sessions
        .iter()
        .find(|x| x.subject.as_deref() == Some("team-a/train"))
        .expect("the claim's session");
    assert_eq!(mine.device, 1);
    assert_eq!(mine.limit_bytes, Some(256 << 20));

    // It may not be moved off its device, not even by its own tenant.
    let moved = Connection::one_shot(
        &s.addr,
        &Connection::hello(
            SessionKind::Migrate {
                session: mine.id,
                device: 0,
            },
            claim_token(&second),
            Default::default(),
        ),
    )
    .unwrap();
    match moved {
        ServerHello::Refused { reason } => {
            assert!(reason.contains("bound to its device"), "{reason}")
        }
        other => panic!("a claim's session was moved: {other:?}"),
    }
    let st = Connection::query_status(&s.addr, admin.clone()).unwrap();
    assert_eq!(st.sessions[0].device, 1);

    // A device this node does not have: refused, naming it.
    let reason = refusal(open(
        &s,
        claim_token("GPU-00000000-0000-0000-0000-000000000000"),
    ));
    assert!(reason.contains("which this node does not have"), "{reason}");

    // Only the claim's own token may end its sessions.
    let end = |t: String| {
        Connection::one_shot(
            &s.addr,
            &Connection::hello(SessionKind::EndClaim, t, Default::default()),
        )
        .unwrap()
    };
    assert!(matches!(end(admin.clone()), ServerHello::Refused { .. }));
    // Unprepared: the spec goes, then the node ends the claim's session.
    std::fs::remove_file(&spec).unwrap();
    let claim_only = token(Claims {
        subject: "team-a/train".into(),
        claim: Some(UID.into()),
        ..Default::default()
    });
    assert_eq!(end(claim_only), ServerHello::ClaimEnded { sessions: 1 });
    let st = Connection::query_status(&s.addr, admin).unwrap();
    assert!(st.sessions.is_empty(), "{:?}", st.sessions);
    assert!(
        c.call(&Request::Ping).is_err(),
        "the ended session answered"
    );
    let reason = refusal(open(&s, claim_token(&second)));
    assert!(reason.contains("is not prepared on this node"), "{reason}");
}
