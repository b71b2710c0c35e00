//! `tcp+tls:` end to end on loopback: frames both ways through rustls, certificate checks,
//! client certificates, and the mistakes users make (a plain client on a TLS port, a TLS
//! client on a plain port, the wrong CA, the wrong host name).

use std::path::PathBuf;
use std::sync::Mutex;
use std::thread;

use gpufuse_proto::{encode_frame, FrameKind};
use gpufuse_transport::{Address, ClientTls, Conn, ServerTls, Stream};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// The environment is process-wide: tests that set `GPUFUSE_TLS_*` take turns.
static ENV: Mutex<()> = Mutex::new(());

struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// A CA, a server certificate for `hosts`, a client certificate, and a second CA that
    /// signed nothing here.
    fn new(name: &str, hosts: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("gpufuse-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let mut sp =
            CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
                .unwrap();
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = sp.signed_by(&server_key, &ca, &ca_key).unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
        cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = cp.signed_by(&client_key, &ca, &ca_key).unwrap();
        let other_key = KeyPair::generate().unwrap();
        let mut other = CertificateParams::new(Vec::<String>::new()).unwrap();
        other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        other
            .distinguished_name
            .push(rcgen::DnType::CommonName, "someone else's CA");
        let other = other.self_signed(&other_key).unwrap();
        for (f, text) in [
            ("ca.pem", ca.pem()),
            ("other-ca.pem", other.pem()),
            ("server.pem", server.pem()),
            ("server-key.pem", server_key.serialize_pem()),
            ("client.pem", client.pem()),
            ("client-key.pem", client_key.serialize_pem()),
        ] {
            std::fs::write(dir.join(f), text).unwrap();
        }
        Pki { dir }
    }

    fn p(&self, f: &str) -> PathBuf {
        self.dir.join(f)
    }

    fn server(&self, client_ca: bool) -> ServerTls {
        let ca = self.p("ca.pem");
        ServerTls::from_files(
            &self.p("server.pem"),
            &self.p("server-key.pem"),
            client_ca.then_some(ca.as_path()),
        )
        .unwrap()
    }

    fn client(&self, ca: &str, identity: bool) -> ClientTls {
        let (c, k) = (self.p("client.pem"), self.p("client-key.pem"));
        ClientTls::new(
            Some(&self.p(ca)),
            identity.then_some((c.as_path(), k.as_path())),
        )
        .unwrap()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn frame(kind: FrameKind, id: u64, body: &Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(&mut out, kind, 0, id, body);
    out
}

/// An echo server on a fresh port: every frame it reads comes back with its id + 1.
fn echo_server(tls: ServerTls) -> (String, thread::JoinHandle<Result<(), String>>) {
    let listener = "tcp+tls:127.0.0.1:0"
        .parse::<Address>()
        .unwrap()
        .bind_with(Some(&tls))
        .unwrap();
    let Ok(Address::TcpTls(hp)) = listener.local_address() else {
        panic!("a tcp+tls listener has a tcp+tls address")
    };
    let t = thread::spawn(move || {
        let stream = listener.accept().map_err(|e| e.to_string())?;
        let mut conn = Conn::new(stream);
        loop {
            let (h, body) = match conn.recv() {
                Ok(f) => f,
                Err(gpufuse_transport::TransportError::Closed) => return Ok(()),
                Err(e) => return Err(format!("{e}: {:?}", std::error::Error::source(&e))),
            };
            let body: Vec<u8> = gpufuse_proto::decode_owned(body).map_err(|e| e.to_string())?;
            conn.send(&frame(FrameKind::Reply, h.request_id + 1, &body))
                .map_err(|e| e.to_string())?;
        }
    });
    (hp, t)
}

fn round_trip(conn: &mut Conn, id: u64, body: &Vec<u8>) {
    conn.send(&frame(FrameKind::Request, id, body)).unwrap();
    let (h, got) = conn.recv().unwrap();
    assert_eq!(h.request_id, id + 1);
    let got: Vec<u8> = gpufuse_proto::decode_owned(got).unwrap();
    assert!(got == *body, "{} bytes came back changed", body.len());
}

#[test]
fn frames_cross_a_tls_connection_both_ways() {
    let pki = Pki::new("frames", &["localhost", "127.0.0.1"]);
    let (hp, server) = echo_server(pki.server(false));
    let stream = pki.client("ca.pem", false).connect(&hp).unwrap();
    let mut conn = Conn::new(Stream::TlsClient(Box::new(stream)));
    assert!(conn.stream().is_tls() && !conn.stream().is_tcp());
    // Small frames, then frames larger than a TLS record (16 KiB) and than the receive buffer.
    for (i, len) in [0usize, 1, 100, 16 * 1024 + 7, 300_000, 9 << 20]
        .into_iter()
        .enumerate()
    {
        let body: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
        round_trip(&mut conn, i as u64 * 10, &body);
    }
    // Nothing is waiting: a non-blocking poll says so and does not block.
    assert!(!conn.poll_frame());
    // Many frames sent at once come back in order.
    let mut burst = Vec::new();
    for i in 0..200u64 {
        burst.extend(frame(FrameKind::Request, 1000 + i, &vec![i as u8; 64]));
    }
    conn.send(&burst).unwrap();
    for i in 0..200u64 {
        let (h, body) = conn.recv().unwrap();
        assert_eq!(h.request_id, 1001 + i);
        let body: Vec<u8> = gpufuse_proto::decode_owned(body).unwrap();
        assert_eq!(body, vec![i as u8; 64]);
    }
    drop(conn);
    server.join().unwrap().unwrap();
}

#[test]
fn poll_frame_takes_in_decrypted_frames_without_blocking() {
    let pki = Pki::new("poll", &["localhost"]);
    let (hp, server) = echo_server(pki.server(false));
    let stream = pki
        .client("ca.pem", false)
        .connect(&hp.replace("127.0.0.1", "localhost"))
        .unwrap();
    let mut conn = Conn::new(Stream::TlsClient(Box::new(stream)));
    conn.send(&frame(FrameKind::Request, 5, &vec![7u8; 1000]))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !conn.poll_frame() {
        assert!(
            std::time::Instant::now() < deadline,
            "the echo never arrived"
        );
        thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(conn.has_frame());
    assert_eq!(conn.recv().unwrap().0.request_id, 6);
    drop(conn);
    server.join().unwrap().unwrap();
}

#[test]
fn the_wrong_ca_and_the_wrong_name_are_refused_with_a_reason() {
    let pki = Pki::new("verify", &["localhost"]);
    let (hp, _server) = echo_server(pki.server(false));
    let err = pki
        .client("other-ca.pem", false)
        .connect(&hp)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("UnknownIssuer") && err.contains("--tls-ca"),
        "{err}"
    );

    let (hp, _server) = echo_server(pki.server(false));
    // The certificate names localhost only; 127.0.0.1 is not in it.
    let err = pki
        .client("ca.pem", false)
        .connect(&hp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid peer certificate"), "{err}");
}

#[test]
fn a_server_that_requires_client_certificates_accepts_only_them() {
    let pki = Pki::new("mtls", &["127.0.0.1"]);
    let (hp, server) = echo_server(pki.server(true));
    // Without a certificate: TLS 1.3 finishes the client's side of the handshake, and the
    // server's refusal arrives with the first read.
    let refused = pki.client("ca.pem", false).connect(&hp).and_then(|s| {
        let mut conn = Conn::new(Stream::TlsClient(Box::new(s)));
        conn.send(&frame(FrameKind::Request, 1, &vec![1]))?;
        conn.recv().map(|_| ()).map_err(std::io::Error::other)
    });
    assert!(
        refused.is_err(),
        "a client without a certificate was served"
    );
    assert!(server.join().unwrap().is_err());

    let (hp, server) = echo_server(pki.server(true));
    let stream = pki.client("ca.pem", true).connect(&hp).unwrap();
    let mut conn = Conn::new(Stream::TlsClient(Box::new(stream)));
    round_trip(&mut conn, 1, &vec![1, 2, 3]);
    drop(conn);
    server.join().unwrap().unwrap();
}

#[test]
fn a_plain_client_on_a_tls_port_is_recognised_and_a_tls_client_on_a_plain_port_told() {
    let pki = Pki::new("mixup", &["127.0.0.1"]);
    let listener = "tcp+tls:127.0.0.1:0"
        .parse::<Address>()
        .unwrap()
        .bind_with(Some(&pki.server(false)))
        .unwrap();
    let Ok(Address::TcpTls(hp)) = listener.local_address() else {
        panic!()
    };
    let plain = thread::spawn(move || {
        let mut c = Conn::new(Address::Tcp(hp).connect().unwrap());
        c.send(&frame(FrameKind::Hello, 0, &vec![0])).unwrap();
    });
    let stream = listener.accept().unwrap();
    assert!(stream.is_tls());
    let plain_stream = stream.plain_client_on_tls().expect("a plain gpufuse frame");
    assert!(plain_stream.is_tcp());
    plain.join().unwrap();

    // A TLS client on a plain listener: the server reads a bad magic and closes.
    let listener = "tcp:127.0.0.1:0"
        .parse::<Address>()
        .unwrap()
        .bind()
        .unwrap();
    let Ok(Address::Tcp(hp)) = listener.local_address() else {
        panic!()
    };
    let server = thread::spawn(move || {
        let mut conn = Conn::new(listener.accept().unwrap());
        assert!(conn.recv().is_err());
    });
    let err = pki
        .client("ca.pem", false)
        .connect(&hp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS handshake"), "{err}");
    server.join().unwrap();
}

#[test]
fn an_address_connects_with_the_environments_settings_and_names_bad_files() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let pki = Pki::new("env", &["127.0.0.1"]);
    let (hp, server) = echo_server(pki.server(true));
    std::env::set_var("GPUFUSE_TLS_CA", pki.p("ca.pem"));
    std::env::set_var("GPUFUSE_TLS_CERT", pki.p("client.pem"));
    std::env::set_var("GPUFUSE_TLS_KEY", pki.p("client-key.pem"));
    let addr: Address = format!("tcp+tls:{hp}").parse().unwrap();
    let mut conn = Conn::new(addr.connect().unwrap());
    round_trip(&mut conn, 3, &vec![9; 10]);
    drop(conn);
    server.join().unwrap().unwrap();

    std::env::remove_var("GPUFUSE_TLS_KEY");
    let err = addr.connect().unwrap_err().to_string();
    assert!(
        err.contains("GPUFUSE_TLS_CERT is set but GPUFUSE_TLS_KEY is not"),
        "{err}"
    );
    std::env::remove_var("GPUFUSE_TLS_CERT");
    let missing = pki.p("missing.pem");
    std::env::set_var("GPUFUSE_TLS_CA", &missing);
    let err = addr.connect().unwrap_err().to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    std::env::set_var("GPUFUSE_TLS_CA", pki.p("server-key.pem"));
    let err = addr.connect().unwrap_err().to_string();
    assert!(err.contains("holds no CA certificates"), "{err}");
    std::env::remove_var("GPUFUSE_TLS_CA");

    let not_key = ServerTls::from_files(&pki.p("server.pem"), &pki.p("ca.pem"), None).unwrap_err();
    assert!(not_key.to_string().contains("private key"), "{not_key}");
    let pair =
        ServerTls::from_files(&pki.p("server.pem"), &pki.p("client-key.pem"), None).unwrap_err();
    assert!(
        pair.to_string().contains("certificate and key pair"),
        "{pair}"
    );
}

#[test]
fn a_tls_address_without_an_identity_does_not_bind() {
    let err = "tcp+tls:127.0.0.1:0"
        .parse::<Address>()
        .unwrap()
        .bind()
        .unwrap_err();
    assert!(err.to_string().contains("--tls-cert"), "{err}");
}

/// A self-signed server certificate made the common way (`openssl req -x509 -subj
/// /CN=...`: it marks itself a CA) given as the client's CA file is accepted as pinned, as
/// curl and OpenSSL accept it; another self-signed certificate, or one not naming the host,
/// is still refused.
#[test]
fn a_self_signed_server_certificate_is_accepted_as_pinned() {
    let dir = std::env::temp_dir().join(format!("gpufuse-tls-pinned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let make = |hosts: &[&str], file: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, hosts[0]);
        let cert = p.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{file}-key.pem")), key.serialize_pem()).unwrap();
    };
    make(&["127.0.0.1"], "self");
    make(&["127.0.0.1"], "stranger");
    make(&["localhost"], "elsewhere");
    let server = |f: &str| {
        ServerTls::from_files(
            &dir.join(format!("{f}.pem")),
            &dir.join(format!("{f}-key.pem")),
            None,
        )
        .unwrap()
    };
    let client = |f: &str| ClientTls::new(Some(&dir.join(format!("{f}.pem"))), None).unwrap();

    let (hp, echo) = echo_server(server("self"));
    let stream = client("self").connect(&hp).expect("pinned: accepted");
    let mut conn = Conn::new(Stream::TlsClient(Box::new(stream)));
    round_trip(&mut conn, 3, &b"pinned".to_vec());
    drop(conn);
    echo.join().unwrap().unwrap();

    let (hp, _echo) = echo_server(server("self"));
    let err = client("stranger").connect(&hp).unwrap_err().to_string();
    assert!(err.contains("invalid peer certificate"), "{err}");

    let (hp, _echo) = echo_server(server("elsewhere"));
    let err = client("elsewhere").connect(&hp).unwrap_err().to_string();
    assert!(
        err.contains("invalid peer certificate"),
        "pinned, but it does not name 127.0.0.1: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
