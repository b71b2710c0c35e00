//! A node's token check applies on `tcp+tls:` listeners as on plain ones: TLS proves the
//! server to the client, the token still says who the client is. A node serving with a token
//! secret (`gpufuse serve --token-secret-file`) and a certificate (`--tls-cert`, `--tls-key`)
//! refuses a hello over TLS without a token, with a token signed by another secret, or with
//! an expired one, and answers one with a good token.

use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpufuse_node::{NodeConfig, TokenPolicy};
use gpufuse_proto::{
    decode_owned, encode_frame, ClientHello, FrameKind, ServerHello, SessionKind, PROTOCOL_VERSION,
};
use gpufuse_transport::{ClientTls, Conn, ServerTls, Stream};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};

const SECRET: [u8; 32] = [9; 32];

/// A CA and a server certificate for 127.0.0.1, as files in a fresh directory.
fn pki() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufuse-node-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut sp = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = sp.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server-key.pem"), key.serialize_pem()).unwrap();
    dir
}

/// A node with one emulated device, tokens required, on a `tcp+tls:` listener; its port.
fn start_node(dir: &std::path::Path) -> u16 {
    // A free port: the node binds it again at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tls =
        ServerTls::from_files(&dir.join("server.pem"), &dir.join("server-key.pem"), None).unwrap();
    let config = NodeConfig {
        listen: vec![format!("tcp+tls:127.0.0.1:{port}").parse().unwrap()],
        devices: "emu:1:1GiB".parse().unwrap(),
        tokens: TokenPolicy::Verify(SECRET.to_vec()),
        // Status hellos are answered by the node itself: no worker is started.
        worker_exe: PathBuf::from("/nonexistent/gpufuse"),
        compute_policy: Default::default(),
        tls: Some(tls),
        client_certs: false,
        pool: None,
        http: None,
        elastic: Default::default(),
        image_cache: None,
        cdi_dir: None,
    };
    std::thread::spawn(move || gpufuse_node::serve(config).unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the node did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    port
}

/// Says hello over TLS (the server's certificate verified against the test's CA) with
/// `token`; the node's answer.
fn hello(dir: &std::path::Path, port: u16, kind: SessionKind, token: &str) -> ServerHello {
    let tls = ClientTls::new(Some(&dir.join("ca.pem")), None).unwrap();
    let stream = tls.connect(&format!("127.0.0.1:{port}")).unwrap();
    let mut conn = Conn::new(Stream::TlsClient(Box::new(stream)));
    let hello = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        kind,
        token: token.into(),
        pid: std::process::id(),
        program: "tls-token-test".into(),
        resources: Default::default(),
    };
    let mut out = Vec::new();
    encode_frame(&mut out, FrameKind::Hello, 0, 0, &hello);
    conn.send(&out).unwrap();
    let (h, body) = conn.recv().unwrap();
    assert_eq!(h.kind, FrameKind::HelloReply);
    decode_owned(body).unwrap()
}

fn refused(answer: ServerHello) -> String {
    match answer {
        ServerHello::Refused { reason } => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_token_check_applies_over_tls() {
    let dir = pki();
    let port = start_node(&dir);
    let claims = gpufuse_auth::Claims {
        subject: "team-a".into(),
        ..Default::default()
    };
    let good = gpufuse_auth::issue(&SECRET, &claims).unwrap();
    let forged = gpufuse_auth::issue(&[1; 32], &claims).unwrap();
    let expired = gpufuse_auth::issue(
        &SECRET,
        &gpufuse_auth::Claims {
            expires: Some(1),
            ..claims.clone()
        },
    )
    .unwrap();
    // Over an encrypted, verified connection, and still refused without a valid token.
    for (what, token) in [("none", ""), ("forged", &forged), ("expired", &expired)] {
        let reason = refused(hello(&dir, port, SessionKind::Status, token));
        assert!(reason.contains("authentication failed"), "{what}: {reason}");
        let reason = refused(hello(&dir, port, SessionKind::Cuda, token));
        assert!(reason.contains("authentication failed"), "{what}: {reason}");
    }
    // A good token is accepted.
    match hello(&dir, port, SessionKind::Status, &good) {
        ServerHello::Status(status) => assert_eq!(status.devices.len(), 1),
        other => panic!("a good token was not accepted: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
